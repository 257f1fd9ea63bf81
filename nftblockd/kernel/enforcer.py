"""The enforcement core: decisions in, kernel set changes out, and the kernel kept true to them.

Every source of decisions (log jails, the CLI, feeds, fail2ban, later a fleet stream) calls `apply()` with
plain `Ban`/`Unban` values; nothing else touches the ban state or the kernel. All kernel IO runs on one
worker thread (the netlink socket owns the table and must not be shared between threads); a restore only
encodes its messages on the event loop's thread, for that worker to send (docs/restart.md).

Staying true to the kernel:
- `watch()` reads the ruleset generation every `watch_interval` seconds (one tiny GETGEN). Our own commits
  move it too, so only an unexplained change triggers the check of table, sets, chains and rule counts, and
  a rebuild of whatever is missing plus every active ban. No multicast subscription: any listener makes every
  element add several times slower (docs/netlink.md F7.2).
- `reconcile()` compares each set's element count (NFTA_SET_COUNT, cheap) with the state; only a set whose
  count disagrees is dumped (dumps cost O(n^2), F6.5) and repaired.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: hands batches to the kernel thread and waits for the answers)
import errno as E
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nftblockd.addr import IPNet, format_host, format_target, key_net, key_range, pack_hosts
from nftblockd.allowlist import Allowlist
from nftblockd.config import Config
from nftblockd.events import Ban, Decision, Unban, clip_reason
from nftblockd.kernel.bans import DELETE, BanOutcome, BanState, BulkChange, Change, OpSpec, SetOp
from nftblockd.kernel.batcher import ApplyOutcome, Batcher, FlushReport, Group, OpFailure
from nftblockd.kernel.ruleset import Ruleset
from nftblockd.kernel.setwriter import Features, IngressChange, SetWriter, WriteResult
from nftblockd.neverban import never_ban_keys, never_ban_range
from nftblockd.service.logsetup import quote
from nftblockd.service.metrics import Metrics
from nftblockd.state.change import PackedBans, StateChange

log = logging.getLogger("nftblockd.enforcer")
audit_log = logging.getLogger("nftblockd.audit")
T = TypeVar("T")
# Written before a request is acknowledged. The daemon passes Persister.submit, which queues the change when
# called (so a bulk ban can queue its save, let the kernel commit meanwhile, then await both).
Persist = Callable[[StateChange], Awaitable[None]]

AUDIT_LINES_PER_REQUEST = 50  # beyond this, a bulk request gets one summary line instead of a flood
AUDIT_LINES_PER_SECOND = 10.0  # and over time: a flood of small requests (a jail's burst) is summarised too


class AuditBudget:
    """How many per-address audit lines may be written now: a token bucket of AUDIT_LINES_PER_REQUEST
    lines, refilled at AUDIT_LINES_PER_SECOND. A line costs ~80 us here (formatting, the journal); a burst
    of 10,000 bans logged one by one cost more than banning them, and flooded the journal."""

    def __init__(self, burst: float = AUDIT_LINES_PER_REQUEST, rate: float = AUDIT_LINES_PER_SECOND,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.rate, self.clock = burst, rate, clock
        self.tokens = burst
        self.at = clock()

    def take(self, wanted: int) -> int:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        n = min(wanted, int(self.tokens))
        self.tokens -= n
        return n
RESTORE_CHUNK = 100_000  # elements per restore transaction (2.8 MB of netlink; ~0.25 s of kernel time)


@dataclass(frozen=True, slots=True)
class DecisionResult:
    """What became of one decision. `code` is None on success, else a control error code."""

    target: IPNet
    outcome: BanOutcome
    code: str | None = None
    message: str = ""
    set_name: str = ""
    absorbed: tuple[IPNet, ...] = ()  # ABSORBED: the narrower ranges this ban replaced


@dataclass(slots=True)
class Counters:
    bans: int = 0
    unbans: int = 0
    refused: int = 0
    allowlisted: int = 0
    never_ban: int = 0  # bans of never-ban space refused here (each source should refuse them first)
    kernel_errors: dict[int, int] = field(default_factory=dict)
    set_full: int = 0
    rebuilds: int = 0
    drift_repaired: int = 0
    adopted: int = 0  # elements found in our sets that the state did not know, taken in (see reconcile)
    # saved or kernel-held bans that no ban may cover (never-ban space, the allowlist): removed, not enforced
    unbannable_removed: int = 0
    last_batch_seconds: float = 0.0


def describe_errno(errno: int, text: str, set_name: str, size: int | None, blocklist: str | None = None) -> str:
    """An operator's sentence for an element the kernel refused. The control code is always `unavailable`."""
    if errno == E.ENFILE:
        return f"set {set_name} is full (size {size}); raise blocklists.{blocklist or '<name>'}.size"
    if errno == E.EEXIST:
        return f"overlaps a range already in set {set_name}" + (f" ({text})" if text else "")
    import os
    return f"the kernel refused it: {os.strerror(errno)}" + (f" ({text})" if text else "")


@dataclass(frozen=True, slots=True)
class SyncResult:
    added: int
    removed: int
    failed: int


@dataclass(slots=True)
class BulkResult:
    changes: list[BulkChange] = field(default_factory=list)
    failed: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)
    allowlisted: dict[int, list[int]] = field(default_factory=dict)
    never_ban: dict[int, list[int]] = field(default_factory=dict)  # never-ban space (neverban.py), refused


