"""Pure failure tracker: Hits in, ban decisions out, one small state machine per (jail, offender).

This module never does IO, never imports asyncio and never reads the clock: every call takes `now` (wall-clock
epoch seconds, the clock `Ban.until` is written in). Logging, metrics, persistence and the kernel are the
caller's business; the tracker says what happened in the `TrackOutcome` it returns and the caller counts kinds.

Rules
=====

Offenders. A hit's host is normalised first (IPv4-mapped IPv6 becomes IPv4). IPv4 hosts are tracked one
address at a time. IPv6 hosts are tracked *and banned* by the /`ipv6_prefix` network they belong to (a jail
setting, e.g. 64), because a host rotating through its /64 walks around every /128 ban (docs/why.md #4). One
exception keeps the allowlist absolute: if that network overlaps an allow entry, the offender is the single
address instead, so an allowed neighbour is never caught inside a range ban.

States. Each (jail, offender) is in one of three states:

    IDLE ──failure──► COUNTING ──maxretry-th failure within findtime──► BANNED
      ▲                  │                                                 │
      └── no failure ────┘                                                 │
          for findtime     ◄──────── until passes, or forget_ban() ────────┘

  IDLE      nothing is stored.
  COUNTING  the times of the failures seen within the last `findtime` (fewer than `maxretry` of them).
  BANNED    a ban is in force until `until` (None: permanent). A hit costs one dict lookup and returns
            ALREADY_BANNED with the ban in force: no new ban, nothing to log (docs/why.md #11, the "already
            banned" storms). The ban ends when `now` reaches `until` (noticed on the next hit or by `sweep`)
            or when the daemon calls `forget_ban` (a manual unban, or a reconcile that found the kernel
            element gone). The offender then starts again from IDLE; its ban history stays unless forgiven.

What a hit does, in this order:
  1. The offender is BANNED → ALREADY_BANNED.
  2. The host is in never-ban space (unspecified, loopback, link-local, multicast, reserved, broadcast:
     `neverban.py`) → NEVER_BAN; or on the allowlist (global `allowlist:` + the jail's `ignoreip:` + the
     machine's own addresses) → ALLOWLISTED. Either carries the entry that matched. Nothing is counted,
     nothing is banned. (Both live in one lookup table per jail, so the check costs one bisect per hit.)
  3. The failure's time is chosen by the time rule below; a line too old (or too far ahead) → STALE.
  4. The failure is added and failures older than `findtime` are dropped. Fewer than `maxretry` remain →
     COUNTED. `maxretry` remain → BANNED, with the `Ban` to apply and the `BanRecord` to persist; the
     counts are cleared.

Time rule. A Hit carries the line's own timestamp (its arrival time when the line had none). The caller says
whether the line is *live* (the source is tailing: the line was written moments ago) or *catching up* (a
backlog read after a start, a rotation or from a journal cursor).
  - Catching up (`live=False`, the default): the line's time is trusted, because compressing an hour of
    backlog onto "now" would ban everyone who failed twice in that hour (docs/why.md #8, old lines treated as
    new). A line older than `now - findtime` is STALE. A line from the future by more than `max_skew` is
    STALE too (its real age is unknowable and catching up must not ban on guesses); within `max_skew` it
    counts at `now`.
  - Live (`live=True`): the line arrived now, so the failure happened about now whatever its text claims.
    Its own time is kept only within min(max_skew, findtime) before `now` (preserving the order inside a
    slightly delayed batch); otherwise the arrival time `now` is used. So a source whose clock is hours off
    (wrong timezone, a remote or container clock: docs/why.md #9) never blinds live detection. Not re-reading
    old lines as live is the source's job (it keeps offsets, inodes and cursors).
  - Our own clock stepping (NTP, an operator): stored failure times outside [now - findtime, now + max_skew]
    are dropped, so a step by more than findtime either way forgets the partial counts it straddles and
    nothing more. A ban that started more than `max_skew` after `now` (our clock went back past its start)
    is dropped instead of trusted: its real end is unknowable, and an offender that still produces hits is
    evidently not blocked.

Ban duration and escalation. duration = bantime * factor**n, capped at max(escalation.max, bantime), where n
is the number of earlier bans of the same offender *in the same jail* that started within the jail's history
horizon (default: 4 * that cap, and at least the findtime of any recidive jail watching it). Escalation is
per jail on purpose: each jail's bantime suits its service, and one noisy jail must not lengthen another's
bans. Counting across jails is what a recidive jail does, explicitly and with its own limits. bantime
PERMANENT (durations.py) stays so. A ban never ends before an earlier ban of the same offender in the same
jail: `until` is raised to it if needed, which matters only after our clock stepped back.
`until = ban_end(duration, now)`: `now + duration`, or None (an end that never comes) for PERMANENT.

Recidive. A jail whose policy says `recidive=True` counts *bans* instead of hits: the daemon passes each jail
ban it applies to `observe_ban(ban, now)`, and each recidive jail watching that jail (every ordinary jail
when `watch` is empty) treats it as one failure at `now` of the banned target, then applies its own
maxretry / findtime / bantime / escalation / blocklist exactly as above. Recidive jails never watch recidive
jails (no loops) and never receive hits.

History. Each ban comes with a `BanRecord(jail, target, at, until)`; the daemon persists it as a row of plain
values (`as_row()`) as it happens, and after a restart hands the rows back to `load_history`, which restores
escalation counts and the recidive counts of the last findtime. `history_snapshot()` gives every row at
once. Records older than their jail's horizon are forgotten by `sweep` (the store prunes the same way).
`forget_ban(..., forgive=True)` also drops the offender's history and counts: an operator's "that was me".

Taken-over bans. `adopt(bans, now)` makes bans decided elsewhere for one of our jails (fail2ban's, by
`nftblock import-fail2ban`) that jail's own: BANNED as `note_ban` restores them, plus one record starting
`now` in its history, read as `load_history` reads rows (escalation counts it; recidive counts it without
banning at once).

Memory. Counting records live in two generations per jail: every `findtime` the older generation is dropped
whole (nothing in it has failed for a full findtime, so all of it is stale) and the current one becomes the
older. That bounds stale records without scanning on every hit. A record is one float (one failure: most
scanners fail once), or a sorted tuple of floats, under an int key.
On top, `max_tracked` caps the counting records of the whole tracker. When it bites, a batch (1/64 of the
cap) is evicted, in this order, so that a flood of cheap single failures cannot push out an offender close
to its ban (issue 13: 2 failures from A, then 110k single failures from others, then A's third went unbanned):
  1. one-failure records, the older generation first (the largest jail's first), oldest first;
  2. only when no one-failure record is left anywhere: records with several failures, those farthest from
     their jail's maxretry first, then those whose latest failure is oldest (`evicted_several` counts them).
Records with several failures that step 1 walks past are moved out of its way (from the older generation
into the current one, or to the end of the current one), so each is walked past once per round of
evictions; the hot path does not know eviction exists. Pushing out an offender with k failures thus takes
filling the whole cap with records of k failures or more: k lines each from `max_tracked` distinct
offenders (distinct /`ipv6_prefix` networks for IPv6, which is why IPv6 is grouped by /64 by default), each
then one step from a ban itself. `evictions` counts every evicted record (the daemon's metric reads it at
each scrape).
Bans and history are bounded by the kernel set sizes and the horizon, not by `max_tracked`.
"""

