"""The enforcer against an in-memory SetWriter: decisions in, set operations out, failures reported per
element, the kernel kept true to the state (rebuild, reconcile). No root, no kernel."""

from __future__ import annotations

import errno as E
import ipaddress
from collections.abc import AsyncIterator

import pytest

from nftblockd.addr import IPNet, parse_target
from nftblockd.allowlist import build_allowlist
from nftblockd.config import parse_config
from nftblockd.events import Ban, Unban
from nftblockd.kernel.bans import BanOutcome
from nftblockd.kernel.enforcer import Enforcer
from nftblockd.kernel.ruleset import plan_ruleset
from nftblockd.state.change import PackedBans, StateChange
from tests.helpers.fakekernel import Element, FakeSetWriter, running_enforcer

CONFIG = """
blocklists:
  default: {timeout: 1h}
  small: {timeout: 10m, size: 2}
allowlist: [10.0.0.0/8]
allowlist_self: false
"""


class Saved:
    """The persist callback: what the enforcer asked to be written before acknowledging."""

    def __init__(self) -> None:
        self.saves: list[Ban] = []
        self.deletes: list[tuple[str, IPNet]] = []
        self.packed: list[PackedBans] = []
        self.packed_deletes: list[tuple[str, list[bytes]]] = []

    async def __call__(self, change: StateChange) -> None:
        self.saves += change.saves
        self.deletes += change.deletes
        self.packed += change.packed_saves
        self.packed_deletes += change.packed_deletes


class Rig:
    def __init__(self, enforcer: Enforcer, fake: FakeSetWriter, saved: Saved) -> None:
        self.enforcer, self.fake, self.saved = enforcer, fake, saved


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    cfg = parse_config(CONFIG)
    fake = FakeSetWriter(plan_ruleset(cfg))
    saved = Saved()
    async with running_enforcer(cfg, fake, persist=saved) as enforcer:
        yield Rig(enforcer, fake, saved)


def key(addr: str) -> int:
    return int(ipaddress.ip_address(addr))


def ban(target: str, until: float | None, blocklist: str = "default") -> Ban:
    return Ban(parse_target(target), blocklist, until, "cli", "test")


async def test_start_installs_the_table_with_the_allowlist(rig: Rig) -> None:
    assert rig.fake.setups == 1
    assert [str(n) for n in rig.fake.allowlist] == ["10.0.0.0/8"]
    assert rig.enforcer.features is not None and rig.enforcer.features.owner


async def test_a_ban_lands_in_the_hash_set_with_its_end_and_is_saved(rig: Rig) -> None:
    [res] = await rig.enforcer.apply([ban("203.0.113.7", 2e9)], now=1.9e9)
    assert res.outcome is BanOutcome.ADDED and res.code is None and res.set_name == "default_ip4"
    elem = rig.fake.sets["default_ip4"][key("203.0.113.7")]
    assert elem.until_ms == 2_000_000_000_000
    assert [str(b.target) for b in rig.saved.saves] == ["203.0.113.7/32"]


async def test_a_range_goes_to_the_interval_set(rig: Rig) -> None:
    [res] = await rig.enforcer.apply([ban("198.18.0.0/15", None)])
    assert res.code is None and res.set_name == "default_net4"
    assert len(rig.fake.sets["default_net4"]) == 1


async def test_allowlisted_targets_never_reach_the_kernel(rig: Rig) -> None:
    [res] = await rig.enforcer.apply([ban("10.1.2.3", None)])
    assert res.code == "allowlisted" and "allowlisted" in res.message
    assert rig.fake.transactions == [] and rig.saved.saves == []
    assert rig.enforcer.counters.allowlisted == 1


async def test_an_element_the_kernel_refuses_is_reported_and_forgotten(rig: Rig) -> None:
    rig.fake.fail[("default_ip4", key("203.0.113.9"))] = E.EEXIST
    res = await rig.enforcer.apply([ban("203.0.113.9", None), ban("203.0.113.10", None)])
    assert res[0].code == "unavailable" and "overlaps" in res[0].message
    assert res[1].code is None  # one bad element never costs the others
    assert rig.fake.elements("default_ip4") == {key("203.0.113.10")}
    assert [str(b.target) for b in rig.saved.saves] == ["203.0.113.10/32"]
    # forgotten by the state: once the kernel takes it, the same ban is new again
    del rig.fake.fail[("default_ip4", key("203.0.113.9"))]
    [again] = await rig.enforcer.apply([ban("203.0.113.9", None)])
    assert again.outcome is BanOutcome.ADDED and again.code is None


