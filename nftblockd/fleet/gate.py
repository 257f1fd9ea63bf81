"""The trust gate: a received fleet event is untrusted input, checked as strictly as a local detection.

Any host holding write access to the stream can ban on every host, so before an event reaches the kernel:

1. the codec has parsed it (schema version, address with host bits zero, a sane end time);
2. a ban's prefix is no wider than the configured minimum of its family (no /0, no /8 by default);
3. never-ban space is refused: unspecified, loopback, link-local, multicast, reserved and limited broadcast
   (the project's shared table, `neverban.py`);
4. the allowlist wins, and it includes this host's own addresses: a ban that overlaps either is refused;
5. the remaining time is clamped to [1 s, max_ban]; a ban already over is refused as `expired`; permanent is
   kept only when the operator allows it, otherwise it becomes max_ban;
6. a per-origin token bucket caps how many events one host can push (rate per second, burst). Its clock is
   the *server's* entry id time, not ours: a peer cannot forge its way around the cap. A *replay* is told
   from a flood by the event's own time (`ts`, when the origin decided the ban): an event decided more than
   `REPLAY_AGE` before the server took it is an outbox flushed after an outage or a re-assert, and is paced
   by its decision times (the pace the origin really decided at) in a bucket of its own, under a ceiling of
   `FLOOD_FACTOR` times the cap by the server's clock (old `ts` values are forgeable: the ceiling bounds what
   forging buys). A 30k backlog flushed at once was 22-25 % refused by the server-time bucket alone
   (issue #23). The service does not drop what this step refuses: it defers and retries it (service.py).

Unbans pass 1 and 6 only: removing a ban never endangers reachability.
The gate is pure: time is an argument, the only state is the per-origin buckets (bounded by `max_origins`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from nftblockd import optional_c
from nftblockd.addr import IPNet, host_net
from nftblockd.allowlist import Allowlist
from nftblockd.fleet.codec import FleetEvent, Rejection
from nftblockd.neverban import never_ban_keys, never_ban_range

if TYPE_CHECKING:
    from collections.abc import Callable


_plain_mod = optional_c.load("nftblockd.fleet._plain")  # not built: the Python token loop alone
_take_live: Callable[..., tuple[int, float, float]] | None = None if _plain_mod is None else _plain_mod.take_live


def span(net: IPNet) -> tuple[int, int]:
    """First and last address of `net` as ints (without ipaddress's cached broadcast_address)."""
    first = int(net.network_address)
    return first, first + (1 << (net.max_prefixlen - net.prefixlen)) - 1


@dataclass(frozen=True, slots=True)
class TrustLimits:
    min_prefix_v4: int = 16
    min_prefix_v6: int = 48
    max_ban: float = 7 * 86400.0
    allow_permanent: bool = False
    rate: float = 2000.0  # events per second per origin, sustained
    burst: int = 20000  # events one origin may send at once


@dataclass(frozen=True, slots=True)
class Accepted:
    """An event that passed: `until` is clamped (math.inf only for an allowed permanent ban)."""

    event: FleetEvent
    until: float
    clamped: bool = False


REPLAY_AGE = 10.0  # seconds between a ban's decision and its stream entry beyond which it is a replay
FLOOD_FACTOR = 10.0  # replays of one origin: at most this times `rate` and `burst` by the server's clock


class _Bucket:
    __slots__ = ("at", "tokens")

    def __init__(self, tokens: float, at: float) -> None:
        self.tokens = tokens
        self.at = at

    def refill(self, at: float, rate: float, burst: float) -> None:
        if at > self.at:  # a bucket's clock never goes back (a replay's decision times may be out of order)
            self.tokens = min(burst, self.tokens + (at - self.at) * rate)
            self.at = at


class _Origin:
    """One origin's buckets: live events by server time; replays by decision time and, as a ceiling, by
    server time at FLOOD_FACTOR."""

    __slots__ = ("ceiling", "live", "replay")

    def __init__(self, burst: float, at: float) -> None:
        self.live = _Bucket(burst, at)
        self.replay: _Bucket | None = None  # made at the origin's first replay, from that replay's times
        self.ceiling = _Bucket(burst * FLOOD_FACTOR, at)


class Gate:
    """Checks events against `limits` and `allow` (which must already hold this host's own addresses)."""

    def __init__(self, limits: TrustLimits, allow: Allowlist, *, max_origins: int = 10000) -> None:
        self.limits = limits
        self.allow = allow
        self.max_origins = max_origins
        self._buckets: dict[str, _Origin] = {}

    def _bucket(self, origin: str, at: float) -> _Origin:
        b = self._buckets.get(origin)
        if b is None:
            if len(self._buckets) >= self.max_origins:
                # bounded memory: forget the origin seen longest ago (dicts keep insertion order)
                del self._buckets[next(iter(self._buckets))]
            b = self._buckets[origin] = _Origin(float(self.limits.burst), at)
        return b

    def _rate_ok(self, origin: str, at: float, decided: float = 0.0) -> bool:
        """Step 6 for one event entered at server time `at`, decided by its origin at `decided` (0: unknown)."""
        return _take(self._bucket(origin, at), at, decided, self.limits.rate, float(self.limits.burst))

    def check_net(self, net: IPNet) -> Rejection | None:
        """Steps 2-4 for a ban target (also used for snapshot entries, which carry no origin)."""
        lim = self.limits
        minimum = lim.min_prefix_v4 if net.version == 4 else lim.min_prefix_v6
        if net.prefixlen < max(1, minimum):
            return Rejection("too_wide", f"{net} is wider than /{minimum}")
        first, last = span(net)
        special = never_ban_range(net.version, first, last)
        if special is not None:
            return Rejection("never_ban", f"{net}: {special}")
        entry = self.allow.contains_range(net.version, first, last)
        if entry is not None:
            return Rejection("allowlisted", f"{net} overlaps allowlist entry {entry}")
        return None

    def clamp(self, until: float, now: float) -> tuple[float, bool] | Rejection:
        """Step 5: the end to enforce and whether it was shortened, or `expired`."""
        lim = self.limits
        if until == math.inf:
            if lim.allow_permanent:
                return math.inf, False
            return now + lim.max_ban, True
        remaining = until - now
        if remaining <= 0:
            return Rejection("expired", f"ended {-remaining:.0f}s ago")
        if remaining > lim.max_ban:
            return now + lim.max_ban, True
        return max(until, now + 1.0), False

    def check(self, ev: FleetEvent, now: float, server_time: float) -> Accepted | Rejection:
        """The whole gate for one decoded event; `server_time` is the stream entry id's time in seconds."""
        if not self._rate_ok(ev.origin, server_time, ev.ts / 1000):
            return Rejection("rate", ev.origin)
        if ev.op == "unban":
            return Accepted(ev, 0.0)
        bad = self.check_net(ev.net)
        if bad is not None:
            return bad
        clamped = self.clamp(ev.until, now)
        if isinstance(clamped, Rejection):
            return clamped
        return Accepted(ev, clamped[0], clamped[1])

    def check_hosts(self, origins: Sequence[str], ats: Sequence[float], versions: Sequence[int],
                    keys: Sequence[int], untils: Sequence[float], now: float,
                    decided: Sequence[float] | None = None) -> HostVerdict:
        """`check` for many single-address bans at once, in order: ban i is of address `keys[i]` (IP version
        `versions[i]`) until `untils[i]`, from `origins[i]`, received at server time `ats[i]`, decided at
        `decided[i]` (seconds; 0 or None: unknown).

        The same answers as `check` called on each in turn (tests/unit/test_fleet_batch.py), the same bucket
        state after: every ban takes its origin's token in order (a ban the later steps refuse has taken one,
        as in `check`). Steps 2-4 find candidates over the whole batch (the never-ban space by first octet, the
        allowlist's `hosts_among`) and ask `check_net` only about those; step 5 runs once per distinct end."""
        refused = self._take_tokens(origins, ats, decided)
        for i in sorted(set(self._net_candidates(versions, keys))):
            if i not in refused:
                bad = self.check_net(host_net(keys[i], versions[i]))
                if bad is not None:
                    refused[i] = bad
        if untils:  # `clamp` is monotone in the end: when it leaves the earliest and the latest as they are
            # (a catch-up's bans, none over, none beyond max_ban), it leaves every one (no call per distinct end).
            # `lo > now` too: from 2**53 s on, `now + 1.0` is `now`, and an end at `now` is expired
            lo, hi = min(untils), max(untils)
            if lo >= now + 1.0 and lo > now and hi != math.inf and hi - now <= self.limits.max_ban:
                return HostVerdict(list(untils), refused)
        end: dict[float, float] = {}
        expired: dict[float, Rejection] = {}
        for u in set(untils):
            c = self.clamp(u, now)
            if isinstance(c, Rejection):
                expired[u] = c
                end[u] = math.nan
            else:
                end[u] = c[0]
        if expired:
            for i, u in enumerate(untils):
                if u in expired and i not in refused:
                    refused[i] = expired[u]
        return HostVerdict(list(map(end.__getitem__, untils)), refused)

    def _take_tokens(self, origins: Sequence[str], ats: Sequence[float],
                     decided: Sequence[float] | None = None) -> dict[int, Rejection]:
        """Step 6 for events i = 0, 1, ... in order: the `rate` refusals (the live bucket inline, as `_take`
        does: a method call per event was a third of this loop; replays through `_take`)."""
        refused: dict[int, Rejection] = {}
        burst, rate = float(self.limits.burst), self.limits.rate
        origin: str | None = None
        o_b = _Origin(0.0, 0.0)
        b = o_b.live
        n = len(origins)
        if len(ats) != n:
            raise ValueError("origins and ats differ in length")
        # the live runs in C where it was built (`_plain.take_live`: the same float steps, bit for bit)
        run = _take_live if _take_live is not None and type(origins) is list and type(ats) is list and (
            decided is None or type(decided) is list) else None
        skipped: list[int] = []
        i = 0
        while i < n:
            o, at = origins[i], ats[i]
            if o != origin:  # a batch is a few long runs of one origin: one bucket look-up per run
                o_b = self._bucket(o, at)
                b = o_b.live
                origin = o
            if decided is not None and at - decided[i] > REPLAY_AGE and decided[i] > 0:
                if not _take(o_b, at, decided[i], rate, burst):
                    refused[i] = Rejection("rate", o)
            else:
                if at > b.at:
                    b.tokens = min(burst, b.tokens + (at - b.at) * rate)
                    b.at = at
                if b.tokens < 1.0:
                    refused[i] = Rejection("rate", o)
                else:
                    b.tokens -= 1.0
            i += 1
            if run is not None and i < n and type(b.at) is float:  # the rest of this live run, up to what C leaves
                i, b.tokens, b.at = run(origins, ats, decided, i, o, b.tokens, b.at, rate, burst, REPLAY_AGE,
                                        skipped)
                for j in skipped:
                    refused[j] = Rejection("rate", o)
                skipped.clear()
        return refused

    def _net_candidates(self, versions: Sequence[int], keys: Sequence[int]) -> list[int]:
        """Indexes of the addresses steps 2-4 may refuse (a superset: `check_net` decides): all of a family
        whose minimum prefix is longer than an address, those never to be banned (`neverban.never_ban_keys`),
        those the allowlist holds."""
        lim = self.limits
        n = len(keys)
        out: list[int] = []
        for version, bits, minimum in ((4, 32, lim.min_prefix_v4), (6, 128, lim.min_prefix_v6)):
            if version == 4 and 6 not in versions:
                idx: Sequence[int] = range(n)
                fam: Sequence[int] = keys
            else:
                idx = [i for i in range(n) if versions[i] == version]
                fam = [keys[i] for i in idx]
            if not idx:
                continue
            if bits < max(1, minimum):
                out += idx
                continue
            hit = set(never_ban_keys(version, fam))
            if len(self.allow):
                hit.update(self.allow.hosts_among(version, fam))
            if hit:
                out += [idx[j] for j, k in enumerate(fam) if k in hit]
        return out


def _take(o: _Origin, at: float, decided: float, rate: float, burst: float) -> bool:
    """Take one token for an event entered at server time `at` and decided at `decided`; False: refused.

    A live event (decided within REPLAY_AGE of its entry, or of unknown time) takes from the live bucket, by
    server time. A replay takes from the replay bucket, by decision time (a backlog decided over ten minutes
    and flushed in one second passes as it was decided), and from the ceiling, by server time."""
    if decided <= 0 or at - decided <= REPLAY_AGE:
        b = o.live
        b.refill(at, rate, burst)
        if b.tokens < 1.0:
            return False
        b.tokens -= 1.0
        return True
    r = o.replay
    if r is None:
        r = o.replay = _Bucket(burst, decided)
    r.refill(decided, rate, burst)
    c = o.ceiling
    c.refill(at, rate * FLOOD_FACTOR, burst * FLOOD_FACTOR)
    if r.tokens < 1.0 or c.tokens < 1.0:
        return False
    r.tokens -= 1.0
    c.tokens -= 1.0
    return True


class HostVerdict(NamedTuple):
    """`Gate.check_hosts`' answer: `refused[i]` says why ban i is refused; `ends[i]` is the clamped end of
    every other one (math.inf only for an allowed permanent ban)."""

    ends: list[float]
    refused: dict[int, Rejection]


__all__ = ["FLOOD_FACTOR", "REPLAY_AGE", "Accepted", "Gate", "HostVerdict", "TrustLimits"]
