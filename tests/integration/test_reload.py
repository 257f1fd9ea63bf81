"""Reload does what it says: jails removed stop banning, changed policies apply to the next failure (with
what was counted kept), added jails start; the verdict names what changed."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.daemon import DaemonProc
from tests.helpers.netns import NetNS, wait_for
from tests.integration.test_jails import append, banned, failures


def config(a: Path, b: Path, *, a_maxretry: int, with_b: bool) -> str:
    b_jail = f"""
  web:
    files: ["{b}"]
    filter: sshd
    maxretry: 1
    bantime: 1h
""" if with_b else ""
    return f"""
reconcile: {{interval: 1h}}
allowlist_self: false
jails:
  sshd:
    files: ["{a}"]
    filter: sshd
    maxretry: {a_maxretry}
    findtime: 10m
    bantime: 1h{b_jail}
"""


def test_reload_rebuilds_jails_and_tracker_policies(netns: NetNS, tmp_path: Path) -> None:
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("")
    b.write_text("")
    d = DaemonProc(netns, tmp_path / "d", config(a, b, a_maxretry=5, with_b=True)).start()
    try:
        append(a, failures("198.51.100.1", 2))  # counted under maxretry 5: no ban yet
        append(b, failures("198.51.100.50", 1))
        wait_for(lambda: "198.51.100.50" in banned(netns), what="the web jail's ban")
        wait_for(lambda: d.cli_json("status")["jails"][0]["failures"] == 2, what="sshd counting 2 failures")
        d.config_path.write_text("# a comment moves every line\n" + config(a, b, a_maxretry=3, with_b=False))
        r = d.cli("reload")
        assert r.returncode == 0, r.stderr
        assert "configuration reloaded" in d.log()
        assert "jails removed: web" in d.log() and "jails changed: sshd" in d.log()
        # the removed jail no longer bans ...
        append(b, failures("198.51.100.51", 1))
        # ... and sshd's third failure bans under the new maxretry 3, the first two still counted
        append(a, failures("198.51.100.1", 1))
        wait_for(lambda: "198.51.100.1" in banned(netns), what="the ban under the new maxretry")
        append(a, failures("198.51.100.2", 3))  # a marker: a's lines are processed in order
        wait_for(lambda: "198.51.100.2" in banned(netns), what="the marker ban")
        assert "198.51.100.51" not in banned(netns)
        assert [j["name"] for j in d.cli_json("status")["jails"]] == ["sshd"]
        # adding a jail back starts it on the same file
        d.config_path.write_text(config(a, b, a_maxretry=3, with_b=True))
        assert d.cli("reload").returncode == 0
        append(b, failures("198.51.100.52", 1))
        wait_for(lambda: "198.51.100.52" in banned(netns), what="the re-added jail's ban")
    finally:
        d.close()


def feeds_config(local: Path, *, with_feed: bool) -> str:
    feed = f'feeds:\n  local: {{path: "{local}", blocklist: feeds}}\n' if with_feed else ""
    return f"""
reconcile: {{interval: 1h}}
allowlist_self: false
blocklists:
  default: {{timeout: 1h}}
  feeds: {{timeout: permanent}}
{feed}"""


def test_reload_starts_and_stops_feeds(netns: NetNS, tmp_path: Path) -> None:
    local = tmp_path / "local.txt"
    local.write_text("45.0.0.1\n45.0.1.0/24\n")
    d = DaemonProc(netns, tmp_path / "d", feeds_config(local, with_feed=False)).start()
    try:
        d.config_path.write_text(feeds_config(local, with_feed=True))
        r = d.cli("reload")
        assert r.returncode == 0 and "feeds added: local" in r.stdout + r.stderr + d.log(), r.stderr
        wait_for(lambda: set(netns.set_elements("nftblock", "feeds_net4")) == {"45.0.0.1", "45.0.1.0/24"},
                 what="the added feed")
        assert [f["name"] for f in d.cli_json("feeds")["feeds"]] == ["local"]
        d.config_path.write_text(feeds_config(local, with_feed=False))
        assert d.cli("reload").returncode == 0
        assert "feeds removed: local" in d.log() and "blocklists no longer fed: feeds" in d.log()
        assert netns.set_elements("nftblock", "feeds_ip4") == {} == netns.set_elements("nftblock", "feeds_net4")
        assert d.cli_json("feeds")["feeds"] == []
        # the blocklist is an ordinary one again: the CLI may ban into it
        assert d.cli("ban", "--set", "feeds", "45.0.0.9").returncode == 0
    finally:
        d.close()
