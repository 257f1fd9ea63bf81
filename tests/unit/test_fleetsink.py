"""The enforcer's fleet sink (kernel/fleetsink.py) on the in-memory SetWriter: one kernel transaction per
change, the later end wins, a longer local ban stays, unbans remove fleet elements and only older local bans,
fleet bans are saved with their origin host, and `fleet_view` splits fleet from local elements."""

from __future__ import annotations

import asyncio
import errno as E
import ipaddress
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.addr import IPNet, format_host
from nftblockd.config import parse_config
from nftblockd.events import Ban, FleetBan, FleetChange, FleetHosts, FleetUnban, fleet_origin_host
from nftblockd.kernel.bans import OpSpec
from nftblockd.kernel.enforcer import Enforcer
from nftblockd.kernel.fleetsink import EnforcerFleetSink, _packed, _specs
from nftblockd.kernel.ruleset import plan_ruleset
from nftblockd.state.change import StateChange
from nftblockd.state.store import unpack_ends
from tests.helpers.fakekernel import FakeSetWriter, running_enforcer

T0 = 1_900_000_000.0
CONFIG = "blocklists: {default: {}, other: {}}\nallowlist: [10.0.0.0/8]\nallowlist_self: false\n"


def net(text: str) -> IPNet:
    return ipaddress.ip_network(text)


@dataclass
class Rig:
    enforcer: Enforcer
    sink: EnforcerFleetSink
    fake: FakeSetWriter
    saved: list[StateChange]

    def kernel(self, set_name: str = "default_ip4") -> dict[int, int | None]:
        return {k: e.until_ms for k, e in self.fake.sets[set_name].items()}


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    cfg = parse_config(CONFIG)
    fake = FakeSetWriter(plan_ruleset(cfg), clock=lambda: T0)
    saved: list[StateChange] = []

    def persist(change: StateChange) -> asyncio.Future[None]:
        # as the daemon's `Persister.submit`: queued (here: saved) when called, the future for the write
        saved.append(change)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async with running_enforcer(cfg, fake, persist=persist) as enforcer:
        yield Rig(enforcer, EnforcerFleetSink(enforcer, "default", started=T0 - 100, clock=lambda: T0), fake, saved)


def key(text: str) -> int:
    return int(ipaddress.ip_address(text))


async def test_a_change_is_one_transaction_with_the_origin_host(rig: Rig) -> None:
    before = len(rig.fake.transactions)
    await rig.sink.apply_fleet(FleetChange(tuple(FleetBan(net(f"203.0.113.{i}"), T0 + 60, "web-02")
                                                 for i in range(1, 51))))
    assert len(rig.fake.transactions) == before + 1
    assert len(rig.kernel()) == 50
    elem = rig.fake.sets["default_ip4"][key("203.0.113.7")]
    assert elem.comment == "" and elem.until_ms == int((T0 + 60) * 1000)  # single addresses: the fast path
    info = rig.enforcer.state.covering(net("203.0.113.7"))[0]
    assert (info.origin, fleet_origin_host(info.origin, info.reason)) == ("remote", "web-02")
    # saved with origin and host, so a restart restores them as fleet bans
    # single addresses: one packed row per (end, origin host), as the jail sink saves a burst
    assert len(rig.saved) == 1
    [(blocklist, packed, until, origin, reason, jail)] = rig.saved[0].packed_saves
    assert (blocklist, until, origin, reason, jail, len(packed)) == ("default", T0 + 60, "remote", "fleet:web-02",
                                                                    "", 50)
    await rig.sink.apply_fleet(FleetChange((FleetBan(net("198.51.100.0/24"), T0 + 60, "web-03"),)))
    assert [(b.target, b.origin, b.reason) for b in rig.saved[1].saves] == [
        (net("198.51.100.0/24"), "remote", "fleet:web-03")]


