"""feeds/delta.py: the diff of two sorted key lists, and what a refresh sends (added, removed, renewed) as the
feed manager applies it to an Enforcer over the in-memory kernel (tests/helpers/fakekernel.py)."""

from __future__ import annotations

import errno as E
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nftblockd.allowlist import EMPTY
from nftblockd.config import parse_config
from nftblockd.feeds import delta
from nftblockd.feeds.delta import AppliedSets, SetDelta, diff_packed, diff_packed_py, diff_sorted, diff_sorted_py, pack
from nftblockd.feeds.manager import apply_desired
from nftblockd.kernel.enforcer import Enforcer
from nftblockd.kernel.ruleset import plan_ruleset
from tests.helpers.fakekernel import FakeSetWriter

_sorted_keys = st.lists(st.integers(0, 200), max_size=60, unique=True).map(sorted)
Diff = Callable[[list[int], list[int]], tuple[list[int], list[int]]]
# the Python walk, and the C loop (feeds/_sorted.c) where it was built: both must give the set differences
DIFFS = [pytest.param(diff_sorted_py, id="python"),
         pytest.param(diff_sorted, id="native",
                      marks=pytest.mark.skipif(not delta.NATIVE, reason="feeds/_sorted.c not built"))]
# keys on both sides of the C loop's switch from C integers to int objects (2**63), as IPv4 net keys (40
# bits) and IPv6 ones (136 bits) are
_wide_keys = st.lists(st.one_of(st.integers(0, 1 << 40), st.integers((1 << 63) - 50, (1 << 63) + 50),
                                st.integers(0, 1 << 136)), max_size=60, unique=True).map(sorted)


@pytest.mark.parametrize("diff", DIFFS)
@given(old=_sorted_keys, new=_sorted_keys)
def test_diff_sorted_is_the_set_difference_both_ways(diff: Diff, old: list[int], new: list[int]) -> None:
    added, removed = diff(old, new)
    assert added == sorted(set(new) - set(old))
    assert removed == sorted(set(old) - set(new))


@pytest.mark.parametrize("diff", DIFFS)
@given(base=_sorted_keys, add=st.lists(st.integers(0, 200), max_size=8), drop=st.lists(st.integers(0, 200), max_size=8))
def test_diff_sorted_finds_a_few_changes_in_long_equal_runs(diff: Diff, base: list[int], add: list[int],
                                                            drop: list[int]) -> None:
    old = sorted({k * 1000 for k in base})  # long runs of equal elements, then a handful of differences
    new = sorted((set(old) - {k * 1000 for k in drop}) | {k * 1000 + 1 for k in add})
    assert diff(old, new) == (sorted(set(new) - set(old)), sorted(set(old) - set(new)))


@pytest.mark.parametrize("diff", DIFFS)
@given(old=_wide_keys, new=_wide_keys)
def test_diff_sorted_of_wide_keys_equals_the_python_walk(diff: Diff, old: list[int], new: list[int]) -> None:
    added, removed = diff(old, new)
    assert (added, removed) == diff_sorted_py(old, new) == (sorted(set(new) - set(old)), sorted(set(old) - set(new)))
    assert all(type(k) is int for k in added + removed)


@pytest.mark.skipif(not delta.NATIVE, reason="feeds/_sorted.c not built")
def test_the_native_diff_refuses_what_is_not_two_lists_and_passes_comparison_errors_on() -> None:
    with pytest.raises(TypeError):
        diff_sorted((1, 2), [1])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        diff_sorted([1, "a"], [1, 2])  # type: ignore[list-item]  # "a" < 2 raises, as in Python
    untyped: Any = diff_sorted  # any totally ordered items work, as in Python
    assert untyped([(1, 1), (2, 0)], [(1, 1), (3, 0)]) == ([(3, 0)], [(2, 0)])


PackedDiff = Callable[[bytes, list[int], list[int]], tuple[list[int], list[int], bytes] | None]
PACKED = [pytest.param(diff_packed_py, id="python"),
          pytest.param(diff_packed, id="native",
                       marks=pytest.mark.skipif(not delta.NATIVE, reason="feeds/_sorted.c not built"))]
_int64_keys = st.lists(st.one_of(st.integers(0, 1 << 40), st.integers(-(1 << 63), (1 << 63) - 1)),
                       max_size=60, unique=True).map(sorted)


@pytest.mark.parametrize("diff", PACKED)
@given(old=_int64_keys, new=_wide_keys)
def test_the_packed_diff_equals_the_list_diff_or_declines_keys_past_64_bits(diff: PackedDiff, old: list[int],
                                                                           new: list[int]) -> None:
    old_packed = pack(old)
    assert old_packed is not None
    res = diff(old_packed, old, new)
    if any(not -(1 << 63) <= k < 1 << 63 for k in new):
        assert res is None and pack(new) is None
        return
    assert res is not None
    added, removed, new_packed = res
    assert (added, removed) == diff_sorted_py(old, new)
    assert new_packed == pack(new)
    assert all(type(k) is int for k in added + removed)
    old_ids = {id(k) for k in old}
    assert all(id(k) in old_ids for k in removed)  # the ban state's own key objects: found by identity
    with pytest.raises(ValueError):
        diff(old_packed, [*old, 1 << 64], new)


