"""Read the systemd journal through sd-journal (systemd-python's `Reader`), driven by the event loop.

Never polls: the reader's inotify descriptor is watched with `loop.add_reader`, and `sd_journal_process()`
runs when it becomes readable. A timer is armed only when sd-journal asks for one (`get_timeout`, for
journals on file systems without reliable inotify). Matches go to sd-journal, which answers them from the
journal's field indexes, so no entry that does not match is ever looked at in Python. One Reader per source,
opened once for the life of `run`: its descriptors are bounded by the number of journal files, not by traffic.

The rules:

- Matches are (FIELD, value) pairs. Pairs with the same field are ORed, different fields ANDed (sd-journal's
  own rule, as in `journalctl _SYSTEMD_UNIT=a.service _SYSTEMD_UNIT=b.service SYSLOG_IDENTIFIER=sshd`).
  At least one is required: without a match every entry of the journal would be read.
- Start: at the saved cursor (the entry it names was handed over and is skipped; if it was vacuumed, reading
  goes on with the next entry still there), else at the tail: only entries written from now on are read.
- A line is one entry: `text` is MESSAGE decoded as UTF-8 with replacement (counted in `invalid_utf8`; a
  message with newlines stays one line; NUL bytes are removed, counted in `nul`), `time` is
  _SOURCE_REALTIME_TIMESTAMP in seconds where journald recorded it (the kernel's receive time of a syslog
  datagram, kept through journal-remote), else
  __REALTIME_TIMESTAMP (when journald wrote the entry), as fail2ban's systemd backend takes it: a journald
  that fell behind must not move a burst of failures later than it happened; a source time that is not a
  number (journal-remote passes on what a remote sent) is counted in `bad_time`. Entries without MESSAGE
  are passed over; messages longer than `max_line` bytes are skipped and counted in `overlong`.
- Rotation and vacuum: `process()` says INVALIDATE; sd-journal has already re-read its list of files, and it
  keeps its location by sequence number and time, not by file, so reading continues after the last entry
  read. Counted in `rotations`.
- Entries are handed over in batches of up to `batch_size`. The cursor of the last entry handed over is saved
  at most once per `save_interval`, and when `run` ends.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: waits for journal entries on the event loop)
import logging
import os
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any

from systemd import journal

from nftblockd.sources.base import LineBatch, PositionStore, SourceError, SourceStats
from nftblockd.sources.linesplit import DEFAULT_MAX_LINE

__all__ = ["JournalSource"]

log = logging.getLogger(__name__)

JOURNALD_SOCKET = "/run/systemd/journal/socket"  # where a running journald receives native messages
_FIELD = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")  # journal field names, as sd-journal accepts them


class JournalSource:
    """Follow journal entries that match `matches`.

    Where to read (at most one): `path`, a directory of journal files (tests; `journalctl -D`); `files`,
    journal files (`journalctl --file`); `namespace`, a journald namespace (`journalctl --namespace`); none:
    the local journal, system services only unless `system_only=False`.
    `name` is `LineBatch.source` of every batch; the cursor is saved under `journal:<name>`.
    """

    def __init__(self, name: str, matches: Sequence[tuple[str, str]], store: PositionStore, *,
                 path: str | None = None, files: Sequence[str] | None = None, namespace: str | None = None,
                 system_only: bool = True, max_line: int = DEFAULT_MAX_LINE, batch_size: int = 1024,
                 save_interval: float = 1.0, syslog_format: bool = False) -> None:
        if not matches:
            raise ValueError(f"source {name!r}: a journal source needs matches such as "
                             "('_SYSTEMD_UNIT', 'sshd.service'); without one every entry would be read")
        for field, value in matches:
            if not _FIELD.match(field):
                raise ValueError(f"source {name!r}: {field!r} is not a journal field name "
                                 "(capital letters, digits and _, as in _SYSTEMD_UNIT)")
            if "\n" in value:
                raise ValueError(f"source {name!r}: the value for {field} contains a newline")
        if sum(x is not None for x in (path, files, namespace)) > 1:
            raise ValueError(f"source {name!r}: give at most one of path, files and namespace")
        if max_line < 1 or batch_size < 1 or save_interval < 0:
            raise ValueError(f"source {name!r}: max_line and batch_size must be positive, "
                             "save_interval not negative")
        self.name = name
        # "HOST IDENT[PID]: MESSAGE", the line fail2ban's systemd backend builds, so that file filters
        # (built-in and fail2ban's) match journal entries unchanged; the time travels in LineBatch.times
        self._syslog_format = syslog_format
        self.stats = SourceStats()
        self.ready = asyncio.Event()
        self._matches = tuple(matches)
        self._store = store
        self._path = path
        self._files = list(files) if files is not None else None
        self._namespace = namespace
        self._system_only = system_only
        self._max_line = max_line
        self._batch = batch_size
        self._save_interval = save_interval
        self._key = f"journal:{name}"
        self._cursor: str | None = None  # of the last entry handed over (or passed over)
        self._saved: str | None = None
        self._skip_cursor: str | None = None  # the entry a seek landed on was already handed over
        self._save_handle: asyncio.TimerHandle | None = None
        self._failure: OSError | None = None
        self._no_files: str | None = None  # why there is nothing to read (no journal files), while it lasts
        self._dead = False  # ... and it never will: no journald runs

    # ------------------------------------------------------------------ run

    async def run(self, out: asyncio.Queue[LineBatch]) -> None:
        self._failure = None
        reader = self._open()
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        timer: asyncio.TimerHandle | None = None
        try:
            fd = reader.fileno()  # sets up sd-journal's inotify watches: changes from now on are noticed
            loop.add_reader(fd, self._on_readable, reader, wake)
            try:
                self._seek(reader)
                self.ready.set()
                while True:
                    wake.clear()
                    await self._drain(reader, out)
                    if self._failure is not None:
                        raise SourceError(f"source {self.name!r}: the journal cannot be followed: "
                                          f"{self._failure}") from self._failure
                    if timer is not None:
                        timer.cancel()
                    timer = self._arm_timeout(reader, wake)
                    await wake.wait()
            finally:
                loop.remove_reader(fd)
                if timer is not None:
                    timer.cancel()
        finally:
            if self._save_handle is not None:
                self._save_handle.cancel()
            self._save()
            reader.close()

    def _open(self) -> Any:
        try:
            if self._path is not None:
                reader = journal.Reader(path=self._path)
            elif self._files is not None:
                reader = journal.Reader(files=self._files)
            elif self._namespace is not None:
                reader = journal.Reader(namespace=self._namespace)
            else:
                flags = journal.LOCAL_ONLY | (journal.SYSTEM_ONLY if self._system_only else 0)
                reader = journal.Reader(flags)
            for field, value in self._matches:
                reader.add_match(f"{field}={value}")
        except (OSError, ValueError) as exc:
            where = self._path or self._files or self._namespace or "the local journal"
            raise SourceError(f"source {self.name!r}: cannot open {where}: {exc}") from exc
        self._check_files(reader)
        return reader

    def _check_files(self, reader: Any) -> None:
        """A journal with no files at all is said, and listed by `missing()` while it lasts: without journald
        (or with a wrong path) a journal jail would otherwise start silently and never see a line. It is
        followed all the same, in case journald starts (or writes its first file) later."""
        try:
            # the bytes of the journal files it opened (has_runtime_files() only speaks of local journals)
            if reader.get_usage() > 0:
                self._no_files = None
                self._dead = False
                return
        except OSError:
            return
        no_journald = False
        if self._path is not None:
            why = f"no journal files in {self._path}"
        elif self._files is not None:
            why = f"no journal files among {', '.join(self._files)}"
        elif self._namespace is not None:
            why = f"no journal files for namespace {self._namespace!r}"
        else:
            no_journald = not os.path.exists(JOURNALD_SOCKET)
            why = "no journal files in /run/log/journal or /var/log/journal" + (
                f" and no {JOURNALD_SOCKET}: systemd-journald is not running" if no_journald else "")
        self._dead = no_journald
        if why == self._no_files:
            return
        self._no_files = why
        if no_journald:  # nothing will ever come: an error
            self.stats.errors += 1
            log.warning("source %s: %s; nothing can be read until it runs", self.name, why)
        else:  # a journald that has not written its first file yet (a fresh volatile journal) is normal
            log.info("source %s: %s yet; they are read as soon as they appear", self.name, why)

    def dead(self) -> str | None:
        """Why this source can never deliver (no journald runs), for the daemon's health; None otherwise."""
        return self._no_files if self._dead else None

    def missing(self) -> list[str]:
        """Why this source reads nothing, for `status` (empty while journal files exist)."""
        return [] if self._no_files is None else [self._no_files]

    def _seek(self, reader: Any) -> None:
        saved = self._store.get(self._key)
        if saved:
            try:
                reader.seek_cursor(saved)
            except (ValueError, OSError) as exc:
                log.warning("source %s: the saved journal cursor is unusable (%s); starting at the end",
                            self.name, exc)
            else:
                self._cursor = self._saved = self._skip_cursor = saved
                log.info("source %s: resuming the journal after the saved cursor", self.name)
                return
        reader.seek_tail()
        if not reader._previous():
            # No matching entry yet, so whatever comes is new. (sd-journal 252 skips entries written after a
            # seek_tail() whose previous() found nothing: start from the head instead.)
            reader.seek_head()

    def _on_readable(self, reader: Any, wake: asyncio.Event) -> None:
        try:
            change = reader.process()
        except OSError as exc:
            self._failure = exc  # the main loop raises it; the daemon may restart the source
            asyncio.get_running_loop().remove_reader(reader.fileno())  # it would stay readable: no spinning
            wake.set()
            return
        if change == journal.INVALIDATE:
            self.stats.rotations += 1
            log.debug("source %s: journal files were added or removed", self.name)
        if change != journal.NOP and self._no_files is not None:
            self._check_files(reader)
            if self._no_files is None:
                log.info("source %s: journal files appeared; following them", self.name)
        if change != journal.NOP:
            wake.set()

    def _arm_timeout(self, reader: Any, wake: asyncio.Event) -> asyncio.TimerHandle | None:
        deadline = reader.get_timeout()  # CLOCK_MONOTONIC microseconds, or None: inotify is enough
        if deadline is None:
            return None
        delay = max(0.0, deadline / 1e6 - time.monotonic())
        return asyncio.get_running_loop().call_later(delay, wake.set)

    # -------------------------------------------------------------- reading

    async def _drain(self, reader: Any, out: asyncio.Queue[LineBatch]) -> None:
        """Hand over every entry up to the end of the journal, a batch at a time."""
        while True:
            batch, more, cursor = self._read(reader, self._batch)
            if batch:
                # If cancelled while the queue is full, the cursor still points before this batch.
                await out.put(batch)
                self.stats.lines += len(batch)
            if cursor is not None:
                self._cursor = cursor
                self._mark()
            if not more:
                return
            await asyncio.sleep(0)  # a long backlog must not starve the rest of the daemon

    def read_all(self) -> Iterator[LineBatch]:
        """Every matching entry from the journal's head to its end, once, in batches, by the same rules as
        `run` (`nftblock test-filter --journal`): no cursor is read or saved, nothing is followed. Raises
        SourceError when the journal cannot be opened."""
        reader = self._open()
        try:
            reader.seek_head()
            while True:
                batch, more, _ = self._read(reader, self._batch)
                if batch:
                    yield batch
                if not more:
                    return
        finally:
            reader.close()

    def _read(self, reader: Any, n: int) -> tuple[LineBatch, bool, str | None]:
        """Up to n lines, whether the journal may have more, and the cursor of the last entry read."""
        max_line, stats = self._max_line, self.stats
        texts: list[str] = []
        times: list[float] = []
        read = 0
        more = True
        while len(texts) < n:
            if not reader._next():
                more = False
                break
            if self._skip_cursor is not None:
                skip, self._skip_cursor = reader.test_cursor(self._skip_cursor), None
                if skip:
                    continue
            read += 1
            try:
                msg: bytes = reader._get("MESSAGE")
            except KeyError:
                continue
            stats.bytes_read += len(msg)
            if len(msg) > max_line:
                stats.overlong += 1
                continue
            try:
                text = msg.decode("utf-8")
            except UnicodeDecodeError:
                text = msg.decode("utf-8", "replace")
                stats.invalid_utf8 += 1
            if b"\0" in msg:  # not text: removed, as a file's NUL bytes are (sources/linesplit.py, rule 5)
                text = text.replace("\0", "")
                stats.nul += 1
            if self._syslog_format:
                text = _syslog_prefix(reader) + text
            texts.append(text)
            try:  # a trusted field (leading _): no local client can set it, but journal-remote carries any value
                times.append(int(reader._get("_SOURCE_REALTIME_TIMESTAMP")) / 1e6)
            except KeyError:
                times.append(reader._get_realtime() / 1e6)
            except (ValueError, TypeError):
                times.append(reader._get_realtime() / 1e6)
                stats.bad_time += 1
        return LineBatch(self.name, texts, times), more, (reader._get_cursor() if read else None)

    # ------------------------------------------------------------ positions

    def _mark(self) -> None:
        if self._save_interval <= 0:
            self._save()
        elif self._save_handle is None:
            self._save_handle = asyncio.get_running_loop().call_later(self._save_interval, self._save)

    def _save(self) -> None:
        self._save_handle = None
        if self._cursor is None or self._cursor == self._saved:
            return
        try:
            self._store.set(self._key, self._cursor)
        except Exception as exc:  # a store failure must not stop reading; it is retried with the next batch
            self.stats.errors += 1
            log.warning("source %s: cannot save the journal cursor: %s", self.name, exc)
            return
        self._saved = self._cursor
        self.stats.positions_saved += 1


def _field(reader: Any, name: str) -> str:
    try:
        value = reader._get(name)
    except KeyError:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _syslog_prefix(reader: Any) -> str:
    host = _field(reader, "_HOSTNAME")
    ident = _field(reader, "SYSLOG_IDENTIFIER") or _field(reader, "_COMM")
    pid = _field(reader, "SYSLOG_PID") or _field(reader, "_PID")
    head = f"{ident}[{pid}]:" if pid else f"{ident}:"
    return f"{host} {head} " if host else f"{head} "