from __future__ import annotations

import enum
import heapq
import ipaddress
import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple, TypeAlias

from nftblockd.addr import (
    V6_TAG,
    IPAddr,
    IPNet,
    addr_int,
    format_target,
    host_net4,
    host_net4_at,
    normalise_network,
    parse_target,
    tagged_key,
    tagged_net,
)
from nftblockd.allowlist import EMPTY, Allowlist, build_allowlist
from nftblockd.config import Config, Escalation, JailConfig
from nftblockd.durations import PERMANENT, BanLength, Permanent, ban_end, format_duration
from nftblockd.events import Ban, Hit, Origin
from nftblockd.neverban import NEVER_BAN

HistoryRow: TypeAlias = tuple[str, str, float, float | None]
"""(jail, target as text, ban start, ban end or None): what the store persists for one ban."""

# Offender keys are ints, cheap to hash and small to keep: addr's tagged keys, both families in one dict. A
# plain IPv4 address is its own value; anything else is a tagged net key, so a /64 and the /128 of its first
# address never collide. IPv4 networks wider than /32 come only via observe_ban / note_ban / load_history.
_ALL32 = 0xFFFFFFFF
_IPv4 = ipaddress.IPv4Address
_IPv6 = ipaddress.IPv6Address
_addr_int = addr_int


class Kind(enum.Enum):
    COUNTED = "counted"
    BANNED = "banned"
    ALREADY_BANNED = "already_banned"
    ALLOWLISTED = "allowlisted"
    NEVER_BAN = "never_ban"
    STALE = "stale"


class BanRecord(NamedTuple):
    """One ban in a jail's history: who, when it started (`at`) and when it ends (None: never)."""

    jail: str
    target: IPNet
    at: float
    until: float | None

    def as_row(self) -> HistoryRow:
        return (self.jail, format_target(self.target), self.at, self.until)

    @classmethod
    def from_row(cls, row: Sequence[object]) -> BanRecord:
        """Inverse of `as_row`; raises ValueError for anything malformed (the store's data is at fault)."""
        if len(row) != 4:
            raise ValueError(f"a history row has 4 fields, got {len(row)}")
        jail, target, at, until = row
        if not isinstance(jail, str) or not isinstance(at, int | float) or isinstance(at, bool):
            raise ValueError(f"malformed history row {row!r}")
        if until is not None and (not isinstance(until, int | float) or isinstance(until, bool)):
            raise ValueError(f"malformed history row {row!r}")
        return cls(jail, parse_target(str(target)), float(at),
                   None if until is None else float(until))


class TrackOutcome(NamedTuple):
    """What one hit (or one observed ban) did. Metrics count `kind`; the daemon acts on BANNED only.

    BanRecord and TrackOutcome are NamedTuples: a burst of bans builds several per ban, and a frozen
    dataclass's __init__ costs several times a tuple's.
    """

    kind: Kind
    ban: Ban | None = None  # BANNED: the new ban to apply; ALREADY_BANNED: the ban in force
    allow: IPNet | None = None  # ALLOWLISTED: the allow entry that protected the host
    record: BanRecord | None = None  # BANNED: the history record to persist


class Tally(NamedTuple):
    """What a batch of hits did (`Tracker.observe_batch`): how many of each kind, and the bans decided."""

    counts: dict[Kind, int]  # kinds that occurred only
    bans: list[Ban]  # BANNED, in order
    records: list[BanRecord]  # their history records, in the same order


@dataclass(frozen=True, slots=True)
class LoadResult:
    loaded: int
    skipped: int  # malformed, unknown jail, older than the horizon, or already present


@dataclass(frozen=True, slots=True)
class JailPolicy:
    """What the tracker needs of a jail: `JailConfig`'s counting fields plus recidive and history settings.

    `recidive=True` makes the jail count bans of the jails named in `watch` (all ordinary jails when empty)
    instead of hits. `history_horizon` None derives it (see the module rules).
    """

    name: str
    maxretry: int = 5
    findtime: float = 600.0
    bantime: BanLength = 3600.0
    escalation: Escalation = field(default_factory=Escalation)
    blocklist: str = "default"
    ignoreip: tuple[IPNet, ...] = ()
    ipv6_prefix: int = 64  # as the example config: one host walks its /64, and /128 counting is evadable
    recidive: bool = False
    watch: frozenset[str] = frozenset()
    history_horizon: float | None = None

    def __post_init__(self) -> None:
        # Policies are built from validated config, so a failure here is a programming error in the caller.
        if self.maxretry < 1:
            raise ValueError(f"jail {self.name}: maxretry must be at least 1")
        if not self.findtime > 0:
            raise ValueError(f"jail {self.name}: findtime must be positive")
        if not isinstance(self.bantime, Permanent) and not self.bantime > 0:
            raise ValueError(f"jail {self.name}: bantime must be positive or PERMANENT")
        if not 16 <= self.ipv6_prefix <= 128:
            raise ValueError(f"jail {self.name}: ipv6_prefix must be between 16 and 128")
        if self.escalation.factor < 1:
            raise ValueError(f"jail {self.name}: escalation factor must be at least 1")
        if self.watch and not self.recidive:
            raise ValueError(f"jail {self.name}: watch is only for recidive jails")
        if self.history_horizon is not None and not self.history_horizon > 0:
            raise ValueError(f"jail {self.name}: history_horizon must be positive")

    @classmethod
    def from_config(cls, jail: JailConfig, *, recidive: bool = False, watch: Iterable[str] = (),
                    history_horizon: float | None = None) -> JailPolicy:
        return cls(
            name=jail.name, maxretry=jail.maxretry, findtime=jail.findtime, bantime=jail.bantime,
            escalation=jail.escalation, blocklist=jail.blocklist, ignoreip=jail.ignoreip,
            ipv6_prefix=jail.ipv6_prefix, recidive=recidive, watch=frozenset(watch),
            history_horizon=history_horizon,
        )

    @property
    def cap(self) -> float:
        """The longest finite ban escalation can reach (never below bantime itself)."""
        return max(self.escalation.max, 0.0 if isinstance(self.bantime, Permanent) else self.bantime)

    def duration(self, previous: int) -> BanLength:
        """Ban length after `previous` earlier bans within the horizon."""
        if isinstance(self.bantime, Permanent):
            return PERMANENT
        esc = self.escalation
        d = self.bantime
        if not esc.enabled or esc.factor == 1:
            return d
        for _ in range(previous):  # a loop, not factor ** n: n is small and ** overflows on huge n
            d *= esc.factor
            if d >= self.cap:
                return self.cap
        return d


