"""Log jails: sources → bounded queue → filter → tracker → ban sink.

One `JailRunner` per configured jail. Its sources (files tailed with inotify, or the journal) put batches of
lines into a bounded queue; the runner matches each line, feeds failures to the shared tracker and hands each
batch's bans to the sink (kernel/sink.py), a bounded queue in front of the kernel: matching never waits on
netlink, and a full sink slows the sources down instead of growing memory.
Everything a line can turn into is counted: matched, ignored, rejected hosts, allowlisted, stale, banned.

Catching up vs live: lines a source read before it became `ready` (a backlog after a restart or rotation)
are passed to the tracker as catching up, so their own timestamps decide whether they still count; lines
that arrive afterwards are live (see tracker.py, "Time rule").
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: the jail runner feeds source batches to the tracker on the event loop)
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from nftblockd.addr import IPAddr
from nftblockd.config import JailConfig
from nftblockd.detect.matcher import Filter, Match, MatchContext, Rejected
from nftblockd.detect.matchmemory import MatchMemory
from nftblockd.detect.tracker import BanRecord, Kind, Tracker, TrackOutcome
from nftblockd.events import Ban, Hit
from nftblockd.service.metrics import Metrics
from nftblockd.sources.base import LineBatch, PositionStore, Source
from nftblockd.sources.journal import JournalSource
from nftblockd.sources.tail import FileTail

log = logging.getLogger("nftblockd.jails")

# Enum members as module constants: `Kind.COUNTED` is a class attribute lookup per failure
_COUNTED, _BANNED, _ALREADY = Kind.COUNTED, Kind.BANNED, Kind.ALREADY_BANNED
_ALLOWLISTED, _STALE, _NEVER = Kind.ALLOWLISTED, Kind.STALE, Kind.NEVER_BAN

# Hit(...) goes through the NamedTuple's Python-level __new__; tuple.__new__ builds the same value at about
# half the cost (one per failure: ~13 ms of a 32k-failure burst). The matcher builds its Match the same way.
_new_hit: Callable[[type[Hit], tuple[str, IPAddr, float, str]], Hit] = tuple.__new__

QUEUE_BATCHES = 64  # per source: 64 chunks of at most 256 KiB; the sources stop reading when it is full


@dataclass(slots=True)
class JailStats:
    lines: int = 0
    matched: int = 0
    ignored: int = 0
    rejected: int = 0
    failures: int = 0
    bans: int = 0
    already_banned: int = 0
    allowlisted: int = 0
    never_ban: int = 0  # hosts in never-ban space (0.0.0.0, multicast, link-local...): never counted
    stale: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


def _remember(memory: MatchMemory, r: Match, line: str, out: TrackOutcome) -> None:
    """A counted failure's line is kept for the jail's actions; a ban takes its offender's lines along."""
    if out.kind is _COUNTED or out.kind is _BANNED:
        memory.add(r.host, line, r.fields)
        if out.ban is not None and out.kind is _BANNED:
            memory.decided(r.host, out.ban.target)


class BanSink(Protocol):
    """Where a jail's bans go (kernel.sink.JailBanSink): a bounded queue in front of the kernel."""

    async def submit(self, bans: list[Ban], records: list[BanRecord], arrival: float) -> None: ...

    def submit_nowait(self, bans: list[Ban], records: list[BanRecord], arrival: float) -> bool: ...


def _no_failure(_jail: str, _host: IPAddr) -> None:
    pass