async def test_apply_returns_once_the_kernel_has_it_and_settled_waits_for_the_save() -> None:
    """The receive loop's next batch does not wait for this one's database commit; the service's cursor does
    (`settled`), so the cursor never runs ahead of the saved bans."""
    cfg = parse_config(CONFIG)
    fake = FakeSetWriter(plan_ruleset(cfg), clock=lambda: T0)
    writes: list[tuple[StateChange, asyncio.Future[None]]] = []

    def persist(change: StateChange) -> asyncio.Future[None]:
        fut = asyncio.get_running_loop().create_future()
        writes.append((change, fut))
        return fut

    async with running_enforcer(cfg, fake, persist=persist) as enforcer:
        sink = EnforcerFleetSink(enforcer, "default", started=T0 - 100, clock=lambda: T0)
        await sink.apply_fleet(FleetChange((FleetBan(net("203.0.113.1"), T0 + 60, "b"),)))
        await sink.apply_fleet(FleetChange((FleetBan(net("203.0.113.2"), T0 + 60, "b"),)))
        assert len(rig_kernel(fake)) == 2 and len(writes) == 2  # both in the kernel, both writes queued in order
        waiter = asyncio.ensure_future(sink.settled())
        await asyncio.sleep(0)
        writes[0][1].set_result(None)
        await asyncio.sleep(0)
        assert not waiter.done()  # the second write is still out
        writes[1][1].set_result(None)
        await asyncio.wait_for(waiter, 5)
        await sink.settled()  # nothing left: returns at once


def rig_kernel(fake: FakeSetWriter) -> dict[int, int | None]:
    return {k: e.until_ms for k, e in fake.sets["default_ip4"].items()}


async def test_later_end_wins_and_a_longer_local_ban_stays(rig: Rig) -> None:
    await rig.enforcer.apply([Ban(net("203.0.113.1"), "default", T0 + 1000, "cli", "mine")], now=T0)
    await rig.enforcer.apply([Ban(net("203.0.113.2"), "default", T0 + 10, "cli", "mine")], now=T0)
    await rig.sink.apply_fleet(FleetChange((FleetBan(net("203.0.113.1"), T0 + 100, "b"),
                                            FleetBan(net("203.0.113.2"), T0 + 100, "b"))))
    one = rig.enforcer.state.covering(net("203.0.113.1"))[0]
    two = rig.enforcer.state.covering(net("203.0.113.2"))[0]
    assert (one.origin, one.until) == ("cli", T0 + 1000)  # the local ban lasts longer: untouched
    assert (two.origin, two.until) == ("remote", T0 + 100)  # extended by the fleet
    assert rig.kernel()[key("203.0.113.2")] == int((T0 + 100) * 1000)
    await rig.sink.apply_fleet(FleetChange((FleetBan(net("203.0.113.2"), T0 + 50, "c"),)))
    assert rig.enforcer.state.covering(net("203.0.113.2"))[0].until == T0 + 100  # an earlier end: no-op


async def test_unban_removes_fleet_elements_and_only_older_local_bans(rig: Rig) -> None:
    await rig.sink.apply_fleet(FleetChange((FleetBan(net("203.0.113.1"), T0 + 100, "b"),)))
    await rig.enforcer.apply([Ban(net("203.0.113.2"), "default", T0 + 100, "cli")], now=T0)
    rig.sink.note_local([net("203.0.113.2")], T0)  # made at T0
    await rig.enforcer.apply([Ban(net("203.0.113.3"), "default", T0 + 100, "cli")], now=T0)  # restored: start
    await rig.sink.apply_fleet(FleetChange(unbans=(FleetUnban(net("203.0.113.1"), None),
                                                   FleetUnban(net("203.0.113.2"), T0 - 1),
                                                   FleetUnban(net("203.0.113.3"), T0 - 200))))
    assert key("203.0.113.1") not in rig.kernel()
    assert key("203.0.113.2") in rig.kernel()  # made after the unban
    assert key("203.0.113.3") in rig.kernel()  # made at the latest at the start, after the unban
    await rig.sink.apply_fleet(FleetChange(unbans=(FleetUnban(net("203.0.113.2"), T0 + 1),
                                                   FleetUnban(net("203.0.113.3"), T0 - 50))))
    assert key("203.0.113.2") not in rig.kernel() and key("203.0.113.3") not in rig.kernel()
    assert rig.saved[-1].deletes == [("default", net("203.0.113.2")), ("default", net("203.0.113.3"))]


