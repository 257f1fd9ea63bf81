"""The metrics the enforcer updates (nftblockd/service/metrics.py), driven through the enforcer on the in-memory
kernel and read back from the Metrics' own registry: bans and unbans, allowlist hits, the batch histograms,
the per-ban latency, kernel refusals by errno and full sets on every path to the kernel, rebuilds, drift and
adoptions. Each figure is the one a scrape would show."""

from __future__ import annotations

import errno as E
import ipaddress
import time
from collections.abc import AsyncIterator

import pytest

from nftblockd.addr import parse_target
from nftblockd.events import Ban, Origin, Unban
from nftblockd.kernel.bans import DELETE, OpSpec
from nftblockd.kernel.batcher import Group
from nftblockd.service.metrics import Metrics
from tests.helpers.apirig import NOW, ApiRig, api_rig
from tests.helpers.fakekernel import Element

CONFIG = """
blocklists:
  default: {timeout: 1h}
  small: {timeout: 10m, size: 2}
allowlist: [10.0.0.0/8]
allowlist_self: false
"""


@pytest.fixture
async def rig() -> AsyncIterator[ApiRig]:
    async with api_rig(CONFIG, metrics=Metrics()) as r:
        yield r


def sample(rig: ApiRig, name: str, **labels: str) -> float | None:
    """The sample as a scrape shows it; None when the series does not exist (a label set never used)."""
    assert rig.metrics is not None
    return rig.metrics.registry.get_sample_value(name, labels)


def k(addr: str) -> int:
    return int(ipaddress.ip_address(addr))


def ban(target: str, blocklist: str = "default", *, until: float | None = NOW + 3600, origin: Origin = "cli",
        jail: str = "") -> Ban:
    return Ban(parse_target(target), blocklist, until, origin, "test", jail)


def unban(target: str, blocklist: str = "default") -> Unban:
    return Unban(parse_target(target), blocklist, "cli", "")


async def test_bans_count_what_reached_the_kernel_once_per_jail_and_origin(rig: ApiRig) -> None:
    e = rig.enforcer
    await e.apply([ban("192.0.2.1", origin="jail", jail="sshd"), ban("192.0.2.2"), ban("198.51.100.0/24")],
                  now=NOW)
    assert sample(rig, "nftblock_bans_total", jail="sshd", origin="jail") == 1
    assert sample(rig, "nftblock_bans_total", jail="", origin="cli") == 2
    # unchanged (not longer) and covered (inside a range that lasts as long) send nothing: not bans
    await e.apply([ban("192.0.2.2"), ban("198.51.100.0/25")], now=NOW)
    assert sample(rig, "nftblock_bans_total", jail="", origin="cli") == 2
    # extended and absorbing bans are applied to the kernel: counted
    await e.apply([ban("192.0.2.2", until=None), ban("198.51.100.0/23")], now=NOW)
    assert sample(rig, "nftblock_bans_total", jail="", origin="cli") == 4
    assert e.counters.bans == 5


async def test_bulk_bans_count_the_applied_ones_and_observe_one_latency_per_ban(rig: ApiRig) -> None:
    rig.fake.fail[("default_ip4", k("192.0.2.5"))] = E.ENOMEM
    keys = [k(f"192.0.2.{i}") for i in range(1, 11)] + [k("10.9.9.9")]
    started = time.monotonic() - 0.5  # the cause was seen half a second ago
    res = await rig.enforcer.ban_hosts("default", {4: keys}, NOW + 60, origin="jail", jail="sshd", now=NOW,
                                       started=started)
    assert len(res.failed) == 1 and res.allowlisted == {4: [k("10.9.9.9")]}
    assert sample(rig, "nftblock_bans_total", jail="sshd", origin="jail") == 9
    assert sample(rig, "nftblock_allowlist_hits_total") == 1
    assert sample(rig, "nftblock_netlink_errors_total", errno="ENOMEM") == 1
    assert sample(rig, "nftblock_ban_latency_seconds_count", origin="jail") == 9
    assert sample(rig, "nftblock_ban_latency_seconds_bucket", origin="jail", le="0.25") == 0
    sum_ = sample(rig, "nftblock_ban_latency_seconds_sum", origin="jail")
    assert sum_ is not None and sum_ >= 9 * 0.5
    # without a cause time (a restore, an import), no latency is observed
    await rig.enforcer.ban_hosts("default", {4: [k("192.0.2.50")]}, None, origin="jail", jail="sshd", now=NOW)
    assert sample(rig, "nftblock_bans_total", jail="sshd", origin="jail") == 10
    assert sample(rig, "nftblock_ban_latency_seconds_count", origin="jail") == 9