async def test_a_full_set_says_so_and_is_counted(rig: Rig) -> None:
    res = await rig.enforcer.apply([ban(f"192.0.2.{i}", None, "small") for i in range(1, 4)])
    assert [r.code for r in res] == [None, None, "unavailable"]
    assert "is full (size 2)" in res[2].message
    assert rig.enforcer.counters.set_full == 1 and rig.enforcer.counters.kernel_errors == {E.ENFILE: 1}


async def test_unban_removes_the_element_and_the_saved_row(rig: Rig) -> None:
    await rig.enforcer.apply([ban("203.0.113.7", None)])
    [res] = await rig.enforcer.apply([Unban(parse_target("203.0.113.7"), "default", "cli", "")])
    assert res.outcome is BanOutcome.REMOVED
    assert rig.fake.elements("default_ip4") == set()
    assert [(b, str(n)) for b, n in rig.saved.deletes] == [("default", "203.0.113.7/32")]


async def test_a_wider_range_absorbs_narrower_ones_and_the_store_forgets_them(rig: Rig) -> None:
    await rig.enforcer.apply([ban("198.51.100.0/26", None), ban("198.51.100.64/26", None)])
    [res] = await rig.enforcer.apply([ban("198.51.100.0/24", None)])
    assert res.outcome is BanOutcome.ABSORBED
    assert len(rig.fake.sets["default_net4"]) == 1
    assert sorted(str(n) for _b, n in rig.saved.deletes) == ["198.51.100.0/26", "198.51.100.64/26"]


async def test_bulk_bans_skip_the_allowlist_and_report_refusals(rig: Rig) -> None:
    rig.fake.fail[("default_ip4", key("192.0.2.2"))] = E.ENOMEM
    keys = [key("192.0.2.1"), key("192.0.2.2"), key("10.9.9.9")]
    res = await rig.enforcer.ban_hosts("default", {4: keys}, None, origin="cli")
    assert res.allowlisted == {4: [key("10.9.9.9")]}
    assert set(res.failed) == {("default_ip4", key("192.0.2.2"))}
    assert rig.fake.elements("default_ip4") == {key("192.0.2.1")}
    # The save was queued before the kernel answered; what it refused is deleted again after it.
    [(blocklist, blobs, _until, _origin, _reason, _jail)] = rig.saved.packed
    assert blocklist == "default" and blobs == [ipaddress.IPv4Address(a).packed for a in ("192.0.2.1", "192.0.2.2")]
    assert rig.saved.packed_deletes == [("default", [ipaddress.IPv4Address("192.0.2.2").packed])]


async def test_a_bulk_ban_is_saved_while_the_kernel_commits_and_answered_after_both(rig: Rig) -> None:
    import asyncio

    seen: list[set[int]] = []
    written = asyncio.get_running_loop().create_future()

    def persist(change: StateChange) -> asyncio.Future[None]:  # as Persister.submit: queued when called
        seen.append(set(rig.fake.elements("default_ip4")))
        return written

    rig.enforcer.persist = persist
    task = asyncio.create_task(rig.enforcer.ban_hosts("default", {4: [key("192.0.2.1")]}, None))
    for _ in range(100_000):  # until the kernel thread has it (bounded loop turns, no clock)
        if rig.fake.elements("default_ip4"):
            break
        await asyncio.sleep(0)
    assert seen == [set()]  # queued before the kernel committed
    assert rig.fake.elements("default_ip4") == {key("192.0.2.1")}
    for _ in range(20):
        await asyncio.sleep(0)
    assert not task.done()  # committed, but not saved yet: no answer
    written.set_result(None)
    res = await task
    assert not res.failed


async def test_bulk_ban_into_an_unknown_blocklist_raises_key_error(rig: Rig) -> None:
    with pytest.raises(KeyError):
        await rig.enforcer.ban_hosts("nosuch", {4: [key("192.0.2.1")]}, None)


async def test_someone_deleting_a_set_is_noticed_and_every_ban_rebuilt(rig: Rig) -> None:
    await rig.enforcer.apply([ban("203.0.113.7", None), ban("2001:db8::7", None)])
    assert await rig.enforcer.check_kernel() == []  # our own commits explain every generation
    rig.fake.outside_change(drop_set="default_ip4")
    missing = await rig.enforcer.check_kernel()
    assert missing == ["set default_ip4"]
    assert rig.fake.setups == 2 and rig.enforcer.counters.rebuilds == 1
    assert rig.fake.elements("default_ip4") == {key("203.0.113.7")}
    assert rig.fake.elements("default_ip6") == {key("2001:db8::7")}