async def test_allowlist_and_never_ban_are_refused_again(rig: Rig) -> None:
    await rig.sink.apply_fleet(FleetChange((FleetBan(net("10.1.2.3"), T0 + 60, "b"),
                                            FleetBan(net("127.0.0.1"), T0 + 60, "b"),
                                            FleetBan(net("203.0.113.9"), T0 + 60, "b"))))
    assert set(rig.kernel()) == {key("203.0.113.9")}
    assert rig.sink.refused == 2 and rig.sink.applied == 1


async def test_kernel_refusal_is_forgotten(rig: Rig) -> None:
    rig.fake.fail[("default_ip4", key("203.0.113.5"))] = E.ENFILE
    await rig.sink.apply_fleet(FleetChange((FleetBan(net("203.0.113.5"), T0 + 60, "b"),
                                            FleetBan(net("203.0.113.6"), T0 + 60, "b"))))
    assert not rig.enforcer.state.covering(net("203.0.113.5"))
    assert rig.sink.applied == 1 and rig.sink.refused == 1
    assert rig.saved[-1].packed_saves[0][1] == [ipaddress.ip_address("203.0.113.6").packed]
    # counted as on every other path to the kernel (Enforcer.write_sets settles it)
    assert rig.enforcer.counters.kernel_errors == {E.ENFILE: 1} and rig.enforcer.counters.set_full == 1


async def test_ranges_and_permanent(rig: Rig) -> None:
    await rig.sink.apply_fleet(FleetChange((FleetBan(net("198.51.100.0/24"), math.inf, "b"),)))
    info = rig.enforcer.state.covering(net("198.51.100.7"))[0]
    assert info.until is None and info.origin == "remote"


async def test_fleet_view_splits_fleet_and_local(rig: Rig) -> None:
    await rig.sink.apply_fleet(FleetChange((FleetBan(net("203.0.113.1"), T0 + 100, "b"),)))
    await rig.enforcer.apply([Ban(net("203.0.113.2"), "default", None, "jail", "", "sshd")], now=T0)
    await rig.enforcer.apply([Ban(net("203.0.113.3"), "other", T0 + 100, "cli")], now=T0)  # not the fleet's
    rig.sink.note_local([net("203.0.113.2")], T0 - 5)
    fleet, local = await rig.sink.fleet_view()
    assert fleet == {net("203.0.113.1"): T0 + 100}
    assert set(local) == {net("203.0.113.2")}
    assert local[net("203.0.113.2")].until == math.inf and local[net("203.0.113.2")].created == T0 - 5


async def test_note_local_is_bounded_by_the_state(rig: Rig) -> None:
    rig.sink.note_local([net(f"203.0.{i // 250}.{i % 250 + 1}") for i in range(12_000)], T0)
    assert len(rig.sink._created) <= 10_001  # none of them is held: dropped once the map outgrew the state


async def test_removed_targets_are_reported(rig: Rig) -> None:
    removed: list[IPNet] = []
    rig.sink.on_removed = removed.extend
    await rig.sink.apply_fleet(FleetChange((FleetBan(net("203.0.113.1"), T0 + 100, "b"),)))
    await rig.sink.apply_fleet(FleetChange(unbans=(FleetUnban(net("203.0.113.1"), None),
                                                   FleetUnban(net("203.0.113.2"), None))))
    assert removed == [net("203.0.113.1")]


