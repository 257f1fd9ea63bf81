"""FileTail against real files in tmp_path and real inotify. No sleeps: every wait is a bounded poll."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, BinaryIO, cast

import pytest

from nftblockd.sources.base import MemoryPositionStore
from nftblockd.sources.tail import FilePosition, FileTail, missing_files
from tests.helpers.sources import running, wait_for_condition


def append(path: Path, *lines: str, raw: bytes = b"") -> None:
    with open(path, "ab") as f:
        f.write("".join(line + "\n" for line in lines).encode() + raw)


def writer_of(path: Path) -> BinaryIO:
    """A writer that keeps its descriptor, like a daemon writing its log (unbuffered)."""
    return open(path, "ab", buffering=0)


def tail(paths: list[Path] | Path, store: MemoryPositionStore | None = None, **kw: Any) -> FileTail:
    kw.setdefault("save_interval", 0)
    names = [str(p) for p in (paths if isinstance(paths, list) else [paths])]
    return FileTail("web", names, store if store is not None else MemoryPositionStore(), **kw)


async def test_starts_at_the_end_and_follows_appends(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    append(log, "old 1", "old 2")
    async with running(tail(log)) as c:
        append(log, "new 1", "new 2")
        assert await c.wait_lines(2) == ["new 1", "new 2"]
        assert c.lines[0].source == "web"
        assert c.lines[0].time is None
    assert c.source.stats.lines == 2


async def test_start_at_the_end_waits_for_an_unfinished_last_line(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    append(log, "old", raw=b"being writ")
    async with running(tail(log)) as c:
        append(log, "ten", "next")
        assert await c.wait_lines(2) == ["being written", "next"]


async def test_start_at_the_end_inside_an_overlong_last_line(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    append(log, "old", raw=b"y" * 300)
    async with running(tail(log, max_line=100)) as c:
        append(log, "rest of the long line", "next")
        assert await c.wait_lines(1) == ["next"]
    assert c.source.stats.overlong == 0  # not counted: the tailer joined in its middle


async def test_start_beginning_reads_existing_lines(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    append(log, "a", "b")
    async with running(tail(log, start="beginning")) as c:
        assert await c.wait_lines(2) == ["a", "b"]


async def test_resumes_from_the_saved_position_without_dup_or_skip(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    store = MemoryPositionStore()
    append(log, "before start")
    async with running(tail(log, store)) as c:
        append(log, "one", "two", raw=b"thr")
        await c.wait_lines(2)
        await wait_for_condition(lambda: c.source.stats.positions_saved >= 1)
    assert c.texts == ["one", "two"]
    saved = FilePosition.loads(store.get(f"tail:web:{log}"))
    assert saved is not None and saved.offset == len(b"before start\none\ntwo\n")
    append(log, "ee", "four")  # written while stopped, completing the partial line
    async with running(tail(log, store)) as c2:
        append(log, "five")
        assert await c2.wait_lines(3) == ["three", "four", "five"]


async def test_positions_are_saved_at_a_bounded_rate(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    store = MemoryPositionStore()
    async with running(tail(log, store, save_interval=3600, start="beginning")) as c:
        for i in range(50):
            append(log, f"line {i}")
        await c.wait_lines(50)
        assert store.writes == 0  # the next save is an hour away
    assert store.writes == 1  # ... and stopping saves once
    saved = FilePosition.loads(store.get(f"tail:web:{log}"))
    assert saved is not None and saved.offset == log.stat().st_size


async def test_rename_and_create_rotation_reads_the_old_file_to_its_end(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    append(log, "")
    async with running(tail(log)) as c:
        append(log, "a1", "a2")
        await c.wait_lines(2)
        with writer_of(log) as writer:  # the daemon's still open descriptor
            log.rename(tmp_path / "auth.log.1")
            writer.write(b"a3 written after the rename\n")
            append(log, "b1")  # the new file
            writer.write(b"a4\n")
        append(log, "b2")
        texts = await c.wait_lines(6)
    assert sorted(texts) == sorted(["a1", "a2", "a3 written after the rename", "a4", "b1", "b2"])
    assert texts.index("b2") > texts.index("b1")
    assert texts.index("a4") > texts.index("a3 written after the rename")
    assert c.source.stats.rotations == 1


async def test_rotated_file_is_followed_for_rotate_wait_then_closed(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    log.touch()
    src = tail(log, rotate_wait=3600)
    async with running(src) as c:
        with writer_of(log) as writer:
            log.rename(tmp_path / "auth.log.1")
            append(log, "new file")
            await c.wait_lines(1)
            writer.write(b"late line in the old file\n")  # after the tailer has seen the rotation
            assert await c.wait_lines(2) == ["new file", "late line in the old file"]
        assert src.draining() == [str(log)]  # its last known name
    src = tail(log, rotate_wait=0)
    async with running(src) as c:
        with writer_of(log) as writer:
            log.rename(tmp_path / "auth.log.2")
            append(log, "x")
            writer.write(b"unfinished")
            await c.wait_lines(2)
            await wait_for_condition(lambda: src.draining() == [], what="old file closed")
    assert c.texts == ["unfinished", "x"] or c.texts == ["x", "unfinished"]


async def test_copytruncate_reads_the_file_again_from_zero(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    log.touch()
    async with running(tail(log)) as c:
        append(log, "before 1", "before 2")
        await c.wait_lines(2)
        (tmp_path / "auth.log.1").write_bytes(log.read_bytes())
        os.truncate(log, 0)
        append(log, "after 1")
        append(log, "after 2")
        assert await c.wait_lines(4) == ["before 1", "before 2", "after 1", "after 2"]
    assert c.source.stats.truncations == 1


async def test_truncation_that_regrows_past_the_offset_is_seen_by_its_first_bytes(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    log.touch()
    src = tail(log, store := MemoryPositionStore())
    async with running(src) as c:
        append(log, "short")
        await c.wait_lines(1)
    assert store.get(f"tail:web:{log}")
    log.write_text("a different first line, longer than before\n")  # truncated and regrown while stopped
    async with running(tail(log, store)) as c:
        assert await c.wait_lines(1) == ["a different first line, longer than before"]
    assert c.source.stats.truncations == 1


async def test_delete_and_recreate(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    append(log, "")
    async with running(tail(log)) as c:
        append(log, "first life")
        await c.wait_lines(1)
        log.unlink()
        await wait_for_condition(lambda: c.source.stats.rotations == 1, what="deletion seen")
        append(log, "second life")
        assert await c.wait_lines(2) == ["first life", "second life"]


async def test_file_that_does_not_exist_yet_is_read_from_zero(tmp_path: Path) -> None:
    log = tmp_path / "later.log"
    async with running(src := tail(log)) as c:
        assert src.followed() == {}
        append(log, "hello", "world")
        assert await c.wait_lines(2) == ["hello", "world"]


async def test_directory_that_does_not_exist_yet(tmp_path: Path) -> None:
    log = tmp_path / "nginx" / "sub" / "error.log"
    async with running(tail(log)) as c:
        (tmp_path / "nginx").mkdir()
        (tmp_path / "nginx" / "sub").mkdir()
        append(log, "appeared")
        assert await c.wait_lines(1) == ["appeared"]
        append(log, "and grows")
        assert await c.wait_lines(2) == ["appeared", "and grows"]


async def test_missing_names_are_warned_at_start_reported_until_they_appear_then_read(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Debian 12 without rsyslog has no /var/log/auth.log: a jail on it must not silently read nothing."""
    here = tmp_path / "here.log"
    here.write_text("")
    later = tmp_path / "later.log"
    nested = tmp_path / "app" / "error.log"
    glob = tmp_path / "vhosts" / "*.log"
    (tmp_path / "vhosts").mkdir()
    caplog.set_level("INFO", logger="nftblockd.sources.tail")
    async with running(src := tail([here, later, nested, glob])) as c:
        expect = [f"{later} does not exist", f"{nested}: its directory {nested.parent} does not exist",
                  f"{glob}: no file matches"]
        assert src.missing() == expect
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == 3 and all("followed as soon as it appears" in w for w in warned)
        assert [w.split("; ")[0] for w in warned] == [f"source web: {e}" for e in expect]
        append(later, "one")
        (tmp_path / "app").mkdir()
        append(nested, "two")
        append(tmp_path / "vhosts" / "a.log", "three")
        await c.wait_lines(3)
        assert sorted(c.texts) == ["one", "three", "two"]
        assert src.missing() == []


