"""The ban sink (kernel/sink.py) on the in-memory SetWriter and the real tracker: one path for any batch
size, refusals forgotten by the tracker, recidive fed in a loop, failures never fatal, shutdown drains."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno as E
import ipaddress
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nftblockd.addr import host_net4
from nftblockd.allowlist import build_allowlist
from nftblockd.config import parse_config
from nftblockd.detect.tracker import JailPolicy, Kind, Tracker
from nftblockd.events import Ban, Hit
from nftblockd.kernel.ruleset import plan_ruleset
from nftblockd.kernel.sink import JailBanSink, host_keys, split_bans
from nftblockd.state.change import StateChange
from tests.helpers.fakekernel import FakeSetWriter, running_enforcer

T0 = 1_900_000_000.0
CONFIG = "blocklists: {default: {}, long: {}}\nallowlist: [10.0.0.0/8]\nallowlist_self: false\n"


class Rig:
    def __init__(self, sink: JailBanSink, tracker: Tracker, fake: FakeSetWriter) -> None:
        self.sink, self.tracker, self.fake = sink, tracker, fake

    def fail(self, host: str, **kw: Any) -> list[Ban]:
        """One failure from `host` in sshd (maxretry 1): the bans the tracker decides."""
        out = self.tracker.observe(Hit("sshd", ipaddress.ip_address(host), T0, ""), T0, **kw)
        return [out.ban] if out.kind is Kind.BANNED and out.ban is not None else []


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    cfg = parse_config(CONFIG)
    fake = FakeSetWriter(plan_ruleset(cfg), clock=lambda: T0)
    allow = build_allowlist(cfg.allowlist, include_self=False)
    tracker = Tracker([JailPolicy("sshd", maxretry=1, bantime=3600.0, blocklist="default"),
                       JailPolicy("sshd6", maxretry=1, bantime=3600.0, blocklist="default", ipv6_prefix=64),
                       JailPolicy("recidive", recidive=True, maxretry=2, findtime=86400.0, bantime=86400.0,
                                  blocklist="long")], allow)
    async with running_enforcer(cfg, fake, allow=allow) as enforcer:
        yield Rig(JailBanSink(enforcer, tracker, max_batches=4, clock=lambda: T0), tracker, fake)


async def run_sink(rig: Rig, *batches: list[Ban]) -> None:
    task = asyncio.create_task(rig.sink.run())
    for bans in batches:
        await rig.sink.submit(bans, [], 0.0)
    await rig.sink.close()
    await asyncio.wait_for(task, 10)  # a bound, not a pace: run() returns once it reaches the end marker


def k(addr: str) -> int:
    return int(ipaddress.ip_address(addr))


async def test_one_ban_and_a_burst_take_the_same_single_transaction_path(rig: Rig) -> None:
    one = rig.fail("192.0.2.1")
    burst = [b for i in range(2, 200) for b in rig.fail(f"192.0.2.{i}")]
    await run_sink(rig, one)
    await run_sink(rig, burst)
    assert len(rig.fake.transactions) == 2  # one kernel transaction per batch, whatever its size
    assert len(rig.fake.elements("default_ip4")) == 199
    assert rig.sink.stats.applied == 199 and rig.sink.stats.batches == 2


async def test_ranges_go_to_the_interval_set(rig: Rig) -> None:
    bans = [b for b in [rig.tracker.observe(Hit("sshd6", ipaddress.ip_address("2001:db8:1:2::5"), T0, ""),
                                            T0).ban] if b is not None]
    assert bans and bans[0].target.prefixlen == 64
    await run_sink(rig, bans)
    assert len(rig.fake.elements("default_net6")) == 1


async def test_a_ban_the_kernel_refuses_is_forgotten_so_the_next_failure_bans_again(rig: Rig) -> None:
    rig.fake.fail[("default_ip4", k("192.0.2.7"))] = E.ENOMEM
    await run_sink(rig, rig.fail("192.0.2.7"))
    assert rig.fake.elements("default_ip4") == set()
    assert rig.sink.stats.refused == 1
    del rig.fake.fail[("default_ip4", k("192.0.2.7"))]
    again = rig.fail("192.0.2.7")
    assert again, "the tracker still believed the address was banned"
    await run_sink(rig, again)
    assert rig.fake.elements("default_ip4") == {k("192.0.2.7")}


async def test_applied_bans_feed_recidive_whose_bans_are_applied_too(rig: Rig) -> None:
    await run_sink(rig, rig.fail("192.0.2.9"))
    rig.tracker.forget_ban(ipaddress.ip_network("192.0.2.9/32"), jail="sshd")  # e.g. a manual unban
    await run_sink(rig, rig.fail("192.0.2.9"))
    assert rig.fake.elements("long_ip4") == {k("192.0.2.9")}  # second sshd ban -> recidive


async def test_a_failing_batch_is_logged_forgotten_and_the_sink_goes_on(rig: Rig,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    real = rig.sink.enforcer.ban_hosts

    async def flaky(*a: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("netlink socket lost")
        return await real(*a, **kw)

    monkeypatch.setattr(rig.sink.enforcer, "ban_hosts", flaky)
    first = rig.fail("192.0.2.20")
    second = rig.fail("192.0.2.21")
    await run_sink(rig, first)
    await run_sink(rig, second)
    assert rig.sink.stats.errors == 1
    assert rig.fake.elements("default_ip4") == {k("192.0.2.21")}
    assert rig.fail("192.0.2.20"), "the failed batch's ban must be forgotten by the tracker"


async def test_batches_queued_meanwhile_are_applied_together(rig: Rig) -> None:
    # A steady stream of one-offender batches (one log write each), decided moments apart so every ban has
    # its own end: what queued while the sink was busy is merged and its groups reach the enforcer at once,
    # so the batcher makes one transaction of them instead of one per batch (1,000 bans/s fell behind).
    sink = JailBanSink(rig.sink.enforcer, rig.tracker, max_batches=64, clock=lambda: T0)
    bans = [dataclasses.replace(b, until=T0 + 3600 + i) for i in range(50) for b in rig.fail(f"192.0.2.{100 + i}")]
    for b in bans:
        await sink.submit([b], [], 0.0)
    await sink.close()
    await asyncio.wait_for(sink.run(), 10)
    assert rig.fake.elements("default_ip4") == {k(f"192.0.2.{100 + i}") for i in range(50)}
    assert sink.stats.batches == 50 and sink.stats.applied == 50
    assert len(rig.fake.transactions) <= 2  # the batcher may flush the first group alone (it found it idle)


async def test_submit_nowait_refuses_when_the_queue_is_full(rig: Rig) -> None:
    for i in range(4):
        assert rig.sink.submit_nowait(rig.fail(f"192.0.2.{30 + i}"), [], 0.0)
    assert not rig.sink.submit_nowait(rig.fail("192.0.2.40"), [], 0.0)
    assert rig.sink.pending() == 4


class GatedStore:
    """A persist callable whose writes wait for `gate`: what it was asked to save, and what it has saved."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.queued: list[StateChange] = []
        self.saved: list[StateChange] = []

    async def __call__(self, change: StateChange) -> None:
        self.queued.append(change)
        await self.gate.wait()
        self.saved.append(change)


