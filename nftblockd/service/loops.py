"""Periodic work under the daemon's TaskGroup: one helper, so every loop stops the same way (at once when
the stop event is set, not at the end of its period) and a failing round is logged and retried, never
fatal to the daemon."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("nftblockd")


async def every(period: Callable[[], float], stop: asyncio.Event, step: Callable[[], Awaitable[None]],
                what: str) -> None:
    """Run `step` every `period()` seconds (read anew each round, so a reload can change it) until `stop`."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period())
        if stop.is_set():
            return
        try:
            await step()
        except Exception:
            log.exception("%s failed; will try again", what)