async def test_a_request_of_n_bans_is_n_latency_samples(rig: ApiRig) -> None:
    await rig.enforcer.apply([ban(f"192.0.2.{i}") for i in range(1, 4)] + [ban("10.1.1.1")], now=NOW,
                             started=time.monotonic() - 0.5)
    assert sample(rig, "nftblock_ban_latency_seconds_count", origin="cli") == 3
    assert sample(rig, "nftblock_ban_latency_seconds_bucket", origin="cli", le="0.25") == 0
    assert sample(rig, "nftblock_ban_latency_seconds_bucket", origin="cli", le="+Inf") == 3


async def test_unbans_count_only_what_was_removed(rig: ApiRig) -> None:
    e = rig.enforcer
    await e.apply([ban(f"192.0.2.{i}") for i in range(1, 6)], now=NOW)
    await e.apply([unban("192.0.2.1"), unban("192.0.2.99")])
    assert sample(rig, "nftblock_unbans_total", origin="cli") == 1
    await e.unban_hosts("default", {4: [k("192.0.2.2"), k("192.0.2.3"), k("192.0.2.77")]})
    assert sample(rig, "nftblock_unbans_total", origin="cli") == 3
    assert e.counters.unbans == 3


async def test_allowlist_hits_count_each_refused_target(rig: ApiRig) -> None:
    await rig.enforcer.apply([ban("10.1.1.1"), ban("10.0.0.0/9"), ban("192.0.2.1")], now=NOW)
    assert sample(rig, "nftblock_allowlist_hits_total") == 2
    assert rig.fake.transactions and all(k("10.1.1.1") not in g.keys for t in rig.fake.transactions for g in t)


async def test_each_flush_is_one_observation_of_its_size_and_duration(rig: ApiRig) -> None:
    await rig.enforcer.apply([ban(f"192.0.2.{i}") for i in range(1, 4)], now=NOW)
    assert sample(rig, "nftblock_netlink_batch_elements_count") == 1
    assert sample(rig, "nftblock_netlink_batch_elements_sum") == 3
    assert sample(rig, "nftblock_netlink_batch_elements_bucket", le="1.0") == 0
    assert sample(rig, "nftblock_netlink_batch_elements_bucket", le="10.0") == 1
    assert sample(rig, "nftblock_netlink_batch_seconds_count") == 1
    await rig.enforcer.apply([ban("192.0.2.1")], now=NOW)  # unchanged: nothing flushed, nothing observed
    assert sample(rig, "nftblock_netlink_batch_elements_count") == 1
    await rig.enforcer.ban_hosts("default", {4: [k(f"198.18.0.{i}") for i in range(200)]}, None, now=NOW)
    assert sample(rig, "nftblock_netlink_batch_elements_count") == 2
    assert sample(rig, "nftblock_netlink_batch_elements_sum") == 203
    assert sample(rig, "nftblock_netlink_batch_elements_bucket", le="100.0") == 1


