"""The fleet service: publish this host's bans, apply everyone else's, catch up after every (re)connect.

Rules (the receive side is a small state machine: offline -> catching up -> following -> offline ...)

- Local first. The daemon enforces a ban in its own kernel, then hands it to `submit_bans`; the publisher
  writes it to the outbox in the state database (durable) and publishes it when the server is reachable.
  Losing the server never weakens protection: only sharing waits. Outbox rows are published in oseq order;
  a ban that ended or was unbanned meanwhile is skipped.
- Receive (schema 2: a stream per host, link.py). One dedicated connection reads every member's stream
  (woken by the doorbell, `RedisLink.read`), one cursor per stream. An entry's origin is its stream's host:
  an origin field naming anyone else is refused (`origin`); this host's own stream only moves its cursor; a
  host's unban lifts only that host's fleet bans (`FleetUnban.owner`), the operator's any. Every entry is
  decoded and passes the trust gate, whose rate buckets are per stream. The accepted events of one stream's
  reply become ONE `FleetSink.apply_fleet` call (one kernel transaction); within a reply, the last event for an
  address wins. Entries with ids more than FUTURE_MS ahead of the server's clock are refused (`future_id`).
  A reply of nothing but plain single-address bans (a catch-up) takes the batch path
  (`_apply_plain`: `rawread.plain_bans`, `Gate.check_hosts`, `FleetChange.hosts`), which must come to exactly
  what the entry-by-entry path does (`batch=False`; tests/unit/test_fleet_batch.py); any other reply goes
  entry by entry. The cursor is saved after the kernel commit (at most every `cursor_interval` seconds, and at
  close), so a crash replays a little: bans keep the later end and unbans delete if present, so
  re-applying is harmless.
- Catch-up, on every connect: find the members' streams, read the server's run id and each stream's bounds,
  and `catchup.decide` per stream. Replay just continues from the cursor. Snapshot reads those owners' keys
  atomically, gates them, reconciles the fleet's kernel elements to them in one change (an owner's tombstones
  lift only its own bans, never a local one), and continues from each stream's last id. Then this host's own
  recent active bans that its own keys lack are re-published (repairing writes a failed-over primary lost),
  and its epoch token is set.
- Maintenance, once every MAINTAIN_INTERVAL: the server reads run beside the receive loop (`_check`), the
  loop acts on them between two applies (`_maintain`): new members followed from their start, a stream
  whose last id is below our cursor (made again) re-read from a snapshot, and this host's own keys healed
  (`_heal`: epoch gone or own bans missing -> re-assert; own stream unusable -> made again).
- Offline. Any error on the server link closes both connections; the service waits `retry.retry_delay`
  (jittered: 0.2 s for the first 10 s of an outage, 0.5 s until 2 min, growing to 30 s after) and connects again. One
  warning when the link goes down, one info line when it comes back (with how long it was away); retries in
  between log at debug level. A reconnect wakes the publisher at once, whatever it was waiting for.
- A publish the server refuses is not done: the rows stay in the outbox until a MULTI is acknowledged
  (NOREPLICAS under `min-replicas-to-write`, READONLY from a demoted primary, which also drops the link so
  the Sentinels are asked again). The re-assert after a snapshot goes through the outbox too (its rows are
  queued again), so a primary that refuses writes never stops this host from receiving.
- Rate refusals are deferred, not dropped: the gate's per-origin cap refuses what comes faster than `rate`,
  and those events are retried as the cap refills (bounded by `DEFER_LIMIT`; the saved cursor stays before
  the first deferred entry, so a restart re-reads them).

The service never touches the kernel or SQLite itself: the enforcer behind `FleetSink` and the store behind
`FleetState` (called in a worker thread) do. It never reads the wall clock except through `clock`.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: the fleet's receive loop, publisher and reconnects)
import collections
import contextlib
import itertools
import logging
import math
import operator
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol, TypeVar

from nftblockd.addr import IPNet, format_host, format_target, host_net
from nftblockd.allowlist import Allowlist
from nftblockd.config import FleetConfig
from nftblockd.fleet.catchup import (
    Cursor,
    FleetBan,
    FleetChange,
    FleetHosts,
    FleetUnban,
    LocalBan,
    OwnBan,
    Replay,
    ServerView,
    StreamId,
    before,
    decide,
    format_id,
    parse_id,
    reassert,
    reconcile,
)
from nftblockd.fleet.codec import FleetEvent, PlainBans, Rejection, decode, parse_net
from nftblockd.fleet.gate import Gate, TrustLimits
from nftblockd.fleet.link import (
    FUTURE_MS,
    OPERATOR,
    Engine,
    Entry,
    LinkError,
    OwnHealth,
    SnapshotPart,
    honour_cancel,
)
from nftblockd.fleet.rawread import good_ids, plain_bans
from nftblockd.fleet.retry import retry_delay
from nftblockd.state.store import OutboxItem, OutboxRow

log = logging.getLogger("nftblockd.fleet")

READ_COUNT = 1000  # entries per XREAD: one kernel transaction each
CATCHUP_COUNT = 10000  # ... while a backlog is replayed (the previous read came back full)
PUBLISH_BATCH = 10000  # outbox rows per publish round
# reads shorter than this go entry by entry: the batch path's fixed cost makes a one-entry read 22 us instead
# of 12 (in-process); it is 0.66x at 4 entries, 0.30x at 16
BATCH_MIN = 2
QUEUE_LIMIT = 1_000_000  # submitted events waiting for the outbox write; beyond, counted and dropped
DEFER_LIMIT = 200_000  # rate-refused events kept for a retry; beyond, counted as refused ("rate") and dropped
DEFER_BLOCK_MS = 200  # while events are deferred, reads block this long at most, so retries come round
MARK_DELAY = 0.2  # seconds a published round waits to be marked with the next round's store call
MAINTAIN_INTERVAL = 1.0  # seconds between the receive loop's checks of the server (streams, own keys)
# seconds between SCANs for members' streams (new hosts are followed within this), and per member: a SCAN walks
# every key of the database, so a large fleet looks less often (1,000 hosts: every 10 s, docs/fleet.md)
DISCOVER_INTERVAL = 1.0
DISCOVER_PER_MEMBER = 0.01
VERIFY_EVERY = 5  # maintenances between two counts of the running own bans in the outbox (a store read)
# other members' streams checked per maintenance (all of them in turn: an XINFO and an XRANGE each, ~8 us of the
# server's): 64, fewer in a large fleet so that a fleet's checks stay ~65k a second (1,000 hosts: 8 each, every
# stream checked within ~2 minutes)
CHECK_BATCH = 64
CHECK_BUDGET = 8192


def check_batch(members: int) -> int:
    return max(1, min(CHECK_BATCH, CHECK_BUDGET // max(1, members)))



class FleetSink(Protocol):
    """The enforcer, as the fleet sees it: one transaction per change, and what the kernel holds."""

    async def apply_fleet(self, change: FleetChange) -> None:
        """Apply bans (keep the later end; a local ban lasting longer stays as it is) and unbans (remove the
        fleet-origin element; a local-origin ban only if it was made before `FleetUnban.at`)."""
        ...

    async def fleet_view(self) -> tuple[Mapping[IPNet, float], Mapping[IPNet, LocalBan]]:
        """(fleet-origin elements -> end, local-origin bans) of the fleet's blocklist; math.inf = permanent."""
        ...

    async def settled(self) -> None:
        """Wait until what `apply_fleet` applied so far is saved (`apply_fleet` may return once the kernel holds
        a change, its database write still queued)."""
        ...


T = TypeVar("T")


class StoreRunner(Protocol):
    """Runs a store call off the event loop (the daemon's store thread; `asyncio.to_thread` by default)."""

    def __call__(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]: ...


