"""Composition root: builds everything from the Config and runs it under one TaskGroup.

Startup is ordered — config → store → kernel (table, sets, chain, allowlist, saved bans) → control socket →
metrics → sources → READY=1 — and shutdown is its bounded reverse. Signals only set events: SIGTERM/SIGINT
stop, SIGHUP reloads (a broken new config is refused and the old one keeps running). No polling loops beyond
the cheap kernel generation check and the periodic reconcile.

Its parts: daemon/build.py (build steps and checks), and the Daemon's mixins daemon/fleet.py (fleet wiring)
and daemon/reload.py (reloads).
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: the composition root: one TaskGroup, signals)
import contextlib
import dataclasses
import functools
import gc
import ipaddress
import logging
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from nftblockd import needed
from nftblockd.actions.hub import ActionHub
from nftblockd.addr import IPAddr, IPNet, host_net, unpack_hosts, unpack_target
from nftblockd.allowlist import Allowlist, build_allowlist
from nftblockd.config import Config, FeedConfig, JailConfig
from nftblockd.control.api import ControlAPI
from nftblockd.control.server import ControlServer
from nftblockd.daemon.build import (
    Overrides,
    Verdict,
    _origin,
    build_actions,
    build_filters,
    device_names,
    guarded,
    ingress_warnings,
    own_addresses,
    regex_warnings,
)
from nftblockd.daemon.fleet import FleetWiring
from nftblockd.daemon.reload import ReloadLogic
from nftblockd.detect.jails import JailRunner
from nftblockd.detect.subnet import SubnetEscalator
from nftblockd.detect.subnetrun import SubnetRunner
from nftblockd.detect.tracker import JailPolicy, Tracker
from nftblockd.events import Ban, Decision, Unban
from nftblockd.kernel import links, ownaddr
from nftblockd.kernel.bans import BanOutcome
from nftblockd.kernel.enforcer import DecisionResult, Enforcer
from nftblockd.kernel.fleetsink import EnforcerFleetSink
from nftblockd.kernel.ruleset import plan_ruleset
from nftblockd.kernel.sink import JailBanSink
from nftblockd.kernel.writer import KernelWriter
from nftblockd.service.health import Degraded, assess
from nftblockd.service.health import samples as health_samples
from nftblockd.service.loops import every
from nftblockd.service.metrics import Metrics, MetricsServer
from nftblockd.service.sdnotify import Notifier, watchdog_loop
from nftblockd.service.startline import start_line
from nftblockd.sources.base import MemoryPositionStore, PositionStore
from nftblockd.state.change import StateChange
from nftblockd.state.persister import Persister, PersistStatus
from nftblockd.state.store import (
    HostGroups,
    SavedBans,
    Store,
    StoreError,
    StoreProblem,
    drop_shadowed,
    ends_ms,
    group_rows,
    unpack_ends_ms,
)

log = logging.getLogger("nftblockd")
T = TypeVar("T")

if TYPE_CHECKING:
    from nftblockd.feeds.manager import FeedManager
    from nftblockd.fleet.counter import FleetCounter
    from nftblockd.fleet.service import FleetService


SHUTDOWN_GRACE = 10.0
ACTIONS_STOP_GRACE = 5.0  # seconds queued actions may still run at a stop (systemd waits 30 s)
# ... and then the seconds every fail2ban action's actionstop gets (in parallel): 5 + 15 leaves 10 of systemd's
# TimeoutStopSec=30s for the rest of the stop
ACTIONS_STOP_BUDGET = 15.0
STUCK_AFTER = 30.0  # seconds: kernel ops pending this long, or no successful kernel check, is unhealthy


class Daemon(FleetWiring, ReloadLogic):
    def __init__(self, cfg: Config, config_path: str | None = None, overrides: Overrides = Overrides(),  # noqa: B008 (frozen)
                 notifier: Notifier | None = None) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.overrides = overrides
        self.notifier = notifier or Notifier.from_env()
        self.stop = asyncio.Event()
        self.reload_requested = asyncio.Event()
        self._reload_lock = asyncio.Lock()
        self.last_reload = Verdict(True, "not reloaded since start")
        self.plan = plan_ruleset(cfg)
        self.link_watch: links.LinkWatch | None = None  # made in run(), before the table setup
        self._resolved: dict[str, list[IPAddr]] = {}  # what this host needs (needed.py): name -> addresses
        self.allow = self._allowlist(cfg)
        self.metrics = Metrics()
        self.metrics.degraded.read = lambda: health_samples(self.degraded())
        self.metrics_server: MetricsServer | None = None
        self.filters = build_filters(cfg)
        for warning in regex_warnings(cfg, self.filters):
            log.warning("%s", warning)
        # actions (docs/actions.md): fed after each kernel commit, never awaited by the ban path
        self.actions = ActionHub(cfg, build_actions(cfg)) if cfg.actions else None
        self._actions_task: asyncio.Task[None] | None = None
        self._action_metrics()
        self._filter_defs = {n: f.definition for n, f in self.filters.items()}
        self.reload_changes = ""
        self.store: Store | None = None
        self.persister = Persister(self._write_change, on_state=self._persist_state)
        self._saved: tuple[SavedBans, float, float] | None = None
        self._store_exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nftblockd-store")
        self.enforcer = Enforcer(cfg, self.plan, self.allow,
                                 lambda: KernelWriter(self.plan, protect=cfg.protect_table), metrics=self.metrics,
                                 persist=self.persister.submit, on_change=self._changed)
        self.tracker = self._tracker(cfg)
        self.sink = JailBanSink(self.enforcer, self.tracker, on_applied=self._jail_bans_applied)
        self.subnets = self._subnets(cfg)  # subnet escalation (None: no blocklist asks for it)
        # fleet mode: the kernel side is built here; the service (and with it the `redis` import) in run(),
        # once the state database it keeps its outbox and cursor in is open
        self.fleet: FleetService | None = None
        self.fleet_counter: FleetCounter | None = None  # fleet counting, when a jail sets fleet_maxretry
        self._counted_tasks: set[asyncio.Task[None]] = set()
        self.fleet_sink = EnforcerFleetSink(self.enforcer, cfg.fleet.blocklist, on_removed=self._fleet_removed,
                                            on_applied=self._fleet_applied) if cfg.fleet is not None else None
        if self.fleet_sink is not None and self.subnets is not None:
            self.fleet_sink.on_banned = functools.partial(self.subnets.fleet_bans, self.fleet_sink.blocklist)
        self.fleet_failure = ""  # the last unexpected error that stopped the fleet service (it is restarted)
        self.jails: list[JailRunner] = []
        self._kernel_checked = time.monotonic()  # last successful kernel check (the health check reads it)
        self.feeds: FeedManager | None = None
        if cfg.feeds:  # imported only when used: the HTTP client is a dependency of feeds alone
            from nftblockd.feeds.manager import FeedManager
            self.feeds = FeedManager(cfg, self.enforcer, Path(cfg.state_dir) / "feeds", self.metrics,
                                     on_changes=self._feed_changes)

        self.api = ControlAPI(self.enforcer, default_blocklist=self._default_blocklist(cfg),
                              status_extra=self._status_extra, reload=self._reload_for_api)
        if self.feeds is not None:
            self.api.set_feeds(self.feeds.status, self.feeds.refresh, self.feeds.blocklists())
        self.api.adopted = self._adopted
        if cfg.fleet is not None:
            self.api.set_fleet(self._fleet_status, self._api_banned, self._api_unbanned)
            self.api.check_more = self._check_fleet_count
        self.server: ControlServer | None = None
        self._hooks: list[Callable[[], Awaitable[None]]] = []
        self.watch_interval = 0.5
        self._rounds = 0
        self._positions: PositionStore = MemoryPositionStore()
        self._tg: asyncio.TaskGroup | None = None  # set while running: reloads start and stop jails in it
        self._jail_tasks: dict[str, asyncio.Task[None]] = {}

    @staticmethod
    def _default_blocklist(cfg: Config) -> str:
        names = [b.name for b in cfg.blocklists]
        return "default" if "default" in names else names[0]

    @staticmethod
    def _policies(cfg: Config) -> list[JailPolicy]:
        return [JailPolicy.from_config(j, recidive=j.recidive, watch=j.watch) for j in cfg.jails if j.enabled]

    def _tracker(self, cfg: Config) -> Tracker:
        return Tracker(self._policies(cfg), self.allow)

    def _subnets(self, cfg: Config) -> SubnetRunner | None:
        policies = {b.name: b.subnet for b in cfg.blocklists if b.subnet is not None}
        if not policies:
            return None
        runner = SubnetRunner(SubnetEscalator(policies, self.allow), lambda bans: self.enforcer.apply(bans))
        st = runner.escalator.stats
        self.metrics.subnet_escalations.read = lambda: [((), st.escalated)]
        self.metrics.subnet_refused.read = lambda: [((k,), n) for k, n in st.refused.items()]
        return runner

    def _allowlist(self, cfg: Config) -> Allowlist:
        self._own = own_addresses() if cfg.allowlist_self else []
        return build_allowlist([*cfg.allowlist, *self._needed(cfg)], self._own, include_self=cfg.allowlist_self)

    def _needed(self, cfg: Config) -> list[IPNet]:
        """Never banned, whatever `allowlist_self` says: the fleet server and Sentinels, the feed servers and the
        resolvers (needed.py). Literal addresses and resolv.conf at once; names as last resolved."""
        resolved = dict(self._resolved)
        for _what, host in needed.names(cfg):
            with contextlib.suppress(ValueError):
                resolved[host] = [ipaddress.ip_address(host)]
        try:
            with open(needed.RESOLV_CONF, encoding="utf-8", errors="replace") as f:
                resolved[needed.RESOLV_CONF] = needed.nameservers(f.read(needed.RESOLV_MAX))
        except OSError:
            pass  # no resolver configured: nothing to protect
        return needed.networks(resolved)

    async def _refresh_needed(self) -> None:
        """Resolve the names of what this host needs (each bounded; a name that fails keeps its last
        addresses) and install the allowlist again when they changed (a fleet server that moved)."""
        loop = asyncio.get_running_loop()
        before = needed.networks(self._resolved)
        for what, host in needed.names(self.cfg):
            try:
                infos = await asyncio.wait_for(loop.getaddrinfo(host, None, type=socket.SOCK_STREAM), 5.0)
            except (OSError, TimeoutError) as exc:
                log.debug("cannot resolve %s %s: %s", what, host, exc)
                continue
            addrs = []
            for info in infos:
                with contextlib.suppress(ValueError):
                    addrs.append(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]))
            if addrs:
                self._resolved[host] = addrs
        if needed.networks(self._resolved) != before:
            async with self._reload_lock:
                allow = await asyncio.to_thread(self._allowlist, self.cfg)
                log.info("never banned, as this host needs them: %s",
                         ", ".join(f"{h} ({', '.join(map(str, a))})" for h, a in sorted(self._resolved.items())))
                await self._apply_allowlist(allow, "as an address this host needs")

    async def _follow_needed(self) -> None:
        if not needed.names(self.cfg):
            return
        await self._refresh_needed()
        await every(lambda: needed.REFRESH, self.stop, self._refresh_needed, "resolving what this host needs")

    async def _apply_allowlist(self, allow: Allowlist, why: str) -> None:
        """Install a new allowlist: decisions use it at once, bans it now protects are lifted, and the
        kernel's allowlist sets are replaced in one transaction with the rules."""
        self.allow = allow
        self.enforcer.allow = allow
        if self.fleet is not None:
            self.fleet.gate.allow = allow  # received bans meet the same allowlist as local ones
        if self.subnets is not None:
            self.subnets.escalator.allow = allow
        lifted = self.tracker.replace_allowlist(allow)
        if lifted:
            log.warning("the new allowlist protects %d banned addresses; lifting their bans", len(lifted))
            await self.enforcer.apply([Unban(b.target, b.blocklist, "cli", f"allowlisted {why}") for b in lifted])
        await self.enforcer.reinstall()

    async def _follow_own_addresses(self) -> None:
        """allowlist_self follows the machine: an address added at runtime is protected within a moment,
        not at the next restart (rtnetlink address notifications; the list is then read again)."""
        try:
            changes = ownaddr.AddressChanges()
        except OSError as exc:
            log.warning("cannot follow address changes (%s); own addresses are read at start and reload", exc)
            return
        loop = asyncio.get_running_loop()
        heard = asyncio.Event()
        loop.add_reader(changes.fileno(), lambda: heard.set() if changes.drain() else None)
        try:
            while not self.stop.is_set():
                stopping = asyncio.ensure_future(self.stop.wait())
                hearing = asyncio.ensure_future(heard.wait())
                await asyncio.wait({stopping, hearing}, return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                hearing.cancel()
                if self.stop.is_set():
                    return
                heard.clear()
                async with self._reload_lock:  # a reload installs an allowlist too: one at a time
                    before = set(self._own)
                    allow = await asyncio.to_thread(self._allowlist, self.cfg)
                    if set(self._own) != before:
                        log.info("own addresses changed (%d now); allowlist updated", len(self._own))
                        await self._apply_allowlist(allow, "as an own address")
        finally:
            loop.remove_reader(changes.fileno())
            changes.close()

    # -- state ---------------------------------------------------------------------------------------

    async def store_call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._store_exec, lambda: fn(*args, **kw))

    async def open_store(self) -> None:
        path = Path(self.cfg.state_dir) / "state.db"

        def problem(p: StoreProblem) -> None:
            log.error("state database: %s", p.message)
            self.metrics.state_problem(p.kind, p.salvaged_rows, p.dropped_rows, p.truncated_bytes)

        # quick_check runs after READY (`verify`): damage in the bans table is met by the load itself
        self.store = await self.store_call(Store.open, path, on_problem=problem, verify=False)

    async def _write_change(self, change: StateChange) -> None:
        """One store transaction (the persister groups and orders them)."""
        if self.store is None:
            return
        await self.store_call(self.store.commit, save=change.saves, delete=change.deletes, history=change.history,
                              save_packed=change.packed_saves, delete_packed=change.packed_deletes,
                              save_timed=change.timed_saves)

    def _persist_state(self, st: PersistStatus) -> None:
        self.metrics.state_unsaved.set(st.unsaved_changes)
        self.metrics.state_degraded.set(1 if st.degraded else 0)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig, ev in ((signal.SIGTERM, self.stop), (signal.SIGINT, self.stop), (signal.SIGHUP,
                                                                                   self.reload_requested)):
            loop.add_signal_handler(sig, ev.set)
        self.notifier.status("opening the state database")
        await self.open_store()
        self._build_fleet()
        # reading the saved bans (store thread) overlaps setting up the table (kernel thread)
        loading = asyncio.ensure_future(self._load_saved())
        self.notifier.status("setting up the kernel table")
        # listening to link notifications before the table setup looks at the devices: a device that
        # appears in between is news the watch still delivers
        self.link_watch = links.LinkWatch()
        try:
            await self.enforcer.start()
        except BaseException:
            loading.cancel()
            self.link_watch.close()
            self.link_watch = None
            raise
        await self._warn_missing_devices()
        self._saved = await loading
        self.notifier.status("restoring saved bans")
        batcher_stop = asyncio.Event()
        batcher = asyncio.create_task(self.enforcer.batcher.run(batcher_stop))
        try:
            restored = await self.restore()
            if self.feeds is not None:
                self.notifier.status("loading cached feeds")
                restored += await self.feeds.load_caches()
            # bans the kernel still holds that the state database lost (or never saved) are adopted, not
            # deleted, before anything else looks at the state
            await self.enforcer.reconcile()
        finally:
            batcher_stop.set()
            await batcher
        self.server = ControlServer(self.cfg.control.socket, self.api, mode=self.cfg.control.mode,
                                    group=self.cfg.control.group)
        await self.server.start()
        if self.cfg.metrics_listen:
            self._live_metrics()
            self.metrics_server = MetricsServer(self.metrics, self.cfg.metrics_listen)
            await self.metrics_server.start()
        await self.refresh_gauges()
        # an owned table cannot be flushed or deleted by others: the generation check is only a safety net
        features = self.enforcer.features
        self.watch_interval = 5.0 if features is not None and features.owner else 0.5
        try:
            async with asyncio.TaskGroup() as tg:
                # the batcher outlives the jails and the sink: it stops only after they handed over everything
                batcher_stop = asyncio.Event()
                tg.create_task(self.enforcer.batcher.run(batcher_stop), name="batcher")
                sink = tg.create_task(self.sink.run(), name="ban-sink")
                tg.create_task(every(lambda: self.watch_interval, self.stop, self._check_kernel,
                                     "checking the kernel table"), name="kernel-watch")
                tg.create_task(every(lambda: self.cfg.reconcile_interval, self.stop, self._reconcile_round,
                                     "reconcile"), name="reconcile")
                tg.create_task(every(lambda: 60.0, self.stop, self._housekeeping_round, "housekeeping"),
                               name="housekeeping")
                tg.create_task(every(lambda: 5.0, self.stop, self.persister.retry, "saving state changes"),
                               name="persist-retry")
                tg.create_task(self._reloads(), name="reload")
                if self.cfg.allowlist_self:
                    tg.create_task(self._follow_own_addresses(), name="own-addresses")
                tg.create_task(self._follow_needed(), name="needed-addresses")
                tg.create_task(self._follow_links(), name="links")
                tg.create_task(watchdog_loop(self.notifier, self.stop, self._healthy), name="watchdog")
                self._tg = tg
                for j in self.jails:
                    self._jail_tasks[j.jail.name] = tg.create_task(j.run(), name=f"jail-{j.jail.name}")
                if self.feeds is not None:
                    tg.create_task(self.feeds.run(self.stop), name="feeds")
                fleet_task = tg.create_task(self._run_fleet(), name="fleet") if self.fleet is not None else None
                self._start_actions(tg)
                optional = self._start_optional(tg)
                await self._sources_ready()
                if self.store is not None:
                    tg.create_task(self._after_ready(self.store), name="verify-store")
                self.notifier.ready(f"enforcing: {restored} bans restored, {len(self.jails)} jails, "
                                    f"table inet {self.plan.table}")
                tune_gc()
                log.info("nftblockd ready: table inet %s, %d jails, control socket %s", self.plan.table,
                         len(self.jails), self.cfg.control.socket)
                log.info("%s", start_line(self.cfg, self.config_path or "the config file"))
                await self.stop.wait()
                self.notifier.stopping()
                self._tg = None
                for t in self._jail_tasks.values():  # sources save their positions when cancelled
                    t.cancel()
                await asyncio.gather(*self._jail_tasks.values(), return_exceptions=True)
                log.info("stopping: closing the control socket, flushing pending bans")
                await self.sink.close()
                await sink
                await self._stop_optional(optional)
                if fleet_task is not None:
                    fleet_task.cancel()
                    await asyncio.gather(fleet_task, return_exceptions=True)
                    await self._close_fleet()
                await self._stop_actions()
                batcher_stop.set()
                await self.server.close()
                if self.metrics_server is not None:
                    await self.metrics_server.close()
        finally:
            if self.link_watch is not None:
                self.link_watch.close()
                self.link_watch = None
            await self.persister.flush()
            await self.enforcer.close()
            if self.store is not None:
                await self.store_call(self.store.close)
            self._store_exec.shutdown(wait=True)
        log.info("stopped; %d bans stay in the kernel and expire there", len(self.enforcer.state))
        return 0

    def _start_optional(self, tg: asyncio.TaskGroup) -> list[asyncio.Task[None]]:
        """Subnet escalation's and fleet counting's tasks, when configured."""
        out = []
        if self.subnets is not None:
            out.append(tg.create_task(self.subnets.run(), name="subnets"))
        if self.fleet_counter is not None:
            out.append(tg.create_task(self._run_counter(), name="fleet-count"))
        return out

    async def _stop_optional(self, tasks: list[asyncio.Task[None]]) -> None:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, *self._counted_tasks, return_exceptions=True)
        if self.fleet_counter is not None:
            await self.fleet_counter.link.close()

    def _jail_bans_applied(self, bans: Sequence[Ban], now: float) -> None:
        """The ban sink committed these jail bans: their actions are offered, and the shared ones published
        (only after the kernel has them)."""
        if self.actions is not None:
            guarded(self.actions.jail_bans, bans, now)
        if self.subnets is not None:
            self.subnets.jail_bans(bans, now)
        if self.fleet is None or self.fleet_sink is None:
            return
        self.fleet_sink.note_local([b.target for b in bans if b.blocklist == self.fleet_sink.blocklist], now)
        self.fleet.submit_bans((b.target, b.until, f"jail:{b.jail}") for b in bans if b.origin == "jail")

    def _adopted(self, bans: list[Ban], now: float) -> None:
        """Bans taken over from fail2ban for one of our jails are that jail's (Tracker.adopt); their history
        rows are saved like a jail ban's, so a restart keeps the escalation memory."""
        records = self.tracker.adopt(bans, now)
        if records:
            self.persister.submit(StateChange(history=[r.as_row() for r in records]))

    def _api_banned(self, bans: list[tuple[IPNet, float | None, str]], now: float) -> None:
        """`nftblock ban` applied these (src "cli", or "fail2ban" which is never shared)."""
        if self.fleet is None or self.fleet_sink is None:
            return
        self.fleet_sink.note_local([t for t, _u, _s in bans], now)
        self.fleet.submit_bans(bans)

    def _api_unbanned(self, nets: list[IPNet], src: str) -> None:
        """`nftblock unban` is fleet-wide (with `share.cli`)."""
        if self.fleet is not None:
            self.fleet.submit_unbans(nets, src)

    async def _warn_missing_devices(self) -> None:
        if self.cfg.chain.ingress:
            for p in ingress_warnings(self.cfg, await asyncio.to_thread(device_names)):
                log.warning("%s", p)

    async def _follow_links(self) -> None:
        """Ingress chains follow their devices: each batch of link notifications (a device added, removed,
        renamed, or notifications lost) makes the writer compare devices and chains again."""
        assert self.link_watch is not None
        while not self.stop.is_set():
            changed = asyncio.ensure_future(self.link_watch.changed())
            stopper = asyncio.ensure_future(self.stop.wait())
            await asyncio.wait({changed, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if not changed.done():
                changed.cancel()
                return
            names, lost = changed.result()
            if lost:
                log.info("link notifications were lost; checking the ingress devices again")
            if not self.cfg.chain.ingress and not any(c.device for c in self.plan.chains):
                continue
            try:
                await self.enforcer.sync_ingress()
            except Exception:
                log.exception("updating the ingress chains after a link change failed (devices: %s)",
                              ", ".join(sorted(names)) or "unknown")

    async def _sources_ready(self, limit: float = 30.0) -> None:
        """READY=1 means log lines written from now on will be seen: wait for every source's watches."""
        events = [s.ready for j in self.jails for s in j.sources]
        if not events:
            return
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        _done, pending = await asyncio.wait(waits, timeout=limit)
        for w in pending:
            w.cancel()
        if pending:
            log.warning("%d log sources were not ready after %.0fs; continuing without waiting", len(pending),
                        limit)

    def degraded(self) -> list[Degraded]:
        """Why the daemon is degraded now (service/health.py): `status`, its exit code and the metric."""
        dead = [(j.jail.name, why) for j in self.jails for s in j.sources
                if (why := getattr(s, "dead", lambda: None)()) is not None]
        saving = self.persister.status()
        return assess(dead, state_in_memory=self.store is not None and not self.store.persistent,
                      state_error=(saving.last_error or "failing") if saving.degraded else None,
                      batch_error=self.enforcer.batcher.last_error)

    def _status_extra(self) -> dict[str, Any]:
        jails = []
        for j in self.jails:
            st = j.stats
            jails.append({"name": j.jail.name, "filter": j.filter.name, "lines": st.lines, "matched": st.matched,
                          "ignored": st.ignored, "rejected": st.rejected, "failures": st.failures,
                          # bans: applied in the kernel; decided: what the tracker decided (a full set
                          # refuses the difference, counted in ban_refused)
                          "bans": self.sink.stats.applied_by_jail.get(j.jail.name, 0), "decided": st.bans,
                          "ban_refused": self.sink.stats.refused_by_jail.get(j.jail.name, 0),
                          "already_banned": st.already_banned, "allowlisted": st.allowlisted,
                          "never_ban": st.never_ban, "stale": st.stale,
                          "banned_now": self.tracker.banned_count(j.jail.name),
                          "missing": [why for s in j.sources for why in getattr(s, "missing", list)()],
                          "sources": [{"name": getattr(s, "name", ""), **dataclasses.asdict(s.stats)}
                                      for s in j.sources]})
        store = None
        if self.store is not None:
            saving = self.persister.status()
            store = {"path": str(Path(self.cfg.state_dir) / "state.db"), "persistent": self.store.persistent,
                     "degraded": saving.degraded, "unsaved_changes": saving.unsaved_changes,
                     "last_error": saving.last_error, "degraded_since": saving.degraded_since,
                     "salvaged_rows": sum(p.salvaged_rows for p in self.store.problems),
                     "salvage_dropped_rows": sum(p.dropped_rows for p in self.store.problems),
                     "truncated_bytes": sum(p.truncated_bytes for p in self.store.problems)}
        out = {"degraded": [{"reason": d.reason, "message": d.message} for d in self.degraded()],
               "jails": jails, "tracker": {"tracked": self.tracker.tracked, "evictions": self.tracker.evictions,
                                           "evicted_several": self.tracker.evicted_several}, "store": store}
        if self.cfg.fleet is not None:
            out["fleet"] = self._fleet_status()
        if self.subnets is not None:
            out["subnet_escalation"] = self.subnets.status()
        if self.actions is not None:
            out["actions"] = [{"name": n, "type": r.cfg.type, "runs": r.stats.runs, "failures": r.stats.failures,
                               "retries": r.stats.retries, "skipped": dict(r.stats.skipped), "queued": r.queued(),
                               "last_error": r.stats.last_error} for n, r in self.actions.runners.items()]
        return out

    def _changed(self, decisions: Sequence[Decision], results: Sequence[DecisionResult]) -> None:
        """Unbans end the tracker's BANNED state, so new failures can ban again; the jails whose ban ended
        run their unban actions."""
        ended: list[tuple[str, IPNet, str, str, str]] = []
        for d, r in zip(decisions, results, strict=False):
            if isinstance(d, Unban) and r.outcome is BanOutcome.REMOVED:
                for jail, net in self.tracker.forget_ban(d.target):
                    ended.append((jail, net, d.blocklist, d.origin, d.reason))
        if ended and self.actions is not None:
            guarded(self.actions.unbanned, ended, time.time())

    async def _reload_for_api(self) -> tuple[bool, str]:
        v = await self.reload_verdict()
        return v.ok, v.message

    def _healthy(self) -> bool:
        """For the watchdog: the kernel thread answers (ops do not wait for ever, the generation check
        succeeds now and then). A stuck kernel thread or a lost netlink socket withholds the pings, so
        systemd restarts nftblockd, which restores every ban from the state database."""
        now = time.monotonic()
        if self.enforcer.batcher.oldest_pending_age(now) > STUCK_AFTER:
            return False
        return now - self._kernel_checked <= STUCK_AFTER + self.watch_interval

    async def restore(self) -> int:
        """Saved bans go back into the kernel before READY (after a reboot the sets are empty), the tracker
        learns which jail bans are in force and its escalation history, and the jails are built."""
        now = time.time()
        n = 0
        if self._saved is not None:
            saved, t0, t1 = self._saved
            self._saved = None
            gc.disable()  # a million rows of small objects: the collector would run hundreds of times
            try:
                n = await self._restore_rows(saved, now)
            finally:
                gc.enable()
            log.info("restored %d saved bans in %.2fs (reading the database %.2fs, state and kernel %.2fs)", n,
                     time.perf_counter() - t0, t1 - t0, time.perf_counter() - t1)
        if self.store is not None:
            history = await self.store_call(self.store.load_history, now - 30 * 86400)
            self.tracker.load_history(history, now)
        self._positions = self.store.positions() if self.store is not None else MemoryPositionStore()
        for j in self.cfg.jails:
            if j.enabled and not j.recidive:
                self.jails.append(self._runner(j))
        return n

    def _runner(self, j: JailConfig) -> JailRunner:
        r = JailRunner(j, self.filters[j.name], self.tracker, self.sink, self._positions, self.metrics,
                       memory=self.actions.memory(j.name) if self.actions is not None else None)
        if self.fleet_counter is not None and j.fleet_maxretry is not None:
            r.on_failure = self.fleet_counter.failure
        return r

    async def _load_saved(self) -> tuple[SavedBans, float, float] | None:
        if self.store is None:
            return None
        t0 = time.perf_counter()
        saved = await self.store_call(self.store.load_saved, time.time())
        return saved, t0, time.perf_counter()

    async def _restore_rows(self, saved: SavedBans, now: float) -> int:
        """Saved bans back into state and kernel, grouped by label (blocklist, origin, reason, jail) and
        family; every ban keeps its own end."""
        blocklists = {b.name for b in self.cfg.blocklists} - (self.feeds.blocklists() if self.feeds else set())
        # One (keys, ends in ms) list per label and family: its bulk saves oldest first, then its rows, so that
        # of an address given twice the later save wins (restore_plan keeps the later; a row is newer than any
        # bulk save it overlaps). Across labels, the save that ends last (drop_shadowed).
        hosts: HostGroups = {}
        for label, until, size, blob, ends in saved.bulk:
            blocklist, origin, reason, jail = saved.labels[label]
            if blocklist not in blocklists:
                continue
            keys, untils = hosts.setdefault((label, size), ([], []))
            new_keys = unpack_hosts(blob, 4 if size == 4 else 6)
            keys += new_keys
            untils += ends_ms([until]) * len(new_keys) if ends is None else unpack_ends_ms(ends)
        for label, size, blob, row_ends in saved.hosts:
            if saved.labels[label][0] not in blocklists:
                continue
            keys, untils = hosts.setdefault((label, size), ([], []))
            keys += unpack_hosts(blob, 4 if size == 4 else 6)
            untils += row_ends
        others: list[Ban] = []
        for (label, _size), rows in group_rows(saved.others).items():
            blocklist, origin, reason, jail = saved.labels[label]
            if blocklist in blocklists:
                others += [Ban(unpack_target(r[1]), blocklist, r[2], _origin(origin), reason, jail) for r in rows]
        drop_shadowed(hosts, {g[0]: saved.labels[g[0]][0] for g in hosts})
        n = 0
        for (label, size), (keys, untils) in hosts.items():
            if not keys:
                continue
            blocklist, origin, reason, jail = saved.labels[label]
            note = functools.partial(self._note_restored, saved.labels[label], 4 if size == 4 else 6,
                                     now=now) if jail else None
            r = await self.enforcer.restore_hosts(blocklist, 4 if size == 4 else 6, keys, untils, origin=origin,
                                                  reason=reason, jail=jail, meanwhile=note)
            if r is None:
                continue
            _name, new, failures = r
            n += len(new) - len(failures)
        if others:
            results = await self.enforcer.restore_bans(others, now)
            n += sum(1 for r in results if r.code is None)
            for b in others:
                if b.jail:
                    self.tracker.note_ban(b, now)
        return n

    def _note_restored(self, label: tuple[str, str, str, str], version: int, keys: list[int],
                       ms: list[int | None], *, now: float) -> None:
        """The tracker learns which restored jail bans are in force (their offenders answer ALREADY_BANNED):
        `keys`, whose ends are `ms` (ms since the epoch, None = permanent)."""
        blocklist, origin, reason, jail = label
        if jail not in self.tracker.jails:  # a jail no longer configured: nothing to note (~0.1 s per million)
            return
        untils: list[float | None] = ([None if x is None else x / 1000 for x in ms] if None in ms
                                      else list(map(_MS.__rtruediv__, cast("list[int]", ms))))
        if version == 4:  # the bulk form: no Ban object per restored ban (~2.8 s for a million)
            self.tracker.note_hosts(jail, keys, untils, now, blocklist=blocklist, origin=_origin(origin), reason=reason)
            return
        for k, u in zip(keys, untils, strict=True):
            self.tracker.note_ban(Ban(host_net(k, version), blocklist, u, _origin(origin), reason, jail), now)

    async def _after_ready(self, store: Store) -> None:
        """Check the database (skipped before READY), then move single-address rows into bulk rows, so that
        the next restart reads blobs (Store.compact_rows; also done with each prune)."""
        await self.store_call(store.verify)
        await self._compact(store)

    async def _compact(self, store: Store) -> None:
        try:
            t0 = time.perf_counter()
            moved = await self.store_call(store.compact_rows, time.time())
            if moved:
                log.info("state database: %d single-address bans compacted into bulk rows in %.2fs", moved,
                         time.perf_counter() - t0)
        except StoreError as exc:
            log.error("compacting the state database failed: %s", exc)

    async def _housekeeping_round(self) -> None:
        """Once a minute: forget ended bans; every 15 minutes prune the database (a scan of every saved ban:
        with a million of them, doing it each minute cost ~1 % CPU while idle)."""
        now = time.time()
        self._rounds += 1
        ended: dict[str, list[Ban]] | None = None
        if self.actions is not None:  # bans that reached their end: their jails' unban actions
            ended = {j.name: [] for j in self.cfg.jails if j.actions}
        self.tracker.sweep(now, ended)
        if ended and self.actions is not None:
            guarded(self.actions.unbanned, [(b.jail, b.target, b.blocklist, b.origin, "ban ended")
                                   for bs in ended.values() for b in bs], now)
        self.enforcer.state.expire(now)
        if self.store is not None and self._rounds % 15 == 0:
            try:
                await self.store_call(self.store.prune, now, 30 * 86400)
                if self.cfg.fleet is not None:  # published outbox rows older than the history
                    await self.store_call(self.store.fleet_prune, now, self.cfg.fleet.history)
            except StoreError as exc:
                log.error("pruning the state database failed: %s", exc)
            await self._compact(self.store)

    async def _check_kernel(self) -> None:
        await self.enforcer.check_kernel()
        self._kernel_checked = time.monotonic()

    async def _reconcile_round(self) -> None:
        await self.enforcer.reconcile()
        await self.refresh_gauges()

    async def refresh_gauges(self) -> None:
        """Set sizes as the kernel reports them (what is enforced), next to what nftblockd tracks. Runs before
        every scrape: one GETSET dump of our table, whose cost does not grow with the elements (measured
        in tests/integration/test_metrics.py). A kernel that does not report NFTA_SET_COUNT gets the count
        of elements it acknowledged."""
        counts = await self.enforcer.kernel_counts()
        tracked = self.enforcer.state.counts()
        for s in self.plan.sets:
            n = counts.get(s.name)
            if n is None:
                n = tracked.get(s.name)
            if n is not None:
                self.metrics.set_elements.labels(s.name, s.blocklist or "allow", f"ipv{s.version}").set(n)
            if s.name in tracked:
                self.metrics.set_tracked.labels(s.name).set(tracked[s.name])

    def _live_metrics(self) -> None:
        """Figures other components own, read at scrape time (see service/metrics.py)."""
        mx = self.metrics
        mx.before_scrape.append(self.refresh_gauges)
        mx.tracker_addresses.read = lambda: [((jail,), n) for jail, n in self.tracker.tracked_by_jail().items()]
        mx.tracker_evictions.read = lambda: [(("one",), self.tracker.evictions - self.tracker.evicted_several),
                                             (("several",), self.tracker.evicted_several)]
        mx.failures_refused.read = lambda: [((j.jail.name, why), n) for j in self.jails
                                            for why, n in (("allowlisted", j.stats.allowlisted),
                                                           ("never_ban", j.stats.never_ban))]

        def invalid_lines() -> list[tuple[tuple[str, ...], float]]:
            by: dict[tuple[str, ...], float] = {}
            for j in self.jails:
                for src in j.sources:
                    for reason, n in (("overlong", src.stats.overlong), ("invalid_utf8", src.stats.invalid_utf8),
                                      ("nul", src.stats.nul), ("bad_time", src.stats.bad_time)):
                        by[(j.jail.name, reason)] = by.get((j.jail.name, reason), 0) + n
            return list(by.items())

        mx.lines_invalid.read = invalid_lines
        srv = self.server
        if srv is not None:
            mx.control_closed.read = lambda: [(("idle",), srv.idle_closed), (("evicted",), srv.evicted),
                                              (("over_budget",), srv.over_budget)]

    def _feed_changes(self, feed: FeedConfig, added: list[tuple[int, int]], removed: list[tuple[int, int]],
                      now: float) -> None:
        if self.actions is not None:
            guarded(self.actions.feed_changes, feed, added, removed, now)

    def _start_actions(self, tg: asyncio.TaskGroup) -> None:
        if self.actions is not None:
            self._actions_task = tg.create_task(self.actions.run(), name="actions")

    async def _stop_actions(self) -> None:
        """After the last bans were applied: the actions get ACTIONS_STOP_GRACE seconds to run what is queued
        (the mail of the last ban before a restart); what is left then is counted as skipped, not run. Then
        the fail2ban actions' actionstop runs, within ACTIONS_STOP_BUDGET (a buffered mail's remainder)."""
        if self._actions_task is not None:
            if self.actions is not None:
                await self.actions.shutdown(ACTIONS_STOP_GRACE, ACTIONS_STOP_BUDGET)
            self._actions_task.cancel()
            await asyncio.gather(self._actions_task, return_exceptions=True)
            self._actions_task = None

    def _action_metrics(self) -> None:
        """Each action's figures, read from its runner at scrape time (none without actions)."""
        mx = self.metrics

        def runners() -> list[Any]:
            return list(self.actions.runners.values()) if self.actions is not None else []

        mx.action_runs.read = lambda: [((r.cfg.name, result), n) for r in runners()
                                       for result, n in (("ok", r.stats.runs - r.stats.failures),
                                                         ("failed", r.stats.failures))]
        mx.action_retries.read = lambda: [((r.cfg.name,), r.stats.retries) for r in runners()]
        mx.action_skipped.read = lambda: [((r.cfg.name, why), n) for r in runners()
                                          for why, n in r.stats.skipped.items()]
        mx.action_queue.read = lambda: [((r.cfg.name,), r.queued()) for r in runners()]



# gen0 at 150k: a 10k-attacker burst leaves ~100k young container objects alive (bans, their networks,
# records, tracker state); at 50k the collector ran twice in the burst (10-18 ms, gc.callbacks in the
# daemon), at 150k not at all: that state is scanned once, later, off the burst's path. Only cyclic
# garbage waits longer for it (the daemon makes little), a few MB at most.
GC_THRESHOLDS = (150_000, 20, 50)
_MS = 1000  # ms per second: `_MS.__rtruediv__(x)` is x / 1000 in one C call per element



def tune_gc() -> None:
    """After start-up: move what exists (modules, config, restored state) out of the collector's sight
    and collect young objects less often. A burst allocates short-lived tuples and dicts by the hundred
    thousand, next to nothing cyclic; with the default (700, 10, 10) the collector took 13 % of the
    burst path (in-process: 30k lines -> 10k bans, 0.78 s -> 0.68 s)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run(cfg: Config, config_path: str | None, overrides: Overrides) -> int:
    return asyncio.run(Daemon(cfg, config_path, overrides).run())