def refusal_reason(r: DecisionResult) -> str:
    """The `reason` label of nftblock_bans_refused for a refused ban's result."""
    if r.code == "unavailable":  # the kernel refused the element (its set is named) or the state did (overlap)
        return "kernel" if r.set_name else "overlap"
    return r.code or "none"


def _log_unbannable(where: str, messages: Sequence[str]) -> None:
    """One warning for bans removed because no ban may cover them (`where`: whence they came)."""
    more = f" (and {len(messages) - 5} more)" if len(messages) > 5 else ""
    log.warning("removed %d %s that no ban may cover, instead of enforcing them: %s%s", len(messages), where,
                "; ".join(messages[:5]), more)


class Enforcer:
    def __init__(self, cfg: Config, plan: Ruleset, allow: Allowlist, writer_factory: Callable[[], SetWriter],
                 *, metrics: Metrics | None = None, on_flush: Callable[[FlushReport], None] | None = None,
                 persist: Persist | None = None,
                 on_change: Callable[[Sequence[Decision], Sequence[DecisionResult]], None] | None = None) -> None:
        self.cfg = cfg
        self.plan = plan
        self.allow = allow
        self.state = BanState(plan)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nftblockd-kernel")
        self._audit_budget = AuditBudget()
        self._writer_factory = writer_factory
        self.writer: SetWriter | None = None
        self.counters = Counters()
        self.metrics = metrics
        self.persist = persist
        self._on_flush = on_flush
        self._on_change = on_change
        self.batcher = Batcher(self._apply_ops, max_ops=cfg.batch.max_ops, delay=cfg.batch.delay,
                               on_flush=self._flushed)
        self._set_specs = {s.name: s for s in plan.sets}
        self.generation = 0
        self._lock = asyncio.Lock()  # serialises state changes that must stay in order with their kernel ops

    # -- kernel thread -------------------------------------------------------------------------------

    async def kernel(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _writer(self) -> SetWriter:
        assert self.writer is not None, "start() first"
        return self.writer

    async def start(self) -> None:
        def setup() -> SetWriter:
            w = self._writer_factory()
            w.setup(self.allow.networks)
            return w

        self.writer = await self.kernel(setup)
        self.generation = self.writer.last_generation
        log.info("table inet %s ready (%s)", self.plan.table, self.writer.features.sentence())

    @property
    def features(self) -> Features | None:
        """What the kernel can do; None before start()."""
        return self.writer.features if self.writer is not None else None

    async def reinstall(self, plan: Ruleset | None = None) -> None:
        """Re-run the table setup (chains, rules, allowlist) in one transaction, e.g. after a reload; with
        `plan`, the chains it plans replace ours (its sets must be ours: a reload cannot change them)."""
        async with self._lock:
            if plan is not None:
                if plan.sets != self.plan.sets:
                    raise ValueError("a reload cannot change the sets; restart nftblockd")
                self.plan = plan
                self._writer().plan = plan
            await self.kernel(self._writer().setup, self.allow.networks)
            self.generation = self._writer().last_generation

    async def sync_ingress(self) -> IngressChange:
        """Links changed: attach ingress chains whose device appeared, detach those whose device went."""
        async with self._lock:
            change = await self.kernel(self._writer().sync_ingress)
            self.generation = self._writer().last_generation
        for dev in change.attached:
            log.info("device %s appeared: its ingress chain is attached", dev)
        for dev in change.detached:
            log.info("device %s went away: its ingress chain is detached", dev)
        return change

    async def close(self) -> None:
        if self.writer is not None:
            await self.kernel(self.writer.close)
        self._executor.shutdown(wait=True)

    async def _apply_ops(self, groups: list[Group]) -> ApplyOutcome:
        res = await self.kernel(self._writer().write, groups)
        self.generation = self._writer().last_generation
        return ApplyOutcome(res.failed, res.expired, res.transactions, res.missing_sets)

    def _flushed(self, report: FlushReport) -> None:
        self.counters.last_batch_seconds = report.seconds
        mx = self.metrics
        if mx is not None and report.ops:
            mx.batch_seconds.observe(report.seconds)
            mx.batch_elements.observe(report.ops)
        self._count_refusals((f.errno, f.set_name) for f in report.failures)
        if report.missing_sets:
            log.warning("sets missing in the kernel: %s; repairing", ", ".join(sorted(report.missing_sets)))
        if self._on_flush is not None:
            self._on_flush(report)

    def _count_refusals(self, refusals: Iterable[tuple[int, str]]) -> None:
        """Element ops the kernel refused, as (errno, set), on any path to the kernel (batcher, feed sync,
        restore): the status counters and the metrics count them alike. One metric update per distinct
        (errno, set): per refusal, `labels().inc()` was ~0.9 s of the 5.3 s a 400k IPv6 bulk ban spent on
        its 137,856 refusals (a full set)."""
        by_kind = Counter(refusals)
        errors = self.counters.kernel_errors
        for (errno, set_name), n in by_kind.items():
            errors[errno] = errors.get(errno, 0) + n
            full = errno == E.ENFILE
            if full:
                self.counters.set_full += n
            if self.metrics is not None:
                self.metrics.netlink_errors.labels(E.errorcode.get(errno, str(errno))).inc(n)
                if full:
                    self.metrics.set_full.labels(set_name).inc(n)

    def unbannable(self, version: int, interval: bool, keys: Sequence[int]) -> dict[int, tuple[str, str]]:
        """Among `keys` (host keys, or net keys of an interval set), those no ban may cover: key -> (reason,
        message), reason `never_ban` (neverban.py) or `allowlisted`. For what was banned before the rules
        or the allowlist said otherwise: a saved ban, an element found in the kernel."""
        out: dict[int, tuple[str, str]] = {}
        if not interval:
            for k in never_ban_keys(version, keys):
                out[k] = ("never_ban", f"{format_host(k, version)} is never banned: "
                                       f"{never_ban_range(version, k, k)}")
            for k in self.allow.hosts_among(version, keys) if len(self.allow) else ():
                if k not in out:  # the entry is looked up again only for the refused
                    out[k] = ("allowlisted", f"{format_host(k, version)} is allowlisted "
                                             f"({self.allow.contains_range(version, k, k)})")
            return out
        for k in keys:
            first, last = key_range(k, version)
            why = never_ban_range(version, first, last)
            if why is not None:
                out[k] = ("never_ban", f"{format_target(key_net(k, version))} is never banned: {why}")
                continue
            hit = self.allow.contains_range(version, first, last)
            if hit is not None:
                out[k] = ("allowlisted", f"{format_target(key_net(k, version))} is allowlisted ({hit})")
        return out

    def _report_unbannable(self, where: str, found: dict[int, tuple[str, str]]) -> None:
        """Log, count and meter bans removed because no ban may cover them (`where`: whence they came)."""
        if not found:
            return
        self.counters.unbannable_removed += len(found)
        by_reason: dict[str, int] = {}
        for reason, _msg in found.values():
            by_reason[reason] = by_reason.get(reason, 0) + 1
        for reason, n in by_reason.items():
            self.count_refused(reason, n)
        _log_unbannable(where, [msg for _reason, msg in found.values()])

    def audit_lines(self, wanted: int) -> int:
        """How many of `wanted` per-address audit lines may be written now (one budget for every path that
        writes them, AuditBudget); the caller summarises the rest in one line."""
        return self._audit_budget.take(wanted)

    def _describe(self, errno: int, text: str, set_name: str) -> str:
        spec = self._set_specs.get(set_name)
        return describe_errno(errno, text, set_name, spec.size if spec else None, spec.blocklist if spec else None)

    def count_refused(self, reason: str, n: int) -> None:
        """Count `n` bans refused for `reason` (nftblock_bans_refused), also for refusals made before a
        decision exists (the control socket's `host_bits`)."""
        if n and self.metrics is not None:
            self.metrics.bans_refused.labels(reason).inc(n)

    # -- decisions ----------------------------------------------------------------------------------

    async def apply(self, decisions: Sequence[Decision], *, comment: str = "", now: float | None = None,
                    wait: bool = True, started: float | None = None, persist: bool = True,
                    history: Sequence[tuple[str, str, float, float | None]] = (),
                    saves: list[asyncio.Future[None]] | None = None) -> list[DecisionResult]:
        """Apply decisions; with `wait`, return once the kernel acknowledged them (or refused some).

        `started` (monotonic) is when the decision's cause was seen (a log line's arrival), for the
        detection-to-kernel latency metric; by default, now. `saves`: see `ban_hosts`.
        """
        now = time.time() if now is None else now
        started = time.monotonic() if started is None else started
        results: list[DecisionResult | None] = [None] * len(decisions)
        ops: list[SetOp] = []
        owner: dict[tuple[str, int], list[int]] = {}
        async with self._lock:
            for i, d in enumerate(decisions):
                if isinstance(d, Ban):
                    t = d.target  # already normalised; ipaddress's broadcast_address is slow on this path
                    first = int(t.network_address)
                    last = first | ((1 << (t.max_prefixlen - t.prefixlen)) - 1)
                    why = never_ban_range(t.version, first, last)
                    if why is not None:  # the last guard: every source should have refused it already
                        self.counters.never_ban += 1
                        results[i] = DecisionResult(d.target, BanOutcome.CONFLICT, "never_ban",
                                            f"{format_target(d.target)} is never banned: {why}")
                        continue
                    hit = self.allow.contains_range(t.version, first, last)
                    if hit is not None:
                        self.counters.allowlisted += 1
                        results[i] = DecisionResult(d.target, BanOutcome.CONFLICT, "allowlisted",
                                            f"{format_target(d.target)} is allowlisted ({hit}); never banned")
                        continue
                    ch = self.state.ban(d, now, comment)
                else:
                    ch = self.state.unban(d)
                results[i] = self._result(d, ch)
                for op in ch.ops:
                    owner.setdefault((op.set_name, op.key), []).append(i)
                ops.extend(ch.ops)
            fut = await self.batcher.submit(ops)
        if not wait:
            fut.add_done_callback(lambda f: self._settle(decisions, results, f.result(), owner, started))
            return [r for r in results if r is not None]
        failures = await fut
        final = self._settle(decisions, results, failures, owner, started)
        if persist and self.persist is not None:
            saving = self._persist(decisions, final, list(history))
            if saving is not None:
                if saves is None:
                    await saving
                else:
                    saves.append(saving)
        return final

    def _persist(self, decisions: Sequence[Decision], results: Sequence[DecisionResult],
                 history: list[tuple[str, str, float, float | None]]) -> asyncio.Future[None] | None:
        """Queue the write of what changed (None: nothing to write); the saved end of a ban is the state's (a
        re-ban may have kept a later one). Queued when called: saves keep the order of the calls."""
        saves: list[Ban] = []
        deletes: list[tuple[str, IPNet]] = []
        for d, r in zip(decisions, results, strict=False):
            if r.code is not None:
                continue
            if isinstance(d, Ban) and r.outcome in (BanOutcome.ADDED, BanOutcome.EXTENDED, BanOutcome.ABSORBED):
                saves.append(d)
                deletes += [(d.blocklist, n) for n in r.absorbed]
            elif isinstance(d, Unban) and r.outcome is BanOutcome.REMOVED:
                deletes.append((d.blocklist, d.target))
        if saves or deletes or history:
            assert self.persist is not None
            return asyncio.ensure_future(self.persist(StateChange(saves, deletes, history)))
        return None

    # C901: over the limit (17); left for the enforcer's owner to split while reshaping the kernel seam.
    async def ban_hosts(self, blocklist: str, keys_by_version: dict[int, list[int]], until: float | None, *,  # noqa: C901
                        origin: str = "cli", reason: str = "", jail: str = "", comment: str = "",
                        now: float | None = None, persist: bool = True, started: float | None = None,
                        history: Sequence[tuple[str, str, float, float | None]] = (),
                        saves: list[asyncio.Future[None]] | None = None) -> BulkResult:
        """Ban many single addresses at once (CLI stdin, fail2ban restores, saved bans, a jail's burst): see
        BanState.ban_hosts. `history` rows are saved in the same commit; `started` (monotonic) is when the
        cause was seen, for the latency metric.

        The save is queued with the kernel ops and, by default, awaited too. With `saves`, its future is
        appended there instead of awaited (the jail sink: the next batch goes to the kernel while this one's
        save is written; the sink awaits the futures itself). Queued either way: the persister writes changes
        in the order they were queued, retries a failed write and flushes at shutdown."""
        now = time.time() if now is None else now
        out = BulkResult()
        changes: list[BulkChange] = []
        async with self._lock:
            for version, keys in keys_by_version.items():
                if not keys:
                    continue
                never = never_ban_keys(version, keys)
                if never:
                    out.never_ban[version] = never
                    self.counters.never_ban += len(never)
                    drop = set(never)
                    keys = [k for k in keys if k not in drop]
                if len(self.allow):
                    allowed = self.allow.hosts_among(version, keys)
                    if allowed:
                        out.allowlisted[version] = allowed
                        self.counters.allowlisted += len(allowed)
                        drop = set(allowed)
                        keys = [k for k in keys if k not in drop]
                ch = self.state.ban_hosts(blocklist, version, keys, until, now, origin=origin, reason=reason,
                                          jail=jail, comment=comment)
                if ch is None:
                    raise KeyError(blocklist)
                changes.append(ch)
            fut = await self.batcher.submit_many(
                [(c.set_name, c.new, c.spec_new) for c in changes] +
                [(c.set_name, c.extended, c.spec_extended) for c in changes])
            # The save is queued now, in order with every other change, and written while the kernel commits
            # (the fsync and the kernel's work overlap: 100,000 addresses of `nftblock ban -` waited ~30 ms
            # for it after the last commit); the answer still waits for both.
            saving = self._queue_save(blocklist, changes, until, origin, reason, jail, history) \
                if persist and self.persist is not None else None
        failures = await fut
        for f in failures:
            self.state.forget(f.set_name, f.key)
            out.failed[(f.set_name, f.key)] = (
                "unavailable", self._describe(f.errno, f.text, f.set_name))
        if saving is not None:
            if out.failed:  # saved before the kernel refused them: deleted again, as the state forgot them
                deleting = self._queue_delete(blocklist, out.failed)
                if saves is None:
                    await deleting
                else:
                    saves.append(deleting)
            if saves is None:
                await saving
            else:
                saves.append(saving)
        for c in changes:
            out.changes.append(c)
        applied = sum(len(c.new) + len(c.extended) for c in changes) - len(out.failed)
        self.counters.bans += applied
        if self.metrics is not None:
            self.metrics.bans.labels(jail, origin).inc(applied)
            self.metrics.allowlist_hits.inc(sum(len(v) for v in out.allowlisted.values()))
            self.count_refused("allowlisted", sum(len(v) for v in out.allowlisted.values()))
            self.count_refused("never_ban", sum(len(v) for v in out.never_ban.values()))
            self.count_refused("kernel", len(out.failed))
            if started is not None and applied:
                self.metrics.ban_latency.observe((origin,), time.monotonic() - started, applied)
        self.counters.refused += len(out.failed) + sum(len(v) for v in out.allowlisted.values()) + sum(
            len(v) for v in out.never_ban.values())
        if jail:
            # a jail's bans read like one-by-one ones in the audit log, within the same budget
            shown = 0
            budget = self.audit_lines(applied)
            dur = "permanent" if until is None else f"{max(0, round(until - now))}s"
            for c in changes:
                for k in c.new + c.extended:
                    if shown >= budget or (c.set_name, k) in out.failed:
                        continue
                    shown += 1
                    addr = format_host(k, self.plan.set(c.set_name).version)
                    audit_log.info("ban jail=%s address=%s set=%s duration=%s reason=%s", quote(jail), addr,
                                   c.set_name, dur, quote(clip_reason(reason or origin)),
                                   extra={"jail": jail, "address": addr, "set": c.set_name, "origin": origin})
            if applied <= shown:
                return out
        audit_log.info("bulk ban: %d addresses into blocklist %s (%s), %d unchanged, %d refused", applied,
                       blocklist, "permanent" if until is None else f"{max(0, round(until - now))}s",
                       sum(len(c.unchanged) for c in changes), len(out.failed),
                       extra={"jail": jail or origin, "origin": origin})
        return out

    def _queue_save(self, blocklist: str, changes: Sequence[BulkChange], until: float | None, origin: str,
                    reason: str, jail: str, history: Sequence[tuple[str, str, float, float | None]]
                    ) -> asyncio.Future[None] | None:
        """Queue the save of a bulk ban's new and extended addresses (and `history`) before the kernel has
        them; None when there is nothing to save. Called under the lock, so saves keep the order of requests."""
        packed: list[PackedBans] = [
            (blocklist, pack_hosts(c.new + c.extended, self.plan.set(c.set_name).version), until, origin, reason,
             jail) for c in changes if c.new or c.extended]
        if not packed and not history:
            return None
        assert self.persist is not None
        return asyncio.ensure_future(self.persist(StateChange(history=list(history), packed_saves=packed)))

    def _queue_delete(self, blocklist: str, failed: Mapping[tuple[str, int], object]) -> asyncio.Future[None]:
        """Queue the deletion of bans the kernel refused after their save was queued (in order after it)."""
        by_set: dict[str, list[int]] = {}
        for set_name, k in failed:
            by_set.setdefault(set_name, []).append(k)
        assert self.persist is not None
        return asyncio.ensure_future(self.persist(StateChange(packed_deletes=[
            (blocklist, pack_hosts(keys, self.plan.set(name).version)) for name, keys in by_set.items()])))

    async def sync_sets(self, desired: dict[str, list[int]], until: float | None, *, reason: str = "",
                        origin: str = "feed") -> SyncResult:
        """Make whole sets equal `desired` (feed-owned sets) as ONE transaction of deletions and additions.

        Goes straight to the kernel thread rather than through the batcher, whose windows would split a
        large delta into several transactions. Kept entries are re-sent with the new end when there is one
        (so a daily feed's timeouts are refreshed, not left to expire together).
        """
        changes: dict[str, tuple[list[int], list[int], list[int]]] = {}

        def plan() -> list[Group]:
            groups: list[Group] = []
            for name, keys in desired.items():
                added, removed, kept = self.state.replace_set(name, keys, until, origin=origin, reason=reason,
                                                              refresh=until is not None)
                changes[name] = (added, removed, kept)
                until_ms = None if until is None else int(until * 1000)
                if removed:
                    groups.append(Group(name, removed, [DELETE] * len(removed)))
                adds = added + (kept if until is not None else [])
                if adds:
                    spec_new = OpSpec(True, until_ms, "")
                    spec_kept = OpSpec(True, until_ms, "", True)
                    groups.append(Group(name, adds, [spec_new] * len(added) + [spec_kept] * (len(adds) - len(added))))
            return groups

        failed = await self.write_sets(plan, time.time())
        return SyncResult(sum(len(c[0]) for c in changes.values()), sum(len(c[1]) for c in changes.values()),
                          len(failed))

    async def write_sets(self, plan: Callable[[], Sequence[Group]], now: float) -> list[tuple[str, int]]:
        """The whole-set write (feed syncs and deltas, a received fleet batch): `plan()` changes the ban state
        and returns the kernel ops that make the kernel follow, which go to the kernel thread as ONE
        transaction (`now`: the kernel's clock for timeouts, wall seconds). Planning, writing and settling all
        hold the enforcer's lock, so no other state change or kernel op comes between them.

        Settling: the state forgets every element the kernel refused, each is counted (by errno in
        nftblock_netlink_errors_total, a full set in nftblock_set_full_total, and a refused add as a ban
        refused by the kernel; a refused delete is not one) and returned as (set, key). Nothing is written
        when `plan()` returns no ops."""
        async with self._lock:
            groups = plan()
            if not groups:
                return []
            res = await self.kernel(self._writer().write, groups, int(now * 1000))
            self.generation = self._writer().last_generation
            return self._settle_write(res, groups)

    def _settle_write(self, res: WriteResult, groups: Sequence[Group]) -> list[tuple[str, int]]:
        refused: list[tuple[str, int]] = []
        for (name, key), (_errno, _text) in res.failed.items():
            self.state.forget(name, key)
            refused.append((name, key))
        self._count_refusals((errno, name) for (name, _key), (errno, _text) in res.failed.items())
        if refused:
            failed = set(refused)
            sets = {name for name, _key in refused}
            deletes = sum(1 for g in groups if g.set_name in sets
                          for key, spec in zip(g.keys, g.specs, strict=True)
                          if not spec.add and (g.set_name, key) in failed)
            self.count_refused("kernel", len(refused) - deletes)
        if self.metrics is not None and res.elements_sent:
            self.metrics.batch_seconds.observe(res.seconds)
            self.metrics.batch_elements.observe(res.elements_sent)
        return refused

    async def apply_set_deltas(self, deltas: dict[str, tuple[list[int], list[int], list[int]]], until: float | None,
                               *, reason: str = "", origin: str = "feed") -> tuple[SyncResult, list[tuple[str, int]]]:
        """`sync_sets` for a caller that diffed itself (a feed refresh against its previous aggregate,
        feeds/delta.py): per set (added, removed, renewed) keys, ONE transaction of deletions, additions and
        timeout renewals; nothing at all when every delta is empty. Returns the result and the (set, key)
        pairs the kernel refused (forgotten by the state, as in `sync_sets`)."""
        until_ms = None if until is None else int(until * 1000)
        spec_new = OpSpec(True, until_ms, "")
        spec_kept = OpSpec(True, until_ms, "", True)

        def plan() -> list[Group]:
            groups: list[Group] = []
            for name, (added, removed, renewed) in deltas.items():
                if not (added or removed or renewed):
                    continue
                gone = self.state.apply_delta(name, added, removed, renewed, until, origin=origin, reason=reason)
                if gone:
                    groups.append(Group(name, gone, [DELETE] * len(gone)))
                if added or renewed:
                    groups.append(Group(name, added + renewed, [spec_new] * len(added) + [spec_kept] * len(renewed)))
            return groups

        refused = await self.write_sets(plan, time.time())
        return SyncResult(sum(len(d[0]) for d in deltas.values()), sum(len(d[1]) for d in deltas.values()),
                          len(refused)), refused

    async def restore_hosts(self, blocklist: str, version: int, keys: list[int], ends_ms: list[int | None], *,
                            origin: str, reason: str, jail: str,
                            meanwhile: Callable[[list[int], list[int | None]], None] | None = None,
                            ) -> tuple[str, list[int], list[OpFailure]] | None:
        """Saved single-address bans, each with its own end (ms since the epoch, None = permanent), back into
        state and kernel (no persistence). `meanwhile(restored keys, their ends)` is called while the kernel
        writes them (the kernel may still refuse some: they are in the failures returned).

        Straight to the kernel thread in large transactions: this runs before READY with nothing else
        pending, and the batcher's small windows would cost a flush per 10k bans. A saved ban that no ban may
        cover (never-ban space, or the allowlist as configured now) is not restored: it is deleted from the
        state database, logged and counted (status' `unbannable_removed`, nftblock_bans_refused_total).
        """
        now = time.time()
        refused = self.unbannable(version, False, keys)
        if refused:
            kept = [(k, u) for k, u in zip(keys, ends_ms, strict=True) if k not in refused]
            keys, ends_ms = [k for k, _u in kept], [u for _k, u in kept]
            self._report_unbannable(f"saved bans of blocklist {blocklist}", refused)
            if self.persist is not None:
                await self.persist(StateChange(packed_deletes=[(blocklist, pack_hosts(refused, version))]))
        failures: list[OpFailure] = []
        async with self._lock:
            plan = self.state.restore_plan(blocklist, version, keys, ends_ms, now)
            if plan is None:
                return None
            name, restored, ends = plan
            # The kernel's chunks go first, a transaction each (~0.1-0.2 s of kernel time per 100k, with the
            # GIL released): each chunk is encoded here and queued at once (one worker: in order), so the
            # kernel thread only sends, and starts on the first while the next is encoded. Then the state takes
            # every key at once and `meanwhile` runs, both here while the kernel works: for a million restored
            # bans ~0.3 s of encoding, ~0.5 s of state and ~0.4 s of tracker off the kernel's path. Nothing
            # else reads the state before READY, and the lock keeps the set unchanged between the plan and the
            # commit; refusals are forgotten after.
            loop = asyncio.get_running_loop()
            writer = self._writer()
            writes = []
            for i in range(0, len(restored), RESTORE_CHUNK):
                keys_i, ends_i = restored[i:i + RESTORE_CHUNK], ends[i:i + RESTORE_CHUNK]
                now_ms = int(time.time() * 1000)
                encoded = writer.encode_timed_hosts(name, keys_i, ends_i, now_ms)
                writes.append(loop.run_in_executor(self._executor, functools.partial(
                    writer.write_timed_hosts, name, keys_i, ends_i, now_ms, encoded=encoded)))
            try:
                self.state.restore_commit(name, restored, ends, origin=origin, reason=reason, jail=jail)
                if meanwhile is not None:
                    meanwhile(restored, ends)
            finally:  # even if the state failed: no write left running unawaited
                results = await asyncio.gather(*writes)
            for res in results:
                failures += [OpFailure(s, k, e, t) for (s, k), (e, t) in res.failed.items()]
            if self.writer is not None:
                self.generation = self.writer.last_generation
        for f in failures:
            self.state.forget(f.set_name, f.key)
        self._count_refusals((f.errno, f.set_name) for f in failures)
        self.count_refused("kernel", len(failures))
        return name, restored, failures

    async def restore_bans(self, bans: Sequence[Ban], now: float) -> list[DecisionResult]:
        """Saved bans of ranges (and other one-by-one bans) back into state and kernel, without saving them
        again; one that no ban may cover is refused as `apply` refuses it, and deleted from the database."""
        results = await self.apply(bans, now=now, persist=False)
        gone = [(b, r) for b, r in zip(bans, results, strict=True) if r.code in ("never_ban", "allowlisted")]
        if gone:
            self.counters.unbannable_removed += len(gone)  # (refusals already counted by `apply`)
            _log_unbannable("saved bans", [r.message for _b, r in gone])
            if self.persist is not None:
                await self.persist(StateChange(deletes=[(b.blocklist, b.target) for b, _r in gone]))
        return results

    async def unban_hosts(self, blocklist: str, keys_by_version: dict[int, list[int]], *, origin: str = "cli",
                          jail: str = "") -> list[tuple[str, list[int], list[int]]]:
        async with self._lock:
            results = []
            for version, keys in keys_by_version.items():
                r = self.state.unban_hosts(blocklist, version, keys)
                if r is None:
                    raise KeyError(blocklist)
                results.append(r)
            fut = await self.batcher.submit_many([(name, removed, DELETE) for name, removed, _m in results])
        await fut
        n = sum(len(r[1]) for r in results)
        if self.persist is not None and n:
            gone = [(blocklist, pack_hosts(removed, self.plan.set(name).version))
                    for name, removed, _missing in results]
            await self.persist(StateChange(packed_deletes=gone))
        self.counters.unbans += n
        if self.metrics is not None:
            self.metrics.unbans.labels(origin).inc(n)
        if n:
            audit_log.info("bulk unban: %d addresses from blocklist %s (jail %s, origin %s)", n, blocklist,
                           jail or origin, origin, extra={"origin": origin, "jail": jail or origin})
        return results

    def _settle(self, decisions: Sequence[Decision], results: list[DecisionResult | None], failures: list[OpFailure],
                owner: dict[tuple[str, int], list[int]], started: float) -> list[DecisionResult]:
        for f in failures:
            for i in owner.get((f.set_name, f.key), []):
                d = decisions[i]
                if isinstance(d, Ban):
                    self.state.forget(f.set_name, f.key)
                msg = self._describe(f.errno, f.text, f.set_name)
                results[i] = DecisionResult(d.target, BanOutcome.CONFLICT, "unavailable", msg, f.set_name)
        final = [r for r in results if r is not None]
        self._audit(decisions, final)
        if self.metrics is not None:
            self._count(decisions, final, time.monotonic() - started)
        if self._on_change is not None:
            self._on_change(decisions, final)
        return final

    def _count(self, decisions: Sequence[Decision], results: Sequence[DecisionResult], latency: float) -> None:
        mx = self.metrics
        assert mx is not None
        # Counted per label set, one increment each: a child lookup per decision (labels() takes a lock and
        # builds its key) was most of this loop for the 1,000 IPv6 ranges of a 10k-attacker burst.
        banned: dict[str, int] = {}  # origin -> bans applied: each ban is one latency observation
        by_jail: dict[tuple[str, str], int] = {}
        unbans: dict[str, int] = {}
        refused: dict[str, int] = {}
        allowlisted = 0
        for d, r in zip(decisions, results, strict=False):
            if r.code == "allowlisted":
                allowlisted += 1
            elif r.code is None and isinstance(d, Ban) and r.outcome in (BanOutcome.ADDED, BanOutcome.EXTENDED,
                                                                          BanOutcome.ABSORBED):
                key = (d.jail or "", d.origin)
                by_jail[key] = by_jail.get(key, 0) + 1
                banned[d.origin] = banned.get(d.origin, 0) + 1
            elif r.code is None and isinstance(d, Unban) and r.outcome is BanOutcome.REMOVED:
                unbans[d.origin] = unbans.get(d.origin, 0) + 1
            if r.code is not None and isinstance(d, Ban):
                why = refusal_reason(r)
                refused[why] = refused.get(why, 0) + 1
        if allowlisted:
            mx.allowlist_hits.inc(allowlisted)
        for (jail, origin), n in by_jail.items():
            mx.bans.labels(jail, origin).inc(n)
        for origin, n in unbans.items():
            mx.unbans.labels(origin).inc(n)
        for why, n in refused.items():
            mx.bans_refused.labels(why).inc(n)
        for origin, n in banned.items():
            mx.ban_latency.observe((origin,), latency, n)

    def _result(self, d: Decision, ch: Change) -> DecisionResult:
        set_name = ch.ops[-1].set_name if ch.ops else ""
        if ch.outcome is BanOutcome.UNKNOWN_SET:
            return DecisionResult(d.target, ch.outcome, "unknown_set", ch.message)
        if ch.outcome is BanOutcome.CONFLICT:
            return DecisionResult(d.target, ch.outcome, "unavailable", ch.message)
        if ch.outcome is BanOutcome.NOT_FOUND:
            return DecisionResult(d.target, ch.outcome, "not_found", ch.message)
        if ch.outcome is BanOutcome.EXPIRED:
            return DecisionResult(d.target, ch.outcome, None, ch.message)
        msg = ch.message
        if ch.outcome is BanOutcome.COVERED:
            msg = f"already covered by {', '.join(map(format_target, ch.related))}"
        elif ch.outcome is BanOutcome.ABSORBED:
            msg = f"replaces {', '.join(map(format_target, ch.related))}"
            return DecisionResult(d.target, ch.outcome, None, msg, set_name, ch.related)
        return DecisionResult(d.target, ch.outcome, None, msg, set_name)

    def _audit(self, decisions: Sequence[Decision], results: Sequence[DecisionResult]) -> None:
        summary: dict[str, int] = {}
        items: list[tuple[Decision, DecisionResult, str]] = []
        for d, r in zip(decisions, results, strict=False):
            if r.code is not None:
                self.counters.refused += 1
                kind = "refused"
            elif isinstance(d, Ban) and r.outcome in (BanOutcome.ADDED, BanOutcome.EXTENDED, BanOutcome.ABSORBED):
                self.counters.bans += 1
                kind = "ban"
            elif isinstance(d, Unban) and r.outcome is BanOutcome.REMOVED:
                self.counters.unbans += 1
                kind = "unban"
            else:
                continue
            summary[kind] = summary.get(kind, 0) + 1
            items.append((d, r, kind))
        shown = self.audit_lines(len(items))
        for d, r, kind in items[:shown]:
            fields = {"jail": getattr(d, "jail", "") or d.origin, "address": format_target(d.target),
                      "set": r.set_name, "origin": d.origin}
            if kind == "ban":
                assert isinstance(d, Ban)
                dur = "permanent" if d.until is None else f"{max(0, round(d.until - time.time()))}s"
                audit_log.info("ban jail=%s address=%s set=%s duration=%s reason=%s", quote(fields["jail"]),
                               fields["address"], r.set_name, dur, quote(clip_reason(d.reason or d.origin)),
                               extra=fields)
            elif kind == "unban":
                audit_log.info("unban jail=%s address=%s set=%s reason=%s", quote(fields["jail"]),
                               fields["address"], r.set_name, quote(clip_reason(d.reason or d.origin)), extra=fields)
            else:
                audit_log.info("refused %s %s: %s", "ban" if isinstance(d, Ban) else "unban",
                               fields["address"], quote(r.message), extra=fields)
        if shown < len(items):
            audit_log.info("bulk request: %s (first %d shown)",
                           ", ".join(f"{n} {k}" for k, n in sorted(summary.items())), shown)

    # -- staying true to the kernel -----------------------------------------------------------------

    async def check_kernel(self) -> list[str]:
        """If someone else changed the ruleset, verify our objects and rebuild what is missing."""
        gen = await self.kernel(self._writer().generation)
        if gen == self.generation:
            return []
        missing = await self.kernel(self._writer().table_intact)
        self.generation = self._writer().last_generation
        if missing:
            await self.rebuild(missing)
        return missing

    async def rebuild(self, missing: list[str]) -> None:
        log.warning("ruleset changed behind our back (missing: %s); rebuilding table and %d bans",
                    ", ".join(missing), len(self.state))
        self.counters.rebuilds += 1
        if self.metrics is not None:
            self.metrics.rebuilds.inc()
        async with self._lock:
            await self.kernel(self._writer().setup, self.allow.networks)
            fut = await self.batcher.submit_many(list(self.state.all_groups()))
        failures = await fut
        for f in failures:
            self.state.forget(f.set_name, f.key)
        self.generation = self._writer().last_generation

    async def reconcile(self, now: float | None = None) -> int:
        """Compare element counts; dump and repair only the sets that disagree. Returns elements repaired.

        An element the state lacks is adopted, not deleted (the kernel is a witness: a lost state database
        or a forward clock jump must not unban anyone), except in feed-owned sets, which hold exactly their
        feeds' entries. An element the kernel lacks is re-added. Adoptions are logged, counted and saved.
        """
        now = time.time() if now is None else now
        self.state.expire(now)
        counts = await self.kernel(self._writer().set_counts)
        ours = self.state.counts()
        feed_owned = {f.blocklist for f in self.cfg.feeds}
        repaired = 0
        adopted_bans: list[Ban] = []
        for name, expected in ours.items():
            have = counts.get(name)
            if have is None or have == expected:
                continue
            # expired-but-uncollected elements still count (F2.6): only a dump tells the truth
            kernel_keys = await self.kernel(self._writer().dump_keys, name)
            spec = self.plan.set(name)
            async with self._lock:
                entries = self.state.sets[name]
                held = entries.entries  # once: a property, not a plain attribute, since feed refreshes defer
                missing = [k for k in held if k not in kernel_keys]
                extra = [k for k in kernel_keys if k not in held]
                adopted: list[int] = []
                unbannable: dict[int, tuple[str, str]] = {}
                if extra and spec.blocklist not in feed_owned:
                    # never adopt what no ban may cover: such elements are deleted like any other extra
                    unbannable = self.unbannable(spec.version, spec.interval, extra)
                    adopt = {k: kernel_keys[k] for k in extra if k not in unbannable}
                    adopted = self.state.adopt(name, adopt, now)
                    taken = set(adopted)
                    extra = [k for k in extra if k not in taken]
                batches: list[tuple[str, Sequence[int], OpSpec]] = list(
                    self.state.all_groups([name], set(missing))) if missing else []
                if extra:
                    batches.append((name, extra, DELETE))
                fut = await self.batcher.submit_many(batches) if batches else None
            self._report_unbannable(f"elements of set {name} found in the kernel", unbannable)
            if adopted:
                log.warning("set %s holds %d bans that nftblockd's state did not know (state database lost or "
                            "damaged, or the clock jumped); adopted them with their remaining kernel timeouts",
                            name, len(adopted))
                for k in adopted:
                    info = self.state.info(entries, k)
                    adopted_bans.append(Ban(info.target, info.blocklist, info.until, "kernel", info.reason))
            if fut is not None:
                await fut
                repaired += len(missing) + len(extra)
                log.warning("set %s drifted from nftblockd's state: re-added %d, removed %d", name,
                            len(missing), len(extra))
        self.counters.drift_repaired += repaired
        self.counters.adopted += len(adopted_bans)
        if self.metrics is not None:
            if repaired:
                self.metrics.drift.inc(repaired)
            if adopted_bans:
                self.metrics.adopted.inc(len(adopted_bans))
        if adopted_bans and self.persist is not None:
            await self.persist(StateChange(adopted_bans))
        async with self._lock:  # after the repairs: a set they refilled keeps its rule
            idle = await self.kernel(self._writer().drop_idle_rules)
            self.generation = self._writer().last_generation
        if idle:
            log.info("sets now empty, their drop rules removed until their next element: %s", ", ".join(idle))
        return repaired + len(adopted_bans)

    async def kernel_counts(self) -> dict[str, int | None]:
        return await self.kernel(self._writer().set_counts)
