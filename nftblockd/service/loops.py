"""Periodic work under the daemon's TaskGroup: one helper, so every loop stops the same way (at once when
the stop event is set, not at the end of its period) and a failing round is logged and retried, never
fatal to the daemon."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("nftblockd")


async def wait_or_stop(seconds: float, stop: asyncio.Event) -> None:
    """Wait `seconds`, or until `stop` is set, whichever comes first: every pause of a loop here, so a loop
    never sleeps past the daemon's stop."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()


async def every(period: Callable[[], float], stop: asyncio.Event, step: Callable[[], Awaitable[None]],
                what: str) -> None:
    """Run `step` every `period()` seconds (read anew each round, so a reload can change it) until `stop`."""
    while not stop.is_set():
        await wait_or_stop(period(), stop)
        if stop.is_set():
            return
        try:
            await step()
        except Exception:
            log.exception("%s failed; will try again", what)
