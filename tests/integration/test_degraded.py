"""A degraded daemon shows it (issue 33): a journal jail on a machine without journald made `nftblock status`
exit 0 with only the jail's own line saying so. Now its first line says DEGRADED, it exits 3, and the metric
nftblock_degraded{reason} has the reason at 1 (and every reason there, at 0, on a healthy daemon)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nftblockd.sources.journal import JOURNALD_SOCKET
from tests.helpers.daemon import DaemonProc, scrape
from tests.helpers.netns import NetNS, wait_for

CONFIG = """
blocklists:
  default: {timeout: 1h}
metrics: {listen: '127.0.0.1:9790'}
jails: %s
"""
JOURNAL_JAIL = "{sshd: {filter: sshd, journal: {matches: {SYSLOG_IDENTIFIER: sshd}}}}"


def _degraded(ns: NetNS) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families
    return {s.labels["reason"]: s.value for fam in text_string_to_metric_families(scrape(ns, 9790))
            for s in fam.samples if s.name == "nftblock_degraded"}


def test_a_healthy_daemon_has_every_reason_at_zero(netns: NetNS, tmp_path: Path) -> None:
    d = DaemonProc(netns, tmp_path / "h", CONFIG % "{}").start()
    try:
        assert d.cli("status").returncode == 0
        wait_for(lambda: "nftblock_degraded" in scrape(netns, 9790), timeout=10, what="metrics")
        assert _degraded(netns) == {"source": 0, "state": 0, "batches": 0}
        assert 'nftblock_control_closed_total{reason="over_budget"} 0.0' in scrape(netns, 9790)
    finally:
        d.close()


def test_a_journal_jail_without_journald_is_degraded(netns: NetNS, tmp_path: Path) -> None:
    if os.path.exists(JOURNALD_SOCKET) or any(Path(p).is_dir() and any(Path(p).iterdir())
                                              for p in ("/run/log/journal", "/var/log/journal")):
        pytest.skip("journald runs here (or left journal files): the jail would not be dead")
    d = DaemonProc(netns, tmp_path / "j", CONFIG % JOURNAL_JAIL).start()
    try:
        r = wait_for(lambda: (x := d.cli("status")).returncode == 3 and x, timeout=10, what="degraded status")
        first = r.stdout.splitlines()[0]
        assert first.startswith("DEGRADED (source): nftblockd ")
        assert "degraded: source: jail sshd: no journal files in /run/log/journal or /var/log/journal and no " \
               f"{JOURNALD_SOCKET}: systemd-journald is not running" in r.stdout
        assert d.cli("--json", "status").returncode == 3
        assert _degraded(netns) == {"source": 1, "state": 0, "batches": 0}
    finally:
        d.close()


def test_a_state_directory_that_cannot_be_written_runs_degraded(netns: NetNS, tmp_path: Path) -> None:
    # Decided (docs/limits.md): run, enforcing in memory, and say so; refusing to start would leave the host
    # unprotected for a problem that costs only persistence. (Root ignores modes: a path under a regular file
    # cannot be created, which the store meets as a read-only directory does.)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    d = DaemonProc(netns, tmp_path / "s", CONFIG % "{}", extra_args=("--state-dir", str(blocker / "state")))
    d.start()
    try:
        d.cli("ban", "203.0.113.5")
        r = d.cli("status")
        assert r.returncode == 3 and r.stdout.startswith("DEGRADED (state): nftblockd ")
        assert "203.0.113.5" in netns.set_elements("nftblock", "default_ip4")  # enforced all the same
        assert _degraded(netns)["state"] == 1
    finally:
        d.close()
