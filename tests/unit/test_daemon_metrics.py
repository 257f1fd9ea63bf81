"""The metrics the daemon wires to figures other components own (Daemon._live_metrics), read back as a scrape
shows them: tracker evictions by how many failures the evicted record held, and failures a jail refused to
count by reason, and the fleet service's unexpected failures. The daemon is built, not run: nothing here
touches the kernel."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

import nftblockd.daemon.fleet as daemon_fleet
from nftblockd.config import parse_config
from nftblockd.daemon.root import Daemon
from nftblockd.detect.jails import JailRunner, JailStats
from nftblockd.detect.tracker import JailPolicy, Tracker
from nftblockd.events import Hit

T0 = 1_767_225_600.0


def daemon(tmp_path: Path) -> Daemon:
    cfg = parse_config(f"""
state_dir: {tmp_path}
allowlist_self: false
control: {{socket: {tmp_path}/control.sock}}
blocklists:
  default: {{timeout: 1h}}
""")
    d = Daemon(cfg)
    d._live_metrics()
    return d


def sample(d: Daemon, name: str, **labels: str) -> float | None:
    return d.metrics.registry.get_sample_value(name, labels)


def fail(tr: Tracker, addr: str, n: int, now: float) -> None:
    for _ in range(n):
        tr.observe(Hit("sshd", ipaddress.ip_address(addr), now), now)


def test_tracker_evictions_by_failures_held_show_at_the_next_scrape(tmp_path: Path) -> None:
    d = daemon(tmp_path)
    d.tracker = Tracker([JailPolicy("sshd", maxretry=5)], d.allow, max_tracked=64)
    for i in range(64):  # the cap, filled with records two failures deep
        fail(d.tracker, str(ipaddress.IPv4Address(0x0A000000 + i)), 2, T0 + i)
    assert sample(d, "nftblock_tracker_evictions_total", failures="several") == 0
    fail(d.tracker, "203.0.113.1", 1, T0 + 100)  # room is made by evicting a two-failure record
    assert sample(d, "nftblock_tracker_evictions_total", failures="several") == 1
    assert sample(d, "nftblock_tracker_evictions_total", failures="one") == 0
    fail(d.tracker, "203.0.113.2", 1, T0 + 101)  # now the one-failure record goes first
    fail(d.tracker, "203.0.113.3", 1, T0 + 102)
    assert sample(d, "nftblock_tracker_evictions_total", failures="several") == 1
    assert sample(d, "nftblock_tracker_evictions_total", failures="one") == 2


def test_failures_a_jail_refused_to_count_show_by_reason(tmp_path: Path) -> None:
    d = daemon(tmp_path)
    stats = JailStats(allowlisted=4, never_ban=2)
    d.jails = [cast(JailRunner, cast(Any, SimpleNamespace(jail=SimpleNamespace(name="sshd"), stats=stats)))]
    assert sample(d, "nftblock_failures_refused_total", jail="sshd", reason="allowlisted") == 4
    stats.never_ban += 1
    assert sample(d, "nftblock_failures_refused_total", jail="sshd", reason="never_ban") == 3


async def test_a_fleet_service_that_fails_is_counted_shown_and_started_again(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # (a fake service in place of the fleet: the restart loop is service/restart.py's, tested there with a
    # fake clock; here a zero backoff keeps it from waiting at all)
    monkeypatch.setattr(daemon_fleet, "FLEET_RESTART_BASE", 0.0)
    d = daemon(tmp_path)
    runs: list[int] = []

    async def run() -> None:
        runs.append(1)
        if len(runs) <= 2:
            raise RuntimeError(f"database is locked ({len(runs)})")

    fake = SimpleNamespace(run=run, stats=SimpleNamespace(last_error=""))
    d.fleet = cast(Any, fake)
    await d._run_fleet()
    assert len(runs) == 3
    assert sample(d, "nftblock_fleet_service_failures_total") == 2
    assert d.fleet_failure == fake.stats.last_error == "RuntimeError: database is locked (2)"
