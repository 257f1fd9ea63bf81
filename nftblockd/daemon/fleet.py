"""The daemon's fleet wiring: building the fleet service and fleet counting, running them restarted on failure,
their status for `nftblock`, and what the kernel side reports back to the tracker and the actions.

A mixin of Daemon (daemon/root.py), which owns the attributes declared here; it must NOT be used alone, nor
import `redis` before a `fleet:` block asks for it (the services are imported inside the build methods).
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: part of the composition root, daemon/root.py)
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nftblockd.actions.hub import ActionHub
from nftblockd.addr import IPNet
from nftblockd.allowlist import Allowlist
from nftblockd.config import Config, FleetConfig
from nftblockd.daemon.build import guarded
from nftblockd.detect.subnetrun import SubnetRunner
from nftblockd.detect.tracker import Tracker
from nftblockd.events import Ban
from nftblockd.kernel.enforcer import Enforcer
from nftblockd.kernel.fleetsink import EnforcerFleetSink
from nftblockd.service.metrics import Metrics
from nftblockd.service.restart import Backoff, keep_running
from nftblockd.state.persister import Persister
from nftblockd.state.store import Store

log = logging.getLogger("nftblockd")

if TYPE_CHECKING:
    from nftblockd.fleet.counter import FleetCounter
    from nftblockd.fleet.counting import Decided
    from nftblockd.fleet.service import FleetService

FLEET_RESTART_BASE = 1.0  # seconds before a fleet service that failed unexpectedly starts again; doubling
FLEET_RESTART_MAX = 300.0  # per failure in a row up to this (service/restart.py)


class FleetWiring:
    """Daemon's fleet methods; the attributes are made in Daemon.__init__."""

    cfg: Config
    stop: asyncio.Event
    metrics: Metrics
    store: Store | None
    persister: Persister
    allow: Allowlist
    enforcer: Enforcer
    tracker: Tracker
    actions: ActionHub | None
    subnets: SubnetRunner | None
    fleet: FleetService | None
    fleet_counter: FleetCounter | None
    fleet_sink: EnforcerFleetSink | None
    fleet_failure: str
    _counted_tasks: set[asyncio.Task[None]]

    if TYPE_CHECKING:
        async def store_call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any: ...

    def _build_fleet(self) -> None:
        """The fleet service, only with a `fleet:` block: without one, `redis` is never imported."""
        fc = self.cfg.fleet
        if fc is None or self.fleet_sink is None or self.store is None:
            return
        from nftblockd.fleet.link import RedisLink
        from nftblockd.fleet.service import FleetService

        self.fleet = FleetService(fc, RedisLink(fc), self.store, self.fleet_sink, self.allow,
                                  on_lag=self.metrics.fleet_lag.observe, saved=self.persister.saved,
                                  run_store=self.store_call)
        mx = self.metrics
        st = self.fleet.stats
        mx.fleet_events.read = lambda: [((op, result), n) for (op, result), n in st.received.items()]
        mx.fleet_publish_failures.read = lambda: [((), st.publish_failures)]
        mx.fleet_outbox.read = lambda: [((), st.outbox)]
        mx.fleet_snapshots.read = lambda: [((), st.snapshots)]
        mx.fleet_connected.read = lambda: [((), 1 if st.connected else 0)]
        self._build_counter(fc)
        log.info("fleet %s: this host is %s, sharing through %s", fc.name, fc.host_id,
                 fc.url or f"Sentinels {', '.join(f'{h}:{p}' for h, p in fc.sentinel_hosts)}")

    def _build_counter(self, fc: FleetConfig) -> None:
        """Fleet counting (fleet/counter.py), when some jail sets fleet_maxretry."""
        from nftblockd.fleet.counter import FleetCounter
        from nftblockd.fleet.counting import CountPolicy
        from nftblockd.fleet.countlink import CountLink

        policies = {j.name: CountPolicy(j.fleet_maxretry, j.fleet_findtime or j.findtime,
                                        min(fc.max_ban, j.bantime if isinstance(j.bantime, float) else fc.max_ban),
                                        j.ipv6_prefix)
                    for j in self.cfg.jails if j.enabled and j.fleet_maxretry is not None}
        if not policies:
            return
        self.fleet_counter = counter = FleetCounter(fc, CountLink(fc), policies, self._fleet_counted)
        st = counter.stats
        self.metrics.fleet_count_failures.read = lambda: [((k,), getattr(st, k)) for k in (
            "sent", "deferred", "accepted", "limited", "skipped", "lost", "dropped", "malformed")]
        self.metrics.fleet_count_decisions.read = lambda: [((), st.decided)]

    def _fleet_counted(self, decided: list[Decided]) -> None:
        """Fleet-counted bans this host's tally decided (every host decides the same): apply them here, with the
        jail's blocklist, and tell the tracker (the offender's next failures are ALREADY_BANNED)."""
        jails = {j.name: j for j in self.cfg.jails}
        bans = [Ban(d.net, jails[d.jail].blocklist, d.until, "jail", d.reason(), d.jail) for d in decided
                if d.jail in jails]
        task = asyncio.ensure_future(self._apply_counted(bans, decided))
        self._counted_tasks.add(task)
        task.add_done_callback(self._counted_tasks.discard)

    async def _apply_counted(self, bans: list[Ban], decided: list[Decided]) -> None:
        now = time.time()
        try:
            results = await self.enforcer.apply(bans, now=now)
        except Exception:
            log.exception("applying %d fleet-counted bans failed", len(bans))
            return
        applied = [b for b, r in zip(bans, results, strict=True) if r.code is None]
        for b in applied:
            self.tracker.note_ban(b, now)
        if self.fleet_sink is not None:
            self.fleet_sink.note_local([b.target for b in applied if b.blocklist == self.fleet_sink.blocklist], now)
        if self.subnets is not None:
            self.subnets.jail_bans(applied, now)
        if self.fleet is not None and self.cfg.fleet is not None and applied:
            from nftblockd.fleet.counting import published_and_held

            done = {b.target for b in applied}
            pub, held = published_and_held([d for d in decided if d.net in done], self.cfg.fleet.host_id)
            self.fleet.submit_bans(pub)
            self.fleet.note_counted(held)

    async def _run_counter(self) -> None:
        counter = self.fleet_counter
        assert counter is not None
        await keep_running(counter.run, self.stop, what="fleet counting stopped after an unexpected error; "
                           "local detection goes on", failures=self.metrics.fleet_service_failures, logger=log)

    async def _run_fleet(self) -> None:
        """The fleet service under the daemon's TaskGroup. It handles the server going away itself; anything
        else it raises (a bug, a state database that fails) is logged, counted and shown in status, and it is
        started again after a backoff (1 s, doubling to 5 min): local detection and enforcement never depend
        on it."""
        fleet = self.fleet
        assert fleet is not None

        def failed(exc: Exception, _delay: float) -> None:
            self.fleet_failure = fleet.stats.last_error = f"{type(exc).__name__}: {exc}"

        await keep_running(fleet.run, self.stop, what="fleet mode stopped after an unexpected error; this host "
                           "keeps enforcing its own bans", backoff=Backoff(FLEET_RESTART_BASE, FLEET_RESTART_MAX),
                           failures=self.metrics.fleet_service_failures, on_failure=failed, logger=log)

    async def _close_fleet(self) -> None:
        """Save the cursor and close the server connections (shutdown)."""
        if self.fleet is None:
            return
        try:
            await self.fleet.close()
        except Exception:
            log.exception("closing fleet mode failed; the next start replays a little more")

    def _fleet_status(self) -> dict[str, Any]:
        if self.fleet is None:
            fc = self.cfg.fleet
            return {"fleet": fc.name if fc else None, "connected": False, "last_error": "not started"}
        out = self.fleet.status()
        out["blocklist"] = self.fleet.cfg.blocklist
        if self.fleet_sink is not None:
            out["kernel"] = {"applied": self.fleet_sink.applied, "removed": self.fleet_sink.removed,
                             "refused": self.fleet_sink.refused}
        if self.fleet_failure:
            out["failure"] = self.fleet_failure
        if self.fleet_counter is not None:
            out["counting"] = self.fleet_counter.status()
        return out

    async def _check_fleet_count(self, target: IPNet) -> dict[str, Any]:
        """`nftblock check`: which hosts saw failures of `target` (fleet counting)."""
        if self.fleet_counter is None:
            return {}
        return {"fleet_count": await self.fleet_counter.seen(target)}

    def _fleet_removed(self, nets: list[IPNet]) -> None:
        """A fleet-wide unban lifted these here: a jail ban among them ends, so new failures can ban again."""
        for n in nets:
            self.tracker.forget_ban(n)
            if self.fleet_counter is not None:
                self.fleet_counter.forget(n)

    def _fleet_applied(self, n: int, nth: Callable[[int], tuple[str, float | None, str]], gone: list[IPNet],
                       now: float) -> None:
        """Received fleet bans and unbans are in the kernel: the `fleet: actions:` run for them."""
        if self.actions is not None and self.cfg.fleet is not None:
            guarded(self.actions.fleet_bans, n, nth, self.cfg.fleet.blocklist, now)
            if gone:
                guarded(self.actions.fleet_unbans, gone, self.cfg.fleet.blocklist, now)