def test_missing_files_names_what_a_config_would_not_find(tmp_path: Path) -> None:
    (tmp_path / "x.log").write_text("")
    (tmp_path / "hid").mkdir()
    (tmp_path / "hid" / ".hidden.log").write_text("")
    (tmp_path / "adir.log").mkdir()  # not a regular file
    assert missing_files([str(tmp_path / "x.log"), str(tmp_path / "x*.log"), str(tmp_path / "hid/.*.log")]) == []
    assert missing_files([str(tmp_path / "adir.log"), str(tmp_path / "*.gz"), str(tmp_path / "hid" / "*.log"),
                          str(tmp_path / "no" / "x.log")]) == [
        f"{tmp_path}/adir.log is a directory, not a regular file", f"{tmp_path}/*.gz: no file matches",
        f"{tmp_path}/hid/*.log: no file matches",  # as glob(): `*` does not match a leading dot
        f"{tmp_path}/no/x.log: its directory {tmp_path}/no does not exist"]


async def test_directory_deleted_and_recreated_without_spinning(tmp_path: Path) -> None:
    d = tmp_path / "app"
    d.mkdir()
    log = d / "app.log"
    log.touch()
    src = tail(log, rotate_wait=3600)  # the deleted file stays open: the new directory must not wait for it
    rounds = 0
    handle = src._handle

    async def counting(*args: Any) -> None:
        nonlocal rounds
        rounds += 1
        await handle(*args)

    src._handle = counting  # type: ignore[method-assign,assignment]
    async with running(src) as c:
        append(log, "before")
        await c.wait_lines(1)
        log.unlink()
        d.rmdir()
        await wait_for_condition(lambda: src.followed() == {})
        d.mkdir()
        append(log, "after")
        assert await c.wait_lines(2) == ["before", "after"]
        append(log, "again")
        assert await c.wait_lines(3) == ["before", "after", "again"]
    assert rounds < 50  # a watch re-added in a loop would have spun thousands of rounds by now


