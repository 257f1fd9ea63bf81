"""The ban sink: the one path a jail's ban decisions take to the kernel, the database and the recidive jails.

Jails decide bans while matching lines and must not wait on netlink per line; the sink takes each matched
batch's bans from a bounded queue and applies them in order. One path for any batch size:

- single addresses (the common case: every IPv4 offender, IPv6 offenders counted per /128) are grouped by
  (blocklist, end, reason, jail) and go through `Enforcer.ban_hosts`: one set operation in the state, one
  kernel transaction, one packed row in the database, the audit lines within their budget;
- ranges (IPv6 offenders counted per /64, say) go through `Enforcer.apply`, which handles absorption and
  covering ranges;
- the batch's history rows (escalation memory) are saved in the same commit as its first group;
- its ranges go to the enforcer together with its groups, so they share the kernel transaction and the commit.

Batches that queued up while the previous one was applied are merged into one (bans and records in
submission order, the earliest arrival), and a batch's groups go to the enforcer concurrently, where the
batcher and the persister make one kernel transaction and one commit of them. Under a steady stream of small
batches (one offender per log write, 1,000 bans/s) applying them one by one fell 1.3 s behind; merged, the
last ban is in the kernel 4 ms after its write.

Durable, not waited for: each group's save is queued with its kernel ops (ranges: right after their kernel
answer), in order, in the persister, which writes it, retries a failed write and flushes at shutdown (after
the sink has drained). `run()` does not wait for a batch's saves before applying the next batch, so the
commits of earlier batches overlap the kernel work of later ones (the persister merges what queued up
meanwhile into one commit). At most MAX_UNSAVED applied batches may have saves in flight; then the sink
waits for the oldest, so a store that falls behind still slows the sink down, and `run()` returns only
once every save it started was attempted. In a 10k-attacker burst the sink waited up to 90-200 ms per batch
for commits, with the next batches' bans queued behind it. `apply()` called on its own still returns once
its saves were written.

Order of what happens to one batch:
1. apply every group; collect what the kernel refused (a full set, an overlap) or the allowlist stopped;
2. a refused ban is forgotten by the ledger (the tracker), so the tracker never believes an offender is
   banned that the kernel never got, and the next failure counts again;
3. the applied bans go to `on_applied` (fleet mode publishes them from there: after the kernel commit);
4. every applied ban is shown to the recidive jails (`ledger.escalations`); the bans they decide are
   applied the same way, in a loop (recidive never feeds itself, so the loop ends).

Failure rule: if applying a batch raises (a bug, a lost kernel socket), the batch's bans are forgotten by
the ledger, the error is logged and counted (`errors`), and the sink goes on with the next batch; it never
dies with bans queued behind it.

Memory bound: at most `max_batches` batches wait; a jail that submits into a full queue waits (its source
queue then fills and the sources stop reading: file offsets and journal cursors make waiting safe).
Shutdown: `close()` queues an end marker behind everything submitted; `run()` returns when it reaches it.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: a task drains the jails' bounded queue of bans)
import ipaddress
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from nftblockd.addr import IPNet, addr_int, prefixlen_of
from nftblockd.events import Ban
from nftblockd.kernel.enforcer import DecisionResult, Enforcer

log = logging.getLogger("nftblockd.sink")

HistoryRow = tuple[str, str, float, float | None]


class Decided(Protocol):
    """A ban-history record (tracker.BanRecord) as the sink needs it."""

    def as_row(self) -> HistoryRow: ...


class BanLedger(Protocol):
    """What the sink tells the tracker, and asks of it."""

    def forget_ban(self, target: IPNet, *, jail: str | None = None,
                   forgive: bool = False) -> list[tuple[str, IPNet]]: ...

    def escalations(self, ban: Ban, now: float) -> Sequence[tuple[Ban, Decided | None]]:
        """The bans recidive jails decide because `ban` was applied (with their history records)."""
        ...


class BanBatch(NamedTuple):
    bans: list[Ban]
    records: Sequence[Decided]
    arrival: float  # monotonic: when the lines that caused these bans were read (the latency metric)


@dataclass(slots=True)
class SinkStats:
    batches: int = 0
    applied: int = 0
    refused: int = 0
    errors: int = 0
    # per jail, what the kernel holds and what it refused (a full set): a jail's status must not count a ban
    # the kernel never got (issue 13: 1,500 bans counted with 1,000 in a full set)
    applied_by_jail: dict[str, int] = field(default_factory=dict)
    refused_by_jail: dict[str, int] = field(default_factory=dict)


_END = None
MAX_UNSAVED = 4  # applied batches whose saves may still be in flight before the sink waits for the oldest


async def _no_results() -> list[DecisionResult]:
    return []


GroupKey = tuple[str, float | None, str, str, str]  # (blocklist, until, origin, reason, jail)
_NET4 = ipaddress.IPv4Network


def split_bans(bans: Sequence[Ban]) -> tuple[dict[GroupKey, dict[int, list[Ban]]], list[Ban]]:
    """A batch's bans of single addresses grouped by GroupKey and then IP version (in order), and its ranges.

    Per ban on the event loop, so without ipaddress's properties (prefixlen, max_prefixlen, version: a
    Python-level call each): for the 10,000 bans of a burst this and `host_keys` took 8.9 ms that way.
    """
    groups: dict[GroupKey, dict[int, list[Ban]]] = {}
    ranges: list[Ban] = []
    plen = prefixlen_of
    for b in bans:
        t = b.target
        if type(t) is _NET4:
            if plen(t) != 32:
                ranges.append(b)
                continue
            v = 4
        elif plen(t) == t.max_prefixlen:
            v = t.version
        else:
            ranges.append(b)
            continue
        by_version = groups.get(key := (b.blocklist, b.until, b.origin, b.reason, b.jail))
        if by_version is None:
            by_version = groups[key] = {}
        same = by_version.get(v)
        if same is None:
            by_version[v] = [b]
        else:
            same.append(b)
    return groups, ranges


def host_keys(by_version: dict[int, list[Ban]]) -> dict[int, list[int]]:
    """The host keys (address values) of a group's single-address bans, per IP version."""
    return {v: [addr_int(b.target.network_address) for b in bs] for v, bs in by_version.items()}


