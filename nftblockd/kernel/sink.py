"""The ban sink: the one path a jail's ban decisions take to the kernel, the database and the recidive jails.

Jails decide bans while matching lines and must not wait on netlink per line; the sink takes each matched
batch's bans from a bounded queue and applies them in order. One path for any batch size:

- single addresses (the common case: every IPv4 offender, IPv6 offenders counted per /128) are grouped by
  (blocklist, end, reason, jail) and go through `Enforcer.ban_hosts`: one set operation in the state, one
  kernel transaction, one packed row in the database, the audit lines within their budget;
- ranges (IPv6 offenders counted per /64, say) go through `Enforcer.apply`, which handles absorption and
  covering ranges;
- the batch's history rows (escalation memory) are saved in the same commit as its first group.

Batches that queued up while the previous one was applied are merged into one (bans and records in
submission order, the earliest arrival), and a batch's groups go to the enforcer concurrently, where the
batcher and the persister make one kernel transaction and one commit of them. Under a steady stream of small
batches (one offender per log write, 1,000 bans/s) applying them one by one fell 1.3 s behind; merged, the
last ban is in the kernel 4 ms after its write.

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
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from nftblockd.addr import IPNet
from nftblockd.events import Ban
from nftblockd.kernel.enforcer import Enforcer

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
        while True:
            batch = await self._queue.get()
            if batch is _END:
                return
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
                await self.apply(batch.bans, batch.records, batch.arrival)
            except Exception:
                self.stats.errors += 1
                log.exception("applying %d jail bans failed; they are forgotten and will be decided again",
                              len(batch.bans))
                for b in batch.bans:
                    self.ledger.forget_ban(b.target, jail=b.jail or None)
            if end:
                return

    async def apply(self, bans: list[Ban], records: Sequence[Decided], arrival: float) -> None:
        """Apply bans (and the recidive bans they lead to); see the module docstring for the order."""
        history = [r.as_row() for r in records]
        while bans:
            now = self.clock()
            applied = await self._apply_once(bans, history, now, arrival)
            if applied and self.on_applied is not None:
                self.on_applied(applied, now)
            history = []
            bans = []
            for b in applied:
                for more, record in self.ledger.escalations(b, now):
                    bans.append(more)
                    if record is not None:
                        history.append(record.as_row())

    async def _apply_once(self, bans: list[Ban], history: list[HistoryRow], now: float,
                          arrival: float) -> list[Ban]:
        groups: dict[tuple[str, float | None, str, str, str], dict[int, list[Ban]]] = {}
        ranges: list[Ban] = []
        for b in bans:
            t = b.target
            if t.prefixlen == t.max_prefixlen:
                by_version = groups.setdefault((b.blocklist, b.until, b.origin, b.reason, b.jail), {})
                by_version.setdefault(t.version, []).append(b)
            else:
                ranges.append(b)
        applied: list[Ban] = []
        # The groups go to the enforcer together, not one after another: bans decided moments apart have
        # different ends, so a merged batch holds many groups, and the batcher and the persister turn
        # concurrent calls into one kernel transaction and one commit. History is saved with the first group.
        refusals = await asyncio.gather(*(
            self._ban_group(key, by_version, history if i == 0 else [], now, arrival)
            for i, (key, by_version) in enumerate(groups.items())))
        if groups:
            history = []
        for by_version, refused in zip(groups.values(), refusals, strict=True):
            for v, bs in by_version.items():
                for b in bs:
                    if (v, int(b.target.network_address)) in refused:
                        self._refused(b)
                    else:
                        applied.append(b)
        if ranges or history:
            results = await self.enforcer.apply(ranges, now=now, started=arrival, history=history)
            for b, r in zip(ranges, results, strict=True):
                if r.code is None:
                    applied.append(b)
                else:
                    self._refused(b)
        st = self.stats
        st.applied += len(applied)
        by_jail = st.applied_by_jail
        for b in applied:
            by_jail[b.jail] = by_jail.get(b.jail, 0) + 1
        return applied

    async def _ban_group(self, key: tuple[str, float | None, str, str, str], by_version: dict[int, list[Ban]],
                         history: list[HistoryRow], now: float, arrival: float) -> set[tuple[int, int]]:
        """One group's single addresses through `Enforcer.ban_hosts`: the (version, key)s refused."""
        blocklist, until, origin, reason, jail = key
        keys = {v: [int(b.target.network_address) for b in bs] for v, bs in by_version.items()}
        refused: set[tuple[int, int]] = set()
        try:
            res = await self.enforcer.ban_hosts(blocklist, keys, until, origin=origin, reason=reason, jail=jail,
                                                now=now, started=arrival, history=history)
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
