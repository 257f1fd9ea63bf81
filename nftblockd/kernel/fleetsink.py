"""The enforcer as the fleet sees it: a received batch of fleet bans and unbans becomes ONE kernel transaction.

`EnforcerFleetSink` implements the fleet service's `FleetSink` protocol (fleet/service.py) on top of the
enforcer's state and kernel writer, for the one local blocklist the fleet fills (`fleet.blocklist`).

Rules, per element of the fleet's blocklist (one entry per address or range, local or fleet origin):

- A fleet ban is applied with origin "remote" and reason "fleet:<origin host>" (the kernel element's comment
  says the same). The later end wins, whoever holds the entry: a local ban lasting at least as long stays
  as it is (its origin too); a shorter local one is extended and becomes the fleet's. A ban the enforcer's
  own allowlist or the never-ban space covers is refused here again (the gate refused it first; the
  allowlist can have changed since). Range rules are the ban state's (kernel/bans.py): a range inside a
  longer one is covered, one inside a shorter one is refused, one around others absorbs them.
- A fleet unban removes a fleet-origin entry. It removes a local-origin entry only when that ban was made
  before the unban (`FleetUnban.at`; None: never): an operator's fleet-wide unban does not cancel a
  detection this host made after it. When a local ban was made is known for bans made since the daemon
  started (`note_local`); a ban restored from the state database counts as made at the daemon's start,
  which is never later than the truth, so such a ban is only removed by an unban made after the start.
- Everything one `apply_fleet` call changes goes to the kernel thread as one `write` (one transaction; an
  element the kernel refuses is dropped from it and counted, as on every other path), then to the state
  database (so a restart restores fleet bans, with their origin host), then to the audit log: one line per
  ban or unban within the enforcer's audit budget, naming the origin host, and one summary line for the rest.

This module never publishes anything: fleet bans never go back to the fleet (only the daemon's publish hooks,
fed by jails and the CLI, do). It does not import the fleet package (which sits above kernel/).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping

from nftblockd.addr import IPNet, format_target
from nftblockd.events import Ban, FleetChange, LocalBan, Unban, fleet_reason
from nftblockd.kernel.bans import BanOutcome, OpSpec, SetOp
from nftblockd.kernel.batcher import Group
from nftblockd.kernel.enforcer import Enforcer
from nftblockd.neverban import never_ban_range
from nftblockd.service.logsetup import quote
from nftblockd.state.change import StateChange

log = logging.getLogger("nftblockd.fleet")
audit_log = logging.getLogger("nftblockd.audit")

APPLIED = (BanOutcome.ADDED, BanOutcome.EXTENDED, BanOutcome.ABSORBED)


class EnforcerFleetSink:
    def __init__(self, enforcer: Enforcer, blocklist: str, *, started: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.enforcer = enforcer
        self.blocklist = blocklist
        self.clock = clock
        self.started = clock() if started is None else started
        self._created: dict[tuple[str, int], float] = {}  # (set, key) -> when this host banned it locally
        self.applied = 0
        self.removed = 0
        self.refused = 0

    # -- local bans: when they were made -----------------------------------------------------------------

    def note_local(self, targets: Iterable[IPNet], now: float) -> None:
        """Local bans (jails, the CLI) just applied: remember when, for the unban rule. Bounded by the bans the
        state holds (entries it no longer holds are dropped when the map outgrows it)."""
        state = self.enforcer.state
        for t in targets:
            entries = state.set_for(self.blocklist, t)
            if entries is not None:
                self._created[(entries.spec.name, state.key_for(entries, t))] = now
        if len(self._created) > 2 * len(state) + 10_000:
            sets = state.sets
            self._created = {k: v for k, v in self._created.items() if k[1] in sets[k[0]].entries}

    def _made(self, set_name: str, key: int) -> float:
        return self._created.get((set_name, key), self.started)

    # -- FleetSink ---------------------------------------------------------------------------------------

    async def fleet_view(self) -> tuple[Mapping[IPNet, float], Mapping[IPNet, LocalBan]]:
        """(fleet-origin entries -> end, local-origin bans) of the fleet's blocklist; math.inf = permanent."""
        state = self.enforcer.state
        state.expire(self.clock())
        fleet: dict[IPNet, float] = {}
        local: dict[IPNet, LocalBan] = {}
        for name, key, net, until, origin in state.iter_origins(self.blocklist):
            end = math.inf if until is None else until
            if origin == "remote":
                fleet[net] = end
            else:
                local[net] = LocalBan(self._made(name, key), end)
        return fleet, local

    async def apply_fleet(self, change: FleetChange) -> None:
        e = self.enforcer
        now = self.clock()
        async with e._lock:
            ops, bans, gone, refused = self._plan(change, now)
            failed = await self._write(ops, now) if ops else set()
        applied = [(b, absorbed) for b, absorbed in bans if b.target not in failed]
        refused += len(bans) - len(applied)
        self.applied += len(applied)
        self.removed += len(gone)
        self.refused += refused
        e.counters.bans += len(applied)
        e.counters.unbans += len(gone)
        if e.metrics is not None:
            if applied:
                e.metrics.bans.labels("", "remote").inc(len(applied))
            if gone:
                e.metrics.unbans.labels("remote").inc(len(gone))
        if e.persist is not None and (applied or gone):
            deletes = [(self.blocklist, n) for n in gone]
            deletes += [(self.blocklist, n) for _b, absorbed in applied for n in absorbed]
            await e.persist(StateChange([b for b, _a in applied], deletes))
        self._audit([b for b, _a in applied], gone, now)

    def _plan(self, change: FleetChange, now: float
              ) -> tuple[list[SetOp], list[tuple[Ban, tuple[IPNet, ...]]], list[IPNet], int]:
        """The state changes and kernel ops of `change` (under the enforcer's lock): (ops, applied bans with
        the ranges each absorbed, unbanned targets, bans refused)."""
        e = self.enforcer
        state = e.state
        ops: list[SetOp] = []
        bans: list[tuple[Ban, tuple[IPNet, ...]]] = []
        gone: list[IPNet] = []
        refused = 0
        for u in change.unbans:
            entries = state.set_for(self.blocklist, u.net)
            if entries is None:
                continue
            key = state.key_for(entries, u.net)
            origin = state.origin_of(entries, key)
            if origin is None:
                continue
            if origin != "remote" and (u.at is None or self._made(entries.spec.name, key) >= u.at):
                continue  # a local ban made after the unban stays
            ch = state.unban(Unban(u.net, self.blocklist, "remote"))
            if ch.outcome is BanOutcome.REMOVED:
                ops.extend(ch.ops)
                gone.append(u.net)
        for b in change.bans:
            t = b.net
            first = int(t.network_address)
            last = first | ((1 << (t.max_prefixlen - t.prefixlen)) - 1)
            if never_ban_range(t.version, first, last) is not None or \
                    e.allow.contains_range(t.version, first, last) is not None:
                refused += 1
                continue
            reason = fleet_reason(b.origin)
            ban = Ban(t, self.blocklist, None if b.until == math.inf else b.until, "remote", reason)
            ch = state.ban(ban, now, reason)
            if ch.outcome in APPLIED:
                ops.extend(ch.ops)
                bans.append((ban, ch.related if ch.outcome is BanOutcome.ABSORBED else ()))
        return ops, bans, gone, refused

    async def _write(self, ops: list[SetOp], now: float) -> set[IPNet]:
        """ONE kernel write of `ops`; returns the targets the kernel refused (forgotten by the state)."""
        e = self.enforcer
        state = e.state
        groups: dict[str, Group] = {}
        for op in ops:
            g = groups.get(op.set_name)
            if g is None:
                g = groups[op.set_name] = Group(op.set_name, [], [])
            g.keys.append(op.key)
            g.specs.append(OpSpec(op.add, op.until_ms, op.comment, op.existed))
        res = await e.kernel(e._writer().write, list(groups.values()), int(now * 1000))
        e.generation = e._writer().last_generation
        failed: set[IPNet] = set()
        for (name, key), (errno, _text) in res.failed.items():
            e._count_refusal(errno, name)
            failed.add(state.net_of(state.sets[name], key))
            state.forget(name, key)
        return failed

    def _audit(self, bans: list[Ban], gone: list[IPNet], now: float) -> None:
        shown = self.enforcer._audit_budget.take(len(bans) + len(gone))
        n = 0
        for b in bans:
            if n >= shown:
                break
            n += 1
            host = b.reason[len("fleet:"):]
            dur = "permanent" if b.until is None else f"{max(0, round(b.until - now))}s"
            addr = format_target(b.target)
            audit_log.info("ban jail=fleet address=%s set=%s duration=%s reason=%s origin_host=%s", addr,
                           self.blocklist, dur, quote(b.reason), quote(host),
                           extra={"jail": "fleet", "address": addr, "origin": "remote", "origin_host": host})
        for net in gone:
            if n >= shown:
                break
            n += 1
            addr = format_target(net)
            audit_log.info("unban jail=fleet address=%s set=%s reason=%s", addr, self.blocklist,
                           quote("fleet-wide unban"), extra={"jail": "fleet", "address": addr, "origin": "remote"})
        if n < len(bans) + len(gone):
            hosts = sorted({b.reason[len("fleet:"):] for b in bans})
            audit_log.info("fleet: %d bans (from %s) and %d unbans applied to blocklist %s (first %d shown)",
                           len(bans), ", ".join(hosts[:10]) + (", ..." if len(hosts) > 10 else "") or "-",
                           len(gone), self.blocklist, n, extra={"jail": "fleet", "origin": "remote"})


__all__ = ["EnforcerFleetSink"]
