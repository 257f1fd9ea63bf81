"""Log jails end to end: lines appended to a real file → the real daemon in a namespace → the kernel set."""

from __future__ import annotations

import ipaddress
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.daemon import DaemonProc
from tests.helpers.netns import NetNS, wait_for


def config(log: Path) -> str:
    return f"""
allowlist: [192.0.2.0/24]
reconcile: {{interval: 1h}}
jails:
  sshd:
    files: ["{log}"]
    filter: sshd
    maxretry: 3
    findtime: 10m
    bantime: 1h
    ipv6_prefix: 64
"""


_pids = iter(range(1000, 10**6))


def failures(addr: str, n: int, port: int = 40000) -> str:
    """n sshd failures, each from its own connection (its own pid, as sshd logs them)."""
    stamp = time.strftime("%b %e %H:%M:%S")
    return "".join(f"{stamp} host sshd[{next(_pids)}]: Failed password for invalid user admin from {addr} "
                   f"port {port + i} ssh2\n" for i in range(n))


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def banned(ns: NetNS) -> set[str]:
    return set(ns.set_elements("nftblock", "default_ip4")) | set(ns.set_elements("nftblock", "default_net6"))


@pytest.fixture
def setup(netns: NetNS, tmp_path: Path) -> Iterator[tuple[DaemonProc, Path]]:
    log = tmp_path / "auth.log"
    log.write_text("")
    d = DaemonProc(netns, tmp_path / "d", config(log)).start()
    yield d, log
    d.close()


def test_threshold_bans_and_below_threshold_does_not(netns: NetNS, setup: tuple[DaemonProc, Path]) -> None:
    d, log = setup
    append(log, failures("198.51.100.1", 2) + failures("198.51.100.2", 3) + failures("2001:db8:bad::66", 3)
           + failures("192.0.2.7", 5))
    wait_for(lambda: {"198.51.100.2", "2001:db8:bad::/64"} <= banned(netns), what="jail bans")
    # the marker: a later ban proves the earlier lines were all processed
    append(log, failures("198.51.100.99", 3))
    wait_for(lambda: "198.51.100.99" in banned(netns), what="marker ban")
    assert "198.51.100.1" not in banned(netns)
    assert "192.0.2.7" not in banned(netns)  # allowlisted
    ban = next(b for b in d.cli_json("list")["bans"] if b["target"] == "198.51.100.2")
    assert ban["jail"] == "sshd" and ban["origin"] == "jail"
    assert 3500 < ban["expires_in"] <= 3600


def test_rotation_by_rename_and_create_misses_nothing(netns: NetNS, setup: tuple[DaemonProc, Path]) -> None:
    _d, log = setup
    append(log, failures("198.51.100.10", 2))
    os.rename(log, log.with_suffix(".log.1"))
    append(log.with_suffix(".log.1"), failures("198.51.100.11", 3))  # written to the old file after the rename
    log.write_text("")
    append(log, failures("198.51.100.10", 1))
    wait_for(lambda: {"198.51.100.10", "198.51.100.11"} <= banned(netns), what="bans across a rotation")


def test_copytruncate_misses_nothing(netns: NetNS, setup: tuple[DaemonProc, Path]) -> None:
    d, log = setup
    append(log, failures("198.51.100.20", 2))
    wait_for(lambda: d.cli_json("status") is not None and _lines(d) >= 2, what="lines read")
    shutil.copy(log, log.with_suffix(".log.1"))
    with log.open("r+") as f:
        f.truncate(0)
    append(log, failures("198.51.100.20", 1))
    wait_for(lambda: "198.51.100.20" in banned(netns), what="ban after copytruncate")


def _lines(d: DaemonProc) -> int:
    st = d.cli_json("status")
    return sum(j.get("lines", 0) for j in st.get("jails", []))