async def test_host_keys_are_applied_as_the_same_bans_would_be(rig: Rig) -> None:
    """`FleetChange.hosts` (the receive loop's batch form) does what the equivalent `FleetBan`s do: one
    transaction, the later end per address, the allowlist and never-ban space refused again, one packed row."""
    await rig.sink.apply_fleet(FleetChange((FleetBan(net("203.0.113.1"), T0 + 600, "web-01"),)))
    keys = (key("203.0.113.1"), key("203.0.113.2"), key("10.1.2.3"), key("127.0.0.1"))
    before = len(rig.fake.transactions)
    await rig.sink.apply_fleet(FleetChange(hosts=(FleetHosts(4, "web-02", keys, (T0 + 60,) * len(keys)),
                                                  FleetHosts(6, "web-02", (key("2001:db8::1"),), (math.inf,)))))
    assert len(rig.fake.transactions) == before + 1
    assert rig.kernel() == {key("203.0.113.1"): int((T0 + 600) * 1000), key("203.0.113.2"): int((T0 + 60) * 1000)}
    assert list(rig.kernel("default_ip6")) == [key("2001:db8::1")]
    assert rig.sink.refused == 2  # 10.1.2.3 (allowlisted) and 127.0.0.1 (never banned)
    info = rig.enforcer.state.covering(net("203.0.113.2"))[0]
    assert fleet_origin_host(info.origin, info.reason) == "web-02"
    assert [(p[2], len(p[1])) for p in rig.saved[-1].packed_saves] == [(T0 + 60, 1), (None, 1)]


def test_the_nth_applied_fleet_ban_is_found_across_ranges_and_host_groups() -> None:
    from nftblockd.events import Ban
    from nftblockd.kernel.fleetsink import _nth_ban

    rng = Ban(ipaddress.ip_network("10.1.0.0/16"), "default", 50.0, "remote", "fleet:a")
    hosts: list[tuple[str, int, list[int], list[float | None], str, str]] = [
        ("default_ip4", 4, [0x0A000001, 0x0A000002], [100.0, 101.5], "fleet:b", "timed"),
        ("default_ip6", 6, [1], [None], "fleet:c", "shared")]
    nth = _nth_ban([(rng, ())], hosts)
    assert [nth(i) for i in range(4)] == [("10.1.0.0/16", 50.0, "fleet:a"), ("10.0.0.1", 100.0, "fleet:b"),
                                          ("10.0.0.2", 101.5, "fleet:b"), ("::1", None, "fleet:c")]


def test_extended_hosts_are_a_row_each_never_a_bulk_row() -> None:
    # an extended address has an older row of the same label, which would win over a bulk row at a restart
    # and bring back the shorter ban; many sharing one end must still be a row each
    from nftblockd.kernel.fleetsink import _packed
    from nftblockd.state.store import BULK_ROWS, _rows_or_bulk

    keys = list(range(1, BULK_ROWS + 2))
    got, timed = _packed("default", [("default_ip4", 4, keys, [50.0] * len(keys), "fleet:a", "extended")])
    assert timed == [] and len(got) == len(keys) and all(len(p[1]) == 1 and p[2] == 50.0 for p in got)
    rows, bulk = _rows_or_bulk(got)
    assert bulk == [] and len(rows) == len(keys)
    shared, _ = _packed("default", [("default_ip4", 4, keys, [50.0] * len(keys), "fleet:a", "shared")])
    assert _rows_or_bulk(shared)[1] != []  # new ones of one end: one bulk row, as before


def test_packed_rows_are_pack_hosts_per_version_end_and_reason() -> None:
    from nftblockd.addr import pack_hosts
    from nftblockd.kernel.fleetsink import _packed

    hosts: list[tuple[str, int, list[int], list[float | None], str, str]] = [
        ("default_ip4", 4, [1, 2, 3, 4], [10.0, None, 10.0, 11.5], "fleet:a", "shared"),
        ("default_ip6", 6, [5, 6], [10.0, 10.0], "fleet:a", "shared"),
        ("default_ip4", 4, [7, 8], [10.0, 10.0], "fleet:b", "shared")]
    want = {(v, u, r): pack_hosts([k for k, x in zip(keys, untils, strict=True) if x == u], v)
            for _n, v, keys, untils, r, _new in hosts for u in untils}
    got, timed = _packed("default", hosts)
    assert timed == []
    assert [(p[0], p[3], p[5]) for p in got] == [("default", "remote", "")] * len(want)
    assert sorted((p[2] or 0.0, p[4], p[1]) for p in got) == sorted((u or 0.0, r, b) for (_v, u, r), b in want.items())