async def test_kernel_refusals_are_counted_by_errno_name(rig: ApiRig) -> None:
    rig.fake.fail[("default_ip4", k("192.0.2.1"))] = E.ENOMEM
    rig.fake.fail[("default_net4", (k("198.51.100.0") << 8) | 24)] = E.EEXIST
    rig.fake.fail[("default_ip4", k("192.0.2.2"))] = 4095  # no name: the number
    await rig.enforcer.apply([ban("192.0.2.1"), ban("198.51.100.0/24"), ban("192.0.2.2"), ban("192.0.2.3")],
                             now=NOW)
    assert sample(rig, "nftblock_netlink_errors_total", errno="ENOMEM") == 1
    assert sample(rig, "nftblock_netlink_errors_total", errno="EEXIST") == 1
    assert sample(rig, "nftblock_netlink_errors_total", errno="4095") == 1
    assert sample(rig, "nftblock_set_full_total", set="default_ip4") is None


async def test_a_full_set_is_counted_per_set_on_the_single_and_the_bulk_path(rig: ApiRig) -> None:
    res = await rig.enforcer.apply([ban(f"192.0.2.{i}", "small") for i in range(1, 4)], now=NOW)
    assert [r.code for r in res] == [None, None, "unavailable"]
    assert sample(rig, "nftblock_set_full_total", set="small_ip4") == 1
    await rig.enforcer.ban_hosts("small", {4: [k(f"198.18.0.{i}") for i in range(5)]}, None, now=NOW)
    assert sample(rig, "nftblock_set_full_total", set="small_ip4") == 6
    assert sample(rig, "nftblock_netlink_errors_total", errno="ENFILE") == 6
    assert rig.enforcer.counters.set_full == 6


async def test_feed_syncs_count_their_batch_and_their_kernel_refusals(rig: ApiRig) -> None:
    """A feed larger than its set is when set_full matters most; the feed path goes straight to the
    kernel thread (one transaction), not through the batcher, and must count the same way."""
    rig.fake.fail[("default_ip4", k("192.0.2.9"))] = E.ENOMEM
    r = await rig.enforcer.sync_sets({"small_ip4": [k(f"198.18.0.{i}") for i in range(4)],
                                      "default_ip4": [k("192.0.2.9"), k("192.0.2.10")]}, None)
    assert r.failed == 3
    assert sample(rig, "nftblock_netlink_batch_elements_count") == 1
    assert sample(rig, "nftblock_netlink_batch_elements_sum") == 6
    assert sample(rig, "nftblock_set_full_total", set="small_ip4") == 2
    assert sample(rig, "nftblock_netlink_errors_total", errno="ENFILE") == 2
    assert sample(rig, "nftblock_netlink_errors_total", errno="ENOMEM") == 1
    assert rig.enforcer.counters.set_full == 2
    assert sample(rig, "nftblock_bans_refused_total", reason="kernel") == 3  # feed entries are bans too


async def test_feed_deltas_count_their_kernel_refusals_as_full_syncs_do(rig: ApiRig) -> None:
    # a refresh applies a delta (feeds/delta.py) instead of a whole set: the same counting, one shared helper
    rig.fake.fail[("default_ip4", k("192.0.2.9"))] = E.ENOMEM
    r, refused = await rig.enforcer.apply_set_deltas({"default_ip4": ([k("192.0.2.9"), k("192.0.2.10")], [], [])},
                                                     None)
    assert r.failed == 1 and refused == [("default_ip4", k("192.0.2.9"))]
    assert sample(rig, "nftblock_netlink_errors_total", errno="ENOMEM") == 1
    assert sample(rig, "nftblock_bans_refused_total", reason="kernel") == 1


async def test_restored_bans_the_kernel_refuses_are_counted(rig: ApiRig) -> None:
    rig.fake.fail[("default_ip4", k("192.0.2.2"))] = E.ENOMEM
    out = await rig.enforcer.restore_hosts("default", 4, [k("192.0.2.1"), k("192.0.2.2")], [None, None],
                                           origin="store", reason="", jail="")
    assert out is not None and len(out[2]) == 1
    assert sample(rig, "nftblock_bans_refused_total", reason="kernel") == 1
    assert sample(rig, "nftblock_netlink_errors_total", errno="ENOMEM") == 1
    assert rig.enforcer.counters.kernel_errors == {E.ENOMEM: 1}


