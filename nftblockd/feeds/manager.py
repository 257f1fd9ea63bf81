"""Threat feeds in the daemon: fetchers → union per blocklist → aggregate → one atomic kernel delta.

A blocklist that a feed targets belongs to its feeds: its four sets hold exactly the aggregate of those
feeds' last good copies (exact addresses in the hash sets, ranges in the interval sets). Each change is
applied as ONE netlink transaction of deletions and additions, so there is never a moment with old entries
gone and new ones not yet in. At start, cached copies are applied before READY, so a reboot without network
still protects the host.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: a task per feed under a TaskGroup, refreshing on schedule)
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nftblockd.addr import split_net_keys
from nftblockd.config import Config
from nftblockd.feeds.aggregate import Aggregate, Sanitised, aggregate
from nftblockd.feeds.delta import AppliedSets
from nftblockd.feeds.fetch import FeedError, FeedFetcher, FeedUpdate
from nftblockd.kernel.enforcer import Enforcer, SyncResult
from nftblockd.kernel.ruleset import set_name
from nftblockd.service.metrics import Metrics

log = logging.getLogger("nftblockd.feeds")


def _desired(agg: Aggregate, blocklist: str) -> dict[str, list[int]]:
    """Set name -> keys in the ban state's forms (host keys for the hash sets, net keys for the interval sets)."""
    out: dict[str, list[int]] = {}
    for version, keys in ((4, agg.v4), (6, agg.v6)):
        hosts, ranges = split_net_keys(keys, version)
        out[set_name(blocklist, version, False)] = hosts
        out[set_name(blocklist, version, True)] = ranges
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

class FeedManager:
    def __init__(self, cfg: Config, enforcer: Enforcer, cache_dir: Path, metrics: Metrics | None = None) -> None:
        self.cfg = cfg
        self.enforcer = enforcer
        self.metrics = metrics
        cache_dir.mkdir(parents=True, exist_ok=True)
        allow = enforcer.allow.networks
        self.fetchers = {f.name: FeedFetcher(f, cache_dir, allow=allow) for f in cfg.feeds}
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
        async with asyncio.TaskGroup() as tg:
            for f in self.fetchers.values():
                tg.create_task(f.run(self.on_update, stop), name=f"feed-{f.cfg.name}")

    async def on_update(self, upd: FeedUpdate) -> None:
        self.latest[upd.name] = upd.sanitised
        if upd.deferred is not None:
            self.deferred[upd.name] = upd.deferred
        else:
            self.deferred.pop(upd.name, None)
        if self.metrics is not None:
            self.metrics.feed_fetch.labels(upd.name, upd.origin).inc()
        await self.sync(upd.blocklist)

    async def sync(self, blocklist: str) -> int:
        """Make the blocklist's sets equal the aggregate of its feeds; one transaction."""
        async with self._sync_lock:
            feeds = [f.name for f in self.cfg.feeds if f.blocklist == blocklist]
            parts = [self.latest[n] for n in feeds if n in self.latest]
            parts += [self.deferred[n] for n in feeds if n in self.deferred]
            t0 = time.perf_counter()
            agg = aggregate(parts)
            timeouts = [self._timeouts[n] for n in feeds]
            ban_timeout = None if any(t is None for t in timeouts) else max(t for t in timeouts if t is not None)
            until = None if ban_timeout is None else time.time() + ban_timeout
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
                "next_refresh": st.next_refresh, "error": st.error,
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
            upd = await f.fetch()
            if self.metrics is not None:
                self.metrics.feed_fetch.labels(name, "ok" if upd else "unchanged").inc()
        except FeedError:
            if self.metrics is not None:
                self.metrics.feed_fetch.labels(name, "error").inc()
            upd = None
        if upd is not None:
            await self.on_update(upd)
        return {"feed": next(d for d in self.status() if d["name"] == name)}