async def _kernel_after(changes: list[FleetChange], held: list[tuple[int, float]]) -> tuple[Any, ...]:
    cfg = parse_config(CONFIG)
    fake = FakeSetWriter(plan_ruleset(cfg), clock=lambda: T0)
    async with running_enforcer(cfg, fake) as enforcer:
        sink = EnforcerFleetSink(enforcer, "default", started=T0 - 100, clock=lambda: T0)
        if held:
            await sink.apply_fleet(FleetChange(hosts=tuple(FleetHosts(4, "web-00", (k,), (e,)) for k, e in held)))
        for ch in changes:
            await sink.apply_fleet(ch)
        state = {(n, k): (u, o) for n, k, _net, u, o in enforcer.state.iter_origins("default")}
        reasons = {k: enforcer.state.covering(ipaddress.ip_network(k))[0].reason
                   for k in (format_host(k, 4) for _n, k in state)}
        return {n: {k: e.until_ms for k, e in s.items()} for n, s in fake.sets.items()}, state, reasons, \
            sink.applied, sink.refused


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([key("203.0.113.1"), key("203.0.113.2"), key("198.51.100.9"),
                                           key("10.1.2.3"), key("127.0.0.1")]),
                          st.sampled_from([T0 - 1, T0 + 60, T0 + 60.25, T0 + 600, T0 + 7200, math.inf]),
                          st.sampled_from(["web-01", "web-02"])), max_size=12),
       st.lists(st.tuples(st.sampled_from([key("203.0.113.1"), key("198.51.100.9")]),
                          st.sampled_from([T0 + 60, T0 + 600])), max_size=2))
def test_host_keys_with_their_own_ends_do_what_one_change_per_ban_does(
        bans: list[tuple[int, float, str]], held: list[tuple[int, float]]) -> None:
    """Many addresses with distinct ends in one change (`ban_hosts_each`, one kernel group) against one change
    per ban (each a one-address group, the form a read of distinct ends took before): the same kernel, state,
    origins and counts. One ban per address, as the receive loop sends (the last of a read wins)."""
    last = {k: (e, o) for k, e, o in bans}
    one = [FleetChange(hosts=(FleetHosts(4, o, (k,), (e,)),)) for k, (e, o) in last.items()]
    by_origin: dict[str, list[tuple[int, float]]] = {}
    for k, (e, o) in last.items():
        by_origin.setdefault(o, []).append((k, e))
    many = [FleetChange(hosts=tuple(FleetHosts(4, o, tuple(k for k, _ in kes), tuple(e for _, e in kes))
                                    for o, kes in by_origin.items()))]
    want = asyncio.run(_kernel_after(one, held))
    assert asyncio.run(_kernel_after(many, held)) == want
    # the same with the ends in ms made beforehand (the receive loop's decoder), where none is permanent
    with_ms = [FleetChange(hosts=tuple(FleetHosts(h.version, h.origin, h.keys, h.ends, None if math.inf in h.ends
                                                  else tuple(int(e * 1000) for e in h.ends))
                                       for h in ch.hosts)) for ch in many]
    assert asyncio.run(_kernel_after(with_ms, held)) == want


@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.sampled_from([None, 1e9, 1e9 + 0.5, 2e9])
                          | st.integers(10**9, 2 * 10**9).map(float)), max_size=40), st.booleans())
