"""Test tools for log sources: bounded async polling, and a runner that collects what a source hands over."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from nftblockd.events import LogLine
from nftblockd.sources.base import LineBatch, Source


async def wait_for_condition(pred: Callable[[], Any], timeout: float = 5.0,  # noqa: ASYNC109 (a bound)
                             what: str = "") -> Any:
    """Poll `pred` between event-loop turns until it is truthy; fail after `timeout` seconds.

    The source under test runs in the same loop, so each poll yields to it; a short pause between polls
    keeps the loop from spinning while the kernel (inotify, journald) catches up. `timeout` is a bound only.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or pred}")
        await asyncio.sleep(0.005)


class Collector:
    """Runs a source as a task and consumes its queue into `lines` (as the daemon's matcher task would).

    `maxsize` counts batches. Clearing `consume` pauses the consumer after the batch it is waiting for.
    """

    def __init__(self, source: Source, maxsize: int = 64) -> None:
        self.source = source
        self.queue: asyncio.Queue[LineBatch] = asyncio.Queue(maxsize=maxsize)
        self.lines: list[LogLine] = []
        self.consume = asyncio.Event()
        self.consume.set()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def texts(self) -> list[str]:
        return [line.text for line in self.lines]

    async def _consumer(self) -> None:
        while True:
            await self.consume.wait()
            self.lines.extend(await self.queue.get())

    async def wait_lines(self, n: int, timeout: float = 5.0) -> list[str]:  # noqa: ASYNC109 (a bound)
        await wait_for_condition(lambda: len(self.lines) >= n, timeout,
                                 f"{n} lines (have {len(self.lines)}: {self.texts[-3:]!r})")
        return self.texts

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self.source.run(self.queue)),
                       asyncio.create_task(self._consumer())]
        ready = asyncio.create_task(self.source.ready.wait())
        await asyncio.wait([ready, self._tasks[0]], timeout=10, return_when=asyncio.FIRST_COMPLETED)
        if self._tasks[0].done():
            ready.cancel()
            self._tasks[0].result()  # raises what the source raised
        assert ready.done(), "source did not become ready"

    async def stop(self) -> None:
        """Cancel the source (its positions are saved), then take what it had queued, as the daemon does."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        while not self.queue.empty():
            self.lines.extend(self.queue.get_nowait())


@asynccontextmanager
async def running(source: Source, maxsize: int = 64) -> AsyncIterator[Collector]:
    c = Collector(source, maxsize)
    await c.start()
    try:
        yield c
    finally:
        await c.stop()
