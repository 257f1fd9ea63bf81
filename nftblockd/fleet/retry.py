"""How long the fleet service waits before its next attempt at the server, by how long the outage has lasted.

A fresh outage (`FRESH` seconds) is retried every `FIRST` seconds: a Sentinel failover (~2 s with
`down-after-milliseconds 1000`) or a restart is over within it, and each attempt later than the new primary
adds to the stall (measured: election 2.2-2.3 s, stall 2.5-3.8 s with 0.5 s between attempts on the loaded
test machine). A young one (`YOUNG`) is retried every `FAST` seconds: a healed partition should cost no more.
The old schedule (0.5 s doubling to 30 s) put the attempts 0.5, 1.5, 3.5 and 7.5 s after the loss, so a 2 s
failover stalled sharing 8-10 s and a healed 60 s partition was noticed up to 30 s late (issue #23). An outage
older than `YOUNG` is a server that is really away: the wait grows by a second per `RAMP` seconds, up to
`CAP`, so a fleet of many hosts does not hammer a server that is being rebuilt. Attempts are cheap: a refused
connect is one SYN, a silent one gives up after the link's connect timeout.

Pure: no clock, no randomness (the caller adds jitter), no IO. It must NOT decide what a failure means.
"""

from __future__ import annotations

FIRST = 0.2  # seconds between attempts while an outage is fresh
FRESH = 10.0
FAST = 0.5  # seconds between attempts while an outage is young
YOUNG = 120.0  # an outage this old is young (a failover, a restart, a partition of a minute or two)
RAMP = 10.0  # beyond YOUNG, the wait grows one second per this many seconds of outage
CAP = 30.0


def retry_delay(down_for: float) -> float:
    """Seconds to wait before the next attempt, `down_for` seconds after the outage began."""
    if down_for < FRESH:
        return FIRST
    if down_for < YOUNG:
        return FAST
    return min(CAP, FAST + (down_for - YOUNG) / RAMP)


__all__ = ["CAP", "FAST", "FIRST", "FRESH", "YOUNG", "retry_delay"]