def test_specs_and_rows_of_host_groups_are_one_per_end(bans: list[tuple[int, float | None]], existed: bool) -> None:
    """`_specs` and `_packed` (every end its own: a column at a time) against their plain meaning: one op spec
    per key with its end in ms, one database row per (version, end, reason) holding the keys of that end; keys
    new to the state as one `TimedBans`, its keys and ends in order."""
    keys, untils = [k for k, _u in bans], [u for _k, u in bans]
    specs = _specs(untils, existed)
    assert specs == [OpSpec(True, None if u is None else int(u * 1000), "", existed) for u in untils]
    assert len({id(s) for s in specs}) == len(set(specs))  # keys of one end share one spec (the writer's count)
    rows, timed = _packed("bl", [("bl_ip4", 4, keys, untils, "fleet:h1", "shared")])
    assert timed == []
    rows6, timed6 = _packed("bl", [("bl_ip6", 6, keys, untils, "fleet:h2", "timed")])
    assert rows6 == [] and len(timed6) == (1 if keys else 0)
    for t in timed6:
        assert (t.blocklist, t.keylen, t.origin, t.reason, t.jail) == ("bl", 16, "remote", "fleet:h2", "")
        assert t.keys == b"".join(k.to_bytes(16, "big") for k in keys) and unpack_ends(t.ends) == untils
    want: dict[float | None, list[bytes]] = {}
    for k, u in bans:
        want.setdefault(u, []).append(k.to_bytes(4, "big"))
    assert sorted(rows, key=repr) == sorted([("bl", p, u, "remote", "fleet:h1", "") for u, p in want.items()], key=repr)


async def test_new_keys_with_their_own_ends_are_saved_as_one_timed_row_extended_ones_as_rows(rig: Rig) -> None:
    """A catch-up's jail bans (every end its own, none held yet) go to the database as one `TimedBans` (one bulk
    row); a key the state held already keeps its row (a row wins over a bulk row at a restart)."""
    keys = (key("203.0.113.1"), key("203.0.113.2"), key("203.0.113.3"))
    ends = (T0 + 60, T0 + 61, T0 + 62)
    await rig.sink.apply_fleet(FleetChange(hosts=(FleetHosts(4, "web-02", keys, ends),)))
    [t] = rig.saved[-1].timed_saves
    assert rig.saved[-1].packed_saves == []
    assert (t.blocklist, t.keylen, t.keys, t.origin, t.reason) == ("default", 4, b"".join(k.to_bytes(4, "big")
                                                                                         for k in keys),
                                                                   "remote", "fleet:web-02")
    assert unpack_ends(t.ends) == list(ends)
    await rig.sink.apply_fleet(FleetChange(hosts=(FleetHosts(4, "web-02", (*keys[:2], key("203.0.113.9")),
                                                             (T0 + 600, T0 + 1, T0 + 70)),)))
    [t] = rig.saved[-1].timed_saves  # the new one
    assert t.keys == key("203.0.113.9").to_bytes(4, "big") and unpack_ends(t.ends) == [T0 + 70]
    assert rig.saved[-1].packed_saves == [("default", [key("203.0.113.1").to_bytes(4, "big")], T0 + 600, "remote",
                                           "fleet:web-02", "")]  # extended; .2 stays as it was
    assert rig.kernel()[key("203.0.113.1")] == int((T0 + 600) * 1000)


async def test_a_hosts_unban_lifts_only_the_fleet_bans_that_host_made(rig: Rig) -> None:
    """Schema 2 (issue #34 item 2): C's unbans of A's bans, or of this host's own, lift nothing; A's lift A's."""
    await rig.sink.apply_fleet(FleetChange((FleetBan(net("203.0.113.1"), T0 + 100, "a"),
                                            FleetBan(net("203.0.113.2"), T0 + 100, "c"))))
    await rig.enforcer.apply([Ban(net("203.0.113.3"), "default", T0 + 100, "cli")], now=T0)
    rig.sink.note_local([net("203.0.113.3")], T0)
    forged = tuple(FleetUnban(net(f"203.0.113.{i}"), T0 + 10, "c") for i in (1, 3))
    await rig.sink.apply_fleet(FleetChange(unbans=forged))
    assert {key("203.0.113.1"), key("203.0.113.3")} <= set(rig.kernel())  # A's, and this host's own
    await rig.sink.apply_fleet(FleetChange(unbans=(FleetUnban(net("203.0.113.2"), T0 + 10, "c"),
                                                   FleetUnban(net("203.0.113.1"), T0 + 10, "a"))))
    assert key("203.0.113.1") not in rig.kernel() and key("203.0.113.2") not in rig.kernel()
    await rig.sink.apply_fleet(FleetChange(unbans=(FleetUnban(net("203.0.113.3"), T0 + 10),)))  # the operator's
    assert key("203.0.113.3") not in rig.kernel()
