"""JournalSource against a real systemd-journald started by the test (see tests/helpers/journald.py)."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from nftblockd.sources.base import MemoryPositionStore, SourceError
from nftblockd.sources.journal import JournalSource
from tests.helpers.journald import Journald, unit_name
from tests.helpers.sources import running, wait_for_condition

SSHD = [("SYSLOG_IDENTIFIER", "sshd")]


def source(jd: Journald, matches: list[tuple[str, str]] | None = None,
           store: MemoryPositionStore | None = None, **kw: Any) -> JournalSource:
    kw.setdefault("save_interval", 0)
    return JournalSource("sshd", matches or SSHD, store if store is not None else MemoryPositionStore(),
                         path=str(jd.journal_dir), **kw)


async def test_starts_at_the_tail_and_follows_matching_entries(jd: Journald) -> None:
    jd.send("old entry", SYSLOG_IDENTIFIER="sshd")
    await jd.sync()
    async with running(source(jd)) as c:
        t0 = time.time()
        jd.send("Failed password for root from 192.0.2.1 port 22 ssh2", SYSLOG_IDENTIFIER="sshd")
        jd.send("not for us", SYSLOG_IDENTIFIER="cron")
        jd.send("Invalid user admin from 192.0.2.2", SYSLOG_IDENTIFIER="sshd")
        texts = await c.wait_lines(2)
        t1 = time.time()
    assert texts == ["Failed password for root from 192.0.2.1 port 22 ssh2",
                     "Invalid user admin from 192.0.2.2"]
    line = c.lines[0]
    assert line.source == "sshd"
    assert line.time is not None and t0 - 1 <= line.time <= t1 + 1


async def test_first_start_with_no_matching_entry_yet_misses_nothing(jd: Journald) -> None:
    # sd-journal 252 skips entries after a seek_tail() that found no matching entry; the source must not.
    async with running(source(jd, [("SYSLOG_IDENTIFIER", "brand-new")])) as c:
        for i in range(3):
            jd.send(f"first {i}", SYSLOG_IDENTIFIER="brand-new")
        assert await c.wait_lines(3) == ["first 0", "first 1", "first 2"]


async def test_same_field_ors_different_fields_and(jd: Journald) -> None:
    matches = [("SYSLOG_IDENTIFIER", "sshd"), ("SYSLOG_IDENTIFIER", "dropbear"), ("PRIORITY", "4")]
    async with running(source(jd, matches)) as c:
        jd.send("sshd warning", SYSLOG_IDENTIFIER="sshd", PRIORITY="4")
        jd.send("sshd info", SYSLOG_IDENTIFIER="sshd", PRIORITY="6")
        jd.send("cron warning", SYSLOG_IDENTIFIER="cron", PRIORITY="4")
        jd.send("dropbear warning", SYSLOG_IDENTIFIER="dropbear", PRIORITY="4")
        jd.send("end marker", SYSLOG_IDENTIFIER="dropbear", PRIORITY="4")
        assert await c.wait_lines(3) == ["sshd warning", "dropbear warning", "end marker"]


async def test_systemd_unit_match_uses_journald_trusted_field(jd: Journald) -> None:
    unit = unit_name()
    async with running(source(jd, [("_SYSTEMD_UNIT", unit)])) as c:
        jd.send("same text, but not from the unit", SYSLOG_IDENTIFIER="sshd", _SYSTEMD_UNIT=unit)  # forged
        await jd.send_as_unit(unit, "Failed password for invalid user x from 198.51.100.7",
                              SYSLOG_IDENTIFIER="sshd")
        assert await c.wait_lines(1) == ["Failed password for invalid user x from 198.51.100.7"]
        await jd.sync()
        assert len(c.lines) == 1


async def test_cursor_is_saved_and_resumed_without_dup_or_skip(jd: Journald) -> None:
    store = MemoryPositionStore()
    async with running(source(jd, store=store)) as c:
        jd.send("one", SYSLOG_IDENTIFIER="sshd")
        jd.send("two", SYSLOG_IDENTIFIER="sshd")
        await c.wait_lines(2)
    assert store.get("journal:sshd")
    jd.send("three (while stopped)", SYSLOG_IDENTIFIER="sshd")
    async with running(source(jd, store=store)) as c2:
        jd.send("four", SYSLOG_IDENTIFIER="sshd")
        assert await c2.wait_lines(2) == ["three (while stopped)", "four"]
        await jd.sync()
    assert c2.texts == ["three (while stopped)", "four"]


async def test_cursor_saves_are_bounded(jd: Journald) -> None:
    store = MemoryPositionStore()
    async with running(source(jd, store=store, save_interval=3600)) as c:
        for i in range(200):
            jd.send(f"m{i}", SYSLOG_IDENTIFIER="sshd")
        await c.wait_lines(200)
        assert store.writes == 0
    assert store.writes == 1


async def test_unusable_saved_cursor_starts_at_the_tail(jd: Journald) -> None:
    store = MemoryPositionStore({"journal:sshd": "not-a-cursor"})
    jd.send("old", SYSLOG_IDENTIFIER="sshd")
    await jd.sync()
    async with running(source(jd, store=store)) as c:
        jd.send("new", SYSLOG_IDENTIFIER="sshd")
        assert await c.wait_lines(1) == ["new"]


async def test_rotation_and_vacuum_mid_stream_lose_nothing(jd: Journald) -> None:
    src = source(jd)
    async with running(src) as c:
        n = 0
        for _ in range(4):
            for _ in range(250):
                jd.send(f"m{n}", SYSLOG_IDENTIFIER="sshd")
                n += 1
            await jd.rotate()
            for _ in range(250):
                jd.send(f"m{n}", SYSLOG_IDENTIFIER="sshd")
                n += 1
            await c.wait_lines(n, timeout=20)
            assert jd.vacuum()  # the archived file, already read
        await wait_for_condition(lambda: src.stats.rotations >= 4, what="INVALIDATE seen")
    assert c.texts == [f"m{i}" for i in range(n)]


async def test_rotation_while_blocked_by_back_pressure_loses_nothing(jd: Journald) -> None:
    async with running(source(jd, batch_size=10), maxsize=2) as c:
        c.consume.clear()
        for i in range(300):
            jd.send(f"m{i}", SYSLOG_IDENTIFIER="sshd")
        await wait_for_condition(c.queue.full, what="queue full")
        await jd.rotate()
        for i in range(300, 600):
            jd.send(f"m{i}", SYSLOG_IDENTIFIER="sshd")
        await jd.sync()
        c.consume.set()
        assert await c.wait_lines(600, timeout=20) == [f"m{i}" for i in range(600)]


async def test_cancelled_while_blocked_saves_only_what_was_handed_over(jd: Journald) -> None:
    store = MemoryPositionStore()
    async with running(source(jd, store=store, save_interval=3600, batch_size=5), maxsize=2) as c:
        c.consume.clear()
        for i in range(50):
            jd.send(f"m{i}", SYSLOG_IDENTIFIER="sshd")
        await wait_for_condition(c.queue.full, what="queue full")
    n = len(c.texts)
    assert 0 < n < 50
    assert c.texts == [f"m{i}" for i in range(n)]
    async with running(source(jd, store=store)) as c2:
        assert await c2.wait_lines(50 - n) == [f"m{i}" for i in range(n, 50)]


async def test_binary_invalid_multiline_and_overlong_messages(jd: Journald) -> None:
    src = source(jd, max_line=1000)
    async with running(src) as c:
        jd.send(b"bad \xff\xfe from 203.0.113.9", SYSLOG_IDENTIFIER="sshd")
        jd.send(b"nul\x00inside", SYSLOG_IDENTIFIER="sshd")
        jd.send("first line\nsecond line", SYSLOG_IDENTIFIER="sshd")
        jd.send("x" * 5000, SYSLOG_IDENTIFIER="sshd")
        jd.send(None, SYSLOG_IDENTIFIER="sshd", OTHER="no message field")
        jd.send("after", SYSLOG_IDENTIFIER="sshd")
        texts = await c.wait_lines(4)
    # NUL bytes are removed before matching and counted, never a line end (docs/limits.md)
    assert texts == ["bad \ufffd\ufffd from 203.0.113.9", "nulinside", "first line\nsecond line", "after"]
    assert (src.stats.invalid_utf8, src.stats.overlong, src.stats.nul) == (1, 1, 1)


async def test_files_option_reads_given_journal_files(jd: Journald) -> None:
    files = [str(p) for p in jd.journal_dir.glob("*/system.journal")]
    src = JournalSource("sshd", SSHD, MemoryPositionStore(), files=files, save_interval=0)
    async with running(src) as c:
        jd.send("via files=", SYSLOG_IDENTIFIER="sshd")
        assert await c.wait_lines(1) == ["via files="]


async def test_a_started_journald_has_written_its_files_header(jd: Journald) -> None:
    # The flaky ENODATA of the test above: journald's system.journal exists from its open(O_CREAT) on, and
    # sd-journal refuses a file shorter than a header with ENODATA when it is named in files= (a directory
    # skips it). Journald.start() now returns only after journald's event loop ran, i.e. after the header.
    for p in jd.journal_dir.glob("*/system.journal"):
        with p.open("rb") as f:
            assert f.read(8) == b"LPKSHHRH"


def test_a_journal_file_without_a_header_is_enodata_when_named_and_skipped_in_a_directory(tmp_path: Path) -> None:
    import errno

    from systemd import journal

    (tmp_path / "system.journal").touch()  # what a reader can meet between journald's open and its header
    with pytest.raises(OSError) as exc:
        journal.Reader(files=[str(tmp_path / "system.journal")])
    assert exc.value.errno == errno.ENODATA
    journal.Reader(path=str(tmp_path)).close()


async def test_a_journal_that_cannot_be_opened_is_a_source_error(tmp_path: Path) -> None:
    src = JournalSource("sshd", SSHD, MemoryPositionStore(), files=[str(tmp_path / "missing.journal")])
    with pytest.raises(SourceError, match="cannot open"):
        await src.run(asyncio.Queue())


def test_bad_arguments_are_refused() -> None:
    store = MemoryPositionStore()
    with pytest.raises(ValueError, match="needs matches"):
        JournalSource("x", [], store)
    with pytest.raises(ValueError, match="not a journal field"):
        JournalSource("x", [("_systemd_unit", "a")], store)
    with pytest.raises(ValueError, match="newline"):
        JournalSource("x", [("A", "b\nc")], store)
    with pytest.raises(ValueError, match="at most one"):
        JournalSource("x", SSHD, store, path="/a", namespace="b")


# -- no journal to read (issue 13, item 7) --------------------------------------------------------------------


async def test_a_journal_with_no_files_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A journal jail on a host without journald (or a journal directory with nothing in it) started silently
    # with 0 files and 0 errors.
    empty = tmp_path / "journal"
    empty.mkdir()
    src = JournalSource("sshd", [("SYSLOG_IDENTIFIER", "sshd")], MemoryPositionStore(), path=str(empty))
    with caplog.at_level("INFO"):
        async with running(src):
            assert src.missing() == [f"no journal files in {empty}"]
    assert f"no journal files in {empty} yet" in caplog.text


async def test_no_journald_at_all_is_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from systemd import journal

    from nftblockd.sources import journal as journal_source

    probe = journal.Reader(journal.LOCAL_ONLY | journal.SYSTEM_ONLY)
    has_files = probe.get_usage() > 0
    probe.close()
    if has_files:
        pytest.skip("this host has a local journal")
    monkeypatch.setattr(journal_source, "JOURNALD_SOCKET", str(tmp_path / "no-such-socket"))
    src = JournalSource("sshd", [("SYSLOG_IDENTIFIER", "sshd")], MemoryPositionStore())
    with caplog.at_level("WARNING"):
        async with running(src):
            assert src.stats.errors == 1 and "systemd-journald is not running" in src.missing()[0]
    assert "systemd-journald is not running" in caplog.text


async def test_the_time_is_when_the_message_was_sent_not_when_journald_wrote_it(jd: Journald) -> None:
    # A syslog datagram carries the kernel's receive time (journald's _SOURCE_REALTIME_TIMESTAMP); a journald
    # that falls behind writes the entry later (__REALTIME_TIMESTAMP). fail2ban takes the first; so do we.
    import os
    import signal
    import socket

    async with running(source(jd)) as c:
        os.kill(jd.pid, signal.SIGSTOP)
        try:
            sent = time.time()
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(b"<38>sshd[42]: Invalid user admin from 192.0.2.7 port 22", str(jd.sockets / "dev-log"))
            await asyncio.sleep(0.5)  # not a wait for something: the gap journald falls behind by
        finally:
            os.kill(jd.pid, signal.SIGCONT)
        resumed = time.time()
        assert await c.wait_lines(1) == ["Invalid user admin from 192.0.2.7 port 22"]
    line_time = c.lines[0].time
    assert line_time is not None and sent - 0.1 <= line_time < resumed - 0.3


def test_test_filter_reads_the_journal_as_a_jail_does(jd: Journald, tmp_path: Path) -> None:
    # `nftblock test-filter sshd --journal SYSLOG_IDENTIFIER=sshd --journal-dir DIR`: the matching entries
    # from the head, as "HOST IDENT[PID]: MESSAGE", matched stamped (a date-like user name stays text), each
    # match at its entry's time
    import io
    import json

    from nftblockd.detect.testfilter import run

    t0 = time.time()
    jd.send("Invalid user Dec  1 10:00:00 from 192.0.2.8 port 22", SYSLOG_IDENTIFIER="sshd", SYSLOG_PID="7")
    jd.send("Failed password for root from 2001:db8::9 port 22 ssh2", SYSLOG_IDENTIFIER="sshd", SYSLOG_PID="7")
    jd.send("Failed password for root from 192.0.2.99 port 22 ssh2", SYSLOG_IDENTIFIER="cron")
    asyncio.run(jd.sync())
    t1 = time.time()
    out, err = io.StringIO(), io.StringIO()
    assert run("sshd", None, json_output=True, out=out, err=err, journal=[("SYSLOG_IDENTIFIER", "sshd")],
               journal_dir=str(jd.journal_dir)) == 0, err.getvalue()
    doc = json.loads(out.getvalue())
    assert doc["lines"] == 2 and [m["host"] for m in doc["matches"]] == ["192.0.2.8", "2001:db8::9"]
    for m in doc["matches"]:
        assert t0 - 1 <= datetime.fromisoformat(m["time"]).timestamp() <= t1 + 1
    err = io.StringIO()
    assert run("sshd", None, json_output=True, out=out, err=err, journal=[("SYSLOG_IDENTIFIER", "sshd")],
               journal_dir=str(tmp_path / "nothing")) == 1
    assert err.getvalue().startswith("test-filter: ") and err.getvalue().count("\n") == 1
