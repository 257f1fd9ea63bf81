"""KernelWriter's fast path for interval sets (a feed's load and refreshes) sends exactly what its general
path encodes for the same ops: deletions first, the same elements with the same tails, in one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nftblockd.config import parse_config
from nftblockd.kernel import nfmsg as m
from nftblockd.kernel.bans import DELETE, OpSpec
from nftblockd.kernel.batcher import Group
from nftblockd.kernel.netlink import TxOutcome
from nftblockd.kernel.ruleset import plan_ruleset
from nftblockd.kernel.setwriter import Features
from nftblockd.kernel.writer import KernelWriter, flat_ops

NOW_MS = 1_700_000_000_000


class RecordingSock:
    """The NftSocket surface `write` uses; every transaction commits and is kept."""

    generation = 1

    def __init__(self) -> None:
        self.seq = 1
        self.sent: list[list[bytes]] = []

    def next_seq(self, n: int = 1) -> int:
        seq, self.seq = self.seq, self.seq + n
        return seq

    def transact(self, messages: Sequence[bytes], *, genid: int | None = None) -> TxOutcome:
        self.sent.append(list(messages))
        return TxOutcome((), self.generation)

    def list_chains(self, table: str) -> dict[str, None]:
        return {}


def _elements(msgs: Sequence[bytes]) -> list[tuple[int, str, bytes]]:
    """(message type, set, element nests) per message, without headers and sequence numbers."""
    out = []
    for r in m.iter_messages(b"".join(msgs)):
        attrs = m.attrs_dict(r.payload[4:])
        out.append((r.nft_type, m.read_strz(attrs[m.NFTA_SET_ELEM_LIST_SET]),
                    attrs[m.NFTA_SET_ELEM_LIST_ELEMENTS]))
    return out


def _writer(timeout_update: bool = True) -> tuple[KernelWriter, RecordingSock]:
    cfg = parse_config("blocklists: {feeds: {timeout: 1h}}\nallowlist_self: false\n")
    sock = RecordingSock()
    w = KernelWriter(plan_ruleset(cfg), sock, protect=False)  # type: ignore[arg-type]
    w.features = Features((6, 18), True, True, True, timeout_update)
    return w, sock


def _refresh(until_ms: int | None) -> list[Group]:
    add = OpSpec(True, until_ms, "")
    v4 = [(198 << 24 | 51 << 16 | 100 << 8) << 8 | 24, (203 << 24 | 0 << 16 | 113 << 8 | 9) << 8 | 32]
    v6 = [(0x2001_0DB8 << 96) << 8 | 32, ((1 << 128) - 1) << 8 | 128]  # the last one reaches the top: no end
    gone4 = [(192 << 24 | 0 << 16 | 2 << 8) << 8 | 25]
    return [Group("feeds_net4", v4, [add] * 2), Group("feeds_net4", gone4, [DELETE]),
            Group("feeds_net6", v6, [add] * 2)]



def test_fast_path_sends_what_the_general_encoder_makes() -> None:
    for until_ms in (None, NOW_MS + 3_600_000):
        w, sock = _writer()
        groups = _refresh(until_ms)
        res = w.write(groups, NOW_MS)
        assert res.committed_ops == 5 and res.transactions == 1 and not res.failed
        assert len(sock.sent) == 1
        names, keys, specs = flat_ops(groups)
        general, _where = w._encode(names, keys, specs, range(len(keys)), NOW_MS, set())
        fast = _elements(sock.sent[0])
        want = _elements([sm.data for sm in general])
        # the general path orders per set (deletions, then additions); the fast path deletes first across sets
        assert sorted(fast) == sorted(want)
        assert [t for t, _s, _e in fast] == sorted((t for t, _s, _e in fast), key=lambda t: t == m.NFT_MSG_NEWSETELEM)


def test_renewals_and_old_kernels_keep_the_general_path() -> None:
    # mixed specs (additions and renewals of kept entries) and kernels without timeout updates: general path
    w, sock = _writer()
    add, kept = OpSpec(True, NOW_MS + 1000, ""), OpSpec(True, NOW_MS + 1000, "", True)
    w.write([Group("feeds_net4", [1 << 8 | 32, 2 << 8 | 32], [add, kept])], NOW_MS)
    assert len(sock.sent) == 1
    w, sock = _writer(timeout_update=False)
    w.write([Group("feeds_net4", [1 << 8 | 32], [kept])], NOW_MS)
    assert len(sock.sent) == 1 and len(_elements(sock.sent[0])) == 2  # destroy + add, as the general path does


def test_ranges_with_different_ends_take_the_fast_path_too() -> None:
    # a burst's merged batches: IPv6 /64 bans with a few different ends (and a delete of a range they absorb)
    # next to hosts with one end; the general path's per-element encoding is not used, the elements are its own
    w, sock = _writer()
    ends = [OpSpec(True, NOW_MS + 3_600_000 + 1000 * (i % 3), "") for i in range(7)]
    net6 = [(0x2001_0DB8 << 96 | i << 64) << 8 | 64 for i in range(7)]
    groups = [Group("feeds_net6", net6, ends), Group("feeds_net6", [(0x2001_0DB9 << 96 | 5) << 8 | 128], [DELETE]),
              Group("feeds_net4", [(203 << 24 | i) << 8 | 32 for i in range(5)], [ends[0]] * 5)]
    general_encode = w._encode

    def refuse(*a: object, **k: object) -> Any:
        raise AssertionError("the general path was taken")

    w._encode = refuse  # type: ignore[method-assign]
    res = w.write(groups, NOW_MS)
    assert res.committed_ops == 13 and res.transactions == 1 and not res.failed and len(sock.sent) == 1
    names, keys, specs = flat_ops(groups)
    general, _where = general_encode(names, keys, specs, range(len(keys)), NOW_MS, set())
    fast = _elements(sock.sent[0])
    # the same elements, each whole (the messages are cut per end now, so compared element by element)
    assert sorted(_each(fast)) == sorted(_each(_elements([sm.data for sm in general])))
    assert [t for t, _s, _e in fast] == sorted((t for t, _s, _e in fast), key=lambda t: t == m.NFT_MSG_NEWSETELEM)


def _each(msgs: list[tuple[int, str, bytes]]) -> list[tuple[int, str, bytes]]:
    return [(t, s, elem) for t, s, elems in msgs for _kind, elem in m.iter_attrs(elems)]
