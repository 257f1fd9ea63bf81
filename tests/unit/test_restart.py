"""service/restart.py's keep_running on a fake clock and a fake pause (nothing sleeps): the backoff sequence
and its cap, the reset after a healthy run, one log line with a traceback and one count per failure, `stop`,
and cancellation, which always propagates and is never taken for a failure."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest

from nftblockd.service.restart import Backoff, keep_running


class Boom(Exception):
    pass


@dataclass
class Tally:
    n: float = 0

    def inc(self, amount: float = 1) -> None:
        self.n += amount


@dataclass
class Script:
    """Runs that last `durations[i]` fake seconds and then raise (or return, for the last one unless
    `forever`); pauses recorded and passed on the fake clock."""

    durations: list[float]
    now: float = 1000.0
    pauses: list[float] = field(default_factory=list)
    runs: int = 0
    failures: list[tuple[str, float]] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    async def run(self) -> None:
        i = self.runs
        self.runs += 1
        self.now += self.durations[i]
        if i == len(self.durations) - 1:
            return
        raise Boom(f"bug {i}")

    async def pause(self, seconds: float, stop: asyncio.Event) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    def on_failure(self, exc: Exception, delay: float) -> None:
        self.failures.append((str(exc), delay))


async def test_the_backoff_doubles_up_to_its_cap_and_each_failure_is_logged_once_and_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    s = Script([0.5] * 11 + [0.0])
    tally = Tally()
    with caplog.at_level(logging.ERROR, logger="nftblockd"):
        await keep_running(s.run, asyncio.Event(), what="thing failed", backoff=Backoff(1.0, 300.0, 60.0),
                           failures=tally, on_failure=s.on_failure, clock=s.clock, pause=s.pause)
    assert s.pauses == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    assert s.runs == 12 and tally.n == 11
    assert s.failures[:2] == [("bug 0", 1.0), ("bug 1", 2.0)]
    assert [r.getMessage() for r in caplog.records][:2] == ["thing failed; starting it again in 1s",
                                                            "thing failed; starting it again in 2s"]
    assert len(caplog.records) == 11 and all(r.exc_info and r.exc_info[0] is Boom for r in caplog.records)


def test_the_delay_is_capped_for_any_number_of_failures() -> None:
    b = Backoff(0.5, 300.0)
    assert [b.delay(n) for n in (0, 1, 2, 3)] == [0.5, 0.5, 1.0, 2.0]
    assert b.delay(10_000) == 300.0


async def test_a_healthy_run_starts_the_backoff_afresh() -> None:
    # runs of 1 s fail in a row; the 4th lasted 60 s (healthy): its failure is a first one again
    s = Script([1, 1, 1, 60, 1, 59.9, 0])
    await keep_running(s.run, asyncio.Event(), what="x", backoff=Backoff(1.0, 300.0, 60.0), clock=s.clock,
                       pause=s.pause)
    assert s.pauses == [1, 2, 4, 1, 2, 4]


async def test_a_run_that_returns_ends_it_and_stop_ends_it_before_the_next_run() -> None:
    s = Script([0])
    await keep_running(s.run, asyncio.Event(), what="x", clock=s.clock, pause=s.pause)
    assert (s.runs, s.pauses) == (1, [])
    stop = asyncio.Event()
    s = Script([0, 0, 0])

    async def stopping_pause(seconds: float, ev: asyncio.Event) -> None:
        assert ev is stop
        stop.set()  # set while it waits: the pause ends and nothing runs again

    await keep_running(s.run, stop, what="x", clock=s.clock, pause=stopping_pause)
    assert s.runs == 1
    s = Script([0])
    await keep_running(s.run, stop, what="x", clock=s.clock, pause=s.pause)
    assert s.runs == 0  # already stopped: never runs


async def test_the_real_pause_ends_when_stop_is_set() -> None:
    stop = asyncio.Event()
    runs: list[int] = []

    async def run() -> None:
        runs.append(1)
        asyncio.get_running_loop().call_soon(stop.set)
        raise Boom

    # an hour's pause: it is `stop` that ends it (the test would hang otherwise)
    await keep_running(run, stop, what="x", backoff=Backoff(3600.0, 3600.0))
    assert runs == [1]


async def cancel_when(reached: asyncio.Event, coro: Coroutine[Any, Any, None]) -> None:
    """Run `coro` as a task, cancel it once it has `reached` its await, and expect the cancellation back."""
    task = asyncio.create_task(coro)
    await reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_cancelling_a_run_propagates_and_is_no_failure() -> None:
    running = asyncio.Event()
    tally = Tally()

    async def run() -> None:
        running.set()
        await asyncio.Event().wait()

    await cancel_when(running, keep_running(run, asyncio.Event(), what="x", failures=tally))
    assert tally.n == 0


async def test_cancelling_a_pause_propagates() -> None:
    waiting = asyncio.Event()
    s = Script([0, 0])

    async def pause(seconds: float, stop: asyncio.Event) -> None:
        waiting.set()
        await asyncio.Event().wait()

    await cancel_when(waiting, keep_running(s.run, asyncio.Event(), what="x", clock=s.clock, pause=pause))
    assert s.runs == 1


async def test_a_cancelled_error_raised_by_the_run_itself_is_never_swallowed() -> None:
    tally = Tally()
    runs: list[int] = []

    async def run() -> None:
        runs.append(1)
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await keep_running(run, asyncio.Event(), what="x", failures=tally, pause=Script([]).pause)
    assert runs == [1] and tally.n == 0


async def test_a_run_that_turns_its_cancellation_into_an_error_is_not_restarted() -> None:
    running = asyncio.Event()
    tally = Tally()
    runs: list[int] = []

    async def run() -> None:
        runs.append(1)
        running.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise Boom("cleanup failed") from None

    await cancel_when(running, keep_running(run, asyncio.Event(), what="x", failures=tally, pause=Script([]).pause))
    assert runs == [1] and tally.n == 1  # logged and counted, and the cancellation went on