def test_restart_does_not_count_twice(netns: NetNS, setup: tuple[DaemonProc, Path]) -> None:
    d, log = setup
    append(log, failures("198.51.100.30", 2))
    wait_for(lambda: _lines(d) >= 2, what="lines read before restart")
    assert d.stop() == 0
    d.start()
    append(log, failures("198.51.100.31", 3))
    wait_for(lambda: "198.51.100.31" in banned(netns), what="marker after restart")
    assert "198.51.100.30" not in banned(netns)  # its 2 lines were not read again
    # had the 2 old lines been read again, this third failure would make 3 (or 4) and ban
    append(log, failures("198.51.100.30", 1) + failures("198.51.100.32", 3))
    wait_for(lambda: "198.51.100.32" in banned(netns), what="second marker")
    assert "198.51.100.30" not in banned(netns)
    assert sum(j["lines"] for j in d.cli_json("status")["jails"]) == 7  # 3 + 1 + 3 since the restart


def test_lines_written_while_down_are_read_after_restart(netns: NetNS, setup: tuple[DaemonProc, Path]) -> None:
    d, log = setup
    assert d.stop() == 0
    append(log, failures("198.51.100.40", 3))
    d.start()
    wait_for(lambda: "198.51.100.40" in banned(netns), what="ban from lines written while stopped")


def test_restart_keeps_bans_and_escalation(netns: NetNS, setup: tuple[DaemonProc, Path]) -> None:
    d, log = setup
    append(log, failures("198.51.100.50", 3))
    wait_for(lambda: "198.51.100.50" in banned(netns), what="first ban")
    d.cli("ban", "203.0.113.5", "--timeout", "2h")
    assert d.stop() == 0
    netns.nft("flush", "set", "inet", "nftblock", "default_ip4", check=False)  # e.g. after a reboot
    d.start()
    assert {"198.51.100.50", "203.0.113.5"} <= banned(netns)
    targets = {b["target"]: b for b in d.cli_json("list")["bans"]}
    assert targets["198.51.100.50"]["jail"] == "sshd"
    # second offence after the ban is lifted: escalated duration (2h)
    d.cli("unban", "198.51.100.50")
    append(log, failures("198.51.100.50", 3, port=41000))
    wait_for(lambda: "198.51.100.50" in banned(netns), what="second ban")
    ban = {b["target"]: b for b in d.cli_json("list")["bans"]}["198.51.100.50"]
    assert ban["expires_in"] > 7000


async def test_journal_jail_bans_from_a_real_journald(netns: NetNS, tmp_path: Path) -> None:
    from tests.helpers.journald import Journald, skip_reason
    from tests.helpers.sources import wait_for_condition
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    jd = await Journald(tmp_path / "jd").start()
    d = DaemonProc(netns, tmp_path / "d", f"""
reconcile: {{interval: 1h}}
jails:
  sshd:
    journal: {{matches: {{SYSLOG_IDENTIFIER: [sshd, sshd-session]}}, path: "{jd.journal_dir}"}}
    filter: sshd
    maxretry: 3
""")
    try:
        jd.send("Server listening on 0.0.0.0 port 22.", SYSLOG_IDENTIFIER="sshd", SYSLOG_PID="10")
        await jd.sync()
        d.start()
        for i in range(3):
            jd.send(f"Failed password for invalid user admin from 198.51.100.60 port {4000 + i} ssh2",
                    SYSLOG_IDENTIFIER="sshd-session", SYSLOG_PID=str(20 + i))
        jd.send("Failed password for root from 198.51.100.61 port 4000 ssh2", SYSLOG_IDENTIFIER="cron",
                SYSLOG_PID="30")  # not matched by the journal match: never read
        await jd.sync()
        await wait_for_condition(lambda: "198.51.100.60" in banned(netns), 10, "journal ban")
        assert "198.51.100.61" not in banned(netns)
        # restart: the cursor is resumed, nothing counted twice, entries written while down are read
        assert d.stop() == 0
        for i in range(2):
            jd.send(f"Failed password for root from 198.51.100.62 port {4100 + i} ssh2",
                    SYSLOG_IDENTIFIER="sshd", SYSLOG_PID=str(40 + i))
        await jd.sync()
        d.start()
        jd.send("Failed password for root from 198.51.100.62 port 4200 ssh2", SYSLOG_IDENTIFIER="sshd",
                SYSLOG_PID="50")
        await jd.sync()
        await wait_for_condition(lambda: "198.51.100.62" in banned(netns), 10, "ban across a restart")
        lines = sum(j["lines"] for j in d.cli_json("status")["jails"])
        assert lines == 3  # two written while down + one after: the earlier entries were not read again
    finally:
        d.close()
        jd.stop()