class FleetState(Protocol):
    """The state store's fleet tables (`store.Store` implements it); called from a worker thread."""

    def fleet_enqueue(self, items: Iterable[OutboxItem], first: int | None = ..., noted: Sequence[OutboxItem] = ...,
                      noted_first: int | None = ...) -> list[int]: ...
    def fleet_pending(self, now: float, limit: int = ...) -> list[OutboxRow]: ...
    def fleet_mark_published(self, oseqs: Iterable[int]) -> None: ...
    def fleet_round(self, published: Iterable[int], items: Iterable[OutboxItem], now: float,
                    limit: int = ..., first: int | None = ..., noted: Sequence[OutboxItem] = ...,
                    noted_first: int | None = ...) -> list[OutboxRow]: ...
    def fleet_forget(self, targets: Iterable[tuple[str, float]]) -> None: ...
    def fleet_own_active(self, now: float, since: float) -> list[OutboxRow]: ...
    def fleet_requeue(self, oseqs: Iterable[int]) -> None: ...
    def fleet_outbox_size(self) -> int: ...
    def fleet_next_oseq(self) -> int: ...
    def fleet_cursor(self, fleet: str) -> tuple[str, str] | None: ...
    def set_fleet_cursor(self, fleet: str, run_id: str, last_id: str) -> None: ...


def shares(cfg: FleetConfig, src: str) -> bool:
    """Whether a ban decided by `src` ("jail:<name>", "cli", "escalation", ...) goes to the fleet."""
    if src == "cli":
        return cfg.share_cli
    if src.startswith("jail:"):
        return cfg.share_jails is None or src[5:] in cfg.share_jails
    # a fleet-counted ban is published by the host whose failure crossed the line (daemon/fleet.py);
    # escalations, feeds, imports are not: each host decides those itself
    return src.startswith("count:")


def limits_of(cfg: FleetConfig) -> TrustLimits:
    return TrustLimits(cfg.min_prefix_v4, cfg.min_prefix_v6, cfg.max_ban, cfg.allow_permanent, cfg.rate,
                       cfg.burst)


@dataclass
class FleetStats:
    """What `nftblock fleet` shows; counters only grow."""

    connected: bool = False
    server: str = ""
    role: str = ""
    run_id: str = ""
    cursor: str = ""
    outbox: int = 0
    received: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)  # (op, result)
    published: int = 0
    publish_failures: int = 0
    dropped: int = 0  # submitted events the bounded queue could not hold
    snapshots: int = 0
    replays: int = 0
    reasserted: int = 0
    deferred: int = 0  # rate-refused events waiting for a retry now
    deferred_total: int = 0  # events ever deferred (each is applied later, or counted refused if it ends)
    connects: int = 0
    last_error: str = ""
    last_error_at: float = 0.0
    lag_last: float = 0.0
    members: int = 0  # streams followed (this host's own included)
    heals: int = 0  # times the server was found lacking this host's state, and it was re-asserted
    stream_resets: int = 0  # times this host re-created its own stream (it refused appends, ids ahead of TIME)
    # other members' streams found broken, owner -> what ("cursor_ahead", "future_id"); cleared when healed
    stream_problems: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        rejected: dict[str, int] = collections.Counter()
        by_op: dict[str, dict[str, int]] = {}
        for (op, result), n in self.received.items():
            by_op.setdefault(op, {})[result] = n
            if result not in ("applied", "own"):
                rejected[result] += n
        return {
            "connected": self.connected, "server": self.server, "role": self.role, "run_id": self.run_id,
            "cursor": self.cursor, "outbox": self.outbox, "received": by_op, "rejected": dict(rejected),
            "published": self.published, "publish_failures": self.publish_failures, "dropped": self.dropped,
            "snapshots": self.snapshots, "replays": self.replays, "reasserted": self.reasserted,
            "deferred": self.deferred, "deferred_total": self.deferred_total,
            "connects": self.connects, "last_error": self.last_error, "last_error_at": self.last_error_at,
            "lag_last": self.lag_last, "members": self.members, "heals": self.heals,
            "stream_resets": self.stream_resets, "stream_problems": dict(self.stream_problems),
        }


class _Taken(NamedTuple):
    """What one publish round took to write: submitted items numbered from `first`, then fleet-counted bans
    (`noted`) numbered from `noted_first` (None: numbered by the store)."""

    items: list[OutboxItem]
    first: int | None
    noted: list[OutboxItem]
    noted_first: int | None


_NOTHING = _Taken([], None, [], None)


class _Checked(NamedTuple):
    """What one maintenance read from the server (`FleetService._check`), for `_maintain` to act on."""

    now: float
    owners: list[str] | None  # members found (None: no discovery this time)
    cursors: dict[str, StreamId | None]  # the streams checked, with our cursors when they were read
    server_ms: int
    views: dict[str, ServerView]
    health: OwnHealth
    live: int | None  # running own bans in the outbox (None: not counted this time)


def _lifts(owner: str) -> str | None:
    """Whose bans an unban in `owner`'s stream may lift (`FleetUnban.owner`): its own; the operator's, any."""
    return None if owner == OPERATOR else owner


def format_cursors(cursors: Mapping[str, StreamId]) -> str:
    """The cursors of every followed stream as the one text the store keeps: "a=1700000000000-0 b=..."."""
    return " ".join(f"{o}={format_id(sid)}" for o, sid in sorted(cursors.items()))


def parse_cursors(text: str) -> dict[str, StreamId] | None:
    """`format_cursors` read back; None for anything else (a schema 1 cursor is one bare id)."""
    out: dict[str, StreamId] = {}
    for part in text.split():
        owner, sep, sid = part.partition("=")
        if not sep or not owner:
            return None
        try:
            out[owner] = parse_id(sid)
        except ValueError:
            return None
    return out


def _until_text(until: float | None) -> float | None:
    return None if until is None or until == math.inf else until


def _host_groups(last: Sequence[Mapping[int, int]], keys: list[int], origins: list[str], ends: list[float],
                 ends_ms: list[int] | None = None
                 ) -> dict[tuple[int, str], tuple[list[int], list[float], list[int] | None]]:
    """The accepted entries of a plain read (`last`: per IP version, address -> index of the entry that wins)
    as one group per IP version and origin host, every address with its own end (`FleetHosts`); with the ends
    in ms too where `ends_ms` gives them (a group of one origin: a catch-up's)."""
    groups: dict[tuple[int, str], tuple[list[int], list[float], list[int] | None]] = {}
    for version, chosen in zip((4, 6), last, strict=True):
        if not chosen:
            continue
        first = next(iter(chosen.values()))
        if len(chosen) == len(keys) and len(set(origins)) == 1:  # the whole read, in order, from one host
            groups[(version, origins[first])] = (keys, ends, ends_ms)
        elif all(origins[i] == origins[first] for i in chosen.values()):  # one origin: the read as it is
            groups[(version, origins[first])] = (
                list(chosen), list(map(ends.__getitem__, chosen.values())),
                None if ends_ms is None else list(map(ends_ms.__getitem__, chosen.values())))
        else:
            for k, i in chosen.items():
                grp = groups.get((version, origins[i]))
                if grp is None:
                    grp = groups[(version, origins[i])] = ([], [], None)
                grp[0].append(k)
                grp[1].append(ends[i])
    return groups