class UnknownJailError(LookupError):
    """A hit or ban named a jail this tracker was not built with (the caller's wiring is at fault)."""


class _Banned:
    """An offender in BANNED: the ready-made ALREADY_BANNED answer, so a storm allocates nothing."""

    __slots__ = ("outcome", "since", "until")

    def __init__(self, ban: Ban, since: float) -> None:
        self.outcome: TrackOutcome = _new(TrackOutcome, (_ALREADY, ban, None, None))
        self.since = since
        self.until = math.inf if ban.until is None else ban.until


class _RestoredBanned(_Banned):
    """A BANNED IPv4 offender restored in bulk after a restart (`Tracker.note_hosts`): its ALREADY_BANNED
    answer, and the Ban in it, are built at its first hit instead of for each of a million restored bans."""

    __slots__ = ("_key", "_label", "_made")

    def __init__(self, key: int, until: float | None, label: tuple[str, str, str, str], since: float) -> None:
        self._key = key
        self._label = label  # (blocklist, origin, reason, jail), shared by the whole restore
        self._made: TrackOutcome | None = None
        self.since = since
        self.until = math.inf if until is None else until

    @property
    def outcome(self) -> TrackOutcome:  # type: ignore[override]  # read-only over the base's slot: never written
        if self._made is None:
            blocklist, origin, reason, jail = self._label
            until = None if self.until == math.inf else self.until
            ban = Ban(host_net4(self._key), blocklist, until, origin, reason, jail)  # type: ignore[arg-type]
            self._made = _new(TrackOutcome, (_ALREADY, ban, None, None))
        return self._made


_Times: TypeAlias = float | tuple[float, ...]  # one failure as a bare float: most scanners fail once
_Past: TypeAlias = tuple[tuple[float, float | None], ...]  # (at, until) of earlier bans, by `at`


class _Jail:
    __slots__ = ("a4_ends", "a4_nets", "a4_starts", "a6_ends", "a6_nets", "a6_starts", "allow", "banned",
                 "cur", "findtime", "first", "gen_hi", "gen_lo", "gen_start", "history", "horizon", "live_window",
                 "max_skew", "maxretry", "name", "old", "policy", "reasons", "recidive", "v6_low", "v6_shift",
                 "v6_tag")

    def __init__(self, policy: JailPolicy, allow: Allowlist, horizon: float, max_skew: float) -> None:
        self.policy = policy
        self.name = policy.name
        self.recidive = policy.recidive
        self.maxretry = policy.maxretry
        self.findtime = policy.findtime
        self.live_window = min(max_skew, policy.findtime)
        self.set_allow(allow)
        self.horizon = horizon
        self.v6_shift = 128 - policy.ipv6_prefix
        self.v6_low = (1 << self.v6_shift) - 1
        self.v6_tag = V6_TAG | policy.ipv6_prefix  # tagged_key(6, first, prefix) is v6_tag | first << 8
        self.cur: dict[int, _Times] = {}
        self.old: dict[int, _Times] = {}
        self.max_skew = max_skew
        self.anchor(-math.inf)  # the first counted failure anchors the generations
        self.banned: dict[int, _Banned] = {}
        self.history: dict[int, _Past] = {}
        self.reasons: dict[int, str] = {}  # ban reason by failure count: the same text for most bans
        # (now, until, history) of a first offence decided at `now`: a burst decides thousands at one `now`,
        # and they share the end and the history entry (a tuple, never changed in place) instead of
        # building two tuples and calling ban_end each
        self.first: tuple[float, float | None, _Past] = (math.nan, None, ())

    def anchor(self, now: float) -> None:
        """Start the current generation at `now`; [gen_lo, gen_hi) is when no rotation is due."""
        self.gen_start = now
        self.gen_lo = now - self.max_skew
        self.gen_hi = now + self.findtime

    def set_allow(self, allow: Allowlist) -> None:
        # The lookup tables are copied into slots so the hot path bisects without a method call and two
        # attribute hops per hit.
        self.allow = allow
        self.a4_starts, self.a4_ends, self.a4_nets = allow.v4.starts, allow.v4.ends, allow.v4.nets
        self.a6_starts, self.a6_ends, self.a6_nets = allow.v6.starts, allow.v6.ends, allow.v6.nets


def _key_of_net(net: IPNet, group_prefix: int) -> int:
    """The offender key of `net` in a jail grouping IPv6 by /group_prefix (a narrower net joins its group)."""
    if net.version == 4:
        return tagged_key(4, int(net.network_address), net.prefixlen)
    p = min(group_prefix, net.prefixlen)
    shift = 128 - p
    return tagged_key(6, int(net.network_address) >> shift << shift, p)


# Hot-path constants: an Enum member lookup (`Kind.BANNED`) costs 0.35 us on 3.11, and tuple.__new__
# builds a NamedTuple in a third of the time its generated __new__ takes with keywords.
_BANNED, _ALREADY = Kind.BANNED, Kind.ALREADY_BANNED
_new: Callable[[type[Any], tuple[Any, ...]], Any] = tuple.__new__
_COUNTED = TrackOutcome(Kind.COUNTED)
_STALE = TrackOutcome(Kind.STALE)
_COUNTED_KIND, _STALE_KIND = Kind.COUNTED, Kind.STALE
_NEVER_NETS = frozenset(NEVER_BAN)