def saved_hosts(changes: list[StateChange]) -> int:
    return sum(len(p[1]) for c in changes for p in c.packed_saves)


@contextlib.asynccontextmanager
async def gated_rig() -> AsyncIterator[tuple[Rig, GatedStore]]:
    """A sink (sshd, maxretry 1) on the fake kernel whose saves wait for the store's gate."""
    cfg = parse_config(CONFIG)
    fake = FakeSetWriter(plan_ruleset(cfg), clock=lambda: T0)
    store = GatedStore()
    tracker = Tracker([JailPolicy("sshd", maxretry=1, bantime=3600.0, blocklist="default")],
                      build_allowlist(cfg.allowlist, include_self=False))
    async with running_enforcer(cfg, fake, persist=store) as enforcer:
        yield Rig(JailBanSink(enforcer, tracker, clock=lambda: T0), tracker, fake), store


async def test_the_next_batch_reaches_the_kernel_while_the_last_one_is_saved() -> None:
    # the commit of batch N overlaps the kernel work of batch N+1; every save is still made, and run()
    # returns only once they are (the daemon flushes the persister after the sink has drained)
    async with gated_rig() as (rig, store):
        run = asyncio.create_task(rig.sink.run())
        await rig.sink.submit(rig.fail("192.0.2.50"), [], 0.0)
        await wait_until(lambda: len(store.queued) == 1)
        await rig.sink.submit(rig.fail("192.0.2.51"), [], 0.0)
        await wait_until(lambda: k("192.0.2.51") in rig.fake.elements("default_ip4"))
        assert store.saved == []  # batch 2 is in the kernel though batch 1's save has not been written
        await rig.sink.close()
        await asyncio.sleep(0)
        assert not run.done()  # run() waits for the saves it started
        store.gate.set()
        await asyncio.wait_for(run, 10)
        assert saved_hosts(store.saved) == 2


