"""The daemon's reload: re-read the config, refuse a broken or kernel-changing one, apply jail, feed and action
changes in place, and say what became of it (a Verdict).

A mixin of Daemon (daemon/root.py), which owns the attributes and methods declared below. This module must NOT
raise out of a reload (enforcement survives any reload), change the table or its sets (that takes a
restart), or read the config anywhere but config.load_config.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: the composition root: one TaskGroup, signals)
import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nftblockd.actions.f2baction import F2bAction
from nftblockd.actions.hub import ActionHub
from nftblockd.allowlist import Allowlist
from nftblockd.config import Config, ConfigError, FeedConfig, FleetConfig, JailConfig, load_config
from nftblockd.control.api import ControlAPI
from nftblockd.daemon.build import (
    Overrides,
    Verdict,
    apply_overrides,
    build_actions,
    build_filters,
    regex_warnings,
)
from nftblockd.detect.jails import JailRunner
from nftblockd.detect.matcher import Filter
from nftblockd.detect.tracker import JailPolicy, Tracker
from nftblockd.kernel.enforcer import Enforcer
from nftblockd.kernel.ruleset import Ruleset, plan_ruleset
from nftblockd.service.metrics import Metrics
from nftblockd.service.sdnotify import Notifier

log = logging.getLogger("nftblockd")

if TYPE_CHECKING:
    from nftblockd.feeds.manager import FeedManager


class ReloadLogic:
    """Daemon's reload methods; the attributes, and the methods under TYPE_CHECKING, are the Daemon's."""

    cfg: Config
    config_path: str | None
    overrides: Overrides
    notifier: Notifier
    stop: asyncio.Event
    reload_requested: asyncio.Event
    _reload_lock: asyncio.Lock
    last_reload: Verdict
    reload_changes: str
    allow: Allowlist
    plan: Ruleset
    enforcer: Enforcer
    tracker: Tracker
    metrics: Metrics
    api: ControlAPI
    actions: ActionHub | None
    feeds: FeedManager | None
    filters: dict[str, Filter]
    _filter_defs: dict[str, Any]
    jails: list[JailRunner]
    _jail_tasks: dict[str, asyncio.Task[None]]
    _tg: asyncio.TaskGroup | None

    if TYPE_CHECKING:
        @staticmethod
        def _policies(cfg: Config) -> list[JailPolicy]: ...
        def _allowlist(self, cfg: Config) -> Allowlist: ...
        async def _apply_allowlist(self, allow: Allowlist, why: str) -> None: ...
        async def _warn_missing_devices(self) -> None: ...
        def _runner(self, j: JailConfig) -> JailRunner: ...
        def _start_actions(self, tg: asyncio.TaskGroup) -> None: ...
        def _feed_changes(self, feed: FeedConfig, added: list[tuple[int, int]], removed: list[tuple[int, int]],
                          now: float) -> None: ...

    async def _reloads(self) -> None:
        while not self.stop.is_set():
            waiter = asyncio.ensure_future(self.reload_requested.wait())
            stopper = asyncio.ensure_future(self.stop.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            stopper.cancel()
            if self.stop.is_set():
                return
            self.reload_requested.clear()
            await self.reload_verdict()

    async def reload_verdict(self) -> Verdict:
        """Reload (SIGHUP, or the control socket's `reload`, which hands the verdict to `nftblock reload` and
        so to systemd's ExecReload); one at a time, and never raising: enforcement must survive any reload."""
        async with self._reload_lock:
            try:
                ok = await self.reload()
            except Exception as exc:
                log.exception("reload failed; the running configuration stays")
                self.notifier.ready("reload failed; running the previous config")
                self.last_reload = Verdict(False, f"reload failed: {exc}; the running configuration stays")
            else:
                if ok:
                    changes = f" ({self.reload_changes})" if self.reload_changes else ""
                    self.last_reload = Verdict(True, f"configuration reloaded from {self.config_path}{changes}")
            return self.last_reload

    async def reload(self) -> bool:
        """Re-read the config; a broken one is refused (the reason in `last_reload`) and the running one stays.

        "Changed" means changed in meaning: config values compare without their line numbers, so moving or
        commenting the file does not refuse a reload."""
        if not self.config_path:
            self.last_reload = Verdict(False, "no config file to reload (started without --config)")
            return False
        self.notifier.reloading()
        try:
            new = apply_overrides(load_config(self.config_path), self.overrides)
            filters = build_filters(new)  # a filter that does not compile refuses the reload, as at a start
            for warning in regex_warnings(new, filters):
                log.warning("%s", warning)
            f2b_actions = build_actions(new)
            policies = self._policies(new)
            Tracker(policies, self.allow)  # policies the tracker refuses (a bad watch list) refuse the reload
        except ConfigError as exc:
            log.error("reload refused, the running config stays:\n%s", exc)
            self.notifier.ready("reload refused: config invalid; running the previous config")
            self.last_reload = Verdict(False, "reload refused, the running config stays: "
                                              + "; ".join(str(p) for p in exc.problems))
            return False
        # the chains (hook, priority, ingress devices) are replaced in the setup transaction below; the table
        # and the sets would take a restart
        changed = [what for what, a, b in (("table", new.table, self.cfg.table),
                                           ("blocklists", new.blocklists, self.cfg.blocklists),
                                           ("fleet", _fleet_key(new), _fleet_key(self.cfg))) if a != b]
        if changed:
            why = f"{' and '.join(changed)} changed; restart nftblockd to apply"
            log.error("reload refused: %s", why)
            self.notifier.ready("reload refused: kernel layout changed; restart to apply")
            self.last_reload = Verdict(False, f"reload refused: {why}")
            return False
        old_cfg = self.cfg
        self.cfg = new
        self.enforcer.cfg = new
        await self._apply_allowlist(await asyncio.to_thread(self._allowlist, new), "on reload")
        if new.chain != old_cfg.chain:  # hook, priority or ingress devices: the chains are replaced
            self.plan = plan_ruleset(new)
            await self.enforcer.reinstall(self.plan)
            log.info("chains now: %s", ", ".join(c.name for c in self.plan.chains))
            await self._warn_missing_devices()
        actions = self._reload_actions(new, f2b_actions)
        jails = await self._reload_jails(old_cfg, new, filters, policies)
        feeds = await self._reload_feeds(old_cfg, new)
        summary = "; ".join(x for x in (jails, feeds, actions) if x)
        log.info("configuration reloaded from %s%s", self.config_path, f" ({summary})" if summary else "")
        self.notifier.ready("configuration reloaded")
        self.reload_changes = summary
        return True
    def _reload_actions(self, new: Config, f2b: dict[str, F2bAction]) -> str:
        """A changed action gets a new runner (its old one runs what it had queued first, hub.RELOAD_DRAIN);
        jails whose action list changed are restarted by _reload_jails, and take their line memory from the hub."""
        if self.actions is None:
            if not new.actions:
                return ""
            self.actions = ActionHub(new, f2b)
            if self._tg is not None:
                self._start_actions(self._tg)
            return f"actions added: {', '.join(a.name for a in new.actions)}"
        changed = self.actions.configure(new, f2b)
        return f"actions changed: {', '.join(sorted(changed))}" if changed else ""

    async def _reload_feeds(self, old: Config, new: Config) -> str:
        """Apply feed changes (feeds/manager.py: `reconfigure`); the API learns which blocklists feeds own
        now. Returns a summary."""
        if self.feeds is None:
            if not new.feeds:
                return ""
            from nftblockd.feeds.manager import FeedManager
            self.feeds = FeedManager(old, self.enforcer, Path(new.state_dir) / "feeds", self.metrics,
                                     on_changes=self._feed_changes)
            if self._tg is not None:
                self._tg.create_task(self.feeds.run(self.stop), name="feeds")
        owned = self.feeds.blocklists()
        added, removed, changed = await self.feeds.reconfigure(new)
        self.api.set_feeds(self.feeds.status, self.feeds.refresh, self.feeds.blocklists())
        now_owned = self.feeds.blocklists()
        parts = [f"{what}: {', '.join(sorted(names))}" for what, names in
                 (("feeds added", added), ("feeds removed", removed), ("feeds changed", changed),
                  ("blocklists now fed", now_owned - owned), ("blocklists no longer fed", owned - now_owned))
                 if names]
        return "; ".join(parts)

    async def _reload_jails(self, old: Config, new: Config, filters: dict[str, Filter],
                            policies: list[JailPolicy]) -> str:
        """Apply jail changes: the tracker takes the new policies (keeping what it counted for jails that
        stay), and runners whose jail changed are restarted on their saved positions. Returns a summary."""
        added, removed, changed = self.tracker.reconfigure(policies)
        self.filters = filters
        before = {j.name: j for j in old.jails if j.enabled and not j.recidive}
        after = {j.name: j for j in new.jails if j.enabled and not j.recidive}
        restart = [n for n in after if n in before and (after[n] != before[n] or
                                                         filters[n].definition != self._filter_defs.get(n))]
        for name in [n for n in before if n not in after] + restart:
            task = self._jail_tasks.pop(name, None)
            if task is not None:
                task.cancel()  # the sources save their positions
                await asyncio.gather(task, return_exceptions=True)
        self.jails = [r for r in self.jails if r.jail.name in after and r.jail.name not in restart]
        for name in [n for n in after if n not in before] + restart:
            runner = self._runner(after[name])
            self.jails.append(runner)
            if self._tg is not None:
                self._jail_tasks[name] = self._tg.create_task(runner.run(), name=f"jail-{name}")
        self._filter_defs = {n: f.definition for n, f in filters.items()}
        parts = [f"{what}: {', '.join(sorted(names))}" for what, names in
                 (("jails added", added), ("jails removed", removed), ("jails changed", changed),
                  ("jails restarted", restart)) if names]
        return "; ".join(parts)


def _fleet_key(cfg: Config) -> FleetConfig | None:
    """The fleet block in meaning (without its line number): a reload that changes it is refused, because the
    server connections, the cursor and the outbox belong to one fleet setting (restart to apply)."""
    return None if cfg.fleet is None else replace(cfg.fleet, line=0, actions=())