def _fast_ban() -> Callable[[IPNet, str, float | None, Origin, str, str], Ban]:
    """`Ban(target, blocklist, until, origin, reason, jail)` for the tracker's bans, in ~0.4 us, not ~0.7.

    A frozen dataclass's __init__ sets each field through object.__setattr__; this writes Ban's slots through
    their descriptors, which is what that does less the lookups. A burst decides 10,000 bans at once. Used only
    if the fields are still those six slots, in that order, and the result equals Ban's own, checked here at
    import; otherwise Ban itself is.
    """
    names = ("target", "blocklist", "until", "origin", "reason", "jail")
    if tuple(f.name for f in fields(Ban)) != names or getattr(Ban, "__slots__", None) != names:
        return Ban
    new = object.__new__
    st, sb, su, so, sr, sj = (vars(Ban)[n].__set__ for n in names)

    def make(target: IPNet, blocklist: str, until: float | None, origin: Origin, reason: str, jail: str) -> Ban:
        b = new(Ban)
        st(b, target)
        sb(b, blocklist)
        su(b, until)
        so(b, origin)
        sr(b, reason)
        sj(b, jail)
        return b

    probe = (host_net4(0x0A000001), "default", 1.5, "jail", "3 failures", "sshd")
    fast, real = make(*probe), Ban(*probe)  # type: ignore[arg-type]
    return make if fast == real and hash(fast) == hash(real) and repr(fast) == repr(real) else Ban


_make_ban = _fast_ban()


def _protected(entry: IPNet) -> TrackOutcome:
    """The outcome of a host inside a jail's protected space: never-ban space, or the allowlist."""
    return TrackOutcome(Kind.NEVER_BAN if entry in _NEVER_NETS else Kind.ALLOWLISTED, allow=entry)


