"""Coalesce element ops and flush them to the kernel in batches.

`Pending` is the pure plan: per set, element key -> op. Within one window
  - add then add       -> one add with the later end (permanent wins) — a re-ban never shortens;
  - add then delete    -> nothing, if the add created the element; else a delete;
  - delete then add    -> an add that refreshes (the element may still be in the kernel);
  - delete then delete -> one delete.
So a batch never both adds and deletes one element. Bulk submissions (one op shared by many keys) are merged
with dict/set operations, not a Python loop per element: per-element Python work bounds bulk throughput.

`Batcher` is the small async driver: ops wait in a bounded window (back-pressure when full) and are flushed
as one transaction when `max_ops` are pending or `delay` seconds after the window's first op. The window is
for ops that arrive together under load; a window opened while the batcher was idle (no flush in flight, and
none ended in the last `delay` seconds) is flushed at once, so a lone `nftblock ban` does not wait for
company that is not coming (bench/bench_cli.py: 18.2 ms with the 2 ms window, 11.4 ms without it). Each submitter
gets a future that resolves once the transaction carrying its ops was acknowledged by the kernel, with the
per-op failures, so `nftblock ban` can return only when the set really holds the address.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: the batch driver: flushes on size or delay, on the event loop)
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from nftblockd.kernel.bans import OpSpec, SetOp

log = logging.getLogger("nftblockd.batcher")

Key = tuple[str, int]


def merge(old: OpSpec, new: OpSpec) -> OpSpec | None:
    """The coalescing rule for one element; None = the two cancel out."""
    if old.add and new.add:
        until = None if old.until_ms is None or new.until_ms is None else max(old.until_ms, new.until_ms)
        return OpSpec(True, until, new.comment or old.comment, old.existed or new.existed)
    if old.add:  # then delete
        return new if old.existed else None
    if new.add:  # delete then add
        return new if new.existed else OpSpec(True, new.until_ms, new.comment, True)
    return old


@dataclass(frozen=True, slots=True)
class Group:
    """Ops for one set, as parallel lists (what the kernel writer encodes). `specs` is a list, or a `TimedSpecs`
    column (adds each with its own end: no `OpSpec` per key)."""

    set_name: str
    keys: list[int]
    specs: Sequence[OpSpec]


class Pending:
    """Ops waiting for the next flush, coalesced per element. Pure."""

    def __init__(self) -> None:
        self.sets: dict[str, dict[int, OpSpec]] = {}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def has_any(self, set_name: str, keys: Sequence[int]) -> bool:
        d = self.sets.get(set_name)
        if not d or not keys:
            return False
        # Flushes take keys in insertion order, so a submission's last key usually leaves last: while it is
        # pending the answer is yes at O(1); the full check runs about once per submission, not per flush.
        if keys[-1] in d:
            return True
        return not d.keys().isdisjoint(keys)

    def add(self, op: SetOp) -> None:
        self.add_many(op.set_name, [op.key], OpSpec(op.add, op.until_ms, op.comment, op.existed))

    def add_many(self, set_name: str, keys: Sequence[int], spec: OpSpec) -> None:
        d = self.sets.setdefault(set_name, {})
        before = len(d)
        clash = d.keys() & keys if d else ()
        if not clash:
            d.update(dict.fromkeys(keys, spec))
        else:
            for k in keys:
                old = d.get(k)
                if old is None:
                    d[k] = spec
                    continue
                merged = merge(old, spec)
                if merged is None:
                    del d[k]
                else:
                    d[k] = merged
        self._len += len(d) - before

    def take(self, limit: int) -> list[Group]:
        out: list[Group] = []
        left = limit
        for name, d in self.sets.items():
            if left <= 0:
                break
            if not d:
                continue
            if len(d) <= left:
                out.append(Group(name, list(d.keys()), list(d.values())))
                left -= len(d)
                self._len -= len(d)
                d.clear()
            else:
                keys = list(itertools.islice(d.keys(), left))
                out.append(Group(name, keys, [d.pop(k) for k in keys]))
                self._len -= left
                left = 0
        return out

    def ops(self) -> list[SetOp]:
        """Everything pending as SetOps (for tests and debugging)."""
        return [SetOp(n, k, s.add, s.until_ms, s.comment, s.existed) for n, d in self.sets.items()
                for k, s in d.items()]


@dataclass(frozen=True, slots=True)
class OpFailure:
    set_name: str
    key: int
    errno: int
    text: str


@dataclass(slots=True)
class Ticket:
    groups: list[tuple[str, Sequence[int]]]
    future: asyncio.Future[list[OpFailure]]
    failures: list[OpFailure] = field(default_factory=list)
    _index: dict[str, set[int]] | None = None

    def owns(self, f: OpFailure) -> bool:
        if self._index is None:  # built only when a failure needs attributing
            self._index = {}
            for name, keys in self.groups:
                self._index.setdefault(name, set()).update(keys)
        return f.key in self._index.get(f.set_name, ())


@dataclass(slots=True)
class ApplyOutcome:
    failed: dict[Key, tuple[int, str]]
    expired: list[Key]
    transactions: int
    missing_sets: set[str]


@dataclass(slots=True)
class FlushReport:
    ops: int
    failures: list[OpFailure]
    expired: int
    seconds: float
    transactions: int
    missing_sets: set[str]


ApplyFn = Callable[[list[Group]], Awaitable[ApplyOutcome]]


class Batcher:
    def __init__(self, apply: ApplyFn, *, max_ops: int = 10000, delay: float = 0.002,
                 max_pending: int = 2_000_000, on_flush: Callable[[FlushReport], None] | None = None) -> None:
        self._apply = apply
        self.max_ops = max_ops
        self.delay = delay
        self.max_pending = max_pending
        self._pending = Pending()
        self._tickets: list[Ticket] = []
        self._wake = asyncio.Event()
        self._space = asyncio.Event()
        self._space.set()
        self._first_at: float | None = None
        self._flushing = False
        self._last_flush_end = -float("inf")  # monotonic
        self._idle_window = False  # the pending window was opened while idle: flush it without waiting
        self._on_flush = on_flush
        self.flushes = 0
        self.ops_flushed = 0
        self.failures = 0
        self.last_error: str | None = None  # why the last batch failed whole (None after one that did not)
        self.waiting_submitters = 0

    def oldest_pending_age(self, now: float) -> float:
        """Seconds the oldest queued op has waited for a flush (0 when nothing waits); `now` is monotonic."""
        return 0.0 if self._first_at is None else now - self._first_at

    def pending(self) -> int:
        return len(self._pending)

    async def _room(self) -> None:
        while len(self._pending) >= self.max_pending:
            self.waiting_submitters += 1
            self._space.clear()
            try:
                await self._space.wait()
            finally:
                self.waiting_submitters -= 1

    def _ticket(self, groups: list[tuple[str, Sequence[int]]]) -> asyncio.Future[list[OpFailure]]:
        fut: asyncio.Future[list[OpFailure]] = asyncio.get_running_loop().create_future()
        if not any(keys for _n, keys in groups):
            fut.set_result([])
            return fut
        self._tickets.append(Ticket(groups, fut))
        if self._first_at is None:
            self._first_at = time.monotonic()
            self._idle_window = not self._flushing and self._first_at - self._last_flush_end >= self.delay
        self._wake.set()
        return fut

    async def submit(self, ops: Sequence[SetOp]) -> asyncio.Future[list[OpFailure]]:
        """Queue ops; the returned future resolves with the failures once the kernel has them."""
        await self._room()
        by_set: dict[str, list[int]] = {}
        for op in ops:
            self._pending.add(op)
            by_set.setdefault(op.set_name, []).append(op.key)
        return self._ticket(list(by_set.items()))

    async def submit_many(self, batches: Sequence[tuple[str, Sequence[int], OpSpec]]
                          ) -> asyncio.Future[list[OpFailure]]:
        """Queue bulk ops: each (set, keys, spec) applies one spec to many keys."""
        await self._room()
        for name, keys, spec in batches:
            if keys:
                self._pending.add_many(name, keys, spec)
        return self._ticket([(name, keys) for name, keys, _spec in batches])

    async def run(self, stop: asyncio.Event) -> None:
        """Flush loop; returns after `stop` is set and everything pending was flushed."""
        while True:
            if not self._pending:
                self._settle(self._tickets, [])
                self._tickets = []
                self._first_at = None
                if stop.is_set():
                    return
                self._wake.clear()
                waiter = asyncio.ensure_future(self._wake.wait())
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stopper.cancel()
                continue
            if len(self._pending) < self.max_ops and not stop.is_set() and self._first_at is not None \
                    and not self._idle_window:
                wait = self._first_at + self.delay - time.monotonic()
                if wait > 0:
                    self._wake.clear()
                    # more ops, or `stop`, end the wait early: stopping flushes at once, not after the window
                    waiter = asyncio.ensure_future(self._wake.wait())
                    stopper = asyncio.ensure_future(stop.wait())
                    await asyncio.wait({waiter, stopper}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    stopper.cancel()
                    if len(self._pending) < self.max_ops and not stop.is_set() \
                            and time.monotonic() < self._first_at + self.delay:
                        continue
            await self.flush_once()

    async def flush_once(self) -> FlushReport:
        groups = self._pending.take(self.max_ops)
        # tickets none of whose keys are still pending settle after this flush
        done: list[Ticket] = []
        keep: list[Ticket] = []
        for t in self._tickets:
            if any(self._pending.has_any(name, keys) for name, keys in t.groups):
                keep.append(t)
            else:
                done.append(t)
        self._tickets = keep
        self._first_at = time.monotonic() if self._pending else None
        self._idle_window = False  # what is left, or comes during this flush, is load: it waits its window
        self._flushing = True
        if len(self._pending) < self.max_pending:
            self._space.set()
        t0 = time.perf_counter()
        n = sum(len(g.keys) for g in groups)
        failures: list[OpFailure] = []
        outcome = ApplyOutcome({}, [], 0, set())
        if groups:
            try:
                outcome = await self._apply(groups)
                failures = [OpFailure(s, k, e, t) for (s, k), (e, t) in outcome.failed.items()]
                self.last_error = None
            except Exception as exc:  # a kernel error must reach the submitters, not kill the loop
                log.exception("applying a batch of %d ops failed", n)
                self.last_error = str(exc) or type(exc).__name__
                failures = [OpFailure(g.set_name, k, getattr(exc, "errno", 5) or 5, str(exc))
                            for g in groups for k in g.keys]
        self._flushing = False
        self._last_flush_end = time.monotonic()
        report = FlushReport(n, failures, len(outcome.expired), time.perf_counter() - t0, outcome.transactions,
                             outcome.missing_sets)
        self.flushes += 1
        self.ops_flushed += n
        self.failures += len(failures)
        if self._on_flush is not None:
            self._on_flush(report)
        if failures:
            for t in keep:  # failures of tickets that span several flushes wait on the ticket
                t.failures += [f for f in failures if t.owns(f)]
        self._settle(done, failures)
        return report

    @staticmethod
    def _settle(tickets: list[Ticket], failures: list[OpFailure]) -> None:
        for t in tickets:
            mine = [f for f in failures if t.owns(f)] if failures else []
            if not t.future.done():
                t.future.set_result(t.failures + mine)