async def test_directory_renamed_away_and_recreated(tmp_path: Path) -> None:
    d = tmp_path / "app"
    d.mkdir()
    log = d / "app.log"
    log.touch()
    async with running(tail(log, rotate_wait=3600)) as c:
        append(log, "before")
        await c.wait_lines(1)
        d.rename(tmp_path / "app.old")
        d.mkdir()
        append(log, "after")
        append(tmp_path / "app.old" / "app.log", "late in the old one")
        assert sorted(await c.wait_lines(3)) == ["after", "before", "late in the old one"]


async def test_partial_last_line_is_held_until_its_newline(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    log.touch()
    async with running(src := tail(log)) as c:
        append(log, "whole", raw=b"par")
        await c.wait_lines(1)
        append(log, raw=b"tial")
        await wait_for_condition(lambda: src.followed()[str(log)] == log.stat().st_size)
        assert c.texts == ["whole"]
        append(log, "", "next")
        assert await c.wait_lines(3) == ["whole", "partial", "next"]


async def test_overlong_line_is_skipped_counted_and_sync_kept(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    log.touch()
    async with running(tail(log, max_line=100, chunk_size=64)) as c:
        append(log, "before", "x" * 1000, "after")
        assert await c.wait_lines(2) == ["before", "after"]
    assert c.source.stats.overlong == 1


async def test_invalid_utf8_is_replaced_and_counted(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    log.touch()
    async with running(tail(log)) as c:
        append(log, raw=b"bad \xff\xfe from 1.2.3.4\nfine\n")
        assert await c.wait_lines(2) == ["bad \ufffd\ufffd from 1.2.3.4", "fine"]
    assert c.source.stats.invalid_utf8 == 1


async def test_nul_bytes_are_removed_and_counted(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    log.touch()
    async with running(tail(log)) as c:
        append(log, raw=b"one\n\0\0\0\0two from 1.2.3.4\0\0\nthree\n")
        assert await c.wait_lines(3) == ["one", "two from 1.2.3.4", "three"]
    assert c.source.stats.nul == 1


async def test_glob_picks_up_new_files(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text("existing\n")
    (tmp_path / "notes.txt").touch()
    async with running(src := tail(tmp_path / "*.log")) as c:
        append(tmp_path / "b.log", "new file")
        append(tmp_path / "notes.txt", "not matched")
        append(tmp_path / ".hidden.log", "not matched either")
        append(tmp_path / "a.log", "appended")
        texts = await c.wait_lines(2)
        assert sorted(texts) == ["appended", "new file"]
        assert sorted(src.followed()) == [str(tmp_path / "a.log"), str(tmp_path / "b.log")]


async def test_glob_that_matches_the_rotated_name_never_reads_it_twice(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    log.touch()
    store = MemoryPositionStore()
    async with running(tail(tmp_path / "auth.log*", store)) as c:
        append(log, "one", "two")
        await c.wait_lines(2)
        log.rename(tmp_path / "auth.log.1")
        append(log, "three")
        await c.wait_lines(3)
        append(tmp_path / "auth.log.1", "four")
        assert await c.wait_lines(4) == ["one", "two", "three", "four"]
    async with running(tail(tmp_path / "auth.log*", store)) as c:
        append(log, "five")
        assert await c.wait_lines(1) == ["five"]


async def test_several_files_in_one_source(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    a, b = tmp_path / "a.log", tmp_path / "x" / "b.log"
    async with running(tail([a, b])) as c:
        append(a, "from a")
        append(b, "from b")
        assert sorted(await c.wait_lines(2)) == ["from a", "from b"]


async def test_rotation_while_stopped_finishes_the_old_file_first(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    store = MemoryPositionStore()
    log.touch()
    async with running(tail(log, store)) as c:
        append(log, "seen")
        await c.wait_lines(1)
    append(log, "unseen in old")
    log.rename(tmp_path / "auth.log.1")
    append(log, "in new")
    async with running(tail(log, store)) as c:
        assert await c.wait_lines(2) == ["unseen in old", "in new"]


async def test_new_file_since_last_run_is_read_from_zero(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    store = MemoryPositionStore()
    log.touch()
    async with running(tail(log, store)) as c:
        append(log, "seen")
        await c.wait_lines(1)
    log.unlink()
    append(log, "new 1", "new 2")
    async with running(tail(log, store)) as c:
        assert await c.wait_lines(2) == ["new 1", "new 2"]


async def test_back_pressure_stops_reading_and_loses_nothing(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    log.touch()
    store = MemoryPositionStore()
    src = tail(log, store, chunk_size=4096)
    async with running(src, maxsize=3) as c:
        c.consume.clear()
        append(log, *(f"line {i}" for i in range(5000)))
        await wait_for_condition(lambda: c.queue.full(), what="queue full")
        # The paused consumer took 1 chunk, 3 are queued, 1 is in hand: the rest waits in the file.
        assert src.followed()[str(log)] <= 5 * 4096 < log.stat().st_size
        c.consume.set()
        texts = await c.wait_lines(5000)
    assert texts == [f"line {i}" for i in range(5000)]
    assert src.stats.lines == 5000


async def test_cancelled_while_blocked_saves_exactly_what_was_handed_over(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    log.touch()
    store = MemoryPositionStore()
    src = tail(log, store, save_interval=3600, chunk_size=64)
    async with running(src, maxsize=2) as c:
        c.consume.clear()
        append(log, *(f"line {i}" for i in range(100)), raw=b"partial")
        await wait_for_condition(lambda: c.queue.full(), what="queue full")
    # stop() took the queued batches (and the one the paused consumer was waiting for), as the daemon drains
    # its queue before exiting; the batch in the tailer's hand when it was cancelled was not handed over.
    n = len(c.texts)
    assert 0 < n < 100
    assert c.texts == [f"line {i}" for i in range(n)]
    saved = json.loads(store.get(f"tail:web:{log}") or "{}")
    assert saved["offset"] == sum(len(f"line {i}\n") for i in range(n))
    async with running(tail(log, store)) as c2:
        append(log, "")
        assert await c2.wait_lines(101 - n) == [f"line {i}" for i in range(n, 100)] + ["partial"]


class FailingStore(MemoryPositionStore):
    def set(self, key: str, value: str) -> None:
        raise OSError("disk full")


async def test_a_failing_position_store_does_not_stop_reading(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    log.touch()
    async with running(tail(log, FailingStore())) as c:
        append(log, "still read")
        assert await c.wait_lines(1) == ["still read"]
    assert c.source.stats.errors >= 1
    assert c.source.stats.positions_saved == 0


def test_bad_configuration_is_refused() -> None:
    store = MemoryPositionStore()
    with pytest.raises(ValueError, match="file name only"):
        FileTail("x", ["/var/log/*/access.log"], store)
    with pytest.raises(ValueError, match="no files"):
        FileTail("x", [], store)
    with pytest.raises(ValueError, match="start"):
        FileTail("x", ["/a"], store, start="middle")  # type: ignore[arg-type]


def test_position_round_trip_and_garbage() -> None:
    pos = FilePosition(1, 2, 3, 4, "ab")
    assert FilePosition.loads(pos.dumps()) == pos
    for junk in (None, "", "{", "[]", '{"dev": 1}', '{"dev":1,"ino":2,"offset":-5}'):
        assert FilePosition.loads(junk) is None


# -- paths that are not regular files (issue 13, item 7) --------------------------------------------------


async def test_a_path_that_is_a_directory_fifo_or_device_is_reported(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    d = tmp_path / "auth.log"
    d.mkdir()
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    log = tmp_path / "real.log"
    append(log, "old")
    with caplog.at_level("WARNING"):
        async with running(tail([d, fifo, Path("/dev/null"), log])) as c:
            append(log, "new")
            assert await c.wait_lines(1) == ["new"]
            assert c.source.stats.files_opened == 1
            assert cast(FileTail, c.source).followed() == {str(log): len(b"old\nnew\n")}
            assert cast(FileTail, c.source).missing() == [f"{d} is a directory, not a regular file",
                                          f"{fifo} is a FIFO, not a regular file",
                                          "/dev/null is a character device, not a regular file"]
    text = caplog.text
    assert f"{d} is a directory, not a regular file; it will be followed as soon as it appears" in text
    assert f"{fifo} is a FIFO, not a regular file" in text
    assert "/dev/null is a character device, not a regular file" in text


# -- copytruncate (issue 13, item 6) ---------------------------------------------------------------------


def copytruncate(log: Path, copy: Path) -> None:
    """What logrotate's copytruncate does: copy the file, then truncate the original in place."""
    copy.write_bytes(log.read_bytes())
    os.truncate(log, 0)


async def test_copytruncate_soon_after_the_first_read_regrown_past_the_offset(tmp_path: Path) -> None:
    # Within the first position save (save_interval 1 s), with new content longer than the old offset:
    # the size never looked smaller and no fingerprint of the first bytes existed yet (54/80 lines read).
    log = tmp_path / "auth.log"
    log.touch()
    async with running(tail(log, save_interval=3600)) as c:
        append(log, *(f"old {i}" for i in range(30)))
        await c.wait_lines(30)
        copytruncate(log, tmp_path / "auth.log.1")
        append(log, *(f"new line number {i}, longer than the old ones" for i in range(50)))
        assert (await c.wait_lines(80))[30:] == [f"new line number {i}, longer than the old ones"
                                                 for i in range(50)]
        st = c.source.stats
        assert st.truncations == 1 and st.truncated_lost == 0


async def test_copytruncate_under_load_reads_the_backlog_from_the_copy(tmp_path: Path) -> None:
    # The tailer lags (its queue is full), logrotate copies and truncates, the writer goes on: the lines
    # between the tailer's offset and the truncation are read from the copy, none lost, none twice.
    log = tmp_path / "auth.log"
    log.touch()
    async with running(tail(log, chunk_size=4096, save_interval=3600), maxsize=1) as c:
        c.consume.clear()  # the consumer stops taking batches: the tailer blocks on the full queue
        append(log, *(f"old {i:05d}" for i in range(2000)))
        await wait_for_condition(lambda: c.source.stats.bytes_read > 0 and c.queue.full(), what="a backlog")
        copytruncate(log, tmp_path / "auth.log.1")
        append(log, *(f"new {i:05d}" for i in range(500)))
        c.consume.set()
        texts = await c.wait_lines(2500)
        assert texts == [f"old {i:05d}" for i in range(2000)] + [f"new {i:05d}" for i in range(500)]
        st = c.source.stats
        assert st.truncations == 1 and st.truncated_salvaged > 0 and st.truncated_lost == 0


async def test_a_truncation_without_a_copy_counts_what_could_not_be_read(tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    log.touch()
    async with running(tail(log, chunk_size=4096, save_interval=3600), maxsize=1) as c:
        c.consume.clear()
        append(log, *(f"old {i:05d}" for i in range(2000)))
        await wait_for_condition(lambda: c.source.stats.bytes_read > 0 and c.queue.full(), what="a backlog")
        os.truncate(log, 0)  # no copy anywhere: the backlog is gone
        append(log, "new")
        c.consume.set()
        await wait_for_condition(lambda: c.texts[-1:] == ["new"], what="the line after the truncation")
        st = c.source.stats
        assert st.truncations == 1 and st.truncated_salvaged == 0
        unread = 2000 * len("old 00000\n") - st.bytes_read
        assert 0 < st.truncated_lost <= unread + 4096  # at least what was seen and never read


async def test_copytruncate_in_a_fast_stream_misses_and_doubles_nothing(tmp_path: Path) -> None:
    # Issue 13 measured 18.6 % and 48.1 % of 200k lines missed at 100k lines/s. The writer keeps its
    # descriptor (O_APPEND, as syslog does) and logrotate's copy + truncate happen between two of its writes.
    log = tmp_path / "auth.log"
    log.touch()
    n, rotate_at = 200_000, 100_000

    def write() -> None:
        with open(log, "ab", buffering=0) as w:
            for start in range(0, n, 1000):
                if start == rotate_at:
                    copytruncate(log, tmp_path / "auth.log.1")
                w.write(b"".join(b"line %06d\n" % i for i in range(start, start + 1000)))

    async with running(tail(log, chunk_size=64 * 1024)) as c:
        await asyncio.to_thread(write)
        texts = await c.wait_lines(n, timeout=60)
        assert len(texts) == n and texts == [f"line {i:06d}" for i in range(n)]
        st = c.source.stats
        assert st.truncations == 1 and st.truncated_lost == 0