async def test_apply_on_its_own_returns_once_saved() -> None:
    async with gated_rig() as (rig, store):
        applying = asyncio.create_task(rig.sink.apply(rig.fail("192.0.2.60"), [], 0.0))
        await wait_until(lambda: len(store.queued) == 1)
        assert not applying.done()
        store.gate.set()
        await asyncio.wait_for(applying, 10)
        assert saved_hosts(store.saved) == 1


async def wait_until(cond: Callable[[], bool], limit: float = 5.0) -> None:
    """Poll `cond` with a bound (no fixed sleeps)."""
    deadline = asyncio.get_running_loop().time() + limit
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.001)


async def test_applied_and_refused_are_counted_per_jail(rig: Rig) -> None:
    """Counted per group at once (not ban by ban): refused bans are left out, ranges counted one by one."""
    bans = [b for i in range(1, 4) for b in rig.fail(f"192.0.2.{i}")]
    bans += [b for b in [rig.tracker.observe(Hit("sshd6", ipaddress.ip_address("2001:db8:1:2::5"), T0, ""),
                                             T0).ban] if b is not None]
    bans.append(Ban(ipaddress.ip_network("10.1.2.3/32"), "default", T0 + 3600, "jail", bans[0].reason, "sshd"))
    await run_sink(rig, bans)  # the enforcer's allowlist refuses 10.1.2.3
    assert rig.sink.stats.applied_by_jail == {"sshd": 3, "sshd6": 1}
    assert rig.sink.stats.refused_by_jail == {"sshd": 1}
    assert rig.sink.stats.applied == 4 and rig.sink.stats.refused == 1


async def test_a_group_with_nothing_applied_is_not_counted(rig: Rig) -> None:
    bans = [Ban(ipaddress.ip_network("10.1.2.3/32"), "default", T0 + 3600, "jail", "x", "sshd")]
    await run_sink(rig, bans)
    assert rig.sink.stats.applied_by_jail == {} and rig.sink.stats.refused_by_jail == {"sshd": 1}


# -- split_bans / host_keys: the per-ban grouping held to the plain loop over ipaddress's properties --------

def _plain_split(bans: list[Ban]) -> tuple[dict[Any, dict[int, list[Ban]]], list[Ban]]:
    groups: dict[Any, dict[int, list[Ban]]] = {}
    ranges: list[Ban] = []
    for b in bans:
        t = b.target
        if t.prefixlen == t.max_prefixlen:
            groups.setdefault((b.blocklist, b.until, b.origin, b.reason, b.jail), {}).setdefault(
                t.version, []).append(b)
        else:
            ranges.append(b)
    return groups, ranges


_targets = st.one_of(
    st.builds(lambda i, p: ipaddress.IPv4Network((i, p), strict=False), st.integers(0, 2**32 - 1),
              st.sampled_from([32, 32, 24, 0])),
    st.builds(lambda i: host_net4(i), st.integers(0, 2**32 - 1)),
    st.builds(lambda i, p: ipaddress.IPv6Network((i, p), strict=False), st.integers(0, 2**128 - 1),
              st.sampled_from([128, 128, 64, 0])),
)
_bans = st.lists(st.builds(lambda t, bl, u, j: Ban(t, bl, u, "jail", f"3 failures ({j})", j), _targets,
                           st.sampled_from(["default", "long"]), st.sampled_from([None, T0, T0 + 60]),
                           st.sampled_from(["sshd", "web"])), max_size=30)


@given(_bans)
def test_split_bans_is_the_plain_grouping(bans: list[Ban]) -> None:
    groups, ranges = split_bans(bans)
    plain_groups, plain_ranges = _plain_split(bans)
    assert ranges == plain_ranges
    assert list(groups) == list(plain_groups)  # the same groups in the same order ...
    assert [list(g.items()) for g in groups.values()] == [list(g.items()) for g in plain_groups.values()]
    for by_version in groups.values():  # ... and their keys are the addresses' values
        assert host_keys(by_version) == {v: [int(b.target.network_address) for b in bs]
                                         for v, bs in by_version.items()}
