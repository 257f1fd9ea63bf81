"""The real daemon in a private network namespace, driven through the `nftblock` CLI, checked with `nft -j`."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.daemon import DaemonProc, scrape
from tests.helpers.netns import NetNS, wait_for

CONFIG = """
allowlist: [192.0.2.0/24, "2001:db8:aaaa::/48"]
blocklists:
  default: {timeout: 1h}
  small: {timeout: 10m, size: 4}
reconcile: {interval: 1s}
jails: {}
"""


@pytest.fixture
def daemon(netns: NetNS, tmp_path: Path) -> Iterator[DaemonProc]:
    d = DaemonProc(netns, tmp_path / "d", CONFIG).start()
    yield d
    d.close()


def elems(ns: NetNS, set_name: str) -> dict[str, dict[str, object]]:
    return ns.set_elements("nftblock", set_name)


def test_ban_and_unban_reach_the_kernel_set(netns: NetNS, daemon: DaemonProc) -> None:
    r = daemon.cli("ban", "203.0.113.7", "--timeout", "10m", "--comment", "manual test")
    assert r.returncode == 0, r.stderr
    e = elems(netns, "default_ip4")["203.0.113.7"]
    assert 590 <= int(e["expires"]) <= 600  # type: ignore[call-overload]
    assert daemon.cli("unban", "203.0.113.7").returncode == 0
    assert "203.0.113.7" not in elems(netns, "default_ip4")


def test_timeout_expires_in_the_kernel(netns: NetNS, daemon: DaemonProc) -> None:
    assert daemon.cli("ban", "203.0.113.9", "--timeout", "1s").returncode == 0
    assert "203.0.113.9" in elems(netns, "default_ip4")
    wait_for(lambda: "203.0.113.9" not in elems(netns, "default_ip4"), timeout=10, what="kernel expiry")
    assert "203.0.113.9" not in daemon.cli("list").stdout


def test_reban_extends_and_never_shortens(netns: NetNS, daemon: DaemonProc) -> None:
    daemon.cli("ban", "203.0.113.10", "--timeout", "1m")
    daemon.cli("ban", "203.0.113.10", "--timeout", "2h")
    assert int(elems(netns, "default_ip4")["203.0.113.10"]["expires"]) > 7000  # type: ignore[call-overload]
    daemon.cli("ban", "203.0.113.10", "--timeout", "5m")
    assert int(elems(netns, "default_ip4")["203.0.113.10"]["expires"]) > 7000  # type: ignore[call-overload]


def test_cidr_ipv6_and_mapped_addresses(netns: NetNS, daemon: DaemonProc) -> None:
    r = daemon.cli("ban", "198.51.100.0/24", "2001:db8:1::5", "2001:db8:2::/48", "::ffff:203.0.113.20")
    assert r.returncode == 0, r.stderr
    assert "198.51.100.0/24" in elems(netns, "default_net4")
    assert "2001:db8:1::5" in elems(netns, "default_ip6")
    assert "2001:db8:2::/48" in elems(netns, "default_net6")
    assert "203.0.113.20" in elems(netns, "default_ip4")
    check = daemon.cli_json("check", "198.51.100.77")
    assert check["bans"][0]["target"] == "198.51.100.0/24" and check["allowlisted"] is None


def test_bad_input_gets_one_clear_line(daemon: DaemonProc) -> None:
    r = daemon.cli("ban", "192.0.2.5")
    assert r.returncode == 1 and "allowlisted" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = daemon.cli("ban", "not-an-ip")
    assert r.returncode == 2 and "not-an-ip" in r.stderr
    r = daemon.cli("ban", "--set", "nope", "203.0.113.1")
    assert r.returncode == 1 and "nope" in r.stderr


def test_daemon_not_running_is_one_line(tmp_path: Path, netns: NetNS) -> None:
    d = DaemonProc(netns, tmp_path / "none", CONFIG)
    r = d.cli("status")
    assert r.returncode == 1 and "not running" in r.stderr


def test_full_set_refuses_the_excess_but_applies_the_rest(netns: NetNS, daemon: DaemonProc) -> None:
    addrs = [f"203.0.113.{i}" for i in range(100, 106)]
    r = daemon.cli("--json", "ban", "--set", "small", *addrs)
    assert r.returncode == 1
    assert len(elems(netns, "small_ip4")) == 4
    assert "full" in r.stdout + r.stderr
    status = daemon.cli_json("status")
    assert status["errors"]["set_full"] == 2


def test_bulk_ban_from_stdin(netns: NetNS, daemon: DaemonProc) -> None:
    lines = "\n".join(f"10.{i // 65536}.{(i // 256) % 256}.{i % 256}" for i in range(1, 20001))
    r = daemon.cli("ban", "--timeout", "1h", "-", input="# bulk\n" + lines + "\n")
    assert r.returncode == 0, r.stderr
    assert daemon.cli_json("status")["sets"][2]["elements"] == 20000
    r = daemon.cli("unban", "-", input=lines)
    assert r.returncode == 0
    assert len(elems(netns, "default_ip4")) == 0


def test_foreign_table_is_untouched(netns: NetNS, tmp_path: Path) -> None:
    netns.run("nft", "-f", "-", input="table inet mine {\n set s { type ipv4_addr; elements = { 1.2.3.4 }; }\n"
              " chain c { type filter hook input priority 0; ip saddr @s drop; }\n}\n")
    before = netns.nft("list", "table", "inet", "mine").stdout
    d = DaemonProc(netns, tmp_path / "f", CONFIG).start()
    try:
        d.cli("ban", "203.0.113.50")
        assert netns.nft("list", "table", "inet", "mine").stdout == before
    finally:
        d.close()
    assert netns.nft("list", "table", "inet", "mine").stdout == before


def test_flush_ruleset_and_delete_table_do_not_unprotect(netns: NetNS, daemon: DaemonProc) -> None:
    daemon.cli("ban", "203.0.113.60")
    netns.nft("flush", "ruleset")
    assert netns.nft("delete", "table", "inet", "nftblock", check=False).returncode != 0
    assert "203.0.113.60" in elems(netns, "default_ip4")


def test_unprotected_table_is_rebuilt_with_its_bans(netns: NetNS, tmp_path: Path) -> None:
    d = DaemonProc(netns, tmp_path / "u", CONFIG + "table: {name: nftblock, protect: false}\n").start()
    try:
        d.cli("ban", "203.0.113.61", "198.51.100.0/24")
        netns.nft("delete", "table", "inet", "nftblock")
        wait_for(lambda: "203.0.113.61" in _maybe(netns, "default_ip4"), timeout=5, what="rebuild after delete")
        assert "198.51.100.0/24" in elems(netns, "default_net4")
        netns.nft("flush", "ruleset")
        wait_for(lambda: "203.0.113.61" in _maybe(netns, "default_ip4"), timeout=5, what="rebuild after flush")
        assert d.cli_json("status")["errors"]["rebuilds"] == 2
    finally:
        d.close()


def _maybe(ns: NetNS, set_name: str) -> dict[str, dict[str, object]]:
    r = ns.nft("-j", "list", "set", "inet", "nftblock", set_name, check=False)
    return elems(ns, set_name) if r.returncode == 0 else {}


def test_elements_removed_behind_our_back_are_restored(netns: NetNS, tmp_path: Path) -> None:
    d = DaemonProc(netns, tmp_path / "r", CONFIG + "table: {name: nftblock, protect: false}\n").start()
    try:
        d.cli("ban", "203.0.113.70", "203.0.113.71")
        netns.nft("delete", "element", "inet", "nftblock", "default_ip4", "{ 203.0.113.70 }")
        wait_for(lambda: "203.0.113.70" in elems(netns, "default_ip4"), timeout=10, what="reconcile")
        assert d.cli_json("status")["errors"]["drift_repaired"] >= 1
    finally:
        d.close()


def test_stop_leaves_bans_and_reload_keeps_running(netns: NetNS, daemon: DaemonProc) -> None:
    daemon.cli("ban", "203.0.113.80")
    daemon.config_path.write_text(CONFIG.replace("192.0.2.0/24", "192.0.2.0/25"))
    daemon.signal(signal.SIGHUP)
    daemon.wait_notify("READY=1")
    assert daemon.cli_json("check", "192.0.2.200")["allowlisted"] is None
    daemon.config_path.write_text("blocklists: {default: {timeout: nonsense}}\n")
    daemon.signal(signal.SIGHUP)
    daemon.wait_notify("READY=1")
    assert daemon.cli("status").returncode == 0  # the old config keeps running
    assert daemon.stop() == 0
    assert "203.0.113.80" in elems(netns, "default_ip4")


def test_metrics_endpoint_reports_sets_batches_and_bans(netns: NetNS, tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families
    d = DaemonProc(netns, tmp_path / "m", CONFIG + "metrics: {listen: '127.0.0.1:9789'}\n").start()
    try:
        d.cli("ban", "203.0.113.90", "203.0.113.91", "198.51.100.0/24")
        d.cli("ban", "192.0.2.1")  # allowlisted
        d.cli("unban", "203.0.113.91")
        d.signal(signal.SIGHUP)  # not needed for metrics; proves a reload keeps the endpoint
        d.wait_notify("READY=1")
        samples = {}
        wait_for(lambda: "nftblock_set_elements" in scrape(netns, 9789), timeout=10, what="metrics")
        for fam in text_string_to_metric_families(scrape(netns, 9789)):
            for smp in fam.samples:
                samples[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
        assert samples[("nftblock_bans_total", (("jail", ""), ("origin", "cli")))] == 3
        assert samples[("nftblock_unbans_total", (("origin", "cli"),))] == 1
        assert samples[("nftblock_allowlist_hits_total", ())] == 1
        assert samples[("nftblock_netlink_batch_seconds_count", ())] >= 2
        assert any(k[0] == "nftblock_ban_latency_seconds_count" for k in samples)
        wait_for(lambda: _gauge(netns, "default_ip4") == 1.0, timeout=10, what="set gauge refresh")
    finally:
        d.close()


def _gauge(ns: NetNS, set_name: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families
    for fam in text_string_to_metric_families(scrape(ns, 9789)):
        for smp in fam.samples:
            if smp.name == "nftblock_set_elements" and smp.labels.get("set") == set_name:
                return smp.value
    return None


def test_bulk_bans_survive_a_restart_and_unbans_stay_unbanned(netns: NetNS, daemon: DaemonProc) -> None:
    lines = [f"10.9.{i // 256}.{i % 256}" for i in range(3000)]
    assert daemon.cli("ban", "--timeout", "2h", "-", input="\n".join(lines) + "\n").returncode == 0
    assert daemon.cli("unban", "10.9.0.1", "10.9.0.2").returncode == 0
    assert daemon.stop() == 0
    netns.nft("delete", "table", "inet", "nftblock")  # a reboot: the kernel sets are empty
    daemon.start()
    have = set(elems(netns, "default_ip4"))
    assert len(have) == 2998 and "10.9.0.1" not in have and "10.9.11.183" in have
    ban = {b["target"]: b for b in daemon.cli_json("list")["bans"]}["10.9.0.3"]
    assert 7000 < ban["expires_in"] <= 7200