async def _first(fut: asyncio.Future[Any], event: asyncio.Event) -> None:
    """Wait until `fut` is done or `event` is set (`fut` keeps running)."""
    if event.is_set():
        return
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((fut, waiter), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


class FleetService:
    def __init__(self, cfg: FleetConfig, link: Engine, state: FleetState, sink: FleetSink, allow: Allowlist, *,
                 clock: Callable[[], float] = time.time, cursor_interval: float = 1.0,
                 on_lag: Callable[[float], None] | None = None, read_count: int = READ_COUNT,
                 catchup_count: int = CATCHUP_COUNT, batch: bool = True,
                 saved: Callable[[], asyncio.Future[bool]] | None = None, run_store: StoreRunner | None = None,
                 on_heal: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.cfg = cfg
        self.link = link
        # called after this host re-asserted its own bans because the server had lost them (at a connect to a
        # server without our epoch, and at each heal), with the reason: fleet counting re-asserts the
        # fleet-counted bans this host holds there (issue #34 item 7, its own keys and code)
        self.on_heal = on_heal
        self.state = state
        self.sink = sink
        self.gate = Gate(limits_of(cfg), allow)
        self.clock = clock
        self.cursor_interval = cursor_interval
        self.on_lag = on_lag
        self.read_count = read_count
        self.catchup_count = max(read_count, catchup_count)
        self.batch = batch  # False: every read entry by entry (the reference the batch path is tested against)
        self._own_origin = cfg.host_id.encode()
        self.stats = FleetStats()
        # one cursor per followed stream (owner -> last id applied), all of one server run (`_run_id`)
        self._cursors: dict[str, StreamId] = {}
        self._run_id: str | None = None
        self._cursor_loaded = False
        self._epoch = ""  # the token this host set in its epoch key at this connect ("": not set yet)
        self._own_count = -1  # the own `active` count at the last check (-1: not known)
        self._checks = 0
        self._maintained_at = -math.inf
        self._discovered_at = -math.inf
        self._check_from = 0  # where the next maintenance's batch of stream checks starts
        self._skew = 0.0  # the server's TIME minus this host's clock, in seconds
        self._saved_at = -math.inf
        self._dirty = False
        self._queue: collections.deque[OutboxItem] = collections.deque()
        self._noted: list[OutboxItem] = []  # fleet-counted bans to record as published (`note_counted`)
        self._unmarked: list[int] = []  # oseqs published and not yet marked so (`_publish_pending`)
        # a fast round's store call left running once its MULTI is out (`_fast_round`), and what it took: the next
        # store call runs after it, and the next round waits for it only at its end
        self._storing: asyncio.Future[list[OutboxRow]] | None = None
        self._storing_taken: _Taken | None = None
        # whether everything the daemon saved so far is written (its persister): an own ban is published from
        # memory only after its local save (`_fast_round`); None: nothing to wait for (tests, tools)
        self.saved = saved
        # where the publisher's store calls run: the daemon passes its store thread, the one its ban saves (the
        # persister) run on, so a round's bookkeeping queues behind the saves instead of a second thread taking
        # the store's lock (and the GIL) between them (docs/fleet.md, round three)
        self._run_store: StoreRunner = asyncio.to_thread if run_store is None else run_store
        self._next_oseq: int | None = None  # the next event's oseq, when known (`_take` numbers rows)
        self._requeues = 0  # re-asserts queued: rows pending that no round of this publisher queued
        self._wake = asyncio.Event()
        self._online = asyncio.Event()
        self._connected = asyncio.Event()  # set at each (re)connect: a waiting publisher retries at once
        self._down_since: float | None = None
        # rate-refused events by target, oldest first: (entry id, event); a newer event of a target replaces
        # its deferred one (within a read, too, the last event of an address wins)
        self._deferred: dict[IPNet, tuple[str, StreamId, FleetEvent]] = {}  # (owner, id, event)

    # -- publishing ----------------------------------------------------------------------------------

    def submit_bans(self, bans: Iterable[tuple[IPNet, float | None, str]]) -> int:
        """Queue own bans (target, absolute end or None, src) the kernel already holds; returns how many the
        fleet shares. Never blocks, never raises."""
        now = self.clock()
        n = 0
        for net, until, src in bans:
            if shares(self.cfg, src):
                n += self._put(("ban", format_target(net), _until_text(until), src, now))
        return n

    def submit_unbans(self, nets: Iterable[IPNet], src: str = "cli") -> int:
        """Queue fleet-wide unbans (an operator's `nftblock unban`)."""
        if not shares(self.cfg, src):
            return 0
        now = self.clock()
        return sum(self._put(("unban", format_target(net), None, src, now)) for net in nets)

    def note_counted(self, bans: Iterable[tuple[IPNet, float | None, str]]) -> None:
        """Fleet-counted bans this host holds but did not cross (target, end, src "count:<jail>"; the crossing
        host publishes them, fleet/counting.py), so they are not published; the publisher's next round writes them as
        published own rows (numbered when it takes them, after its submissions), and a server that restarts
        without them gets them back from the re-assert like any own ban. Never blocks, never raises."""
        now = self.clock()
        self._noted += [("ban", format_target(net), _until_text(until), src, now) for net, until, src in bans]
        self._wake.set()

    def _put(self, item: OutboxItem) -> int:
        if len(self._queue) >= QUEUE_LIMIT:
            self.stats.dropped += 1
            return 0
        self._queue.append(item)
        self._wake.set()
        return 1

    async def _publish_loop(self) -> None:
        failing_since: float | None = None
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._online.is_set():
                failing_since = None  # the receive loop is reconnecting: a new outage for the publisher after it
                if self._queue or self._noted:  # kept durably until the server is back
                    await self._store_round(None)
                self.stats.outbox = await asyncio.to_thread(self.state.fleet_outbox_size)
                continue
            if self._next_oseq is None:
                await self._load_oseq()
            try:
                await self._publish_pending()
                honour_cancel()
                failing_since = None
            except Exception as exc:  # LinkError expected; anything else must not end fleet mode either
                if not isinstance(exc, LinkError):
                    log.error("fleet %s: unexpected error while publishing", self.cfg.name, exc_info=True)
                elif exc.stream_full:
                    await self._reset_own_stream(str(exc))
                    self.stats.publish_failures += 1
                    self._note_error(exc)
                    self._wake.set()
                    continue
                elif exc.not_primary:
                    # a demoted primary still serves reads: drop the link so the receive loop asks the
                    # Sentinels again, instead of following a replica that refuses every publish
                    log.info("fleet %s: %s; reconnecting", self.cfg.name, exc)
                    await self.link.close()
                self.stats.publish_failures += 1
                self._note_error(exc)
                # the rows stay in the outbox: a refused MULTI (NOREPLICAS, READONLY) is not published
                now = self.clock()
                failing_since = now if failing_since is None else failing_since
                self._connected.clear()
                with contextlib.suppress(TimeoutError):  # a reconnect ends the wait
                    await asyncio.wait_for(self._connected.wait(),
                                           retry_delay(now - failing_since) * random.uniform(0.8, 1.2))
                self._wake.set()

    def _take(self) -> _Taken:
        """What was submitted and noted since the last round, numbered now (submissions first): a round numbers
        rows when it takes them, so that a later round's numbers always come after these, whenever this round's
        store call starts (`_chained`: behind the one before it)."""
        items = list(self._queue)
        self._queue.clear()
        noted, self._noted = self._noted, []
        first = self._take_oseqs(len(items))
        return _Taken(items, first, noted, self._take_oseqs(len(noted)) if noted else None)

    def _put_back(self, taken: _Taken, at: int = 0, noted_at: int = 0) -> None:
        """`taken` back where it was (after the first `at` queued items and `noted_at` noted bans: the round
        before it, put back first), ahead of anything submitted or noted later; the numbers are forgotten."""
        q = self._queue
        q.rotate(-at)  # (one pass, not an insert per item: a round may hold the whole queue)
        q.extendleft(reversed(taken.items))
        q.rotate(at)
        self._noted[noted_at:noted_at] = taken.noted
        self._next_oseq = None  # (the call may have failed for a number used already: ask the store again)

    async def _store_round(self, sent: list[int] | None, now: float = 0.0, taken: _Taken | None = None
                           ) -> list[OutboxRow]:
        """One call on the store thread, one transaction: mark `sent` published, queue what was submitted and
        noted (or `taken`, already taken and numbered by a fast round), and (unless `sent` is None: offline,
        only queue) read what is pending. What was taken goes back to the head of the queue (and of the noted
        bans) if the store fails, to be queued with the next attempt. Rows are numbered by this publisher while
        it knows the next oseq (`_fast_round` publishes them before they are written); a failure forgets it."""
        if taken is None:
            taken = self._take()
        items, first, noted, noted_first = taken
        try:
            if sent is None:
                await self._run_store(self.state.fleet_enqueue, items, first, noted, noted_first)
                return []
            return await self._run_store(self.state.fleet_round, sent, items, now, PUBLISH_BATCH, first, noted,
                                         noted_first)
        except BaseException:
            self._put_back(taken)
            raise

    async def _chained(self, prev: asyncio.Future[list[OutboxRow]] | None, prev_taken: _Taken | None,
                       sent: list[int], now: float, taken: _Taken) -> list[OutboxRow]:
        """`_store_round` after the store call before it (`prev`, of `prev_taken`) is done: one store call at a
        time, in round order. If that one failed, what it took is back at the heads of the queue and of the noted
        bans, and these go right after it, before anything submitted later: batch order is kept (an unban never
        ahead of its ban)."""
        if prev is not None:
            try:
                await prev  # (its rows: the round that left it running reads them)
            except BaseException:
                back = prev_taken or _NOTHING
                self._put_back(taken, len(back.items), len(back.noted))
                raise
        return await self._store_round(sent, now, taken)

    async def _drain(self) -> list[OutboxRow]:
        """Wait for a store call a fast round left running; its rows read (or none)."""
        storing, self._storing = self._storing, None
        return [] if storing is None else await storing

    def _take_oseqs(self, n: int) -> int | None:
        first = self._next_oseq
        if first is not None:
            self._next_oseq = first + n
        return first

    async def _load_oseq(self) -> None:
        """Learn the next oseq from the store (at start, and after a failed store call); a failure leaves it
        unknown: rows are then numbered by the store, and nothing is published before it is written."""
        try:
            self._next_oseq = await asyncio.to_thread(self.state.fleet_next_oseq)
        except Exception as exc:
            log.debug("fleet %s: could not read the outbox's sequence: %s", self.cfg.name, exc)

    async def _fast_round(self, sent: list[int], flight: asyncio.Future[None] | None, flying: list[int], now: float
                          ) -> tuple[list[OutboxRow], list[int], asyncio.Future[None] | None, list[int]]:
        """A round when nothing else is pending (the previous round read every pending row): what was submitted
        is published from memory as soon as the MULTI before it is acknowledged and the daemon's saves made
        before it (the bans' own) are written, while its outbox rows are written by the same round's store
        call, not before it: that call's commit was most of a ban's way from A's kernel to the stream
        (bench/bench_fleet.py). At least once still holds: the rows are marked published only by a later
        round, after both (a refused MULTI or a crash leaves them pending, published again); a failed store
        call puts the items back in the queue (published again, under new numbers: harmless). Returns
        (pending rows read, oseqs to mark, the MULTI out now, its oseqs)."""
        taken = self._take()
        items, first = taken.items, taken.first
        assert first is not None
        durable = None if self.saved is None else self.saved()  # the daemon's saves up to now: the bans' own
        prev, prev_taken, self._storing = self._storing, self._storing_taken, None
        storing = asyncio.ensure_future(self._chained(prev, prev_taken, sent, now, taken))
        marking, sent = sent, []  # (the rows `prev` read as pending, these are marked by `storing`)
        try:
            if flight is not None:  # MULTIs never overlap: this one leaves once the one before it is acknowledged
                await flight
                sent, flight = flying, None
                self.stats.published += len(sent)
            if (durable is None or await durable) and self._online.is_set():
                flying = list(range(first, first + len(items)))
                events = [self._event(OutboxRow(o, *item)) for o, item in zip(flying, items, strict=True)]
                flight = asyncio.ensure_future(self.link.publish([e for e in events if e is not None], now))
                # out from memory: this store call goes on behind the next round, which waits only for the MULTI
                # and its own bans' saves; this round waits for the one before (its rows are then written, so
                # `sent` may be marked), and returns what that one read
                self._storing, self._storing_taken = storing, taken
                rows = [] if prev is None else [r for r in await prev if r.oseq not in marking]
            else:
                rows = await storing
        except BaseException:
            self._storing = None
            if not storing.done():  # its items must be back in the queue or in the outbox, not in between
                with contextlib.suppress(BaseException):
                    await storing
            if flight is not None and not flight.done():
                flight.cancel()
                with contextlib.suppress(BaseException):
                    await flight
            raise
        return rows, sent, flight, flying

    async def _round(self, fast: bool, sent: list[int], flight: asyncio.Future[None] | None, flying: list[int],
                     now: float) -> tuple[list[OutboxRow], bool, list[int], asyncio.Future[None] | None, list[int]]:
        """`_publish_pending`'s store call, fast or plain: (pending rows read and neither out nor published, whether
        the read was full, and the new `sent`, `flight`, `flying`)."""
        if fast:
            rows, sent, flight, flying = await self._fast_round(sent, flight, flying, now)
            self._unmarked = sent
        else:
            await self._drain()  # (its rows are read again by this call, which runs after it)
            rows = await self._store_round(sent, now)
            self._unmarked = sent = []
        more = len(rows) >= PUBLISH_BATCH  # a backlog: more may be pending than was read
        # rows read again while out or unmarked (a fast round's read meets its own MULTI's and the last one's)
        out = set(sent).union(flying) if flight is not None else set(sent)
        if out:
            rows = [r for r in rows if r.oseq not in out]
        return rows, more, sent, flight, flying

    async def _publish_pending(self) -> None:
        """Publish until nothing is pending. A round is one store call (mark the previous round's events
        published, queue what was submitted since, read what is pending: one transaction) and one MULTI.
        What is submitted while a MULTI is out gets its store call at once, so its own MULTI leaves as soon as
        the one before it is acknowledged (MULTIs never overlap: an unban must not overtake its ban, and a
        refused MULTI must leave everything after it pending). At 1,000 bans/s the four store calls a round
        made at first (queue, read, mark, read again, each its own commit) were most of a ban's way from A's
        kernel to the stream; then a submission still waited for the whole round before it, store call and
        MULTI (bench/bench_fleet.py)."""
        sent: list[int] = []  # published, marked by the next store call
        flight: asyncio.Future[None] | None = None  # the MULTI out now, of the rows `flying`
        flying: list[int] = []
        backlog = False  # a full read was met: the rows are marked at the end at once, not after MARK_DELAY
        clean = False  # the last round read every pending row, and published them or has them out now
        try:
            while True:
                now = self.clock()
                self._wake.clear()  # this round takes the queue and reads every pending row
                requeues = self._requeues
                fast = clean and bool(self._queue) and self._next_oseq is not None and self._online.is_set()
                rows, more, sent, flight, flying = await self._round(fast, sent, flight, flying, now)
                backlog = backlog or more
                clean = not more and requeues == self._requeues
                if flight is not None:
                    if fast and not rows and not more:  # this round's own MULTI is out: as below
                        if not self._queue:
                            await _first(flight, self._wake)
                        if self._queue:
                            continue
                    await flight  # (refused: raises, and its rows stay pending like the ones just read)
                    sent, flight = sent + flying, None
                    self.stats.published += len(flying)
                if rows:
                    events = [self._event(r) for r in rows]
                    flight = asyncio.ensure_future(self.link.publish([e for e in events if e is not None], now))
                    flying = [r.oseq for r in rows]
                    if not more:
                        if not self._queue:  # whichever comes first: its acknowledgement, or a submission
                            await _first(flight, self._wake)
                        if self._queue:  # the next round takes it while the MULTI is out
                            continue
                    await flight
                    sent, flight = sent + flying, None
                    self.stats.published += len(flying)
                if more or self._queue:
                    continue
                if self._storing is not None and not await self._settled(sent):
                    clean = clean and bool(self._queue)  # (rows re-queued meanwhile: the next round reads them)
                    continue
                if not sent:
                    self.stats.outbox = 0
                    return
                # Nothing else waits: these are marked by the next round, with what comes next, if it comes
                # within MARK_DELAY, else alone (at once after a backlog). Marked at once (a store call of its
                # own), the mark was where the next submission waited at 1,000 bans/s. Unmarked, a published
                # row is published again after a crash: harmless (a ban keeps the later end, rows in order).
                self.stats.outbox = 0
                self._unmarked = sent  # (a stop meanwhile: `close` marks them)
                if not self._wake.is_set() and not backlog and self._online.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), MARK_DELAY)
                if not self._wake.is_set() or not self._online.is_set():  # (offline: the wake is the caller's)
                    await self._mark_unmarked()
                    return
        finally:
            await self._abandon(flight)

    async def _abandon(self, flight: asyncio.Future[None] | None) -> None:
        """`_publish_pending` ends on a failure or a stop: the MULTI out now is cancelled (its rows stay pending;
        published again if it got through: harmless), and a store call left running is waited for (its items
        in the outbox or back in the queue before anything else takes the queue)."""
        if flight is not None and not flight.done():
            flight.cancel()
            with contextlib.suppress(BaseException):
                await flight
        if self._storing is not None:
            with contextlib.suppress(BaseException):
                await self._drain()

    async def _settled(self, sent: list[int]) -> bool:
        """At the end of `_publish_pending`: wait for the last fast round's store call (its rows are written
        before they are marked); False if a submission came meanwhile (its round goes on behind that call) or
        the call read rows pending that are not `sent` (re-queued meanwhile)."""
        assert self._storing is not None
        await _first(self._storing, self._wake)
        if self._queue:
            return False
        return not [r for r in await self._drain() if r.oseq not in sent]

    async def _mark_unmarked(self) -> None:
        sent, self._unmarked = self._unmarked, []
        if sent:
            try:
                await self._run_store(self.state.fleet_mark_published, sent)
            except BaseException:
                self._unmarked = sent
                raise

    def _event(self, r: OutboxRow) -> FleetEvent | None:
        # `ts` is when this host decided the event (the row's creation), not when it is published: receivers
        # tell a backlog flushed after an outage from a flood by it (gate.py, step 6)
        ts = int(r.created * 1000)
        net = parse_net(r.target)
        if isinstance(net, Rejection):
            return None  # cannot happen for rows we wrote; never let one poison the outbox
        if r.op == "ban":
            return FleetEvent("ban", net, math.inf if r.until is None else r.until, self.cfg.host_id, r.oseq,
                              r.src, ts)
        return FleetEvent("unban", net, 0.0, self.cfg.host_id, r.oseq, r.src, ts)

    # -- receiving -----------------------------------------------------------------------------------

    def _note_error(self, exc: BaseException) -> None:
        self.stats.last_error = str(exc)
        self.stats.last_error_at = self.clock()

    async def _load_cursor(self) -> None:
        if self._cursor_loaded:
            return
        saved = await asyncio.to_thread(self.state.fleet_cursor, self.cfg.name)
        if saved is not None:
            cursors = parse_cursors(saved[1])
            if cursors is not None:  # (a schema 1 cursor, one id for the one stream, means nothing now)
                self._run_id, self._cursors = saved[0], cursors
        self._cursor_loaded = True

    async def save_cursor(self) -> None:
        """Persist the cursors as they are now (the daemon calls this at shutdown). The positions are taken
        before waiting for the saves of what was applied up to them (`settled`), so that batches applied
        meanwhile (the receive loop saves in the background) never carry a saved cursor past their own saves."""
        if self._run_id is None or not self._dirty:
            return
        run_id, cursors = self._run_id, dict(self._cursors)
        for owner, sid, _ev in self._deferred.values():  # a restart must read deferred entries again
            if owner in cursors:
                cursors[owner] = min(cursors[owner], before(sid))
        self._dirty = False  # a move while this save runs sets it again
        try:
            await self.sink.settled()  # the cursor never runs ahead of the saved bans
            await asyncio.to_thread(self.state.set_fleet_cursor, self.cfg.name, run_id, format_cursors(cursors))
        except BaseException:
            self._dirty = True
            raise
        self._saved_at = self.clock()

    def _move(self, owner: str, sid: StreamId) -> None:
        self._cursors[owner] = sid
        self._dirty = True
        self.stats.cursor = format_id(sid)

    async def _receive_loop(self) -> None:
        while True:
            try:
                run_id = await self.link.connect()
                self.stats.connects += 1
                self.stats.run_id = run_id
                self.stats.server = getattr(self.link, "server", "")
                self.stats.role = await self.link.role()
                if self.cfg.sentinel_hosts and self.stats.role != "master":
                    # the Sentinels named a server that is no longer (or not yet) the primary: ask again
                    raise LinkError(f"{self.stats.server} is a {self.stats.role}, not the primary")
                await self._catch_up()
                self.stats.connected = True
                if self._down_since is not None:
                    log.info("fleet %s: connected to %s again after %.1fs", self.cfg.name, self.stats.server,
                             self.clock() - self._down_since)
                    self._down_since = None
                else:
                    log.info("fleet %s: connected to %s (%s)", self.cfg.name, self.stats.server, self.stats.role)
                self._online.set()
                self._connected.set()
                self._wake.set()
                await self._follow()
            except Exception as exc:  # LinkError is the expected case; anything else is a bug or a surprise
                # from the client library, and must not end fleet mode (or the daemon's TaskGroup)
                if not isinstance(exc, LinkError):
                    log.error("fleet %s: unexpected error, reconnecting", self.cfg.name, exc_info=True)
                self._online.clear()
                self.stats.connected = False
                self._note_error(exc)
                if self._down_since is None:
                    self._down_since = self.clock()
                    what = ("the server refused this host" if isinstance(exc, LinkError) and exc.refused
                            else "server unreachable")
                    log.warning("fleet %s: %s (%s); bans are still enforced here and queued for the fleet; "
                                "retrying with backoff", self.cfg.name, what, exc)
                else:
                    log.debug("fleet %s: still unreachable: %s", self.cfg.name, exc)
                await self.link.close()
                await asyncio.sleep(retry_delay(self.clock() - self._down_since) * random.uniform(0.8, 1.2))

    async def _follow(self) -> None:
        """Read every followed stream and apply, the next read already on its way while a batch is applied
        (the reader connection waits for the server meanwhile, instead of the kernel and the database waiting
        for it). A full read means a backlog (a replay): the next one asks for CATCHUP_COUNT entries per
        stream. The next read's request goes out before the apply starts (one turn of the loop). Once every
        MAINTAIN_INTERVAL a check of the server runs beside the loop (`_check`), and the loop acts on what it
        found between two applies (`_maintain`)."""
        reading: asyncio.Future[list[tuple[str, Sequence[Entry]]]] | None = asyncio.ensure_future(
            self.link.read(dict(self._cursors), self.read_count, self._block()))
        # The periodic cursor save runs beside the loop, one at a time: inline, its wait for the queued ban
        # saves and its own fsync'd commit held the next read's batch for a few ms once a second, the slowest
        # bans of a steady stream (bench/bench_fleet.py's p99). A failed save raises here at the next turn.
        saving: asyncio.Future[None] | None = None
        checking: asyncio.Future[_Checked] | None = None  # a maintenance's server reads, beside the loop
        try:
            while True:
                assert reading is not None
                got = await reading
                honour_cancel()
                nxt = dict(self._cursors)
                full = False
                for owner, entries in got:
                    try:
                        nxt[owner] = entries[-1][0]
                    except ValueError as exc:  # the read's last id is not one: the next read cannot start after it
                        await self._apply_good(entries, owner, exc)
                        raise LinkError(f"the fleet server sent an entry without a stream id after "
                                        f"{format_id(self._cursors.get(owner, (0, 0)))} in {owner}'s stream"
                                        ) from None
                    full = full or len(entries) >= self.read_count
                count = self.catchup_count if full else self.read_count
                reading = asyncio.ensure_future(self.link.read(nxt, count, self._block()))
                if got:
                    await asyncio.sleep(0)  # the read's task runs to its wait for the reply: the request is sent
                for owner, entries in got:
                    try:
                        await self._apply(entries, owner)
                    except ValueError as exc:
                        await self._apply_good(entries, owner, exc)
                if self._deferred:
                    await self._retry_deferred()
                if checking is not None and checking.done():
                    checked, checking = checking.result(), None  # (a LinkError raises here: reconnect)
                    await self._maintain(checked)
                if checking is None and time.monotonic() - self._maintained_at >= MAINTAIN_INTERVAL:
                    # (intervals on the monotonic clock: a test's `clock` may stand still)
                    self._maintained_at = time.monotonic()
                    checking = asyncio.ensure_future(self._check())
                if saving is not None and saving.done():
                    done: asyncio.Future[None] = saving
                    saving = None
                    done.result()
                if saving is None and self._dirty and self.clock() - self._saved_at >= self.cursor_interval:
                    saving = asyncio.ensure_future(self.save_cursor())
        finally:
            for pending in (reading, checking):
                if pending is not None and not pending.done():
                    pending.cancel()
                    with contextlib.suppress(BaseException):
                        await pending
            if saving is not None and not saving.done():
                with contextlib.suppress(BaseException):
                    await saving  # a save under way finishes (close() saves again after it)

    def _block(self) -> int | None:
        """The next read's BLOCK: short while events wait for a retry, the link's own otherwise."""
        return DEFER_BLOCK_MS if self._deferred else None

    def _defer(self, owner: str, sid: StreamId, ev: FleetEvent) -> None:
        """Keep a rate-refused event for a retry (a backlog flushed after an outage is legitimate: refused,
        it was never enforced here). Beyond DEFER_LIMIT it is refused for good and counted."""
        d = self._deferred
        if ev.net not in d and len(d) >= DEFER_LIMIT:
            self.stats.received[(ev.op, "rate")] += 1
            return
        d.pop(ev.net, None)
        d[ev.net] = (owner, sid, ev)
        self.stats.deferred_total += 1
        self.stats.deferred = len(d)

    async def _retry_deferred(self) -> None:
        """Deferred events through the gate again, oldest first, as live events at the present time (their
        bucket refills as time passes; their decision times no longer count), the accepted ones as one change.
        Those still refused wait for the next round."""
        now = self.clock()
        items = list(self._deferred.values())
        self._deferred.clear()
        bans: list[FleetBan] = []
        unbans: list[FleetUnban] = []
        for owner, sid, ev in items:
            ok = self.gate.check(replace(ev, ts=0), now, now)
            if isinstance(ok, Rejection):
                if ok.reason == "rate":
                    self._deferred[ev.net] = (owner, sid, ev)
                else:
                    self.stats.received[(ev.op, ok.reason)] += 1
                continue
            self.stats.received[(ev.op, "applied")] += 1
            if ev.op == "ban":
                bans.append(FleetBan(ev.net, ok.until, ev.origin))
            else:
                unbans.append(FleetUnban(ev.net, sid[0] / 1000, _lifts(owner)))
        self.stats.deferred = len(self._deferred)
        if bans or unbans:
            await self.sink.apply_fleet(FleetChange(tuple(bans), tuple(unbans)))
            if unbans:
                await asyncio.to_thread(self.state.fleet_forget,
                                        [(format_target(u.net), u.at or now) for u in unbans])

    async def _apply_good(self, entries: Sequence[Entry], owner: str, exc: ValueError) -> None:
        """`_apply` of a read in which a stream id did not parse (`_apply` raised ValueError before it counted
        or applied anything): those entries counted (`bad_id`) and skipped, the others applied. `exc` with
        every id sound is not this: raised again."""
        good, bad = good_ids(entries)
        if not bad:
            raise exc
        self.stats.received[("?", "bad_id")] += bad
        log.warning("fleet %s: skipped %d entries whose stream id the server could not have sent", self.cfg.name, bad)
        if good:
            await self._apply(good, owner)

    def _future_from(self, entries: Sequence[Entry], owner: str) -> int:
        """How many entries of a read come before the first whose id is more than FUTURE_MS ahead of the
        server's clock (such an id is not the server's `*`: someone with `owner`'s credentials chose it, and
        every later id of that stream is above it). Those are refused, and the stream is shown as broken."""
        limit = (self.clock() + self._skew) * 1000 + FUTURE_MS
        last = entries[-1][0]
        if last[0] <= limit:
            return len(entries)
        n = next(i for i, (sid, _f) in enumerate(entries) if sid[0] > limit)
        if self.stats.stream_problems.get(owner) != "future_id":
            self.stats.stream_problems[owner] = "future_id"
            log.warning("fleet %s: %s's stream has ids far ahead of the server's clock (%s): its events are refused "
                        "until it is re-created", self.cfg.name, owner, format_id(last))
        self.stats.received[("?", "future_id")] += len(entries) - n
        return n

    async def _apply(self, entries: Sequence[Entry], owner: str) -> None:
        """Apply one read of `owner`'s stream: its origin is the stream's, never a field (an entry naming
        another origin is refused, `origin`). A stream id that does not parse (a `RawEntries` read parses them
        as they are read) raises ValueError before anything is counted or applied."""
        end = entries[-1][0]
        if owner == self.cfg.host_id:  # our own stream: only the cursor moves (nothing decoded)
            self.stats.received[("?", "own")] += len(entries)
        else:
            n = self._future_from(entries, owner)
            if n:
                await self._apply_entries(entries if n == len(entries) else entries[:n], owner)
        self._move(owner, end)

    async def _apply_entries(self, entries: Sequence[Entry], owner: str) -> None:
        now = self.clock()
        plain = (plain_bans(entries, self._own_origin)
                 if self.batch and owner != OPERATOR and len(entries) >= BATCH_MIN else None)
        if plain is not None and not plain.own and plain.origins.count(owner) == len(plain.origins):
            await self._apply_plain(plain, now, owner)
            return
        entries = list(entries)  # (every id parsed before the first entry is counted)
        latest: dict[IPNet, tuple[FleetEvent, float]] = {}
        received = self.stats.received
        claimed = "operator" if owner == OPERATOR else owner
        for sid, fields in entries:
            ev = decode(fields)
            if isinstance(ev, Rejection):
                op = fields.get(b"op", b"?")
                received[(op.decode("ascii", "replace")[:8] if isinstance(op, bytes) else "?", ev.reason)] += 1
                log.debug("fleet: refused entry %s: %s %s", format_id(sid), ev.reason, ev.detail)
                continue
            if ev.origin != claimed:  # a forged origin: refused whole, whoever it names
                received[(ev.op, "origin")] += 1
                log.debug("fleet: refused %s %s in %s's stream claiming origin %s", ev.op, ev.net, owner, ev.origin)
                continue
            if owner == OPERATOR:
                ev = replace(ev, origin=OPERATOR)
            ok = self.gate.check(ev, now, sid[0] / 1000)
            if isinstance(ok, Rejection):
                if ok.reason == "rate":
                    self._defer(owner, sid, ev)
                    continue
                received[(ev.op, ok.reason)] += 1
                log.debug("fleet: refused %s %s from %s: %s", ev.op, ev.net, ev.origin, ok.detail)
                continue
            received[(ev.op, "applied")] += 1
            if self._deferred and self._deferred.pop(ev.net, None) is not None:
                self.stats.deferred = len(self._deferred)  # this newer event wins over the deferred older one
            latest[ev.net] = (ev, ok.until if ev.op == "ban" else sid[0] / 1000)
        bans = tuple(FleetBan(net, v, ev.origin) for net, (ev, v) in latest.items() if ev.op == "ban")
        lifts = _lifts(owner)
        unbans = tuple(FleetUnban(net, v, lifts) for net, (ev, v) in latest.items() if ev.op == "unban")
        if bans or unbans:
            await self.sink.apply_fleet(FleetChange(bans, unbans))
            # one lag figure per batch (the newest ban's: a histogram observation per ban cost 3 % of a replay)
            newest = max((ev.ts for ev, _ in latest.values() if ev.op == "ban"), default=0)
            if newest:
                self.stats.lag_last = self.clock() - newest / 1000
                if self.on_lag is not None:
                    self.on_lag(self.stats.lag_last)
            if unbans:
                await asyncio.to_thread(self.state.fleet_forget,
                                        [(format_target(u.net), u.at or now) for u in unbans])

    async def _apply_plain(self, plain: PlainBans, now: float, owner: str) -> None:
        """`_apply`'s per-entry loop for a read of plain single-address bans, over the whole read at once:
        the same counters, the same last-wins rule per address, the same change for the sink (its addresses
        as host keys grouped by IP version and origin, each with its end, `FleetHosts`), without a network
        object, event or verdict per entry. A 100k catch-up spent two thirds of its receive loop in those
        (`decode` ~10 us and `Gate.check` ~6 us per entry)."""
        received = self.stats.received
        for op, n in plain.own.items():
            received[(op, "own")] += n
        versions, keys, origins = plain.versions, plain.keys, plain.origins
        ts_ms = plain.ts
        decided = list(map(operator.truediv, ts_ms, itertools.repeat(1000)))
        ends, refused = self.gate.check_hosts(origins, plain.ats, versions, keys, plain.untils, now, decided)
        n = len(keys)
        if n > len(refused):
            received[("ban", "applied")] += n - len(refused)
        # the last accepted entry per address wins (dicts keep an address where it first came, as `latest`)
        if not refused and 6 not in versions:
            last: list[dict[int, int]] = [dict(zip(keys, range(n), strict=True)), {}]
        else:
            last = [{}, {}]
            for i in range(n):
                if i not in refused:
                    last[versions[i] == 6][keys[i]] = i
        if self._deferred:  # an accepted newer ban of a target settles its deferred older event (an unban)
            self._settle_deferred(last)
        self._plain_refused(plain, refused, last, owner)
        # the decoder's ends in ms hold while the gate left every end as it was (`check_hosts` clamps none of a
        # catch-up's: a list equal item for item, the same float objects, so the comparison is a pointer each)
        ends_ms = plain.ends_ms if plain.ends_ms is not None and ends == plain.untils else None
        groups = _host_groups(last, keys, origins, ends, ends_ms)
        if not groups:
            return
        await self.sink.apply_fleet(FleetChange(hosts=tuple(
            FleetHosts(v, origin, tuple(ks), tuple(es), None if ms is None else tuple(ms))
            for (v, origin), (ks, es, ms) in groups.items())))
        if sum(map(len, last)) == n:
            newest = max(ts_ms)
        else:
            newest = max(map(ts_ms.__getitem__, [i for chosen in last for i in chosen.values()]))
        if newest:
            self.stats.lag_last = self.clock() - newest / 1000
            if self.on_lag is not None:
                self.on_lag(self.stats.lag_last)

    def _plain_refused(self, plain: PlainBans, refused: Mapping[int, Rejection],
                       last: Sequence[Mapping[int, int]], owner: str) -> None:
        """The batch path's refusals: `rate` ones deferred unless a later entry of the read for the same
        address was accepted (as `_apply` does, entry by entry), the rest counted."""
        keys, versions, origins = plain.keys, plain.versions, plain.origins
        for i, rej in refused.items():
            if rej.reason == "rate":  # the entry id is not kept here: its millisecond, which is no later
                if last[versions[i] == 6].get(keys[i], -1) > i:
                    continue
                self._defer(owner, (int(plain.ats[i] * 1000), 0), FleetEvent(
                    "ban", host_net(keys[i], versions[i]), plain.untils[i], origins[i], 0, "fleet", plain.ts[i]))
                continue
            self.stats.received[("ban", rej.reason)] += 1
            log.debug("fleet: refused ban %s from %s: %s", format_host(keys[i], versions[i]), origins[i],
                      rej.detail)

    def _settle_deferred(self, last: Sequence[Mapping[int, int]]) -> None:
        """Accepted host keys (IPv4, IPv6) of a read: their deferred older events must not follow them."""
        for version, chosen in zip((4, 6), last, strict=True):
            for k in chosen:
                self._deferred.pop(host_net(k, version), None)
        self.stats.deferred = len(self._deferred)

    # -- catch-up ------------------------------------------------------------------------------------

    async def _catch_up(self) -> None:
        """Per followed stream, `catchup.decide` from its cursor: replay from the cursor, or a snapshot of that
        owner's keys. Our own stream is followed from its end (only for its bounds). Then this host's own bans
        the server lacks are re-asserted and its epoch token set (`_heal` checks both from then on)."""
        await self._load_cursor()
        own = self.cfg.host_id
        owners = [o for o in await self.link.members() if o != own]
        self._discovered_at = time.monotonic()
        saved_run = self._run_id
        server_ms, views = await self.link.server_views({o: self._cursors.get(o) for o in [*owners, own]})
        self._skew = server_ms / 1000 - self.clock()
        snap: list[str] = []
        whys: set[str] = set()
        cursors: dict[str, StreamId] = {own: views[own].last_generated}
        replays = 0
        for o in owners:
            c = self._cursors.get(o)
            choice = decide(Cursor(saved_run, c) if saved_run is not None and c is not None else None, views[o])
            if isinstance(choice, Replay):
                cursors[o] = choice.after
                replays += 1
            else:
                snap.append(o)
                whys.add(choice.why)
        self._cursors = cursors
        self._run_id = views[own].run_id
        self._dirty = True
        self.stats.members = len(owners) + 1
        self.stats.stream_problems.clear()
        if views[own].first_id is None and views[own].last_generated == (0, 0):
            with contextlib.suppress(LinkError):  # (a server refusing writes: the first publish makes it)
                await self.link.announce()
        self._deferred.clear()  # read again: their streams are replayed from the saved cursors or snapshotted
        self.stats.deferred = 0
        if replays:
            self.stats.replays += 1
            log.info("fleet %s: replaying %d streams from their cursors", self.cfg.name, replays)
        if snap:
            await self._snapshot(snap, ", ".join(sorted(whys)))
        elif saved_run is not None and saved_run != self._run_id and not replays:  # a new server holding no stream
            self.stats.snapshots += 1
            log.info("fleet %s: snapshot (new server): it holds no member's stream", self.cfg.name)
        await self.save_cursor()
        await self._reassert_by_scores()
        self._own_count = -1
        if self._epoch and self.on_heal is not None:  # a reconnect to a server that lost our state: tell counting
            with contextlib.suppress(LinkError):
                epoch = (await self.link.health(self.clock())).epoch
                if epoch != self._epoch:
                    await self.on_heal("the server lost this host's state")
        await self._mark_epoch()

    async def _mark_epoch(self) -> None:
        """A new epoch token in our own key: its absence later means the server lost our state. A server that
        refuses writes (NOREPLICAS) must not stop receiving: `_heal` tries again."""
        token = f"{self.clock():.3f}-{random.getrandbits(32):08x}"
        try:
            await self.link.mark_epoch(token)
        except LinkError as exc:
            if exc.not_primary:
                raise
            log.debug("fleet %s: could not set the epoch marker: %s", self.cfg.name, exc)
            return
        self._epoch = token

    def _gated_active(self, active_raw: Mapping[str, float], now: float, seen: dict[IPNet, float]
                      ) -> dict[IPNet, float]:
        active: dict[IPNet, float] = {}
        for member, until in active_raw.items():
            net = parse_net(member)
            if isinstance(net, Rejection):
                self.stats.received[("snapshot", net.reason)] += 1
                continue
            seen[net] = until
            bad = self.gate.check_net(net)
            clamped = self.gate.clamp(until, now) if bad is None else bad
            if isinstance(clamped, Rejection):
                self.stats.received[("snapshot", clamped.reason)] += 1
                continue
            active[net] = clamped[0]
        return active

    async def _snapshot(self, owners: Sequence[str], why: str) -> None:
        """Snapshot of `owners`' keys: their bans added where this host lacks them, their tombstones lifting
        only their own bans here (an operator's, any fleet ban), nothing removed because it is absent (see
        catchup.reconcile); each followed from its stream's last id."""
        now = self.clock()
        snap = await self.link.snapshot(owners, now)
        fleet_elements, local = await self.sink.fleet_view()
        bans: dict[IPNet, FleetBan] = {}
        unbans: dict[IPNet, FleetUnban] = {}
        n_active = n_tombs = 0
        for owner, part in snap.parts.items():
            change = self._reconcile_part(owner, part, now, fleet_elements, local)
            n_active += len(part.active)
            n_tombs += len(part.tombstones)
            for b in change.bans:
                if b.net not in bans or bans[b.net].until < b.until:
                    bans[b.net] = b
            for u in change.unbans:
                unbans[u.net] = u
            self._move(owner, part.last_id)
            self.stats.stream_problems.pop(owner, None)
        for net in bans:  # banned by one owner, lifted by another: the ban stands
            unbans.pop(net, None)
        if bans or unbans:
            await self.sink.apply_fleet(FleetChange(tuple(bans.values()), tuple(unbans.values())))
        self.stats.snapshots += 1
        log.info("fleet %s: snapshot of %d streams (%s): %d active, %d tombstones; %d added, %d removed here",
                 self.cfg.name, len(snap.parts), why, n_active, n_tombs, len(bans), len(unbans))

    def _reconcile_part(self, owner: str, part: SnapshotPart, now: float, fleet_elements: Mapping[IPNet, float],
                        local: Mapping[IPNet, LocalBan]) -> FleetChange:
        seen: dict[IPNet, float] = {}
        active = self._gated_active(part.active, now, seen)
        tombstones: dict[IPNet, float] = {}
        for member, at in part.tombstones.items():
            net = parse_net(member)
            if not isinstance(net, Rejection):
                tombstones[net] = at
        return reconcile(active, tombstones, fleet_elements, local, owner=_lifts(owner),
                         origin=owner)

    async def _own_active(self, now: float) -> list[OwnBan]:
        rows = await asyncio.to_thread(self.state.fleet_own_active, now, now - self.cfg.history)
        own = []
        for r in rows:
            net = parse_net(r.target)
            if not isinstance(net, Rejection):
                own.append(OwnBan(r.oseq, net, math.inf if r.until is None else r.until, r.src, r.created))
        return own

    async def _requeue(self, again: Sequence[OwnBan]) -> None:
        """Re-assert: through the outbox, not published here. Published by the catch-up, a server that refused
        writes (NOREPLICAS) failed the whole catch-up, and with it receiving, on every host that had own bans
        to re-assert (issue #23). Queued again, the publisher publishes them, retried until acknowledged."""
        if again:
            await asyncio.to_thread(self.state.fleet_requeue, [b.oseq for b in again])
            self.stats.reasserted += len(again)
            self._requeues += 1
            self._wake.set()
            log.info("fleet %s: re-asserting %d own bans the server lacks", self.cfg.name, len(again))

    async def _reassert_by_scores(self) -> int:
        """This host's own recent active bans its own keys lack (asked for them alone, `RedisLink.scores`) are
        queued again; returns how many."""
        now = self.clock()
        own = await self._own_active(now)
        if not own:
            return 0
        active_raw, tombs_raw = await self.link.scores([format_target(b.net) for b in own])
        by_text = {format_target(b.net): b.net for b in own}
        again = reassert(own, {by_text[m]: v for m, v in active_raw.items()},
                         {by_text[m]: v for m, v in tombs_raw.items()}, now)
        await self._requeue(again)
        return len(again)

    # -- maintenance: discovery, broken streams, healing ---------------------------------------------

    async def _check(self) -> _Checked:
        """The server reads of one maintenance, beside the receive loop (on the command connection, while the
        reader waits in XREAD): members (every DISCOVER_INTERVAL, more rarely in a large fleet), a batch of the
        followed streams' bounds, this host's own keys, and, when the own count fell or every VERIFY_EVERY
        checks, how many running own bans the outbox holds. Done inline between two reads, the three round
        trips and the store read held a read's batch once a second, the slowest bans at 1,000 bans/s."""
        now = self.clock()
        tick = time.monotonic()
        own = self.cfg.host_id
        owners = None
        every = max(DISCOVER_INTERVAL, DISCOVER_PER_MEMBER * self.stats.members)
        if tick - self._discovered_at >= every * random.uniform(0.8, 1.2):
            self._discovered_at = tick
            owners = [o for o in await self.link.members() if o != own]
        others = sorted(o for o in self._cursors if o != own)
        batch: dict[str, StreamId | None] = {}
        if others:
            start = self._check_from % len(others)
            picked = (others[start:] + others[:start])[:check_batch(len(others) + 1)]
            self._check_from = start + len(picked)
            batch = {o: self._cursors.get(o) for o in picked}
        server_ms, views = await self.link.server_views(batch) if batch else (0, {})
        h = await self.link.health(now)
        self._checks += 1
        gone = h.last_id is None and self._cursors.get(own, (0, 0)) > (0, 0)  # our stream vanished
        live = None
        if h.epoch == self._epoch and (gone or 0 <= h.active < self._own_count or self._checks % VERIFY_EVERY == 0):
            live = len(await self._own_active(now))
        return _Checked(now, owners, batch, server_ms, views, h, live)

    async def _maintain(self, c: _Checked) -> None:
        """Act on a `_check`, between two reads: follow new members, drop gone ones, take a snapshot of a stream
        whose last id is below our cursor (made again), mark streams with ids ahead of the server's clock, and
        heal our own keys."""
        own = self.cfg.host_id
        if c.owners is not None:
            new = [o for o in c.owners if o not in self._cursors]
            for gone in [o for o in self._cursors if o != own and o not in c.owners]:
                del self._cursors[gone]  # its stream is gone: if it comes back, it is read from its start
                self.stats.stream_problems.pop(gone, None)
            self.stats.members = len(c.owners) + 1
            for o in new:  # a stream that appeared since we connected: everything in it is new to us
                self._move(o, (0, 0))
            if new:
                log.info("fleet %s: following %d new members: %s", self.cfg.name, len(new), ", ".join(new[:10]))
        if c.server_ms:
            self._skew = c.server_ms / 1000 - c.now
        ahead = []
        for o, view in c.views.items():
            cur = c.cursors.get(o)
            if cur is not None and cur > view.last_generated and self._cursors.get(o) == cur:
                ahead.append(o)  # (a cursor that moved since the check was read on: the stream works)
            elif view.last_generated[0] > c.server_ms + FUTURE_MS:
                self.stats.stream_problems.setdefault(o, "future_id")
            elif self.stats.stream_problems.get(o) == "future_id" and self._cursors.get(o) == cur:
                del self.stats.stream_problems[o]  # (only if nothing was read since: the view is not stale)
        if ahead:
            for o in ahead:
                self.stats.stream_problems[o] = "cursor_ahead"
                self.stats.received[("?", "cursor_ahead")] += 1
            log.warning("fleet %s: our cursor is ahead of the last id of %s's stream (re-created, or its ids "
                        "were rewound): taking a snapshot of it", self.cfg.name, ", ".join(ahead))
            await self._snapshot(ahead, "cursor ahead")
        await self._heal(c.health, c.live)

    async def _heal(self, h: OwnHealth, live: int | None) -> None:
        """Does the server still hold what this host enforces? Its epoch token gone (the server lost its state:
        a restart without persistence, a flush, a failover to a replica that missed it), or fewer of its own
        bans running in its `active` than its outbox holds (`live`): the missing ones are re-asserted. Its own
        stream with ids ahead of the server's clock (written with its credentials by someone else): re-created."""
        own = self.cfg.host_id
        if h.last_id is not None and h.last_id[0] > h.server_ms + FUTURE_MS:
            await self._reset_own_stream(f"its last id {format_id(h.last_id)} is ahead of the server's clock")
            return
        if h.last_id is not None and self._cursors.get(own, (0, 0)) > h.last_id:
            self._cursors[own] = h.last_id  # re-created (by us, or by someone with our credentials)
        lost = h.epoch != self._epoch or (live is not None and live > h.active)
        self._own_count = h.active
        if lost:
            n = await self._reassert_by_scores()
            self.stats.heals += 1
            why = "epoch marker gone" if h.epoch != self._epoch else "own active bans missing"
            log.warning("fleet %s: the server lost this host's state (%s): %d own bans re-asserted", self.cfg.name,
                        why, n)
            await self._mark_epoch()
            if self.on_heal is not None:
                await self.on_heal(why)

    async def _reset_own_stream(self, why: str) -> None:
        """Our own stream refuses appends or carries ids ahead of the server's clock: delete it (our own key)
        and re-assert; other hosts notice their cursor ahead of its new ids and take a snapshot of it."""
        log.warning("fleet %s: this host's stream is unusable (%s); re-creating it", self.cfg.name, why)
        try:
            await self.link.reset_stream()
        except LinkError as exc:
            log.debug("fleet %s: could not re-create our stream: %s", self.cfg.name, exc)
            return
        self.stats.stream_resets += 1
        self._cursors[self.cfg.host_id] = (0, 0)
        with contextlib.suppress(LinkError):
            await self._reassert_by_scores()

    # -- lifecycle -----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Publisher and receiver until cancelled (run it under the daemon's TaskGroup)."""
        self.stats.outbox = await asyncio.to_thread(self.state.fleet_outbox_size)
        await self._load_oseq()
        if self.stats.outbox:
            self._wake.set()
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._receive_loop(), name="fleet-receive")
                tg.create_task(self._publish_loop(), name="fleet-publish")
        finally:
            self._online.clear()
            self.stats.connected = False

    async def close(self) -> None:
        """Save the cursor and close the connections (after `run` was cancelled)."""
        try:
            try:
                await self._mark_unmarked()
            except Exception as exc:  # they are published again at the next start: harmless
                log.debug("fleet %s: could not mark published events: %s", self.cfg.name, exc)
            await self.save_cursor()
        finally:
            await self.link.close()

    def status(self) -> dict[str, Any]:
        d = self.stats.as_dict()
        d.update(fleet=self.cfg.name, host_id=self.cfg.host_id, queued=len(self._queue))
        return d


__all__ = ["FleetService", "FleetSink", "FleetState", "FleetStats", "limits_of", "shares"]
