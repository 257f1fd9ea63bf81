"""Starting a long-lived task again after it failed unexpectedly: one helper for every such loop (the fleet
service, each feed's task), so they all log, count, back off and stop the same way.

`keep_running(run, stop, ...)`, its rules in order:

- `run()` returning ends it: the task's work is done (it saw `stop`, or its feed went away).
- `run()` raising an `Exception` (a bug, a database that fails: whatever the task's own retries do not
  handle) is logged once, with its traceback, counted in `failures`, handed to `on_failure(error, pause)`
  (for status lines) and followed by a pause; then `run()` is called again.
- The pause is `Backoff.delay(n)` for the n-th failure in a row: `base`, doubling per failure, at most
  `cap`. A run that lasted `healthy` seconds or more was a good run: the failure that ends it counts as the
  first in a row again, so a task that fails once a day is not kept waiting for minutes.
- `stop` set: no run starts any more, and a pause ends at once.
- Cancellation is never caught: `CancelledError` (a `BaseException`) raised in a run or a pause propagates,
  so the TaskGroup stops the task at once. A run that turned its cancellation into another error does not
  get restarted either: the error is logged and counted, and the cancellation goes on.

Time is passed in: `clock` (monotonic seconds) measures runs and `pause(seconds, stop)` waits, so tests drive
every path without sleeping. Must not: swallow a cancellation, log a failure twice, or decide what a failure
means for status (the caller's `on_failure` does).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from nftblockd.service.loops import wait_or_stop

log = logging.getLogger("nftblockd")

RESTART_BASE = 1.0  # seconds before the first restart: soon, a one-off failure should cost little
RESTART_MAX = 300.0  # the longest pause: a task failing in a loop logs a traceback at most every 5 minutes
RESTART_HEALTHY = 60.0  # a run this long was a good one: the next failure starts the backoff afresh


class Counts(Protocol):
    """Where a failure is counted: a prometheus_client Counter (or its `labels(...)` child) fits."""

    def inc(self, amount: float = 1) -> None: ...


@dataclass(frozen=True, slots=True)
class Backoff:
    base: float = RESTART_BASE
    cap: float = RESTART_MAX
    healthy: float = RESTART_HEALTHY

    def delay(self, in_a_row: int) -> float:
        """The pause after the `in_a_row`-th failure in a row (1: the first)."""
        doublings = min(max(in_a_row, 1) - 1, 30)  # (bounded: the pause is capped long before, and no overflow)
        return min(self.cap, self.base * float(1 << doublings))


async def keep_running(run: Callable[[], Awaitable[None]], stop: asyncio.Event, *, what: str,
                       backoff: Backoff = Backoff(), failures: Counts | None = None,
                       on_failure: Callable[[Exception, float], None] | None = None,
                       clock: Callable[[], float] = time.monotonic,
                       pause: Callable[[float, asyncio.Event], Awaitable[None]] = wait_or_stop,
                       logger: logging.Logger = log) -> None:
    """Run `run()` until it returns or `stop` is set, starting it again after each unexpected error (see the
    module's rules). `what` opens the failure's log line on `logger`, e.g. "feed x: its task failed"."""
    in_a_row = 0
    while not stop.is_set():
        started = clock()
        try:
            await run()
            return
        except Exception as exc:
            in_a_row = 1 if clock() - started >= backoff.healthy else in_a_row + 1
            delay = backoff.delay(in_a_row)
            logger.exception("%s; starting it again in %gs", what, delay)
            if failures is not None:
                failures.inc()
            if on_failure is not None:
                on_failure(exc, delay)
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError from exc  # cancelled while failing: stopping wins
        await pause(delay, stop)


__all__ = ["RESTART_BASE", "RESTART_HEALTHY", "RESTART_MAX", "Backoff", "Counts", "keep_running"]