async def test_reconcile_repairs_a_set_whose_count_disagrees(rig: Rig) -> None:
    await rig.enforcer.apply([ban("203.0.113.7", None), ban("203.0.113.8", None)])
    del rig.fake.sets["default_ip4"][key("203.0.113.8")]  # an element lost behind our back
    assert await rig.enforcer.reconcile() == 1
    assert rig.fake.elements("default_ip4") == {key("203.0.113.7"), key("203.0.113.8")}
    assert rig.enforcer.counters.drift_repaired == 1
    assert await rig.enforcer.reconcile() == 0  # and a set that agrees is not touched


async def test_feed_sets_are_replaced_in_one_transaction(rig: Rig) -> None:
    await rig.enforcer.sync_sets({"default_ip4": [key("192.0.2.1"), key("192.0.2.2")]}, None, origin="feed")
    before = len(rig.fake.transactions)
    r = await rig.enforcer.sync_sets({"default_ip4": [key("192.0.2.2"), key("192.0.2.3")]}, None, origin="feed")
    assert (r.added, r.removed, r.failed) == (1, 1, 0)
    assert len(rig.fake.transactions) == before + 1
    assert rig.fake.elements("default_ip4") == {key("192.0.2.2"), key("192.0.2.3")}


async def test_reinstall_runs_setup_again_with_the_current_allowlist(rig: Rig) -> None:
    rig.enforcer.allow = build_allowlist([parse_target("192.168.0.0/16")], include_self=False)
    await rig.enforcer.reinstall()
    assert rig.fake.setups == 2 and [str(n) for n in rig.fake.allowlist] == ["192.168.0.0/16"]


async def test_reconcile_adopts_kernel_bans_the_state_lost_with_their_kernel_timeouts(rig: Rig) -> None:
    now = rig.fake.clock()
    await rig.enforcer.apply([ban("203.0.113.7", now + 3600), ban("198.18.0.0/15", None)], now=now)
    rig.saved.saves.clear()
    # the state forgets everything (a truncated database at the last restart, say); the kernel still has it
    rig.enforcer.state.sets["default_ip4"].entries.clear()
    rig.enforcer.state.forget("default_net4", next(iter(rig.enforcer.state.sets["default_net4"].entries)))
    assert await rig.enforcer.reconcile(now=now) == 2
    assert rig.fake.elements("default_ip4") == {key("203.0.113.7")}  # nothing was deleted
    assert len(rig.fake.sets["default_net4"]) == 1
    infos = {str(b.target): b for b in rig.enforcer.state.iter_bans()}
    assert infos["203.0.113.7/32"].origin == "kernel"
    assert infos["203.0.113.7/32"].until == pytest.approx(now + 3600, abs=1)  # the kernel's remaining time
    assert infos["198.18.0.0/15"].until is None
    assert sorted(str(b.target) for b in rig.saved.saves) == ["198.18.0.0/15", "203.0.113.7/32"]
    assert rig.enforcer.counters.adopted == 2


async def test_saved_bans_no_ban_may_cover_are_removed_not_restored(rig: Rig) -> None:
    # loose end of issue 13: a state database written before never-ban space or the allowlist said otherwise
    now = rig.fake.clock()
    keys = [key("0.0.0.0"), key("10.1.2.3"), key("203.0.113.1"), key("224.0.0.1")]
    end = int((now + 60) * 1000)  # ms
    r = await rig.enforcer.restore_hosts("default", 4, keys, [end, None, end, end], origin="jail", reason="r",
                                         jail="sshd")
    assert r is not None and r[1] == [key("203.0.113.1")]
    assert rig.fake.elements("default_ip4") == {key("203.0.113.1")}
    [(blocklist, gone)] = rig.saved.packed_deletes
    assert blocklist == "default" and sorted(gone) == sorted(k.to_bytes(4, "big") for k in keys if k != keys[2])
    # ranges take the one-by-one path: refused as any ban is, and deleted from the database too
    results = await rig.enforcer.restore_bans([ban("224.0.0.0/8", None), ban("10.9.0.0/16", now + 60),
                                               ban("198.51.100.0/24", now + 60)], now)
    assert [r.code for r in results] == ["never_ban", "allowlisted", None]
    assert sorted(str(t) for _b, t in rig.saved.deletes) == ["10.9.0.0/16", "224.0.0.0/8"]
    assert rig.saved.saves == []  # restoring saves nothing again
    assert rig.enforcer.counters.unbannable_removed == 5