class JailBanSink:
    def __init__(self, enforcer: Enforcer, ledger: BanLedger, *, max_batches: int = 256,
                 clock: Callable[[], float] = time.time,
                 on_applied: Callable[[Sequence[Ban], float], None] | None = None) -> None:
        self.enforcer = enforcer
        self.ledger = ledger
        self.clock = clock
        self.on_applied = on_applied  # the kernel holds these now (fleet mode publishes them); must not raise
        self.stats = SinkStats()
        self._queue: asyncio.Queue[BanBatch | None] = asyncio.Queue(max_batches)

    async def submit(self, bans: list[Ban], records: Sequence[Decided], arrival: float) -> None:
        """Queue a batch's bans; waits while `max_batches` batches are queued (back-pressure)."""
        await self._queue.put(BanBatch(bans, records, arrival))

    def submit_nowait(self, bans: list[Ban], records: Sequence[Decided], arrival: float) -> bool:
        """Queue without waiting (a jail stopping); False when the queue is full and nothing was queued."""
        try:
            self._queue.put_nowait(BanBatch(bans, records, arrival))
        except asyncio.QueueFull:
            return False
        return True

    def pending(self) -> int:
        return self._queue.qsize()

    async def close(self) -> None:
        """Mark the end: `run()` returns once everything submitted before this was applied."""
        await self._queue.put(_END)

    async def run(self) -> None:
        unsaved: deque[list[asyncio.Future[None]]] = deque()  # per applied batch, its saves in flight
        try:
            while True:
                batch = await self._queue.get()
                if batch is _END:
                    return
                saves: list[asyncio.Future[None]] = []
                end = await self._run_one(batch, saves)
                unsaved.append(saves)
                while unsaved and (len(unsaved) > MAX_UNSAVED or all(f.done() for f in unsaved[0])):
                    await self._saved(unsaved.popleft())
                if end:
                    return
        finally:
            while unsaved:
                await self._saved(unsaved.popleft())

    async def _saved(self, saves: list[asyncio.Future[None]]) -> None:
        """Wait for the saves of a batch (the persister's futures never fail; a failing save is reported)."""
        for r in await asyncio.gather(*saves, return_exceptions=True):
            if isinstance(r, BaseException):
                self.stats.errors += 1
                log.error("saving jail bans failed: %s", r)

    async def _run_one(self, batch: BanBatch, saves: list[asyncio.Future[None]]) -> bool:
        """Apply `batch` merged with whatever queued up behind it; True if the end marker was met."""
        end = False
        # Whatever queued up while the last batch was applied goes in one merged batch: under a steady
        # stream of small batches (one offender per log write) applying them one at a time fell behind
        # (1,000 bans/s: all in the kernel 1.3 s after the last write; merged, see the module rules).
        while not self._queue.empty():
            more = self._queue.get_nowait()
            if more is _END:
                end = True
                break
            self.stats.batches += 1
            batch = BanBatch(batch.bans + more.bans, [*batch.records, *more.records],
                             min(batch.arrival, more.arrival))
        self.stats.batches += 1
        try:
            await self.apply(batch.bans, batch.records, batch.arrival, saves=saves)
        except Exception:
            self.stats.errors += 1
            log.exception("applying %d jail bans failed; they are forgotten and will be decided again",
                          len(batch.bans))
            for b in batch.bans:
                self.ledger.forget_ban(b.target, jail=b.jail or None)
        return end

    async def apply(self, bans: list[Ban], records: Sequence[Decided], arrival: float,
                    saves: list[asyncio.Future[None]] | None = None) -> None:
        """Apply bans (and the recidive bans they lead to); see the module docstring for the order. With
        `saves`, the futures of their saves are appended there (the caller awaits them); without, they are
        awaited before this returns."""
        mine: list[asyncio.Future[None]] = [] if saves is None else saves
        history = [r.as_row() for r in records]
        while bans:
            now = self.clock()
            applied = await self._apply_once(bans, history, now, arrival, mine)
            if applied and self.on_applied is not None:
                self.on_applied(applied, now)
            history = []
            bans = []
            for b in applied:
                for more, record in self.ledger.escalations(b, now):
                    bans.append(more)
                    if record is not None:
                        history.append(record.as_row())
        if saves is None:
            await asyncio.gather(*mine)

    async def _apply_once(self, bans: list[Ban], history: list[HistoryRow], now: float, arrival: float,
                          saves: list[asyncio.Future[None]]) -> list[Ban]:
        groups, ranges = split_bans(bans)
        applied: list[Ban] = []
        # The groups and the ranges go to the enforcer together, not one after another: bans decided moments
        # apart have different ends, so a merged batch holds many groups, and the batcher and the persister
        # turn concurrent calls into one kernel transaction and one commit. History is saved with the first
        # group (with the ranges when there is no group).
        with_ranges = bool(ranges) or (bool(history) and not groups)
        refusals, results = await asyncio.gather(  # groups first: they take the enforcer's lock first
            asyncio.gather(*(self._ban_group(key, by_version, history if i == 0 else [], now, arrival, saves)
                             for i, (key, by_version) in enumerate(groups.items()))),
            self.enforcer.apply(ranges, now=now, started=arrival, history=[] if groups else history, saves=saves)
            if with_ranges else _no_results())
        st = self.stats
        by_jail = st.applied_by_jail
        for key, by_version, refused in zip(groups, groups.values(), refusals, strict=True):
            was = len(applied)
            for v, bs in by_version.items():
                if not refused:  # the common case: no per-ban lookup
                    applied += bs
                    continue
                for b in bs:
                    if (v, int(b.target.network_address)) in refused:
                        self._refused(b)
                    else:
                        applied.append(b)
            if len(applied) > was:  # a group is one jail's: counted at once, not ban by ban
                by_jail[key[4]] = by_jail.get(key[4], 0) + len(applied) - was
        if with_ranges:
            for b, r in zip(ranges, results, strict=True):
                if r.code is None:
                    applied.append(b)
                    by_jail[b.jail] = by_jail.get(b.jail, 0) + 1
                else:
                    self._refused(b)
        st.applied += len(applied)
        return applied

    async def _ban_group(self, key: GroupKey, by_version: dict[int, list[Ban]],
                         history: list[HistoryRow], now: float, arrival: float,
                         saves: list[asyncio.Future[None]]) -> set[tuple[int, int]]:
        """One group's single addresses through `Enforcer.ban_hosts`: the (version, key)s refused."""
        blocklist, until, origin, reason, jail = key
        keys = host_keys(by_version)
        refused: set[tuple[int, int]] = set()
        try:
            res = await self.enforcer.ban_hosts(blocklist, keys, until, origin=origin, reason=reason, jail=jail,
                                                now=now, started=arrival, history=history, saves=saves)
        except KeyError:  # the blocklist went away in a reload while the batch was on its way
            log.error("jail %s: blocklist %r no longer exists; %d bans not applied", jail, blocklist,
                      sum(len(bs) for bs in by_version.values()))
            return {(v, k) for v, ks in keys.items() for k in ks}
        refused.update((self.enforcer.plan.set(name).version, k) for name, k in res.failed)
        refused.update((v, k) for v, ks in res.allowlisted.items() for k in ks)
        refused.update((v, k) for v, ks in res.never_ban.items() for k in ks)
        return refused

    def _refused(self, ban: Ban) -> None:
        st = self.stats
        st.refused += 1
        st.refused_by_jail[ban.jail] = st.refused_by_jail.get(ban.jail, 0) + 1
        self.ledger.forget_ban(ban.target, jail=ban.jail or None)
