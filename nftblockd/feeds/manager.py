"""Threat feeds in the daemon: fetchers → union per blocklist → aggregate → one atomic kernel delta.

A blocklist that a feed targets belongs to its feeds: its sets hold exactly the aggregate of those feeds'
last good copies, all of it in the interval sets (single addresses as /32 or /128 ranges) and nothing in the
hash sets, whose drop rules then stay out of the chain: one lookup per packet instead of two for the feed
(docs/datapath.md, `feedint`). Nobody else writes these sets (jails, CLI and fleet bans are refused there),
and the aggregate never overlaps itself, so one interval set per family can hold it all. Upgrading from the
layout with hosts in the hash sets: the first sync sends them an empty list, and the start's reconcile
deletes what the kernel still holds there (feed-owned sets are never adopted from). Each change is
applied as ONE netlink transaction of deletions and additions, so there is never a moment with old entries
gone and new ones not yet in. At start, cached copies are applied before READY, so a reboot without network
still protects the host.

Each feed runs as its own task, supervised: a task that raises something unexpected (a bug, not a failed
fetch, which the fetcher retries itself) is logged, counted (nftblock_feed_task_failures_total), shown as
the feed's `error` in status, and started again after a backoff (1 s doubling to 5 min, from 1 s again after
a run of a minute or more: service/restart.py) while the other feeds and the daemon carry on. A reload
applies added, removed and changed feeds (`reconfigure`): removed feeds stop and their entries leave their
blocklist, added ones start from their cache, changed ones restart. A blocklist that loses its last feed is
emptied of feed entries; one that gains its first belongs to feeds from then on, exactly as at a start with
that configuration.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: a task per feed under a TaskGroup, refreshing on schedule)
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nftblockd.addr import IPNet
from nftblockd.config import Config, FeedConfig
from nftblockd.durations import PERMANENT, ban_end, longest
from nftblockd.feeds.aggregate import Aggregate, Sanitised, aggregate
from nftblockd.feeds.delta import AppliedSets
from nftblockd.feeds.fetch import FeedError, FeedFetcher, FeedUpdate
from nftblockd.kernel.enforcer import Enforcer, SyncResult
from nftblockd.kernel.ruleset import set_name
from nftblockd.service.metrics import Metrics
from nftblockd.service.restart import RESTART_BASE, RESTART_MAX, Backoff, keep_running

log = logging.getLogger("nftblockd.feeds")


def _desired(agg: Aggregate, blocklist: str) -> dict[str, list[int]]:
    """Set name -> keys in the ban state's forms: every entry's net key in the interval set of its family,
    the hash sets empty."""
    out: dict[str, list[int]] = {}
    for version, keys in ((4, agg.v4), (6, agg.v6)):
        out[set_name(blocklist, version, False)] = []
        out[set_name(blocklist, version, True)] = list(keys)
    return out


async def apply_desired(enforcer: Enforcer, applied: AppliedSets, desired: dict[str, list[int]],
                        until: float | None, *, reason: str, now: float | None = None) -> SyncResult:
    """Make a feed blocklist's sets hold `desired` (`_desired`'s sorted keys), one kernel transaction: the
    delta against what was applied before (feeds/delta.py: only the difference, and timeouts past half-life
    renewed), or in full the first time (`Enforcer.sync_sets`, diffing against the ban state)."""
    now = time.time() if now is None else now
    until_ms = None if until is None else int(until * 1000)
    deltas = applied.plan(desired, until_ms, int(now * 1000))
    if deltas is None:
        res = await enforcer.sync_sets(desired, until, reason=reason)
        applied.record(desired, until_ms, int(now * 1000), None)
        if res.failed:  # sync_sets forgot them in the state: take them out of what is applied too
            held = {name: enforcer.state.sets[name].entries for name in desired}
            applied.forget((name, k) for name, keys in desired.items() for k in keys if k not in held[name])
        return res
    res, refused = await enforcer.apply_set_deltas(dict(deltas), until, reason=reason)
    applied.record(desired, until_ms, int(now * 1000), deltas)
    applied.forget(refused)
    return res


class FeedNotFound(LookupError):
    """`feeds refresh/accept` named a feed, or a held copy, that does not exist (the client's mistake)."""

CRASH_RETRY_BASE = RESTART_BASE  # seconds before a crashed feed task starts again; doubles per crash in a row
CRASH_RETRY_MAX = RESTART_MAX


class FeedManager:
    def __init__(self, cfg: Config, enforcer: Enforcer, cache_dir: Path, metrics: Metrics | None = None, *,
                 fetcher: Callable[[FeedConfig, Path, Sequence[IPNet]], FeedFetcher] | None = None,
                 crash_retry_base: float = CRASH_RETRY_BASE,
                 on_changes: Callable[[FeedConfig, list[tuple[int, int]], list[tuple[int, int]], float], None]
                 | None = None) -> None:
        self.cfg = cfg
        # after a feed's refresh is in the kernel: (feed, added, removed (version, net key)s, now), for the
        # feed's actions; only feeds with actions are diffed
        self.on_changes = on_changes
        self.enforcer = enforcer
        self.metrics = metrics
        self.cache_dir = cache_dir
        cache_dir.mkdir(parents=True, exist_ok=True)
        self._new_fetcher = fetcher or (lambda f, d, allow: FeedFetcher(f, d, allow=allow))
        self._crash_retry_base = crash_retry_base
        allow = enforcer.allow.networks
        self.fetchers = {f.name: self._new_fetcher(f, cache_dir, allow) for f in cfg.feeds}
        self.crashes: dict[str, int] = {}  # feed -> tasks that raised (status, metric)
        self._crashed: dict[str, str] = {}  # feed -> the error of its last crash, until it runs again
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._tg: asyncio.TaskGroup | None = None
        self._stop: asyncio.Event | None = None
        self.latest: dict[str, Sanitised] = {}
        self.deferred: dict[str, Sanitised] = {}  # defer_removals: the copy before the latest, still in force
        self._timeouts = {f.name: f.ban_timeout for f in cfg.feeds}
        self._sync_lock = asyncio.Lock()
        self._applied: dict[str, AppliedSets] = {}  # blocklist -> what its sets hold for the feeds
        self.syncs = 0
        self.last_sync: dict[str, dict[str, Any]] = {}
        if metrics is not None:  # the fetchers' own figures, read at scrape time: no status call needed
            metrics.feed_last_success.read = lambda: [((n, ), t) for n, f in self.fetchers.items()
                                                      if (t := f.status().last_success) is not None]
            metrics.feed_entries.read = lambda: [((n, ), f.status().entries) for n, f in self.fetchers.items()]
            metrics.feed_entries_refused.read = lambda: [
                ((n, why), getattr(c, why)) for n, f in self.fetchers.items()
                for c in (f.status().counters,) for why in ("invalid", "markup", "host_bits")]

    def blocklists(self) -> set[str]:
        return {f.blocklist for f in self.cfg.feeds}

    async def load_caches(self) -> int:
        """Apply every feed's cached copy (before READY). Returns the elements installed."""
        for name, f in self.fetchers.items():
            upd = await f.load_cache()
            if upd is not None:
                self.latest[name] = upd.sanitised
        total = 0
        for bl in sorted(self.blocklists()):
            total += await self.sync(bl)
        return total

    async def run(self, stop: asyncio.Event) -> None:
        """Run every feed until `stop`; feeds added by a reload start here too."""
        self._stop = stop
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                for name in self.fetchers:
                    self._start(name)
                await stop.wait()
        finally:
            self._tg = None
            self._tasks.clear()

    def _start(self, name: str) -> None:
        running = self._tasks.get(name)
        if running is not None and not running.done():
            return  # run() and reconfigure() may both get here for a feed added just before run() began
        if self._tg is not None and self._stop is not None:
            self._tasks[name] = self._tg.create_task(self._supervise(name, self._stop), name=f"feed-{name}")

    async def _supervise(self, name: str, stop: asyncio.Event) -> None:
        """One feed's task: its fetcher's loop, started again after a backoff if it raises (a bug: failed
        fetches are the fetcher's to retry). Never raises but CancelledError, so no feed takes others down."""

        async def run() -> None:
            self._crashed.pop(name, None)  # running (again): the last crash is history
            f = self.fetchers.get(name)
            if f is not None:  # (gone: a reload removed the feed)
                await f.run(self.on_update, stop)

        def failed(exc: Exception, delay: float) -> None:
            self.crashes[name] = self.crashes.get(name, 0) + 1
            self._crashed[name] = (f"the feed's task failed ({type(exc).__name__}: {exc}); "
                                   f"starting it again in {delay:g}s")

        await keep_running(run, stop, what=f"feed {name}: its task failed; the other feeds carry on",
                           backoff=Backoff(self._crash_retry_base, CRASH_RETRY_MAX),
                           failures=self.metrics.feed_task_failures.labels(name) if self.metrics else None,
                           on_failure=failed, logger=log)

    async def reconfigure(self, cfg: Config) -> tuple[list[str], list[str], list[str]]:
        """Apply the feeds of a reloaded config: (added, removed, changed) feed names. Removed and changed
        feeds stop; added and changed ones start from their cache; every blocklist concerned is synced."""
        old = {f.name: f for f in self.cfg.feeds}
        new = {f.name: f for f in cfg.feeds}
        added = [n for n in new if n not in old]
        removed = [n for n in old if n not in new]
        changed = [n for n in new if n in old and new[n] != old[n]]
        touched = {old[n].blocklist for n in removed + changed} | {new[n].blocklist for n in added + changed}
        for name in removed + changed:
            task = self._tasks.pop(name, None)
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            self.fetchers.pop(name, None)
            self.latest.pop(name, None)
            self.deferred.pop(name, None)
            self._crashed.pop(name, None)
        self.cfg = cfg
        self._timeouts = {f.name: f.ban_timeout for f in cfg.feeds}
        allow = self.enforcer.allow.networks
        for name in added + changed:
            f = self.fetchers[name] = self._new_fetcher(new[name], self.cache_dir, allow)
            upd = await f.load_cache()
            if upd is not None:
                self.latest[name] = upd.sanitised
        for bl in sorted(touched):
            await self.sync(bl)
        for name in added + changed:
            self._start(name)
        return added, removed, changed

    async def on_update(self, upd: FeedUpdate) -> None:
        before = self.latest.get(upd.name)
        self.latest[upd.name] = upd.sanitised
        if upd.deferred is not None:
            self.deferred[upd.name] = upd.deferred
        else:
            self.deferred.pop(upd.name, None)
        if self.metrics is not None:
            self.metrics.feed_fetch.labels(upd.name, upd.origin).inc()
        await self.sync(upd.blocklist)
        feed = next((f for f in self.cfg.feeds if f.name == upd.name), None)
        if self.on_changes is not None and feed is not None and feed.actions and before is not upd.sanitised:
            added: list[tuple[int, int]] = []
            removed: list[tuple[int, int]] = []
            for version, new, old in ((4, upd.sanitised.v4, before.v4 if before else []),
                                      (6, upd.sanitised.v6, before.v6 if before else [])):
                new_set, old_set = set(new), set(old)
                added += [(version, k) for k in new if k not in old_set]
                removed += [(version, k) for k in old if k not in new_set]
            if added or removed:
                self.on_changes(feed, added, removed, time.time())

    async def sync(self, blocklist: str) -> int:
        """Make the blocklist's sets equal the aggregate of its feeds; one transaction."""
        async with self._sync_lock:
            feeds = [f.name for f in self.cfg.feeds if f.blocklist == blocklist]
            parts = [self.latest[n] for n in feeds if n in self.latest]
            parts += [self.deferred[n] for n in feeds if n in self.deferred]
            t0 = time.perf_counter()
            agg = aggregate(parts)
            timeouts = [self._timeouts[n] for n in feeds]
            # a blocklist without feeds (its last one removed by a reload) is emptied: no end to choose
            until = ban_end(longest(timeouts) if timeouts else PERMANENT, time.time())
            desired = _desired(agg, blocklist)
            applied = self._applied.setdefault(blocklist, AppliedSets())
            res = await apply_desired(self.enforcer, applied, desired, until, reason="feeds " + ", ".join(feeds))
            self.syncs += 1
            self.last_sync[blocklist] = {"at": time.time(), "seconds": round(time.perf_counter() - t0, 4),
                                         "added": res.added, "removed": res.removed, "failed": res.failed,
                                         "entries": len(agg)}
            log.info("feeds -> blocklist %s: %d entries (%d added, %d removed, %d refused) in %.3fs", blocklist,
                     len(agg), res.added, res.removed, res.failed, time.perf_counter() - t0)
            return len(agg)

    def status(self) -> list[dict[str, Any]]:
        out = []
        for name, f in self.fetchers.items():
            st = f.status()
            d = {
                "name": name, "blocklist": st.blocklist, "source": st.source, "entries": st.entries,
                "last_success": st.last_success, "last_attempt": st.last_attempt,
                "next_refresh": st.next_refresh, "error": self._crashed.get(name) or st.error,
                "task_failures": self.crashes.get(name, 0),
                "pending_shrink": asdict(st.pending_shrink) if st.pending_shrink else None,
                "counters": asdict(st.counters),
            }
            out.append(d)
        return out

    async def refresh(self, name: str, accept: bool = False) -> dict[str, Any]:
        """Fetch a feed now (`feeds refresh`), or first accept a copy the shrink guard held (`feeds accept`)."""
        f = self.fetchers.get(name)
        if f is None:
            raise FeedNotFound(f"no feed named {name!r} (feeds: {', '.join(self.fetchers) or 'none'})")
        if accept and not f.accept():
            raise FeedNotFound(f"feed {name!r} has no held copy to accept")
        try:
            upd = await f.fetch_now(self.on_update)  # answers once the copy in force is enforced
            if self.metrics is not None:
                self.metrics.feed_fetch.labels(name, "ok" if upd else "unchanged").inc()
        except FeedError:
            if self.metrics is not None:
                self.metrics.feed_fetch.labels(name, "error").inc()
        return {"feed": next(d for d in self.status() if d["name"] == name)}
