"""Writing state changes before requests are acknowledged: group commit, in order, and a failure that is
visible and retried instead of logged once and forgotten.

Rules:
- `save(change)` queues the change and returns once a write that included it was attempted. Changes that
  arrive while a write is in progress share the next transaction (one fsync for many requests under load).
  `submit(change)` is the same without the wait: the change is queued when it is called (so calls keep their
  order) and the returned future resolves when `save` would return. A bulk ban queues its save as it hands
  its ops to the kernel and awaits both, so the fsync runs while the kernel commits (enforcer.ban_hosts);
  the jail sink awaits a batch's saves only later, while later batches go to the kernel (kernel/sink.py).
  A change that deletes starts a new transaction (the store deletes before it saves within one call).
- Order is kept: a change is never written before one queued earlier. When a write fails (disk full, I/O
  error, a read-only file system), the change stays at the head of the queue, the persister is *degraded*
  and every later change waits behind it; `retry()` (called periodically) writes them when it can.
- A failed write does not hold the request up: the kernel already enforces the ban, so the request is
  acknowledged and the loss risk is reported instead (log once per incident, `status()`, metrics) until
  everything is saved.
- `saved()` answers whether everything queued so far is written (True), or a write failed meanwhile (False),
  once that is known: fleet mode publishes a jail's ban from memory only once its local save is written, so
  a ban the fleet holds is never one this host lost in a crash.
- Memory bound: while degraded the queue grows by the changes made meanwhile (a few hundred bytes each);
  the status and the `unsaved` gauge show how many.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: queues changes and writes them in order, on the event loop)
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nftblockd.state.change import StateChange

log = logging.getLogger("nftblockd.store")

Writer = Callable[[StateChange], Awaitable[None]]  # one store transaction (runs on the store thread)


@dataclass(frozen=True, slots=True)
class PersistStatus:
    degraded: bool
    unsaved_changes: int
    last_error: str | None
    degraded_since: float | None  # wall clock, for operators


class Persister:
    def __init__(self, write: Writer, *, on_state: Callable[[PersistStatus], None] | None = None) -> None:
        self._write = write
        self._queue: list[tuple[StateChange, asyncio.Future[None] | None]] = []
        self._task: asyncio.Task[None] | None = None
        self._error: str | None = None
        self._since: float | None = None
        self._on_state = on_state
        self.failures = 0
        self._queued = 0  # changes ever queued, and ever written: a `saved()` waits for its mark
        self._written = 0
        self._marks: list[tuple[int, asyncio.Future[bool]]] = []

    def status(self) -> PersistStatus:
        return PersistStatus(self._error is not None, len(self._queue), self._error, self._since)

    async def save(self, change: StateChange) -> None:
        await self.submit(change)

    def submit(self, change: StateChange) -> asyncio.Future[None]:
        """Queue `change` now; the future resolves once a write that included it was attempted."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not change:
            fut.set_result(None)
            return fut
        self._queue.append((change, fut))
        self._queued += 1
        self._kick()
        return fut

    def saved(self) -> asyncio.Future[bool]:
        """Resolves True once every change queued before this call is written, False as soon as a write fails
        before that (the changes stay queued and are retried: the caller must not rely on them yet)."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self._written >= self._queued:
            fut.set_result(True)
        elif self._error is not None:
            fut.set_result(False)
        else:
            self._marks.append((self._queued, fut))
        return fut

    def _resolve_marks(self, ok: bool) -> None:
        keep = []
        for mark, fut in self._marks:
            if fut.done():
                continue
            if not ok:
                fut.set_result(False)
            elif self._written >= mark:
                fut.set_result(True)
            else:
                keep.append((mark, fut))
        self._marks = keep

    async def retry(self) -> None:
        """Try the unsaved changes again (no-op when nothing waits)."""
        if self._queue:
            self._kick()
            assert self._task is not None
            await asyncio.shield(self._task)

    async def flush(self) -> None:
        """Wait for the writes in progress (shutdown): one last attempt at anything unsaved."""
        await self.retry()

    def _kick(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while self._queue:
            n = 1
            while n < len(self._queue) and not self._queue[n][0].deletes_anything:
                n += 1
            batch = self._queue[:n]
            try:
                await self._write(StateChange.merge([c for c, _f in batch]))
            except Exception as exc:
                self.failures += 1
                first = self._error is None
                self._error = str(exc) or type(exc).__name__
                if first:
                    self._since = time.time()
                    log.error("could not save state changes (%s); the kernel enforces them, but they will not "
                              "survive a restart until saved; retrying", self._error)
                self._release(self._queue)  # acknowledge all waiting: the kernel has the bans; the changes stay queued
                self._resolve_marks(False)
                self._report()
                return
            del self._queue[:n]
            self._written += n
            self._release(batch)
            self._resolve_marks(True)
            if self._error is not None and not self._queue:
                log.warning("state database writable again: every pending change is saved")
                self._error = None
                self._since = None
            self._report()

    @staticmethod
    def _release(batch: list[tuple[StateChange, asyncio.Future[None] | None]]) -> None:
        for _change, f in batch:
            if f is not None and not f.done():
                f.set_result(None)

    def _report(self) -> None:
        if self._on_state is not None:
            self._on_state(self.status())