class Tracker:
    """The state machines of every jail; see the module rules. Not thread-safe: one owner calls it."""

    def __init__(self, policies: Iterable[JailPolicy], allowlist: Allowlist = EMPTY, *,
                 max_tracked: int = 100_000, max_skew: float = 60.0) -> None:
        if max_tracked < 1:
            raise ValueError("max_tracked must be at least 1")
        if max_skew < 0:
            raise ValueError("max_skew cannot be negative")
        pols = list(policies)
        by_name = {p.name: p for p in pols}
        if len(by_name) != len(pols):
            raise ValueError("jail names must be unique")
        for p in pols:
            for w in p.watch:
                if w not in by_name or by_name[w].recidive:
                    raise ValueError(f"recidive jail {p.name} watches {w!r}, which is not an ordinary jail")
        self.max_tracked = max_tracked
        self.max_skew = max_skew
        self.evictions = 0  # counting records dropped because max_tracked bit
        self.evicted_several = 0  # ... of which records with several failures (an attack on the cap?)
        self._tracked = 0
        self._allow = allowlist
        self._protect = allowlist.union(NEVER_BAN)  # what no jail may ban: the allowlist and never-ban space
        self._jails: dict[str, _Jail] = {}
        for p in pols:
            horizon = p.history_horizon
            if horizon is None:
                horizon = max([4 * p.cap] + [r.findtime for r in pols if r.recidive and _watches(r, p)])
            self._jails[p.name] = _Jail(p, self._jail_allow(p), horizon, max_skew)
        self._recidive = [j for j in self._jails.values() if j.policy.recidive]

    @classmethod
    def from_config(cls, config: Config, own_addresses: Iterable[IPNet | IPAddr] = (), *,
                    extra: Iterable[JailPolicy] = (), max_tracked: int = 100_000,
                    max_skew: float = 60.0) -> Tracker:
        """The enabled jails of `config`, the global allowlist with own addresses, plus `extra` jails."""
        allow = build_allowlist(config.allowlist, own_addresses, include_self=config.allowlist_self)
        policies = [JailPolicy.from_config(j) for j in config.jails if j.enabled]
        return cls([*policies, *extra], allow, max_tracked=max_tracked, max_skew=max_skew)

    # -- the hot path ----------------------------------------------------------------------------------

    # C901: the checks run in the order the module rules give, in one function: it runs for every failure,
    # and a helper call per check would cost a good part of the hit (bench_tracker: ns per hit).
    def observe(self, hit: Hit, now: float, *, live: bool = False) -> TrackOutcome:  # noqa: C901
        """One failure of `hit.host` in `hit.jail`; see the module rules for the order of checks."""
        j = self._jails.get(hit.jail)
        if j is None or j.recidive:
            raise UnknownJailError(f"no log jail named {hit.jail!r} in this tracker")
        host = hit.host
        x = int(host)
        if isinstance(host, _IPv4) or x >> 32 == 0xFFFF:  # IPv4, or IPv4-mapped IPv6
            x &= _ALL32
            key = x
            b = j.banned.get(key)
            if b is not None:
                if b.since - self.max_skew <= now < b.until:
                    return b.outcome
                del j.banned[key]
            i = bisect_right(j.a4_starts, x) - 1
            if i >= 0 and j.a4_ends[i] >= x:
                return _protected(j.a4_nets[i])
        else:
            shift = j.v6_shift
            first = x >> shift << shift
            key = j.v6_tag | first << 8
            b = j.banned.get(key)
            if b is not None:
                if b.since - self.max_skew <= now < b.until:
                    return b.outcome
                del j.banned[key]
            i = bisect_right(j.a6_starts, first | j.v6_low) - 1
            if i >= 0 and j.a6_ends[i] >= first:
                own = j.allow.v6.find(x, x)
                if own is not None:
                    return _protected(own)
                # An allowed neighbour shares the range: this offender is the single address.
                key = tagged_key(6, x, 128)
                b = j.banned.get(key)
                if b is not None:
                    if b.since - self.max_skew <= now < b.until:
                        return b.outcome
                    del j.banned[key]

        t = hit.time
        if live:
            if not now - j.live_window <= t <= now:
                t = now
        elif t > now:
            if t > now + self.max_skew:
                return _STALE
            t = now
        elif t < now - j.findtime:
            return _STALE
        return self._count(j, key, t, now)

    # C901: `observe` and `_count` inlined for a batch of one jail's failures, on purpose: the per-hit
    # method calls, the Hit built per failure and the per-hit jail lookup were a third of the tracker's time
    # in a 10k-attacker burst (bench_e2e). `observe` stays the reference; tests hold the two equal.
    def observe_batch(self, jail: str, hosts: Sequence[IPAddr], times: Sequence[float], now: float, *,  # noqa: C901
                      live: bool = False) -> Tally:
        """`observe` of each (host, time) in order, all in jail `jail` at `now`: the same state changes and
        outcomes, returned as counts per kind and the bans decided (with their records), in order."""
        j = self._jails.get(jail)
        if j is None or j.recidive:
            raise UnknownJailError(f"no log jail named {jail!r} in this tracker")
        counted = stale = already = 0
        counts: dict[Kind, int] = {}
        bans: list[Ban] = []
        records: list[BanRecord] = []
        banned = j.banned
        get_banned = banned.get
        a4_starts, a4_ends, a4_nets = j.a4_starts, j.a4_ends, j.a4_nets
        skew = self.max_skew
        lo_live = now - j.live_window
        too_old = now - j.findtime
        ahead = now + skew
        maxretry = j.maxretry
        rotated = False
        cur = old = j.cur
        observe = self.observe
        a6_starts, a6_ends = j.a6_starts, j.a6_ends
        v6_shift, v6_tag, v6_low = j.v6_shift, j.v6_tag, j.v6_low
        v4: _IPv4 | None
        for host, t in zip(hosts, times, strict=True):
            if type(host) is _IPv4:
                v4 = host
                key = _addr_int(host)
            elif type(host) is _IPv6 and (x := _addr_int(host)) >> 32 != 0xFFFF:  # IPv6, not IPv4-mapped
                # counted by its range's key, as `observe` does; a range that meets protected space (never-ban,
                # the allowlist) goes to `observe`, which sorts out an allowed neighbour sharing the range
                v4 = None
                first = x >> v6_shift << v6_shift
                i = bisect_right(a6_starts, first | v6_low) - 1
                key = -1 if i >= 0 and a6_ends[i] >= first else v6_tag | first << 8
            else:  # IPv4-mapped IPv6: the general path
                v4 = None
                key = -1
            if key < 0:
                out = observe(_new(Hit, (jail, host, t, "")), now, live=live)
            else:
                b = get_banned(key)
                if b is not None:
                    if b.since - skew <= now < b.until:
                        already += 1
                        continue
                    del banned[key]
                i = bisect_right(a4_starts, key) - 1 if v4 is not None else -1
                if i >= 0 and a4_ends[i] >= key:
                    out = _protected(a4_nets[i])
                else:
                    if live:
                        if not lo_live <= t <= now:
                            t = now
                    elif t > now:
                        if t > ahead:
                            stale += 1
                            continue
                        t = now
                    elif t < too_old:
                        stale += 1
                        continue
                    if not rotated:  # as `_count` does, at the first failure that reaches it
                        if not j.gen_lo <= now < j.gen_hi:
                            self._rotate(j, now)
                        rotated = True
                        cur, old = j.cur, j.old
                    if maxretry > 1:
                        rec = cur.get(key)
                        if rec is None:
                            if key not in old:  # IDLE -> COUNTING
                                if self._tracked >= self.max_tracked:
                                    self._evict()
                                cur[key] = t
                                self._tracked += 1
                                counted += 1
                                continue
                        elif type(rec) is float:
                            if maxretry > 2 and too_old <= rec <= ahead:
                                cur[key] = (rec, t) if t >= rec else (t, rec)  # a second failure, short of a ban
                                counted += 1
                                continue
                        elif type(rec) is tuple and too_old <= rec[0] and rec[-1] <= t <= ahead:
                            # a later failure of a record whose times are all in the window, in order: what
                            # `_count` does with it, without the call, its lookups again and the outcome
                            if len(rec) + 1 >= maxretry:
                                del cur[key]
                                self._tracked -= 1
                                ban, record = self._decide(j, key, len(rec) + 1, now, v4)
                                bans.append(ban)
                                records.append(record)
                            else:
                                cur[key] = (*rec, t)
                                counted += 1
                            continue
                    out = self._count(j, key, t, now, v4)
            kind = out.kind
            if kind is _COUNTED_KIND:
                counted += 1
            elif kind is _BANNED:
                bans.append(out.ban)  # type: ignore[arg-type]  # a BANNED outcome always has both
                records.append(out.record)  # type: ignore[arg-type]
            elif kind is _ALREADY:
                already += 1
            elif kind is _STALE_KIND:
                stale += 1
            else:
                counts[kind] = counts.get(kind, 0) + 1
        if counted:
            counts[_COUNTED_KIND] = counted
        if bans:
            counts[_BANNED] = len(bans)
        if already:
            counts[_ALREADY] = already
        if stale:
            counts[_STALE_KIND] = stale
        return Tally(counts, bans, records)

    def _count(self, j: _Jail, key: int, t: float, now: float, host: _IPv4 | None = None) -> TrackOutcome:
        """Count a failure of `key` at `t`; `host`, an IPv4 host's address when the caller has it, becomes a
        ban's target as it is (saves building another)."""
        if not j.gen_lo <= now < j.gen_hi:
            self._rotate(j, now)
        cur = j.cur
        rec = cur.get(key)
        if rec is None:
            rec = j.old.pop(key, None)
            if rec is None:  # IDLE → COUNTING (or straight to BANNED with maxretry 1)
                if j.maxretry == 1:
                    return self._ban(j, key, 1, now, host)
                if self._tracked >= self.max_tracked:
                    self._evict()
                cur[key] = t
                self._tracked += 1
                return _COUNTED
        lo = now - j.findtime
        hi = now + self.max_skew
        # Times are kept sorted so pruning looks at the ends only; out of order is rare (interleaved sources).
        if isinstance(rec, tuple):
            if rec[0] < lo or rec[-1] > hi:
                rec = tuple(v for v in rec if lo <= v <= hi)
            times = (*rec, t) if not rec or t >= rec[-1] else tuple(sorted((*rec, t)))
        elif lo <= rec <= hi:
            times = (rec, t) if t >= rec else (t, rec)
        else:  # the one earlier failure left the window (records exist only when maxretry >= 2)
            cur[key] = t
            return _COUNTED
        if len(times) >= j.maxretry:
            cur.pop(key, None)
            self._tracked -= 1
            return self._ban(j, key, len(times), now, host)
        cur[key] = times if len(times) > 1 else times[0]
        return _COUNTED

    def _rotate(self, j: _Jail, now: float) -> None:
        """Start a new generation if one is due; called before anything reads or writes `cur`/`old`."""
        if j.gen_lo <= now < j.gen_hi:
            return
        if now < j.gen_lo:
            # Our clock went back: restart the generation clock; the per-record rule handles the times.
            j.anchor(now)
            return
        dropped = len(j.old)
        if now >= j.gen_start + 2 * j.findtime:
            dropped += len(j.cur)
            j.old = {}
        else:
            j.old = j.cur
        j.cur = {}
        j.anchor(now)
        self._tracked -= dropped

    def _evict(self) -> None:
        """Make room under `max_tracked`: see the module rules (Memory) for the order."""
        # A batch at a time: cheap per eviction, and deleting from a dict's front one key at a time would
        # rescan the deleted slots on every call.
        want = max(1, self.max_tracked // 64)
        got = 0
        jails = sorted(self._jails.values(), key=lambda s: len(s.old), reverse=True)
        for j in jails:  # 1. one-failure records of the older generations
            if got == want:
                break
            got += self._evict_singles(j, j.old, want - got, older=True)
        for j in sorted(jails, key=lambda s: len(s.cur), reverse=True):  # 2. ... then of the current ones
            if got == want:
                break
            got += self._evict_singles(j, j.cur, want - got, older=False)
        if got < want:
            # 3. No one-failure record is left anywhere: whoever filled the table paid two lines or more per
            # record. Those farthest from their jail's maxretry go first, then those quiet the longest.
            picked = heapq.nsmallest(want - got, (
                (len(v) - j.maxretry, v[-1], i, k, d is j.old)
                for i, j in enumerate(jails) for d in (j.old, j.cur) for k, v in d.items()
                if isinstance(v, tuple)))
            for _, _, i, k, older in picked:
                del (jails[i].old if older else jails[i].cur)[k]
            got += len(picked)
            self.evicted_several += len(picked)
        self._tracked -= got
        self.evictions += got

    @staticmethod
    def _evict_singles(j: _Jail, d: dict[int, _Times], want: int, *, older: bool) -> int:
        """Delete up to `want` one-failure records from the front of generation `d`; returns how many.

        Records with several failures met on the way are moved out of the way, so the next call does not
        walk over them again: from the older generation into the current one (they live one generation
        longer; their times are still checked on every hit), within the current one to its end (behind every
        one-failure record present). So each is passed over once per round of evictions, not once per call.
        """
        victims: list[int] = []
        passed: list[int] = []
        for k, v in d.items():
            if isinstance(v, tuple):
                passed.append(k)
            else:
                victims.append(k)
                if len(victims) == want:
                    break
        for k in victims:
            del d[k]
        cur = j.cur
        for k in passed:
            cur[k] = d.pop(k)
        return len(victims)

    def _ban(self, j: _Jail, key: int, failures: int, now: float, host: _IPv4 | None = None) -> TrackOutcome:
        ban, record = self._decide(j, key, failures, now, host)
        out: TrackOutcome = _new(TrackOutcome, (_BANNED, ban, None, record))
        return out

    def _decide(self, j: _Jail, key: int, failures: int, now: float, host: _IPv4 | None = None
                ) -> tuple[Ban, BanRecord]:
        """`key` is banned in `j` now, after `failures`: the ban and its history record (the state is updated)."""
        p = j.policy
        earlier = j.history.get(key)
        if earlier is None:  # a first offence, as nearly every ban of a burst is
            past: _Past = ()
            first = j.first
            if first[0] != now:
                end = ban_end(p.bantime, now)
                first = j.first = (now, end, ((now, end),))
            until, entry = first[1], first[2]
        else:
            lo = now - j.horizon
            past = tuple(r for r in earlier if r[0] >= lo)
            until = ban_end(p.duration(len(past)), now)
            if until is not None:
                # Never end before an earlier ban of the same offender (only possible after a clock step back).
                until = max([until] + [u for _, u in past if u is not None])
            entry = (*past, (now, until))
        target = host_net4_at(host) if host is not None else tagged_net(key)  # its first test: an IPv4 host
        reason = j.reasons.get(failures)
        if reason is None:
            what = "bans" if p.recidive else "failures"
            reason = j.reasons[failures] = f"{failures} {what} in {format_duration(p.findtime)} ({p.name})"
        if past:
            duration = p.duration(len(past))
            if not isinstance(duration, Permanent) and duration != p.bantime:
                reason += f"; ban #{len(past) + 1} escalated to {format_duration(duration)}"
        ban = _make_ban(target, p.blocklist, until, "jail", reason, p.name)
        j.history[key] = entry
        j.banned[key] = _Banned(ban, now)
        return ban, _new(BanRecord, (p.name, target, now, until))

    # -- bans from elsewhere, unbans, the allowlist -------------------------------------------------------

    def observe_ban(self, ban: Ban, now: float) -> list[TrackOutcome]:
        """Feed a ban the daemon applied to the recidive jails watching `ban.jail`: one TrackOutcome per such jail.

        Bans of unknown or recidive jails (and of no jail) are not counted: recidive never feeds itself.
        """
        src = self._jails.get(ban.jail)
        if src is None or src.policy.recidive:
            return []
        out = []
        for r in self._recidive:
            if not _watches(r.policy, src.policy):
                continue
            key, entry = self._resolve(r, ban.target)
            b = r.banned.get(key)
            if b is not None:
                if b.since - self.max_skew <= now < b.until:
                    out.append(b.outcome)
                    continue
                del r.banned[key]
            if entry is not None:
                out.append(_protected(entry))
                continue
            out.append(self._count(r, key, now, now))
        return out

    def escalations(self, ban: Ban, now: float) -> list[tuple[Ban, BanRecord | None]]:
        """The new bans (with their history records) that recidive jails decide because `ban` was applied:
        the BANNED outcomes of `observe_ban`."""
        if not self._recidive:  # the common case: the sink asks once per applied ban
            return []
        return [(o.ban, o.record) for o in self.observe_ban(ban, now) if o.kind is Kind.BANNED and o.ban is not None]

    def note_ban(self, ban: Ban, now: float) -> bool:
        """Restore BANNED for a jail ban still in force (the store's active bans after a restart).

        Returns False when the ban names no jail of this tracker, has ended, or is now allowlisted (the
        daemon should then lift it). Nothing is added to the history: the store already holds it.
        """
        j = self._jails.get(ban.jail)
        if j is None or (ban.until is not None and ban.until <= now):
            return False
        key, entry = self._resolve(j, ban.target)
        if entry is not None:
            return False
        j.banned[key] = _Banned(ban, now)
        return True

    def adopt(self, bans: Iterable[Ban], now: float) -> list[BanRecord]:
        """Bans taken over from elsewhere for a jail of this tracker (fail2ban's, by `nftblock
        import-fail2ban`) become that jail's own: BANNED (as `note_ban`), and one ban in its history that
        starts `now`, so that the offender's next ban in that jail escalates and the recidive jails watching
        it count it (as `load_history` counts: never a ban at once, the next ban observed completes it).

        Returns the records for the daemon to persist. Bans of unknown or recidive jails, ended or now
        allowlisted, are left alone."""
        records = []
        for b in bans:
            j = self._jails.get(b.jail)
            if j is None or j.policy.recidive or not self.note_ban(b, now):
                continue
            records.append(BanRecord(b.jail, b.target, now, b.until))
        if records:
            self.load_history(records, now)
        return records

    def note_hosts(self, jail: str, keys: Sequence[int], untils: Sequence[float | None], now: float, *,
                   blocklist: str, origin: str, reason: str) -> int:
        """`note_ban` for many IPv4 addresses (host keys) of one jail and label, each with its own end: what a
        restart restores. The same rules (ended or allowlisted: not noted), with the allowlist tested for all
        keys at once and each offender's Ban built only when it is hit again. Returns how many were noted."""
        j = self._jails.get(jail)
        if j is None:
            return 0
        allowed = set(j.allow.hosts_among(4, keys)) if len(j.allow) else set()
        label = (blocklist, origin, reason, jail)
        banned = j.banned
        noted = 0
        for k, u in zip(keys, untils, strict=True):
            if (u is not None and u <= now) or k in allowed:
                continue
            banned[k] = _RestoredBanned(k, u, label, now)
            noted += 1
        return noted

    def forget_ban(self, target: IPNet, *, jail: str | None = None,
                   forgive: bool = False) -> list[tuple[str, IPNet]]:
        """The ban of `target` ended outside the tracker (manual unban, reconcile): back to IDLE.

        In `jail` or in every jail. An address inside a banned IPv6 range ends the range's ban state too.
        With `forgive`, the history and failure counts go as well, so the next offence starts afresh.
        Returns (jail, offender) for every offender whose state changed; with `forgive` the store should
        delete the history rows of those.
        """
        if jail is not None and jail not in self._jails:
            raise UnknownJailError(f"no jail named {jail!r} in this tracker")
        net = normalise_network(target)
        changed: list[tuple[str, IPNet]] = []
        for j in self._jails.values() if jail is None else (self._jails[jail],):
            group, _ = self._resolve(j, net)
            for key in dict.fromkeys((group, _key_of_net(net, 128))):
                hit = j.banned.pop(key, None) is not None
                if forgive:
                    hit = j.history.pop(key, None) is not None or hit
                    for d in (j.cur, j.old):
                        if d.pop(key, None) is not None:
                            self._tracked -= 1
                            hit = True
                if hit:
                    changed.append((j.name, tagged_net(key)))
        return changed

    def reconfigure(self, policies: Iterable[JailPolicy]) -> tuple[list[str], list[str], list[str]]:
        """Replace the jails' policies (a reload): returns the jails (added, removed, changed).

        A jail that stays keeps its failure counts, bans and history under its new policy (a changed
        maxretry applies to the next failure), unless its IPv6 grouping changed: its records are keyed by
        the old prefix, so they start afresh (the kernel keeps enforcing its bans). A removed jail's
        records go. Raises ValueError for policies the constructor would refuse, changing nothing.
        """
        fresh = Tracker(policies, self._allow, max_tracked=self.max_tracked, max_skew=self.max_skew)
        added, changed = [], []
        for name, new in fresh._jails.items():
            old = self._jails.get(name)
            if old is None:
                added.append(name)
                continue
            if old.policy != new.policy:
                changed.append(name)
            if old.policy.ipv6_prefix != new.policy.ipv6_prefix:
                continue
            new.cur, new.old, new.banned, new.history = old.cur, old.old, old.banned, old.history
            new.anchor(old.gen_start)
        removed = [name for name in self._jails if name not in fresh._jails]
        self._jails = fresh._jails
        self._recidive = fresh._recidive
        self._tracked = sum(len(j.cur) + len(j.old) for j in self._jails.values())
        return added, removed, changed

    def replace_allowlist(self, allowlist: Allowlist) -> list[Ban]:
        """Swap the global allowlist (reload, own addresses changed); jails keep their `ignoreip`.

        Returns the bans in force that the new allowlist protects, now forgotten here: the daemon should lift
        them (docs/why.md #16, locked out after the admin's address changed).
        """
        self._allow = allowlist
        self._protect = allowlist.union(NEVER_BAN)
        lifted = []
        for j in self._jails.values():
            j.set_allow(self._jail_allow(j.policy))
            for key, b in list(j.banned.items()):
                ban = b.outcome.ban
                if ban is not None and j.allow.contains(ban.target) is not None:
                    del j.banned[key]
                    lifted.append(ban)
        return lifted

    def _jail_allow(self, p: JailPolicy) -> Allowlist:
        return self._protect.union(p.ignoreip) if p.ignoreip else self._protect

    def _resolve(self, j: _Jail, net: IPNet) -> tuple[int, IPNet | None]:
        """The offender key for `net` in `j`, and the allow entry protecting `net` (None if unprotected).

        The same grouping as `observe`: the jail's IPv6 range, unless that overlaps the allowlist.
        """
        net = normalise_network(net)
        key = _key_of_net(net, j.policy.ipv6_prefix)
        if j.allow.contains(tagged_net(key)) is None:
            return key, None
        own = j.allow.contains(net)
        if own is not None:
            return key, own
        return _key_of_net(net, 128), None

    # -- upkeep and persistence ---------------------------------------------------------------------------

    def sweep(self, now: float, ended: dict[str, list[Ban]] | None = None) -> int:
        """Drop ended bans, stale generations and history past the horizon; returns how many went.

        Call it now and then (e.g. with each reconcile) so memory shrinks even when no hits arrive. The bans
        of the jails named in `ended` that reached their end are added to its lists (their unban actions).
        """
        gone = 0
        for j in self._jails.values():
            before = self._tracked
            self._rotate(j, now)
            gone += before - self._tracked
            out = ended.get(j.name) if ended is not None else None
            for key, b in list(j.banned.items()):
                if not b.since - self.max_skew <= now < b.until:
                    del j.banned[key]
                    gone += 1
                    if out is not None and now >= b.until:
                        ban = b.outcome.ban
                        if ban is not None:
                            out.append(ban)
            lo = now - j.horizon
            for key, past in list(j.history.items()):
                keep = tuple(r for r in past if r[0] >= lo)
                if len(keep) != len(past):
                    gone += len(past) - len(keep)
                    if keep:
                        j.history[key] = keep
                    else:
                        del j.history[key]
        return gone

    def history_snapshot(self) -> list[HistoryRow]:
        """Every history record as plain rows, oldest first (what `load_history` takes back)."""
        rows = [
            (j.name, format_target(tagged_net(key)), at, until)
            for j in self._jails.values() for key, past in j.history.items() for at, until in past
        ]
        rows.sort(key=lambda r: (r[2], r[0], r[1]))
        return rows

    def load_history(self, rows: Iterable[Sequence[object] | BanRecord], now: float) -> LoadResult:
        """Restore history rows (from the store or `history_snapshot`) and the recidive counts they imply.

        Rows of jails no longer configured, rows past the horizon, duplicates and malformed rows are
        skipped and counted. Bans still in force are restored separately with `note_ban`.
        """
        loaded = skipped = 0
        records: list[tuple[BanRecord, int]] = []
        for row in rows:
            try:
                rec = row if isinstance(row, BanRecord) else BanRecord.from_row(row)
            except (ValueError, TypeError):
                skipped += 1
                continue
            j = self._jails.get(rec.jail)
            if j is None or rec.at < now - j.horizon:
                skipped += 1
                continue
            key, _ = self._resolve(j, rec.target)
            past = j.history.get(key, ())
            item = (rec.at, rec.until)
            if item in past:
                skipped += 1
                continue
            j.history[key] = tuple(sorted((*past, item), key=lambda r: r[0]))
            records.append((rec, key))
            loaded += 1
        # At equal times a jail's ban comes before the recidive ban it caused.
        records.sort(key=lambda r: (r[0].at, self._jails[r[0].jail].policy.recidive))
        for r in self._recidive:
            self._replay(r, [rec for rec, _ in records], now)
        return LoadResult(loaded, skipped)

    def _replay(self, r: _Jail, records: list[BanRecord], now: float) -> None:
        """Rebuild a recidive jail's counts from the bans of its findtime, in time order."""
        self._rotate(r, now)  # before filling `cur`, so a due rotation cannot drop what is restored
        lo, hi = now - r.findtime, now + self.max_skew
        counts: dict[int, list[float]] = {}
        for rec in records:
            src = self._jails[rec.jail]
            if src is r:
                counts.pop(self._resolve(r, rec.target)[0], None)  # its own ban consumed what came before
            elif not src.policy.recidive and _watches(r.policy, src.policy) and lo <= rec.at <= hi:
                key, entry = self._resolve(r, rec.target)
                if entry is None:
                    counts.setdefault(key, []).append(rec.at)
        if r.maxretry == 1:
            return
        for key, times in counts.items():
            old = r.cur.get(key)
            if old is None:
                old = r.old.pop(key, None)
                if old is None:
                    self._tracked += 1
            mine = old if isinstance(old, tuple) else () if old is None else (old,)
            # Keep the newest maxretry - 1: a full set would have banned already, and banning at load time
            # would act on the past; the next ban observed completes it.
            merged = tuple(sorted({*mine, *times}))[-(r.maxretry - 1):]
            r.cur[key] = merged if len(merged) > 1 else merged[0]

    # -- introspection ------------------------------------------------------------------------------------

    @property
    def tracked(self) -> int:
        """Counting records held (all jails), the figure `max_tracked` caps."""
        return self._tracked

    def tracked_by_jail(self) -> dict[str, int]:
        """Counting records held per jail (they sum to `tracked`); O(jails), for metrics at scrape time."""
        return {name: len(j.cur) + len(j.old) for name, j in self._jails.items()}

    @property
    def jails(self) -> tuple[str, ...]:
        return tuple(self._jails)

    def horizon(self, jail: str) -> float:
        """Seconds a ban of `jail` stays in its history: the store may delete older rows."""
        j = self._jails.get(jail)
        if j is None:
            raise UnknownJailError(f"no jail named {jail!r} in this tracker")
        return j.horizon

    def banned_count(self, jail: str | None = None) -> int:
        """Offenders in BANNED (including ended bans not yet noticed by a hit or `sweep`)."""
        return sum(len(j.banned) for j in self._jails.values() if jail is None or j.name == jail)

    def failures(self, jail: str, target: IPAddr | IPNet, now: float) -> int:
        """Failures of `target`'s offender counted within findtime at `now` (answers the CLI's `check`)."""
        j = self._jails.get(jail)
        if j is None:
            raise UnknownJailError(f"no jail named {jail!r} in this tracker")
        net = target if isinstance(target, ipaddress.IPv4Network | ipaddress.IPv6Network) \
            else ipaddress.ip_network(target)
        key, _ = self._resolve(j, net)
        rec = j.cur.get(key, j.old.get(key))
        if rec is None:
            return 0
        times = rec if isinstance(rec, tuple) else (rec,)
        return sum(1 for v in times if now - j.findtime <= v <= now + self.max_skew)


def _watches(r: JailPolicy, p: JailPolicy) -> bool:
    """Whether recidive jail `r` counts the bans of jail `p`."""
    return r.recidive and not p.recidive and (not r.watch or p.name in r.watch)


__all__ = [
    "BanRecord", "HistoryRow", "JailPolicy", "Kind", "LoadResult", "Tally", "TrackOutcome", "Tracker",
    "UnknownJailError",
]
