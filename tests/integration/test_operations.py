"""What an operator meets first, with the real daemon in a namespace: the shipped example config on a
journald-only system (Debian 12), a log file that does not exist yet, and reloads with a verdict."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers.daemon import DaemonProc
from tests.helpers.journald import Journald
from tests.helpers.netns import NetNS, wait_for

REPO = Path(__file__).resolve().parents[2]
NOT_CLEAN = re.compile(r" (WARNING|ERROR|CRITICAL) ")


def sshd_line(addr: str, n: int, daemon: str = "sshd") -> str:
    return (f"{time.strftime('%b %e %H:%M:%S')} host {daemon}[{4000 + n}]: Failed password for root from {addr} "
            f"port {40000 + n} ssh2\n")


async def test_the_example_config_bans_from_the_journal_and_starts_without_a_warning(
        netns: NetNS, tmp_path: Path, jd: Journald) -> None:
    """Debian 12 has no /var/log/auth.log without rsyslog: the shipped sshd jail reads ssh.service's journal
    entries, OpenSSH >= 9.8's `sshd-session` included. Only where the journal lives is changed here."""
    cfg = yaml.safe_load((REPO / "config" / "nftblockd.yaml").read_text())
    assert cfg["jails"]["sshd"]["journal"] == {"matches": {"_SYSTEMD_UNIT": "ssh.service"}}
    assert "files" not in cfg["jails"]["sshd"]
    cfg["jails"]["sshd"]["journal"]["path"] = str(jd.journal_dir)
    d = DaemonProc(netns, tmp_path / "d", yaml.safe_dump(cfg)).start()
    try:
        # entries anyone may write with any identifier: not from the unit, never counted
        for i in range(3):
            jd.send(f"Failed password for root from 198.51.100.66 port {40000 + i} ssh2", SYSLOG_IDENTIFIER="sshd")
        for i, ident in enumerate(("sshd", "sshd-session", "sshd-session")):
            await jd.send_as_unit("ssh.service", f"Failed password for invalid user admin from 198.51.100.7 "
                                  f"port {41000 + i} ssh2", SYSLOG_IDENTIFIER=ident)
        wait_for(lambda: "198.51.100.7" in netns.set_elements("nftblock", "default_ip4"), timeout=15,
                 what="the journal attacker banned")
        assert "198.51.100.66" not in netns.set_elements("nftblock", "default_ip4")
        jail = d.cli_json("status")["jails"][0]
        assert (jail["name"], jail["failures"], jail["bans"], jail["missing"]) == ("sshd", 3, 1, [])
        assert d.stop() == 0
        assert not NOT_CLEAN.search(d.log()), d.log()
    finally:
        d.close()


@pytest.fixture
def missing_log(netns: NetNS, tmp_path: Path) -> Iterator[tuple[DaemonProc, Path]]:
    log = tmp_path / "later" / "auth.log"
    d = DaemonProc(netns, tmp_path / "d", f"jails: {{sshd: {{files: ['{log}'], filter: sshd, maxretry: 2}}}}\n")
    yield d.start(), log
    d.close()


def test_a_missing_log_file_is_reported_until_it_appears_then_followed(
        netns: NetNS, missing_log: tuple[DaemonProc, Path]) -> None:
    d, log = missing_log
    why = f"{log}: its directory {log.parent} does not exist"
    assert f"WARNING nftblockd.sources.tail: source sshd: {why}; it will be followed as soon as it appears" in d.log()
    assert d.cli_json("status")["jails"][0]["missing"] == [why]
    assert f"    not found: {why}\n" in d.cli("status").stdout
    log.parent.mkdir()
    log.write_text(sshd_line("198.51.100.8", 1) + sshd_line("198.51.100.8", 2))
    wait_for(lambda: "198.51.100.8" in netns.set_elements("nftblock", "default_ip4"), what="the ban")
    assert d.cli_json("status")["jails"][0]["missing"] == []


CONFIG = """\
blocklists: {default: {timeout: 1h}}
allowlist: [192.0.2.0/24]
jails: {}
"""


@pytest.fixture
def daemon(netns: NetNS, tmp_path: Path) -> Iterator[DaemonProc]:
    d = DaemonProc(netns, tmp_path / "d", CONFIG).start()
    yield d
    d.close()


def test_reload_verdicts_compare_meaning_and_a_refusal_fails_the_command(daemon: DaemonProc) -> None:
    r = daemon.cli("reload")
    assert r.returncode == 0 and r.stdout.startswith("configuration reloaded from "), r.stderr
    daemon.config_path.write_text("# a comment line at the top moves every line down\n\n" + CONFIG)
    assert daemon.cli("reload").returncode == 0  # the same blocklists, at other lines
    daemon.config_path.write_text(CONFIG.replace("192.0.2.0/24", "192.0.2.0/25"))
    assert daemon.cli("reload").returncode == 0
    assert daemon.cli_json("check", "192.0.2.200")["allowlisted"] is None  # in force

    daemon.config_path.write_text(CONFIG.replace("1h", "2h"))
    r = daemon.cli("reload")
    assert r.returncode == 1
    assert r.stderr == "nftblock: reload refused: blocklists changed; restart nftblockd to apply\n"
    daemon.config_path.write_text("blocklists: {default: {timeout: soon}}\nallowlist: [10.0.0.1/8]\n")
    r = daemon.cli("reload")
    assert r.returncode == 1
    assert f"{daemon.config_path}:1: blocklists.default.timeout" in r.stderr
    assert f"{daemon.config_path}:2: allowlist.0" in r.stderr and "host bits set" in r.stderr
    assert daemon.cli_json("check", "192.0.2.200")["allowlisted"] is None  # the running config stayed
    assert "reload refused" in daemon.log()
