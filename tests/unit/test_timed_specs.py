"""`TimedSpecs` (kernel/bans.py: hash-set adds each with its own end, one column instead of an `OpSpec` per key)
against the list of `OpSpec`s it stands for: as a sequence, in the kernel writer's messages and in the fake
kernel (tests/helpers/fakekernel.py) that the catch-up benchmark runs on (with the encoding added there)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.config import parse_config
from nftblockd.kernel.bans import OpSpec, TimedSpecs
from nftblockd.kernel.batcher import Group
from nftblockd.kernel.ruleset import plan_ruleset
from tests.helpers.fakekernel import FakeSetWriter
from tests.unit.test_writer_ranges import RecordingSock, _elements

NOW_MS = 1_800_000_000_000
_ends = st.lists(st.integers(NOW_MS + 1, NOW_MS + 10**9), max_size=30)


def plain(ends: list[int], new: int) -> list[OpSpec]:
    return [OpSpec(True, e, "", i >= new) for i, e in enumerate(ends)]


@given(_ends, st.data())
def test_timed_specs_are_the_list_of_op_specs(ends: list[int], data: st.DataObject) -> None:
    new = data.draw(st.integers(0, len(ends)))
    t, want = TimedSpecs(ends, new), plain(ends, new)
    assert len(t) == len(want) and list(t) == want and t == want and list(reversed(t)) == want[::-1]
    if ends:
        i = data.draw(st.integers(-len(ends), len(ends) - 1))
        assert t[i] == want[i]
    sl = slice(data.draw(st.integers(-3, 5)), data.draw(st.integers(-3, 40)), data.draw(st.sampled_from([1, 2, -1])))
    assert t[sl] == want[sl]
    probes: list[Any] = [*want[:3], OpSpec(True, None), OpSpec(False), OpSpec(True, ends[0] if ends else 1, "c"),
                         "other"]
    for p in probes:
        assert t.count(p) == want.count(p)


def _writer() -> Any:
    from nftblockd.kernel.setwriter import Features
    from nftblockd.kernel.writer import KernelWriter
    cfg = parse_config("blocklists: {default: {}}\nallowlist_self: false\n")
    sock = RecordingSock()
    w = KernelWriter(plan_ruleset(cfg), sock, protect=False)  # type: ignore[arg-type]
    w.features = Features((6, 18), True, True, True, True)
    return w, sock


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), unique=True, max_size=30), st.data())
def test_the_writer_and_the_fake_kernel_write_timed_specs_as_their_op_specs(keys: list[int],
                                                                            data: st.DataObject) -> None:
    ends = data.draw(st.lists(st.integers(NOW_MS + 1, NOW_MS + 10**9), min_size=len(keys), max_size=len(keys)))
    new = data.draw(st.integers(0, len(keys)))
    results = []
    for specs in (TimedSpecs(ends, new), plain(ends, new)):
        w, sock = _writer()
        res = w.write([Group("default_ip4", keys, specs)], NOW_MS - 5)
        fake = FakeSetWriter(plan_ruleset(parse_config("blocklists: {default: {}}\nallowlist_self: false\n")),
                             clock=lambda: NOW_MS / 1000)
        fake.setup([])
        fres = fake.write([Group("default_ip4", keys, specs)], NOW_MS - 5)
        results.append((res.committed_ops, [_elements(x) for x in sock.sent], fres.committed_ops,
                        fres.elements_sent, fake.sets["default_ip4"], fake.transactions[-1]))
    assert results[0] == results[1]
