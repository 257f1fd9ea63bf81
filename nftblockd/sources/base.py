"""What every log source looks like to the daemon: the `Source` and `PositionStore` seams, and their counters.

A source reads one kind of log (files, the systemd journal) and hands lines to the daemon in batches: each
item of the bounded `asyncio.Queue` the daemon passes to `Source.run` is a `LineBatch`: the texts of the
lines of one chunk read (at most one 256 KiB file chunk, or `batch_size` journal entries), and for the journal
their timestamps, as parallel lists. Batches, not single lines, because a queue put and get cost more per line
than splitting and decoding do (bench_tail.py); the queue bound is then in batches, and so still bounds memory
(maxsize x chunk size). Lists of texts, not of `LogLine`s: the matcher takes a list of texts, and a tuple
built per line and taken apart again cost ~8 % of the daemon's CPU in a 100k-line burst (bench_e2e).
The daemon runs each source as one task under its TaskGroup, feeds every line of every batch to the matcher,
and reads `Source.stats` for its metrics:

    queue: asyncio.Queue[LineBatch] = asyncio.Queue(maxsize=64)
    tg.create_task(source.run(queue))
    await source.ready.wait()          # watches set, start positions chosen: later writes will be seen
    ...
    batch = await queue.get()
    matcher.scan(batch.texts)          # batch.times: the journal's timestamps (None for files)
    source.stats.lines                 # plain ints, read at any time (same thread, no locking)

Progress (a file's device, inode and offset; a journal cursor) is kept through a `PositionStore`. A source
saves a position only for batches already put into the queue, at a bounded rate (at most once per
`save_interval`, and once more when `run` ends, cancellation included), so after a restart no line is read
twice and none is skipped. A batch sitting in the queue when the daemon stops counts as handed over: the
daemon drains the queue into the matcher before it exits. A source blocked on a full queue holds one batch
and reads nothing more; cancelled there, it saves the position before that batch.

This module does no IO; `MemoryPositionStore` is the fake for tests (the sqlite store lives in store.py).
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: sources run on the event loop and fill a bounded asyncio.Queue)
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from nftblockd.events import LogLine

__all__ = ["LineBatch", "MemoryPositionStore", "PositionStore", "Source", "SourceError", "SourceStats"]

@dataclass(frozen=True, slots=True)
class LineBatch:
    """One queue item: the lines of one chunk read by source `source`; the consumer owns it once taken.

    `times[i]` is line i's own timestamp (the journal's), or `times` is None (files: a line's time is in
    its text, or it is the time of arrival). Lines with their own time are matched without looking for a
    date in their text (`Filter.scan(stamped=True)`, as fail2ban's systemd backend). Iterating gives the
    lines as `LogLine`s (tests, tools).
    """

    source: str
    texts: list[str]
    times: list[float] | None = None

    @classmethod
    def of(cls, lines: Sequence[LogLine]) -> LineBatch:
        """The batch of these lines (tests, tools): one source, and times only when every line has one."""
        times = [ln.time for ln in lines]
        return cls(lines[0].source if lines else "", [ln.text for ln in lines],
                   None if None in times else cast("list[float]", times))

    def __len__(self) -> int:
        return len(self.texts)

    def __iter__(self) -> Iterator[LogLine]:
        source = self.source
        if self.times is None:
            return iter([LogLine(source, t) for t in self.texts])
        return iter([LogLine(source, t, w) for t, w in zip(self.texts, self.times, strict=True)])


class SourceError(Exception):
    """A log source cannot go on (a journal that cannot be opened, inotify limits reached).

    The fault is the host's or transient; the message says what to check. The daemon may restart the source.
    """


class PositionStore(Protocol):
    """Where sources keep their progress. Keys and values are strings (values are JSON or journal cursors)."""

    def get(self, key: str) -> str | None: ...

    def set(self, key: str, value: str) -> None: ...


class MemoryPositionStore:
    """The in-memory `PositionStore` for tests; `writes` counts `set` calls (tests check the save rate)."""

    def __init__(self, initial: dict[str, str] | None = None) -> None:
        self.data: dict[str, str] = dict(initial or {})
        self.writes = 0

    def get(self, key: str) -> str | None:
        return self.data.get(key)

    def set(self, key: str, value: str) -> None:
        self.data[key] = value
        self.writes += 1


@dataclass(slots=True)
class SourceStats:
    """Counters a source keeps; the daemon exports each as a Prometheus counter labelled with the source name.

    Nothing a source drops goes uncounted: an overlong line is skipped (`overlong`), undecodable bytes are
    replaced (`invalid_utf8` counts the lines that needed it), NUL bytes removed (`nul`), a journal entry
    whose source time is not a number is read with journald's own time instead (`bad_time`), unreadable
    files are retried (`errors`).
    """

    lines: int = 0  # lines put into the queue (in batches)
    bytes_read: int = 0  # bytes read from files, or MESSAGE bytes taken from the journal
    overlong: int = 0  # lines (messages) longer than max_line, skipped
    invalid_utf8: int = 0  # lines whose invalid UTF-8 was replaced by U+FFFD
    nul: int = 0  # lines whose NUL bytes were removed before matching (linesplit rule 5)
    bad_time: int = 0  # journal: entries whose _SOURCE_REALTIME_TIMESTAMP was not a number (journald's time used)
    rotations: int = 0  # files: a followed name now points elsewhere (rename, delete); journal: INVALIDATE
    truncations: int = 0  # files: truncated in place (copytruncate) and read again from 0
    truncated_salvaged: int = 0  # files: bytes a truncation would have lost, read from the rotated copy
    truncated_lost: int = 0  # files: bytes written before a truncation that could not be read (no copy)
    files_opened: int = 0  # files: files started (new, rotated-in, re-created)
    positions_saved: int = 0  # PositionStore.set calls
    errors: int = 0  # transient failures (unreadable file, store failure), each logged once


class Source(Protocol):
    """A log source: `run` reads forever and puts batches of lines into `out`; cancelling it stops it.

    `run` blocks (stops reading) while `out` is full: offsets and cursors make waiting safe. `run` raises
    `SourceError` only for failures it cannot retry itself.
    """

    name: str
    stats: SourceStats
    ready: asyncio.Event

    async def run(self, out: asyncio.Queue[LineBatch]) -> None: ...
