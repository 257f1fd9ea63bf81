"""A scrape of the real daemon shows each kind of event at once: set sizes read from the kernel at scrape
time (the reconcile, which used to refresh them, is an hour away here), bans and their per-ban latency,
tracked addresses per jail, skipped lines, a feed's entries and last success updated by the feed's own
task; and `promtool check metrics` accepts the scrape."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.daemon import DaemonProc, scrape
from tests.helpers.netns import NetNS, wait_for
from tests.unit.test_metrics import promtool

PORT = 9789
Key = tuple[str, tuple[tuple[str, str], ...]]


def parse(text: str) -> dict[Key, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples: dict[Key, float], name: str, **labels: str) -> float | None:
    """The sample `name` whose labels include `labels` (None if there is none)."""
    for (n, lab), v in samples.items():
        if n == name and set(labels.items()) <= set(lab):
            return v
    return None


def scrape_until(ns: NetNS, ok: Callable[[dict[Key, float]], bool], what: str) -> dict[Key, float]:
    """Scrape until `ok` holds for the samples (log lines and feed files are read by the daemon's tasks)."""
    def once() -> dict[Key, float] | None:
        s = parse(scrape(ns, PORT))
        return s if ok(s) else None
    result: dict[Key, float] = wait_for(once, what=what)
    return result


def sshd_line(addr: str, n: int) -> str:
    stamp = time.strftime("%b %e %H:%M:%S")
    return f"{stamp} host sshd[{4000 + n}]: Failed password for root from {addr} port {40000 + n} ssh2\n"


@pytest.fixture
def daemon(netns: NetNS, tmp_path: Path) -> Iterator[DaemonProc]:
    for name in ("a.log", "b.log"):
        (tmp_path / name).write_text("")
    (tmp_path / "feed.txt").write_text("11.0.0.0/16\n11.1.2.3\n")
    config = f"""
allowlist: [192.0.2.0/24]
blocklists: {{default: {{timeout: 1h}}, feeds: {{timeout: permanent}}}}
reconcile: {{interval: 1h}}
metrics: {{listen: '127.0.0.1:{PORT}'}}
jails:
  a: {{files: ['{tmp_path}/a.log'], filter: sshd, maxretry: 3}}
  b: {{files: ['{tmp_path}/b.log'], filter: sshd, maxretry: 3}}
feeds:
  drop: {{path: '{tmp_path}/feed.txt', blocklist: feeds}}
"""
    d = DaemonProc(netns, tmp_path / "d", config).start()
    yield d
    d.close()


def test_a_scrape_after_each_kind_of_event_shows_the_new_value(netns: NetNS, daemon: DaemonProc,
                                                              tmp_path: Path) -> None:
    # the feed's own task loads it (its first fetch runs after READY): nobody asks `nftblock status` or `feeds`
    first = scrape_until(netns, lambda x: bool(value(x, "nftblock_set_elements", set="feeds_net4")),
                         "the feed in the kernel")
    assert value(first, "nftblock_feed_entries", feed="drop") == 2
    fetched = value(first, "nftblock_feed_last_success_timestamp_seconds", feed="drop")
    assert fetched is not None and abs(fetched - time.time()) < 300
    assert value(first, "nftblock_set_elements", set="feeds_net4") == 2  # the range and the single address
    assert value(first, "nftblock_set_elements", set="allow_net4") is not None

    # a CLI ban of three addresses in one request: in the kernel set at once, three latency samples
    assert daemon.cli("ban", "203.0.113.1", "203.0.113.2", "203.0.113.3").returncode == 0
    s = parse(scrape(netns, PORT))
    assert value(s, "nftblock_set_elements", set="default_ip4") == 3
    assert value(s, "nftblock_ban_latency_seconds_count", origin="cli") == 3
    assert value(s, "nftblock_bans_total", origin="cli") == 3

    assert daemon.cli("unban", "203.0.113.2").returncode == 0
    s = parse(scrape(netns, PORT))
    assert value(s, "nftblock_set_elements", set="default_ip4") == 2
    assert value(s, "nftblock_unbans_total", origin="cli") == 1

    # failures: counted per jail
    with open(tmp_path / "a.log", "a") as f:
        f.write(sshd_line("198.51.100.1", 1) + sshd_line("198.51.100.2", 2) + sshd_line("198.51.100.1", 3))
    with open(tmp_path / "b.log", "a") as f:
        f.write(sshd_line("198.51.100.9", 4))
    s = scrape_until(netns, lambda x: value(x, "nftblock_failures_total", jail="b") == 1
                     and value(x, "nftblock_failures_total", jail="a") == 3, "failures counted")
    assert value(s, "nftblock_tracker_addresses", jail="a") == 2
    assert value(s, "nftblock_tracker_addresses", jail="b") == 1

    # a ban by a jail: the kernel set and one more latency sample, origin jail
    with open(tmp_path / "a.log", "a") as f:
        f.write(sshd_line("198.51.100.1", 5))
    # (the kernel has it a moment before the jail's task, woken by the acknowledgement, counts it)
    s = scrape_until(netns, lambda x: value(x, "nftblock_set_elements", set="default_ip4") == 3
                     and value(x, "nftblock_ban_latency_seconds_count", origin="jail") == 1,
                     "the jail's ban in the set gauge and its latency")
    assert value(s, "nftblock_tracker_addresses", jail="a") == 1  # its counts ended with the ban

    # an overlong line is skipped and counted
    with open(tmp_path / "b.log", "a") as f:
        f.write("x" * 20000 + "\n" + sshd_line("198.51.100.10", 6))
    s = scrape_until(netns, lambda x: value(x, "nftblock_lines_invalid_total", source="b", reason="overlong") == 1,
                     "the overlong line counted")
    assert value(s, "nftblock_lines_invalid_total", source="b", reason="invalid_utf8") == 0

    # the feed file changes: the feed's task picks it up, and the scrape shows it
    (tmp_path / "feed.new").write_text("11.0.0.0/16\n11.1.2.3\n11.1.2.4\n")
    (tmp_path / "feed.new").replace(tmp_path / "feed.txt")  # atomically, as feed tools publish
    s = scrape_until(netns, lambda x: value(x, "nftblock_feed_entries", feed="drop") == 3, "the feed's new entry")
    again = value(s, "nftblock_feed_last_success_timestamp_seconds", feed="drop")
    assert again is not None and again > fetched
    # the copy is taken (entries) a moment before its transaction reaches the kernel (set size)
    scrape_until(netns, lambda x: value(x, "nftblock_set_elements", set="feeds_net4") == 3, "the feed's new entry "
                 "in the kernel")


def test_promtool_accepts_a_real_scrape(netns: NetNS, daemon: DaemonProc) -> None:
    tool = promtool()
    if tool is None:
        pytest.skip("promtool not installed (make deps extracts it)")
    daemon.cli("ban", "203.0.113.1", "2001:db8:bad::/48")
    text = scrape(netns, PORT)
    assert "nftblock_ban_latency_seconds_bucket" in text and "nftblock_feed_entries" in text
    r = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert r.returncode == 0 and not r.stdout and not r.stderr, r.stdout + r.stderr