def test_recidive_jail_counts_bans_across_jails(netns: NetNS, tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    log.write_text("")
    d = DaemonProc(netns, tmp_path / "d", f"""
reconcile: {{interval: 1h}}
blocklists: {{default: {{}}, long: {{}}}}
jails:
  sshd: {{files: ["{log}"], filter: sshd, maxretry: 1, findtime: 10m, bantime: 1m}}
  recidive: {{recidive: true, maxretry: 2, findtime: 1d, bantime: 1w, blocklist: long}}
""").start()
    try:
        append(log, failures("198.51.100.70", 1))
        wait_for(lambda: "198.51.100.70" in banned(netns), what="first sshd ban")
        d.cli("unban", "198.51.100.70")
        append(log, failures("198.51.100.70", 1, port=41000))
        wait_for(lambda: "198.51.100.70" in netns.set_elements("nftblock", "long_ip4"), what="recidive ban")
        ban = {(b["target"], b["jail"]): b for b in d.cli_json("list")["bans"]}[("198.51.100.70", "recidive")]
        assert ban["blocklist"] == "long" and ban["expires_in"] > 6 * 86400
    finally:
        d.close()


def test_a_burst_takes_the_bulk_path_and_keeps_history(netns: NetNS, setup: tuple[DaemonProc, Path]) -> None:
    d, log = setup
    attackers = [f"198.51.100.{i}" for i in range(100, 160)]  # more than JAIL_BULK_MIN in one batch
    append(log, "".join(failures(a, 3) for a in attackers))
    wait_for(lambda: set(attackers) <= banned(netns), what="every attacker of the burst")
    bans = {b["target"]: b for b in d.cli_json("list")["bans"]}
    first = bans[attackers[0]]
    assert first["jail"] == "sshd" and first["origin"] == "jail" and "3 failures" in first["reason"]
    assert "ban jail=sshd address=198.51.100.100 " in d.log()  # audited address by address
    assert d.stop() == 0
    netns.nft("flush", "set", "inet", "nftblock", "default_ip4", check=False)
    d.start()
    assert set(attackers) <= banned(netns)  # saved (as one packed row) and restored
    # the escalation history was saved too: a second offence is banned for twice as long
    d.cli("unban", attackers[5])
    append(log, failures(attackers[5], 3, port=42000))
    wait_for(lambda: attackers[5] in banned(netns), what="second ban")
    assert {b["target"]: b for b in d.cli_json("list")["bans"]}[attackers[5]]["expires_in"] > 7000
    assert attackers[6] in banned(netns)  # unbanning one address of a packed row leaves the others


def test_an_ipv6_burst_of_single_addresses(netns: NetNS, tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    log.write_text("")
    d = DaemonProc(netns, tmp_path / "d", config(log).replace("ipv6_prefix: 64", "ipv6_prefix: 128")).start()
    try:
        # a bulk-sized batch of /128 offenders, in the canonical text nft prints
        attackers = [str(ipaddress.IPv6Address(f"2001:db8:{i:x}::{i + 1:x}")) for i in range(40)]
        append(log, "".join(failures(a, 3) for a in attackers))
        wait_for(lambda: set(attackers) <= set(netns.set_elements("nftblock", "default_ip6")),
                 what="every IPv6 attacker in the hash set")
        listed = {b["target"]: b for b in d.cli_json("list")["bans"]}
        assert listed[attackers[0]]["jail"] == "sshd"
        assert d.stop() == 0
        d.start()
        assert set(attackers) <= set(netns.set_elements("nftblock", "default_ip6"))  # saved and restored
    finally:
        d.close()