async def test_reconcile_never_adopts_what_no_ban_may_cover(rig: Rig) -> None:
    from tests.helpers.fakekernel import Element

    now = rig.fake.clock()
    await rig.enforcer.apply([ban("203.0.113.7", now + 3600)], now=now)
    until = int((now + 600) * 1000)
    for addr in ("0.0.0.0", "10.2.3.4", "198.51.100.9"):  # put there by an older version, or before an allowlist
        rig.fake.sets["default_ip4"][key(addr)] = Element(until, "")
    rig.fake.sets["default_net4"][(key("224.0.0.0") << 8) | 4] = Element(None, "")
    await rig.enforcer.reconcile(now=now)
    assert rig.fake.elements("default_ip4") == {key("203.0.113.7"), key("198.51.100.9")}
    assert rig.fake.elements("default_net4") == set()
    assert sorted(str(b.target) for b in rig.saved.saves if b.origin == "kernel") == ["198.51.100.9/32"]
    assert rig.enforcer.counters.adopted == 1 and rig.enforcer.counters.unbannable_removed == 3


async def test_a_forward_clock_jump_does_not_unban_what_the_kernel_still_enforces(rig: Rig) -> None:
    now = rig.fake.clock()
    await rig.enforcer.apply([ban("203.0.113.8", now + 3600)], now=now)
    # the wall clock jumps a day ahead (NTP step, VM resume): the state thinks the ban ended ...
    assert await rig.enforcer.reconcile(now=now + 86400) == 1
    # ... but the kernel's element is still there (its timeout runs on the kernel's own clock): kept
    assert rig.fake.elements("default_ip4") == {key("203.0.113.8")}
    assert [str(b.target) for b in rig.enforcer.state.iter_bans()] == ["203.0.113.8/32"]


async def test_feed_owned_sets_are_not_adopted_into() -> None:
    cfg = parse_config(CONFIG + "feeds:\n  f: {url: 'https://example.invalid/x', blocklist: small}\n")
    fake = FakeSetWriter(plan_ruleset(cfg))
    async with running_enforcer(cfg, fake) as enforcer:
        fake.sets["small_ip4"][key("192.0.2.1")] = Element(None, "")
        assert await enforcer.reconcile() == 1
        assert fake.elements("small_ip4") == set()  # a feed set holds exactly its feed's entries
        assert fake.idle_checks == 1  # and after the repairs, the rules of sets left empty are dropped


async def test_ingress_chains_follow_devices_and_a_reload_replaces_the_chains() -> None:
    cfg = parse_config(CONFIG + "chain: {ingress: [veth1, wg0]}\n")
    plan = plan_ruleset(cfg)
    fake = FakeSetWriter(plan, devices={"lo", "veth1"})
    enforcer = Enforcer(cfg, plan, build_allowlist(cfg.allowlist, include_self=False), lambda: fake)
    await enforcer.start()
    assert fake.chains == {"prerouting", "ingress_veth1"}  # wg0 does not exist yet
    fake.devices.add("wg0")
    change = await enforcer.sync_ingress()
    assert (change.attached, change.detached) == (("wg0",), ())
    fake.devices.discard("veth1")
    change = await enforcer.sync_ingress()
    assert (change.attached, change.detached) == ((), ("veth1",))
    assert fake.chains == {"prerouting", "ingress_wg0"}
    gen = enforcer.generation
    assert await enforcer.sync_ingress() == type(change)((), ())  # nothing changed: nothing sent
    assert enforcer.generation == gen

    # a reload that drops wg0 from the config: the writer gets the new chains, the sets stay
    new = plan_ruleset(parse_config(CONFIG))
    await enforcer.reinstall(new)
    assert fake.plan is new and enforcer.plan is new and fake.chains == {"prerouting"}
    with pytest.raises(ValueError, match="cannot change the sets"):
        await enforcer.reinstall(plan_ruleset(parse_config("blocklists: {other: {}}\n")))
    await enforcer.close()


def test_the_kernel_features_line_is_a_sentence_naming_what_is_missing() -> None:
    from nftblockd.kernel.setwriter import Features

    full = Features((6, 18), owner=True, persist=True, destroy=True, timeout_update=True)
    assert full.sentence() == ("kernel 6.18: table owned by nftblockd, kept across restarts, idempotent element "
                               "deletes, timeouts refreshed in place")
    old = Features((6, 1), owner=True, persist=False, destroy=False, timeout_update=False)
    assert old.sentence() == ("kernel 6.1: table owned by nftblockd; without: kept across restarts, idempotent "
                              "element deletes, timeouts refreshed in place")