async def test_the_errno_counter_agrees_with_the_status_counters_on_every_path(rig: ApiRig) -> None:
    e = rig.enforcer
    for addr in ("192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"):
        rig.fake.fail[("default_ip4", k(addr))] = E.ENOMEM
    await e.apply([ban("192.0.2.1")], now=NOW)
    await e.ban_hosts("default", {4: [k("192.0.2.2")]}, None, now=NOW)
    await e.sync_sets({"default_ip4": [k("192.0.2.3")]}, None)
    await e.restore_hosts("default", 4, [k("192.0.2.4")], [None], origin="store", reason="", jail="")
    assert sample(rig, "nftblock_netlink_errors_total", errno="ENOMEM") == e.counters.kernel_errors[E.ENOMEM] == 4


async def test_rebuilds_drift_and_adoptions_are_counted(rig: ApiRig) -> None:
    e = rig.enforcer
    await e.apply([ban("192.0.2.1"), ban("192.0.2.2")], now=NOW)
    rig.fake.outside_change(drop_set="default_ip4")
    assert await e.check_kernel() == ["set default_ip4"]
    assert sample(rig, "nftblock_rebuilds_total") == 1
    del rig.fake.sets["default_ip4"][k("192.0.2.2")]  # lost behind our back: re-added
    assert await e.reconcile(now=NOW) == 1
    assert sample(rig, "nftblock_drift_repaired_total") == 1
    assert sample(rig, "nftblock_adopted_total") == 0
    rig.fake.sets["default_ip4"][k("192.0.2.77")] = Element(None, "")  # unknown to the state: adopted
    assert await e.reconcile(now=NOW) == 1
    assert sample(rig, "nftblock_adopted_total") == 1
    assert sample(rig, "nftblock_drift_repaired_total") == 1


async def test_bans_refused_are_counted_by_reason_on_both_paths(rig: ApiRig) -> None:
    e = rig.enforcer
    rig.fake.fail[("default_ip4", k("192.0.2.9"))] = E.ENOMEM
    await e.apply([ban("0.0.0.0"), ban("224.0.0.1/32"), ban("10.1.2.3"), ban("192.0.2.9"), ban("192.0.2.10")],
                  now=NOW)
    assert sample(rig, "nftblock_bans_refused_total", reason="never_ban") == 2
    assert sample(rig, "nftblock_bans_refused_total", reason="allowlisted") == 1
    assert sample(rig, "nftblock_bans_refused_total", reason="kernel") == 1
    # a range inside a longer one that ends sooner is refused by the ban state, not the kernel
    await e.apply([ban("198.51.100.0/24", until=NOW + 60)], now=NOW)
    await e.apply([ban("198.51.100.0/25", until=NOW + 7200)], now=NOW)
    assert sample(rig, "nftblock_bans_refused_total", reason="overlap") == 1
    # the bulk path (a jail's burst, `ban -`) counts the same reasons
    rig.fake.fail[("default_ip4", k("192.0.2.20"))] = E.ENFILE
    await e.ban_hosts("default", {4: [k("0.0.0.0"), k("10.9.9.9"), k("192.0.2.20"), k("192.0.2.21")]}, NOW + 60,
                      now=NOW)
    assert sample(rig, "nftblock_bans_refused_total", reason="never_ban") == 3
    assert sample(rig, "nftblock_bans_refused_total", reason="allowlisted") == 2
    assert sample(rig, "nftblock_bans_refused_total", reason="kernel") == 2
    assert sample(rig, "nftblock_bans_total", jail="", origin="cli") == 3  # .10, the /24 and .21