class JailRunner:
    def __init__(self, jail: JailConfig, flt: Filter, tracker: Tracker, sink: BanSink,
                 positions: PositionStore, metrics: Metrics | None = None, *,
                 sources: list[Source] | None = None, memory: MatchMemory | None = None) -> None:
        self.jail = jail
        # only a jail with an action that shows them keeps its offenders' lines (`{matches}`; memory.keep)
        self.memory = memory
        self.filter = flt
        self.tracker = tracker
        self.sink = sink
        self.metrics = metrics
        self.stats = JailStats()
        self.sources: list[Source] = sources if sources is not None else self._make_sources(positions)
        # multi-line filters (connection ids) keep per-stream memory
        self._ctx: MatchContext | None = MatchContext() if flt.uses_context else None
        self._reported = (0, 0, 0)
        # fleet counting: each failure the tracker counted, (jail, host); must not raise (a dict update).
        # A no-op by default rather than None: a test per failure would take `process` past its complexity cap
        self.on_failure: Callable[[str, IPAddr], None] = _no_failure
        log.info("jail %s: filter %s runs on %s", jail.name, flt.name, flt.scanner)

    def _make_sources(self, positions: PositionStore) -> list[Source]:
        out: list[Source] = []
        if self.jail.files:
            out.append(FileTail(self.jail.name, list(self.jail.files), positions))
        if self.jail.journal_matches:
            out.append(JournalSource(self.jail.name, list(self.jail.journal_matches), positions,
                                     path=self.jail.journal_path, syslog_format=True))
        return out

    async def run(self) -> None:
        """Run the sources and match their lines until cancelled."""
        async with asyncio.TaskGroup() as tg:
            for src in self.sources:
                queue: asyncio.Queue[LineBatch] = asyncio.Queue(maxsize=QUEUE_BATCHES)
                tg.create_task(self._run_source(src, queue), name=f"source-{self.jail.name}")
                tg.create_task(self._consume(src, queue), name=f"jail-{self.jail.name}")

    async def _run_source(self, src: Source, queue: asyncio.Queue[LineBatch]) -> None:
        delay = 1.0
        while True:
            try:
                await src.run(queue)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broken source is retried, never takes the daemon down
                log.error("jail %s: source %s failed: %s; retrying in %.0fs", self.jail.name,
                          getattr(src, "name", "?"), exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 60.0)

    async def _consume(self, src: Source, queue: asyncio.Queue[LineBatch]) -> None:
        ready_mark: list[int] = []

        async def mark_ready() -> None:
            await src.ready.wait()
            ready_mark.append(src.stats.lines)

        marker = asyncio.create_task(mark_ready())
        consumed = 0
        try:
            while True:
                batch = await queue.get()
                arrival = time.monotonic()
                consumed += len(batch)
                live = bool(ready_mark) and consumed > ready_mark[0]
                bans, records = self.process(batch, time.time(), live, arrival)
                if bans:
                    await self.sink.submit(bans, records, arrival)  # waits while the sink's queue is full
                # Queue.get() does not suspend while batches are waiting: yield, so the bans of this batch
                # go to the kernel (its own thread) while the next batch is matched, not after all of them.
                await asyncio.sleep(0)
        finally:
            marker.cancel()
            # lines already handed over by the source are matched before we stop (their position is saved)
            while not queue.empty():
                with contextlib.suppress(Exception):
                    bans, records = self.process(queue.get_nowait(), time.time(), False, time.monotonic())
                    if bans and not self.sink.submit_nowait(bans, records, time.monotonic()):
                        # no room left at shutdown: the tracker must not believe these are banned
                        log.warning("jail %s: %d bans decided while stopping could not be queued",
                                    self.jail.name, len(bans))
                        for b in bans:
                            self.tracker.forget_ban(b.target, jail=b.jail)

    def process(self, batch: LineBatch, now: float, live: bool, arrival: float
                ) -> tuple[list[Ban], list[BanRecord]]:
        """Match a batch of lines and feed the failures to the tracker: returns the bans it decided (for the
        sink, as one submission) and their history records. A batch whose lines carry their own time (the
        journal's: `batch.times`) is matched stamped: no date is looked for in the text (fail2ban's systemd
        backend)."""
        self.stats.lines += len(batch)
        times = batch.times
        found = self.filter.scan(batch.texts, now, self._ctx, stamped=times is not None)
        # read per batch: a reload may change whether the jail's actions show lines (ActionHub.configure)
        memory = self.memory if self.memory is not None and self.memory.keep else None
        if memory is None and self.on_failure is _no_failure:  # nothing needs the hits one by one
            bans, records = self._observe_batch(found, times, now, live)
        else:
            bans, records = self._observe_each(found, batch.texts, times, now, live, memory)
        if self.metrics is not None:
            self._report(self.metrics, len(batch))
        return bans, records

    def _observe_each(self, found: list[tuple[int, Match | Rejected]], texts: list[str], times: list[float] | None,
                      now: float, live: bool, memory: MatchMemory | None) -> tuple[list[Ban], list[BanRecord]]:
        """`process`'s loop hit by hit: for line memory (each counted line kept for the actions) and fleet
        counting (`on_failure` per counted failure). The reference `_observe_batch` is held to."""
        st = self.stats
        bans: list[Ban] = []
        records: list[BanRecord] = []
        observe = self.tracker.observe
        jail = self.jail.name
        on_failure = self.on_failure
        for i, r in found:
            if type(r) is Rejected:
                st.rejected += 1
                st.by_reason[str(r.reason)] = st.by_reason.get(str(r.reason), 0) + 1
                continue
            assert type(r) is Match
            st.matched += 1
            if r.ignored:
                st.ignored += 1
                continue
            t = r.time
            if t is None:
                t = now if times is None else times[i]
            out = observe(_new_hit(Hit, (jail, r.host, t, texts[i])), now, live=live)
            kind = out.kind
            if memory is not None:
                _remember(memory, r, texts[i], out)
            if kind is _COUNTED:
                st.failures += 1
                on_failure(jail, r.host)
            elif kind is _BANNED:
                st.failures += 1
                st.bans += 1
                assert out.ban is not None
                bans.append(out.ban)
                if out.record is not None:
                    records.append(out.record)
            elif kind is _ALREADY:
                st.already_banned += 1
            elif kind is _ALLOWLISTED:
                st.allowlisted += 1
            elif kind is _STALE:
                st.stale += 1
            elif kind is _NEVER:
                st.never_ban += 1
        return bans, records

    def _observe_batch(self, found: list[tuple[int, Match | Rejected]], times: list[float] | None, now: float,
                       live: bool) -> tuple[list[Ban], list[BanRecord]]:
        """`process`'s loop for a batch whose hits no one needs one by one (no line memory, no fleet
        counting): the failures go to the tracker as two columns in one call (`Tracker.observe_batch`), the
        stats are counted per kind. About a third less time per failure than the loop (bench_e2e)."""
        st = self.stats
        ms = [r for _, r in found if type(r) is Match]
        if len(ms) < len(found):
            by_reason = st.by_reason
            for _, r in found:
                if type(r) is Rejected:
                    st.rejected += 1
                    by_reason[str(r.reason)] = by_reason.get(str(r.reason), 0) + 1
        st.matched += len(ms)
        counting = [m for m in ms if not m.ignored]
        st.ignored += len(ms) - len(counting)
        hosts = [m.host for m in counting]
        # a line without a date of its own counts at its arrival, or at its journal entry's time
        tms: list[float]
        if times is None:
            tms = [now if m.time is None else m.time for m in counting]
        else:
            tms = [times[i] if r.time is None else r.time for i, r in found if type(r) is Match and not r.ignored]
        tally = self.tracker.observe_batch(self.jail.name, hosts, tms, now, live=live)
        c = tally.counts
        banned = c.get(_BANNED, 0)
        st.failures += c.get(_COUNTED, 0) + banned
        st.bans += banned
        st.already_banned += c.get(_ALREADY, 0)
        st.allowlisted += c.get(_ALLOWLISTED, 0)
        st.stale += c.get(_STALE, 0)
        st.never_ban += c.get(_NEVER, 0)
        return tally.bans, tally.records

    def _report(self, mx: Metrics, lines: int) -> None:
        st = self.stats
        name = self.jail.name
        mx.lines.labels(name).inc(lines)
        if st.matched:
            mx.matched.labels(name).inc(st.matched - self._reported[0])
            mx.ignored.labels(name).inc(st.ignored + st.rejected - self._reported[1])
            mx.failures.labels(name).inc(st.failures - self._reported[2])
            self._reported = (st.matched, st.ignored + st.rejected, st.failures)
