"""Journal lines against fail2ban's own systemd backend: the same entries in a real journald (the test's own,
tests/helpers/journald.py), read by nftblockd's JournalSource and matched as the daemon's journal jails
match them (stamped: no date search), and read by `fail2ban-regex systemd-journal[journalpath=...]`
(filtersystemd.formatJournalEntry + filter.processLine with the journal's date). Both with fail2ban's
sshd.conf; the failures (address and time) must be the same, messages that hold a date-like text included.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nftblockd.detect.filterload import load_filter
from nftblockd.detect.matcher import Match, MatchContext
from nftblockd.sources.base import MemoryPositionStore
from nftblockd.sources.journal import JournalSource
from tests.helpers.journald import Journald
from tests.helpers.sources import running

ROOT = Path(__file__).resolve().parents[2]
SSHD_CONF = Path("/etc/fail2ban/filter.d/sshd.conf")
_LINE = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ (?P<ident>[\w\-]+)\[(?P<pid>\d+)\]: (?P<msg>.*)$")


def _f2b_reads_journals() -> bool:
    """fail2ban-regex reads a journal only with Debian's python3-systemd (Makefile APT_PACKAGES)."""
    if shutil.which("fail2ban-regex") is None or not SSHD_CONF.is_file():
        return False
    return subprocess.run(["/usr/bin/python3", "-c", "import systemd.journal"], capture_output=True,
                          check=False).returncode == 0


pytestmark = pytest.mark.skipif(not _f2b_reads_journals(),
                                reason="fail2ban-regex with python3-systemd is not installed")


def messages() -> list[tuple[str, str, str]]:
    """(ident, pid, message): a brute-forced server's sshd lines, plus messages holding date-like texts."""
    sys.path.insert(0, str(ROOT))
    from bench.authlog import server_log

    out = []
    for line in server_log(400, seed=11):
        m = _LINE.match(line)
        if m is not None and m.group("ident") == "sshd":
            out.append((m.group("ident"), m.group("pid"), m.group("msg")))
    out += [("sshd", "900", "Invalid user Dec  1 10:00:00 from 192.0.2.3 port 22"),
            ("sshd", "901", "Failed password for invalid user 2026-12-01T10:00:00 from 192.0.2.4 port 22 ssh2"),
            ("sshd", "902", "Failed password for invalid user Jan  2 03:04:05 2026 from 192.0.2.5 port 22 ssh2"),
            ("sshd", "903", "Failed password for invalid user a\nb from 192.0.2.6 port 22 ssh2")]
    return out


def fail2ban_rows(jd: Journald) -> list[tuple[str, float]]:
    proc = subprocess.run(["fail2ban-regex", "-o", "row", "-m", "SYSLOG_IDENTIFIER=sshd",
                           f"systemd-journal[journalpath={jd.journal_dir}]", str(SSHD_CONF)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = []
    for line in proc.stdout.splitlines():
        if line.startswith("["):
            ip, when, _fields = ast.literal_eval(line.rstrip(","))
            rows.append((str(ip), float(when)))
    return rows


async def test_journal_failures_are_those_fail2bans_systemd_backend_finds(jd: Journald) -> None:
    msgs = messages()
    source = JournalSource("sshd", [("SYSLOG_IDENTIFIER", "sshd")], MemoryPositionStore(),
                           path=str(jd.journal_dir), syslog_format=True, save_interval=0)
    async with running(source) as c:
        await source.ready.wait()
        for ident, pid, msg in msgs:
            jd.send(msg, SYSLOG_IDENTIFIER=ident, SYSLOG_PID=pid)
        await c.wait_lines(len(msgs), timeout=20)
    await jd.sync()
    lines = c.lines
    flt = load_filter(f"{SSHD_CONF}[logtype=journal]")
    ctx = MatchContext()
    now = max(line.time or 0.0 for line in lines) + 1
    ours = []
    for i, r in flt.scan([line.text for line in lines], now, ctx, stamped=True):
        if isinstance(r, Match) and not r.ignored:
            assert r.time is None  # the journal's time is the line's, as JailRunner.process takes it
            ours.append((str(r.host), lines[i].time))
    theirs = fail2ban_rows(jd)
    assert len(theirs) > 50
    assert [ip for ip, _ in ours] == [ip for ip, _ in theirs]
    # fail2ban takes _SOURCE_REALTIME_TIMESTAMP (the sender's), the source __REALTIME_TIMESTAMP (journald's
    # receipt): the same moment here, within milliseconds
    assert all(t is not None and abs(t - w) < 1.0 for (_, t), (_, w) in zip(ours, theirs, strict=True))
    assert {"192.0.2.3", "192.0.2.4", "192.0.2.5", "192.0.2.6"} <= {ip for ip, _ in ours}
