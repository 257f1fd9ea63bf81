"""The enforcer as the fleet sees it: a received batch of fleet bans and unbans becomes ONE kernel transaction.

`EnforcerFleetSink` implements the fleet service's `FleetSink` protocol (fleet/service.py) on top of the
enforcer's state and kernel writer, for the one local blocklist the fleet fills (`fleet.blocklist`).

Rules, per element of the fleet's blocklist (one entry per address or range, local or fleet origin):

- A fleet ban is applied with origin "remote" and reason "fleet:<origin host>" (a range's kernel element
  carries it as its comment too; single addresses carry none, see `_plan_hosts`). The later end wins,
  whoever holds the entry: a local ban lasting at least as long stays as it is (its origin too); a shorter
  local one is extended and becomes the fleet's. A ban the enforcer's
  own allowlist or the never-ban space covers is refused here again (the gate refused it first; the
  allowlist can have changed since). Range rules are the ban state's (kernel/bans.py): a range inside a
  longer one is covered, one inside a shorter one is refused, one around others absorbs them.
- A fleet unban of a host (`FleetUnban.owner`) removes only a fleet-origin entry that host banned (reason
  "fleet:<owner>"): a member lifts its own bans, never another's nor this host's own. The operator's unban
  (owner None) removes a fleet-origin entry, and a local-origin entry only when that ban was made
  before the unban (`FleetUnban.at`; None: never): an operator's fleet-wide unban does not cancel a
  detection this host made after it. When a local ban was made is known for bans made since the daemon
  started (`note_local`); a ban restored from the state database counts as made at the daemon's start,
  which is never later than the truth, so such a ban is only removed by an unban made after the start.
- Everything one `apply_fleet` call changes goes to the kernel thread as one `write` (one transaction, through
  `Enforcer.write_sets` as feed syncs go; an element the kernel refuses is dropped from it and counted, as on
  every other path), then to the state database (so a restart restores fleet bans, with their origin host),
  then to the audit log: one line per ban or unban within the enforcer's audit budget
  (`Enforcer.audit_lines`), naming the origin host, and one summary line for the rest.

This module never publishes anything: fleet bans never go back to the fleet (only the daemon's publish hooks,
fed by jails and the CLI, do). It does not import the fleet package (which sits above kernel/).
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: a batch's database write is queued, and waited for by `settled`)
import bisect
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from nftblockd.addr import IPNet, format_host, format_target, net_key
from nftblockd.ends import ends_ms, secs_ms
from nftblockd.events import FLEET_REASON, Ban, FleetChange, LocalBan, Unban, fleet_reason
from nftblockd.kernel.bans import BanOutcome, OpSpec, SetOp, TimedSpecs
from nftblockd.kernel.batcher import Group
from nftblockd.kernel.enforcer import Enforcer
from nftblockd.service.logsetup import quote
from nftblockd.state.change import PackedBans, StateChange, TimedBans, timed_bans

log = logging.getLogger("nftblockd.fleet")
audit_log = logging.getLogger("nftblockd.audit")

APPLIED = (BanOutcome.ADDED, BanOutcome.EXTENDED, BanOutcome.ABSORBED)


class EnforcerFleetSink:
    def __init__(self, enforcer: Enforcer, blocklist: str, *, started: float | None = None,
                 clock: Callable[[], float] = time.time,
                 on_removed: Callable[[list[IPNet]], None] | None = None,
                 on_applied: Callable[[int, Callable[[int], tuple[str, float | None, str]], list[IPNet], float],
                                      None] | None = None) -> None:
        self.enforcer = enforcer
        self.blocklist = blocklist
        self.clock = clock
        self.on_removed = on_removed  # unbanned here (the tracker forgets those bans, so detection goes on)
        # banned here: (ranges, [(IP version, host keys)], now), for subnet escalation; must not raise
        self.on_banned: Callable[[list[IPNet], list[tuple[int, list[int]]], float], None] | None = None
        # after each commit: (bans applied, i -> (address, end, reason) of the i-th, unbans, now) for actions;
        # the addresses are formatted only for the bans an action takes (a catch-up can bring a million)
        self.on_applied = on_applied
        self.started = clock() if started is None else started
        self._created: dict[tuple[str, int], float] = {}  # (set, key) -> when this host banned it locally
        self.applied = 0
        self.removed = 0
        self.refused = 0
        self._saves: list[asyncio.Future[None]] = []  # database writes of applied batches not yet done

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

    async def settled(self) -> None:
        """Wait until every change `apply_fleet` made so far is written to the state database (the fleet
        service calls this before it saves its cursor, so the cursor never runs ahead of the saved bans)."""
        saves, self._saves = self._saves, []
        for f in saves:
            await f

    async def apply_fleet(self, change: FleetChange) -> None:
        e = self.enforcer
        now = self.clock()
        plan = _Plan()
        refused_ops = await e.write_sets(lambda: self._plan(change, now, plan), now)
        ranges, hosts = plan.ranges, plan.hosts
        if refused_ops:  # the kernel refused them and the state forgot them: neither applied nor saved
            failed = set(refused_ops)
            failed_ranges = {(e.state.sets[name].spec.version, net_key(e.state.net_of(e.state.sets[name], key)))
                             for name, key in refused_ops}
            ranges = [(b, absorbed) for b, absorbed in ranges
                      if (b.target.version, net_key(b.target)) not in failed_ranges]
            hosts = [(name, v, [k for k in keys if (name, k) not in failed],
                      [u for k, u in zip(keys, untils, strict=True) if (name, k) not in failed], reason, new)
                     for name, v, keys, untils, reason, new in hosts]
        applied = len(ranges) + sum(len(h[2]) for h in hosts)
        refused = plan.refused + plan.attempted - applied
        self.applied += applied
        self.removed += len(plan.gone)
        self.refused += refused
        e.counters.bans += applied
        e.counters.unbans += len(plan.gone)
        if e.metrics is not None:
            if applied:
                e.metrics.bans.labels("", "remote").inc(applied)
            if plan.gone:
                e.metrics.unbans.labels("remote").inc(len(plan.gone))
        if e.persist is not None and (applied or plan.gone):
            deletes = [(self.blocklist, n) for n in plan.gone]
            deletes += [(self.blocklist, n) for _b, absorbed in ranges for n in absorbed]
            packed, timed = _packed(self.blocklist, hosts)
            # queued now, in order with every other change, and not waited for: the kernel holds the batch, and
            # the receive loop's next batch need not wait for this one's commit (at 1,000 bans/s that wait was
            # half of each batch's time on the receiving host). `settled` waits for it before the cursor moves.
            self._saves = [f for f in self._saves if not f.done()]
            self._saves.append(asyncio.ensure_future(e.persist(StateChange([b for b, _a in ranges], deletes,
                                                                           packed_saves=packed, timed_saves=timed))))
        self._audit(ranges, hosts, plan.gone, now)
        if applied and self.on_banned is not None:
            self.on_banned([b.target for b, _a in ranges], [(h[1], h[2]) for h in hosts if h[2]], now)
        if plan.gone and self.on_removed is not None:
            self.on_removed(plan.gone)
        if self.on_applied is not None and (applied or plan.gone):
            self.on_applied(applied, _nth_ban(ranges, hosts), plan.gone, now)

    def _plan(self, change: FleetChange, now: float, plan: _Plan) -> list[Group]:
        """The state changes of `change`, into `plan`, and the kernel ops that follow them (under the
        enforcer's lock, with the write, `Enforcer.write_sets`).

        Single addresses (nearly every fleet ban; `change.hosts` holds them already grouped, as host keys)
        take the bulk path, grouped by IP version and origin host, each with its own end: one pass in the state
        per group (BanState.ban_hosts_each, same later-end rule), one kernel group. A 100k replay spent a third
        of its time in per-ban `BanState.ban` calls, `Ban` values and database rows before; grouped by end as
        well, 100k distinct ends (jail bans) made 100k one-address groups, each paying every per-group cost."""
        e = self.enforcer
        state = e.state
        ops: list[SetOp] = []
        self._plan_unbans(change, plan, ops)
        by_group: dict[tuple[int, str], _HostGroup] = {}
        for b in change.bans:
            t = b.net
            if t.prefixlen == t.max_prefixlen:
                grp = by_group.get((t.version, b.origin))
                if grp is None:
                    grp = by_group[(t.version, b.origin)] = _HostGroup([], [])
                grp.keys.append(int(t.network_address))
                grp.ends.append(b.until)
                continue
            if e.unbannable(t.version, True, [net_key(t)]):
                plan.refused += 1
                continue
            reason = fleet_reason(b.origin)
            ban = Ban(t, self.blocklist, None if b.until == math.inf else b.until, "remote", reason)
            ch = state.ban(ban, now, reason)
            if ch.outcome in APPLIED:
                ops.extend(ch.ops)
                plan.attempted += 1
                plan.ranges.append((ban, ch.related if ch.outcome is BanOutcome.ABSORBED else ()))
        for h in change.hosts:  # already host keys (the receive loop's fast path): no network object each
            grp = by_group.get((h.version, h.origin))
            if grp is None:
                by_group[(h.version, h.origin)] = _HostGroup(list(h.keys), list(h.ends),
                                                             None if h.ends_ms is None else list(h.ends_ms))
            else:
                grp.keys.extend(h.keys)
                grp.ends.extend(h.ends)
                grp.ends_ms = None
        self._plan_hosts(by_group, now, plan)
        by_set: dict[str, tuple[list[int], list[OpSpec]]] = {}
        for op in ops:
            keys, specs = by_set.setdefault(op.set_name, ([], []))
            keys.append(op.key)
            specs.append(OpSpec(op.add, op.until_ms, op.comment, op.existed))
        plan.groups += [Group(name, keys, specs) for name, (keys, specs) in by_set.items()]
        return plan.groups

    def _plan_unbans(self, change: FleetChange, plan: _Plan, ops: list[SetOp]) -> None:
        state = self.enforcer.state
        for u in change.unbans:
            entries = state.set_for(self.blocklist, u.net)
            if entries is None:
                continue
            key = state.key_for(entries, u.net)
            origin = state.origin_of(entries, key)
            if origin is None:
                continue
            if u.owner is not None and (origin != "remote"
                                        or state.info(entries, key).reason != fleet_reason(u.owner)):
                continue  # a host's unban lifts only the fleet bans that host made (never a local one)
            if origin != "remote" and (u.at is None or self._made(entries.spec.name, key) >= u.at):
                continue  # a local ban made after the unban stays
            ch = state.unban(Unban(u.net, self.blocklist, "remote"))
            if ch.outcome is BanOutcome.REMOVED:
                ops.extend(ch.ops)
                plan.gone.append(u.net)

    def _plan_hosts(self, by_group: dict[tuple[int, str], _HostGroup], now: float, plan: _Plan) -> None:
        state = self.enforcer.state
        for (version, host), grp in by_group.items():
            keys, ends, ms = self._admissible(version, grp, plan)
            if not keys:
                continue
            reason = fleet_reason(host)
            # no kernel comment on single addresses: a comment takes the writer off its uniform fast path (the
            # kernel thread's encoding was a quarter of a 100k replay); state, database, audit and
            # `nftblock check` name the origin host
            if ends.count(ends[0]) == len(ends):  # one end (a `ban -` burst): set operations, one shared spec
                until = None if ends[0] == math.inf else ends[0]
                bc = state.ban_hosts(self.blocklist, version, keys, until, now, origin="remote", reason=reason)
                if bc is None:
                    plan.refused += len(keys)
                    continue
                for part, spec in ((bc.new, bc.spec_new), (bc.extended, bc.spec_extended)):
                    if part:
                        plan.groups.append(Group(bc.set_name, part, [spec] * len(part)))
                plan.attempted += len(bc.new) + len(bc.extended)
                for part, kind in ((bc.new, _SHARED), (bc.extended, _EXTENDED)):
                    if part:
                        plan.hosts.append((bc.set_name, version, part, [until] * len(part), reason, kind))
                continue
            # (with the decoder's ms none is permanent: the ends as they are, no pass over them)
            untils = (cast("list[float | None]", ends) if ms is not None or math.inf not in ends
                      else [None if e == math.inf else e for e in ends])
            each = state.ban_hosts_each(self.blocklist, version, keys, untils, now, origin="remote", reason=reason,
                                        ends_ms=ms)
            if each is None:
                plan.refused += len(keys)
                continue
            done = each.new + each.extended
            if done:
                plan.groups.append(Group(each.set_name, done,
                                         _timed_specs(each.new_untils, each.extended_untils, each.new_ms)))
            plan.attempted += len(done)
            # new keys and extended ones apart: the database keeps the new ones as one bulk row (no row of theirs
            # exists), an extended one as its row (a row wins over a bulk row at a restart)
            if each.new:
                plan.hosts.append((each.set_name, version, each.new, each.new_untils, reason, _TIMED))
            if each.extended:
                plan.hosts.append((each.set_name, version, each.extended, each.extended_untils, reason, _EXTENDED))

    def _admissible(self, version: int, grp: _HostGroup, plan: _Plan
                    ) -> tuple[list[int], list[float], list[int] | None]:
        """The group's keys (and their ends) less what no ban may cover (never-ban space, the allowlist: the gate
        refused them first; the allowlist may have changed since), counted as refused."""
        keys = grp.keys
        drop = self.enforcer.unbannable(version, False, keys)
        if not drop:
            return keys, grp.ends, grp.ends_ms
        plan.refused += len(drop)
        keep = [k not in drop for k in keys]
        return (list(itertools.compress(keys, keep)), list(itertools.compress(grp.ends, keep)),
                None if grp.ends_ms is None else list(itertools.compress(grp.ends_ms, keep)))

    def _audit(self, ranges: list[tuple[Ban, tuple[IPNet, ...]]], hosts: list[_Hosts], gone: list[IPNet],
               now: float) -> None:
        n_bans = len(ranges) + sum(len(h[2]) for h in hosts)
        budget = self.enforcer.audit_lines(n_bans + len(gone))
        shown = 0
        lines: list[tuple[str, str, float | None]] = [(format_target(b.target), b.reason, b.until)
                                                      for b, _a in ranges[:budget]]
        for _name, v, keys, untils, reason, _kind in hosts:
            if len(lines) >= budget:
                break
            lines += [(format_host(k, v), reason, u) for k, u in zip(keys[:budget - len(lines)], untils, strict=False)]
        for addr, reason, until in lines:
            shown += 1
            host = reason[len(FLEET_REASON):]
            dur = "permanent" if until is None else f"{max(0, round(until - now))}s"
            audit_log.info("ban jail=fleet address=%s set=%s duration=%s reason=%s origin_host=%s", addr,
                           self.blocklist, dur, quote(reason), quote(host),
                           extra={"jail": "fleet", "address": addr, "origin": "remote", "origin_host": host})
        for net in gone[:max(0, budget - shown)]:
            shown += 1
            addr = format_target(net)
            audit_log.info("unban jail=fleet address=%s set=%s reason=%s", addr, self.blocklist,
                           quote("fleet-wide unban"), extra={"jail": "fleet", "address": addr, "origin": "remote"})
        if shown < n_bans + len(gone):
            hosts_named = sorted({b.reason for b, _a in ranges} | {h[4] for h in hosts})
            names = ", ".join(r[len(FLEET_REASON):] for r in hosts_named[:10]) + (", ..." if len(hosts_named) > 10
                                                                                  else "")
            audit_log.info("fleet: %d bans (from %s) and %d unbans applied to blocklist %s (first %d shown)",
                           n_bans, names or "-", len(gone), self.blocklist, shown,
                           extra={"jail": "fleet", "origin": "remote"})


# (set name, IP version, keys applied, their ends (None permanent), reason, how the database keeps them) of one
# group of single-address bans. _TIMED: new to the state, each its own end: one bulk row of keys and ends.
# _SHARED: new, one end: packed rows by end (a bulk row from BULK_ROWS on). _EXTENDED: held already, now
# longer: a row each, never a bulk row, since the address's older row would win over a bulk row at a restart
# and bring back the shorter ban.
_TIMED, _SHARED, _EXTENDED = "timed", "shared", "extended"
_Hosts = tuple[str, int, list[int], list[float | None], str, str]


def _timed_specs(new: list[float | None], extended: list[float | None], new_ms: list[int] | None = None
                 ) -> Sequence[OpSpec]:
    """The kernel op specs of `ban_hosts_each`'s new then extended keys: one `TimedSpecs` column (the ends in ms,
    as `BanState.ban_hosts_each` makes them; `new_ms`: the new keys' already, when it computed them) when none is
    permanent, else `_specs` each."""
    if (new_ms is None and None in new) or None in extended:
        return _specs(new, False) + _specs(extended, True)
    ms = secs_ms(cast("list[float]", new)) if new_ms is None else new_ms
    return TimedSpecs(ms + secs_ms(cast("list[float]", extended)) if extended else ms, len(new))


def _specs(untils: list[float | None], existed: bool) -> list[OpSpec]:
    """One kernel op spec per key, its end in ms as `BanState.ban_hosts` makes it; keys of one end share one
    (the writer tells a uniform group by `list.count`, which an identical object passes at once)."""
    ms = ends_ms(untils)
    ends = list(dict.fromkeys(ms))  # each end once, in order
    rep = itertools.repeat
    spec = dict(zip(ends, map(OpSpec._make, zip(rep(True), ends, rep(""), rep(existed), strict=False)), strict=True))
    return list(map(spec.__getitem__, ms))


def _packed(blocklist: str, hosts: list[_Hosts]) -> tuple[list[PackedBans], list[TimedBans]]:
    """The database rows of applied host groups: keys new to the state as one `TimedBans` per group (a bulk
    row of keys and ends: a catch-up of 100k jail bans made 100k rows, each a tuple, a list and a bytes, and
    100k upserts); the others one packed row per (IP version, end, reason), as `PackedBans` carry one end."""
    rows: dict[tuple[int, float | None, str], list[bytes]] = {}
    timed: list[TimedBans] = []
    single: list[PackedBans] = []
    for _name, v, keys, untils, reason, kind in hosts:
        if kind == _TIMED:
            if keys:
                timed.append(timed_bans(blocklist, v, keys, untils, "remote", reason, ""))
            continue
        size = 4 if v == 4 else 16
        if kind == _SHARED:
            for k, u in zip(keys, untils, strict=True):
                packed = k.to_bytes(size, "big")
                row = rows.get((v, u, reason))
                if row is None:
                    rows[(v, u, reason)] = [packed]
                else:
                    row.append(packed)
            continue
        single += [(blocklist, [k.to_bytes(size, "big")], u, "remote", reason, "")  # _EXTENDED
                   for k, u in zip(keys, untils, strict=True)]
    return [(blocklist, packed, u, "remote", reason, "") for (_v, u, reason), packed in rows.items()] + single, timed


def _nth_ban(ranges: list[tuple[Ban, tuple[IPNet, ...]]],
             hosts: list[_Hosts]) -> Callable[[int], tuple[str, float | None, str]]:
    """i -> (address, end, reason) of the i-th ban applied: the ranges, then each group's hosts in order."""
    starts = list(itertools.accumulate((len(h[2]) for h in hosts), initial=len(ranges)))

    def nth(i: int) -> tuple[str, float | None, str]:
        if i < len(ranges):
            b = ranges[i][0]
            return format_target(b.target), b.until, b.reason
        g = bisect.bisect_right(starts, i) - 1
        _name, v, keys, untils, reason, _kind = hosts[g]
        return format_host(keys[i - starts[g]], v), untils[i - starts[g]], reason

    return nth


@dataclass(slots=True)
class _HostGroup:
    """The single-address bans of one (IP version, origin host) of a change: keys, their ends (seconds, inf
    permanent) and, where the receive loop's decoder made them, the ends in ms (`FleetHosts.ends_ms`)."""

    keys: list[int]
    ends: list[float]
    ends_ms: list[int] | None = None


@dataclass(slots=True)
class _Plan:
    groups: list[Group] = field(default_factory=list)
    ranges: list[tuple[Ban, tuple[IPNet, ...]]] = field(default_factory=list)  # with the ranges absorbed
    hosts: list[_Hosts] = field(default_factory=list)
    gone: list[IPNet] = field(default_factory=list)
    attempted: int = 0  # bans sent to the kernel
    refused: int = 0  # bans refused before the kernel (never-ban, allowlist, unknown set)


__all__ = ["EnforcerFleetSink"]