async def test_write_sets_is_one_transaction_under_the_lock_settled_and_counted(rig: ApiRig) -> None:
    """`Enforcer.write_sets`, the whole-set write that feed syncs and the fleet sink share: the plan runs under
    the lock, its ops are one transaction, and what the kernel refuses is forgotten, returned and counted by
    reason (a refused add is a ban refused by the kernel; a refused delete is not)."""
    e = rig.enforcer
    await e.sync_sets({"small_ip4": [k("198.18.0.1")], "default_ip4": [k("192.0.2.1")]}, None)
    rig.fake.fail[("default_ip4", k("192.0.2.1"))] = E.ENOMEM  # the delete is refused
    rig.fake.fail[("default_ip4", k("192.0.2.2"))] = E.EEXIST  # and one add
    before = len(rig.fake.transactions)
    locked: list[bool] = []

    def plan() -> list[Group]:
        locked.append(e._lock.locked())
        adds = [k("192.0.2.2"), k("192.0.2.3")]
        e.state.replace_set("default_ip4", adds, None, origin="feed", reason="test")
        e.state.replace_set("small_ip4", [k("198.18.0.1"), k("198.18.0.2"), k("198.18.0.3")], None,
                            origin="feed", reason="test")
        spec = OpSpec(True, None, "")
        return [Group("default_ip4", [k("192.0.2.1")], [DELETE]), Group("default_ip4", adds, [spec, spec]),
                Group("small_ip4", [k("198.18.0.2"), k("198.18.0.3")], [spec, spec])]  # size 2: one too many

    refused = await e.write_sets(plan, NOW)
    assert locked == [True]
    assert len(rig.fake.transactions) == before + 1
    assert sorted(refused) == sorted([("default_ip4", k("192.0.2.1")), ("default_ip4", k("192.0.2.2")),
                                      ("small_ip4", k("198.18.0.3"))])
    assert k("192.0.2.2") not in e.state.sets["default_ip4"].entries  # refused: the state forgot it
    assert k("198.18.0.3") not in e.state.sets["small_ip4"].entries
    assert k("192.0.2.3") in e.state.sets["default_ip4"].entries and rig.fake.elements("default_ip4") == {
        k("192.0.2.1"), k("192.0.2.3")}  # (the refused delete left the old element in the kernel)
    assert sample(rig, "nftblock_netlink_errors_total", errno="ENOMEM") == 1
    assert sample(rig, "nftblock_netlink_errors_total", errno="EEXIST") == 1
    assert sample(rig, "nftblock_netlink_errors_total", errno="ENFILE") == 1
    assert sample(rig, "nftblock_set_full_total", set="small_ip4") == 1
    assert sample(rig, "nftblock_bans_refused_total", reason="kernel") == 2  # not the refused delete
    assert e.generation == rig.fake.last_generation
    # a plan with nothing to write sends nothing
    assert await e.write_sets(lambda: [], NOW) == [] and len(rig.fake.transactions) == before + 1


async def test_refusals_count_once_each_in_counters_and_metrics(rig: ApiRig) -> None:
    """Refusals are counted per (errno, set) in one update each: the totals stay per element."""
    keys = [k(f"192.0.2.{i}") for i in range(1, 8)]
    rig.fake.fail[("small_ip4", keys[0])] = E.ENOMEM
    await rig.enforcer.ban_hosts("small", {4: keys}, NOW + 60, origin="cli", now=NOW)
    assert sample(rig, "nftblock_set_full_total", set="small_ip4") == 4  # 7 - 2 held - 1 refused otherwise
    assert sample(rig, "nftblock_netlink_errors_total", errno="ENFILE") == 4
    assert sample(rig, "nftblock_netlink_errors_total", errno="ENOMEM") == 1
    c = rig.enforcer.counters
    assert c.set_full == 4 and c.kernel_errors == {E.ENFILE: 4, E.ENOMEM: 1}