@given(steps=st.lists(st.tuples(_wide_keys, st.lists(st.sampled_from(range(0, 200)), max_size=3)), max_size=6))
def test_applied_sets_plan_the_same_with_and_without_the_packed_keys(steps: list[tuple[list[int], list[int]]]) -> None:
    # refreshes (with refusals forgotten in between) planned by the packed walk and by the list walk alone
    plain, packed = AppliedSets(), AppliedSets()
    plain.record({"s": [1, 5]}, None, 0, None)
    packed.record({"s": [1, 5]}, None, 0, None)
    for keys, refused in steps:
        plans = []
        for a, native in ((plain, False), (packed, True)):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(delta, "NATIVE", native)
                plan = a.plan({"s": keys}, None, 0)
            a.record({"s": keys}, None, 0, plan)
            a.forget(("s", k) for k in refused)
            plans.append(plan)
        assert plans[0] == plans[1]
        assert plain.sets["s"].keys == packed.sets["s"].keys
        held = packed.sets["s"]
        assert held.packed is None or held.packed == pack(held.keys)


def test_applied_sets_diff_the_previous_aggregate_and_renew_at_half_life() -> None:
    a = AppliedSets()
    day = 86_400_000
    assert a.plan({"s": [1, 2, 3]}, day, 0) is None  # nothing applied yet: a full sync
    a.record({"s": [1, 2, 3]}, day, 0, None)
    # an unchanged refresh a little later: nothing to send
    plan = a.plan({"s": [1, 2, 3]}, 1000 + day, 1000)
    assert plan == {"s": SetDelta([], [], [])} and not plan["s"]
    a.record({"s": [1, 2, 3]}, 1000 + day, 1000, plan)
    # churn: only the difference; the new key's end starts a cohort of its own
    plan = a.plan({"s": [2, 3, 4]}, 2000 + day, 2000)
    assert plan == {"s": SetDelta([4], [1], [])}
    a.record({"s": [2, 3, 4]}, 2000 + day, 2000, plan)
    # past half of the first cohort's life: its keys still wanted are renewed, the newer cohort is not due
    now = day // 2 + 1
    plan = a.plan({"s": [2, 3, 4, 5]}, now + day, now)
    assert plan == {"s": SetDelta([5], [], [2, 3])}
    a.record({"s": [2, 3, 4, 5]}, now + day, now, plan)
    assert a.plan({"s": [2, 3, 4, 5]}, now + 1 + day, now + 1) == {"s": SetDelta([], [], [])}
    # long after: every cohort ended (the kernel dropped them): all renewed, i.e. written again
    later = 5 * day
    assert a.plan({"s": [2, 3, 4, 5]}, later + day, later) == {"s": SetDelta([], [], [2, 3, 4, 5])}


def test_applied_sets_fall_back_to_a_full_sync_when_the_shape_changes() -> None:
    a = AppliedSets()
    a.record({"s": [1]}, None, 0, None)
    assert a.plan({"s": [1], "t": []}, None, 0) is None  # another set
    assert a.plan({"s": [1]}, 10_000, 0) is None  # permanent -> ending
    assert a.plan({"s": [1, 2]}, None, 0) == {"s": SetDelta([2], [], [])}


def test_a_key_removed_and_added_back_is_added_not_renewed() -> None:
    a = AppliedSets()
    a.record({"s": [1, 2]}, 100, 0, None)
    plan = a.plan({"s": [2]}, 110, 10)
    a.record({"s": [2]}, 110, 10, plan)
    assert a.plan({"s": [1, 2]}, 160, 60) == {"s": SetDelta([1], [], [2])}


def test_refused_keys_are_added_again_by_the_next_refresh() -> None:
    a = AppliedSets()
    a.record({"s": [1, 2, 3]}, None, 0, None)
    a.forget([("s", 2), ("other", 9)])
    assert a.plan({"s": [1, 2, 3]}, None, 0) == {"s": SetDelta([2], [], [])}


# -- through the enforcer, into the in-memory kernel ----------------------------------------------------------

CONFIG = "blocklists: {feeds: {timeout: 1h, size: 100}}\nallowlist_self: false\n"


@pytest.fixture
async def enforcer() -> AsyncIterator[tuple[Enforcer, FakeSetWriter]]:
    cfg = parse_config(CONFIG)
    plan = plan_ruleset(cfg)
    fake = FakeSetWriter(plan)
    enf = Enforcer(cfg, plan, EMPTY, lambda: fake)
    await enf.start()
    try:
        yield enf, fake
    finally:
        await enf.close()


def _desired(hosts: list[int], nets: list[int]) -> dict[str, list[int]]:
    return {"feeds_ip4": sorted(hosts), "feeds_net4": sorted(nets), "feeds_ip6": [], "feeds_net6": []}


def _net(i: int) -> int:
    return (0xC6120000 + (i << 8)) << 8 | 24  # 198.18.i.0/24 as a net key


async def test_an_unchanged_refresh_sends_nothing_and_churn_is_applied_exactly(
        enforcer: tuple[Enforcer, FakeSetWriter]) -> None:
    enf, fake = enforcer
    applied = AppliedSets()
    hosts = [0xC6130000 + i for i in range(50)]
    nets = [_net(i) for i in range(30)]
    await apply_desired(enf, applied, _desired(hosts, nets), None, reason="feeds x")
    assert fake.elements("feeds_ip4") == set(hosts) and fake.elements("feeds_net4") == set(nets)
    sent = len(fake.transactions)
    res = await apply_desired(enf, applied, _desired(hosts, nets), None, reason="feeds x")
    assert (res.added, res.removed, res.failed) == (0, 0, 0) and len(fake.transactions) == sent
    # 1 address and 1 range dropped, 2 of each added: one transaction carrying exactly those six
    hosts2 = [*hosts[1:], 0xC6140001, 0xC6140002]
    nets2 = [*nets[:-1], _net(40), _net(41)]
    res = await apply_desired(enf, applied, _desired(hosts2, nets2), None, reason="feeds x")
    assert (res.added, res.removed, res.failed) == (4, 2, 0)
    assert len(fake.transactions) == sent + 1
    ops = {(g.set_name, k, s.add) for g in fake.transactions[-1] for k, s in zip(g.keys, g.specs, strict=True)}
    assert ops == {("feeds_ip4", hosts[0], False), ("feeds_ip4", 0xC6140001, True), ("feeds_ip4", 0xC6140002, True),
                   ("feeds_net4", nets[-1], False), ("feeds_net4", _net(40), True), ("feeds_net4", _net(41), True)}
    assert fake.elements("feeds_ip4") == set(hosts2) and fake.elements("feeds_net4") == set(nets2)
    assert set(enf.state.sets["feeds_ip4"].entries) == set(hosts2)
    assert set(enf.state.sets["feeds_net4"].entries) == set(nets2)
    # the interval index, rebuilt lazily after a bulk change, still answers look-ups
    assert enf.state.sets["feeds_net4"].containing(0xC6122805, 0xC6122805) == _net(40)


async def test_timeouts_are_renewed_past_half_life_only(enforcer: tuple[Enforcer, FakeSetWriter]) -> None:
    enf, fake = enforcer
    applied = AppliedSets()
    day = 86_400.0
    t0 = time.time()
    hosts = [0xC6130000 + i for i in range(20)]
    await apply_desired(enf, applied, _desired(hosts, []), t0 + day, reason="feeds x", now=t0)
    sent = len(fake.transactions)
    # an hour later, one new address: only it is sent, with the new end; the others keep theirs
    t1 = t0 + 3600
    await apply_desired(enf, applied, _desired([*hosts, 0xC6140001], []), t1 + day, reason="feeds x", now=t1)
    assert len(fake.transactions) == sent + 1
    assert [(g.set_name, g.keys) for g in fake.transactions[-1]] == [("feeds_ip4", [0xC6140001])]
    assert fake.sets["feeds_ip4"][hosts[0]].until_ms == int((t0 + day) * 1000)
    # past half of the first cohort's life: its 20 are renewed (re-sent as kept elements), the newer one not
    t2 = t0 + 0.52 * day  # the first cohort has 0.48 d left, the second (an hour younger) 0.52 d
    await apply_desired(enf, applied, _desired([*hosts, 0xC6140001], []), t2 + day, reason="feeds x", now=t2)
    (group,) = fake.transactions[-1]
    assert sorted(group.keys) == hosts and all(s.existed for s in group.specs)
    assert fake.sets["feeds_ip4"][hosts[0]].until_ms == int((t2 + day) * 1000)
    assert fake.sets["feeds_ip4"][0xC6140001].until_ms == int((t1 + day) * 1000)


async def test_an_element_the_kernel_refused_is_added_again_next_time(enforcer: tuple[Enforcer, FakeSetWriter]
                                                                     ) -> None:
    enf, fake = enforcer
    applied = AppliedSets()
    hosts = [0xC6130000 + i for i in range(5)]
    await apply_desired(enf, applied, _desired(hosts[:3], []), None, reason="feeds x")
    fake.fail[("feeds_ip4", hosts[3])] = E.ENOMEM
    res = await apply_desired(enf, applied, _desired(hosts, []), None, reason="feeds x")
    assert res.failed == 1 and fake.elements("feeds_ip4") == set(hosts) - {hosts[3]}
    del fake.fail[("feeds_ip4", hosts[3])]
    res = await apply_desired(enf, applied, _desired(hosts, []), None, reason="feeds x")
    assert (res.added, res.failed) == (1, 0) and fake.elements("feeds_ip4") == set(hosts)
