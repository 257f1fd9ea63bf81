"""Which actions a ban or unban goes to, and the runners' lives under the daemon's TaskGroup.

The daemon calls `jail_bans`, `unbanned`, `fleet_bans`, `feed_bans` after the kernel committed (never
before: an action must not announce a ban the kernel refused) and never awaits anything: each call only
builds events and offers them to the runners' bounded queues. An event a runner cannot take is counted there
(skipped), and a flood's remainder is counted without even being built (`room`).

The runners' lives follow fail2ban's, where each jail holds its own instance of an action: a fail2ban action
runs `actionstart` once for each `<name>` its bans carry (each jail using it; `fleet`; `feed`) when its runner
starts or a reload adds that name, and `actionstop` when it stops: at a reload that replaces or removes it
(the old runner first runs what it had queued, for up to RELOAD_DRAIN seconds, with the config those events
were decided under; the replacement starts only after the old one stopped), and at the daemon's stop
(`shutdown`) once the queues drained what they could, every action in parallel within one budget. Nothing
here waits for a runner's life but `shutdown`.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: the runners' tasks)
import contextlib
import logging
import socket
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence

from nftblockd.actions.f2baction import F2bAction, TagRef
from nftblockd.actions.render import ActionEvent, f2b_name
from nftblockd.actions.runner import ActionRunner, Executor, RealExecutor
from nftblockd.addr import IPNet, format_target, key_net
from nftblockd.config import ActionConfig, Config, FeedConfig
from nftblockd.detect.matchmemory import MatchMemory
from nftblockd.durations import ban_end
from nftblockd.events import Ban

log = logging.getLogger("nftblockd.actions")

# A reload that replaces or removes an action lets its old runner run what it had queued for this long (as the
# daemon's stop does, ACTIONS_STOP_GRACE in daemon/root.py) before its actionstop: a reload to fix a typo in a mail
# action's recipient must not throw away the bans of the minute before. What is left then is counted skipped.
RELOAD_DRAIN = 5.0


# fail2ban tags whose values come from the offender's kept lines (MatchMemory): `<F-*>` too
_OFFENDER_TAGS = frozenset({"matches", "ipmatches", "ipjailmatches", "failures", "ipfailures", "ipjailfailures"})


def shows_lines(cfg: ActionConfig, f2b: Mapping[str, F2bAction]) -> bool:
    """Whether the action's ban runs show what the jail's match memory keeps: the offender's lines, its
    `<F-*>` captures or its failure count. A command (NFTBLOCK_MATCHES, ... in every run's environment) and
    a webhook (every event's JSON) always do; a fail2ban file only when its actionban names such a tag that
    its options do not fix. An action that does not run on ban never does."""
    if "ban" not in cfg.on:
        return False
    if cfg.type != "fail2ban":
        return True
    action = f2b.get(cfg.name)
    script = action.command("actionban") if action is not None else None
    if action is None or script is None:
        return False
    fixed = {k for k, _ in action.fixed}
    return any(isinstance(p, TagRef) and p.tag not in fixed and (p.tag in _OFFENDER_TAGS or p.tag.startswith("F-"))
               for p in script.parts)


def _left(until: float, now: float) -> float:
    """Whole seconds a ban has left (the tracker and the sink read the clock moments apart)."""
    return float(max(0, round(until - now)))


def life_names(cfg: Config, f2b: Mapping[str, F2bAction]) -> dict[str, tuple[str, ...]]:
    """For each fail2ban action, the `<name>`s its bans carry: fail2ban runs actionstart and actionstop once per
    jail using the action (each jail has its own instance of it, with its `<name>`), so a config imported from
    fail2ban mails "jail sshd started" for each jail as before; options that fix `name` make it one."""
    users: dict[str, list[str]] = {}
    for j in cfg.jails:
        for n in j.actions if j.enabled else ():
            users.setdefault(n, []).append(j.name)
    for f in cfg.feeds:
        for n in f.actions:
            users.setdefault(n, []).append("feed")  # a feed's events have no jail: fail2ban's <name> is "feed"
    for n in cfg.fleet.actions if cfg.fleet is not None else ():
        users.setdefault(n, []).append("fleet")
    out = {}
    for n, jails in users.items():
        action = f2b.get(n)
        if action is not None:
            out[n] = tuple(dict.fromkeys(f2b_name(action, j) for j in jails))
    return out


class ActionHub:
    def __init__(self, cfg: Config, f2b: Mapping[str, F2bAction], execute: Executor | None = None) -> None:
        self.execute = execute if execute is not None else RealExecutor()
        self.host = cfg.fleet.host_id if cfg.fleet is not None else socket.gethostname()
        self.runners: dict[str, ActionRunner] = {}
        self.memories: dict[str, MatchMemory] = {}  # per jail with actions: its offenders' recent lines
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._retiring: set[asyncio.Task[None]] = set()  # replaced or removed runners running their actionstop
        self._draining: set[ActionRunner] = set()  # of those, the ones still running what they had queued
        self._hurry = asyncio.Event()  # set by `shutdown`: a reload's drain ends now, not after RELOAD_DRAIN
        self._tg: asyncio.TaskGroup | None = None
        self.configure(cfg, f2b)

    def configure(self, cfg: Config, f2b: Mapping[str, F2bAction]) -> list[str]:
        """Take `cfg`'s actions: an action whose config changed gets a new runner (the old one runs what it had
        queued first, `_stop`); returns the names that changed."""
        old = self.runners
        self.runners = {}
        changed = []
        names = life_names(cfg, f2b)
        for a in cfg.actions:
            r = old.pop(a.name, None)
            if r is None or r.cfg != a or (a.type == "fail2ban" and r.f2b.get(a.name) != f2b.get(a.name)):
                new = ActionRunner(a, f2b, self.execute, names=names.get(a.name, ()), host=self.host)
                stopping = None
                if r is not None:
                    stopping = self._stop(a.name, r)
                    new.stats = r.stats  # the counters go on (the old one's last runs and skips count there too)
                r = new
                changed.append(a.name)
                if self._tg is not None:
                    self._start(r, stopping)
            else:
                self._rename(r, names.get(a.name, ()))
            self.runners[a.name] = r
        for name, r in old.items():
            self._stop(name, r)
            changed.append(name)
        self.jail_actions = {j.name: [self.runners[n] for n in j.actions if n in self.runners] for j in cfg.jails}
        self.feed_actions = {f.name: [self.runners[n] for n in f.actions if n in self.runners] for f in cfg.feeds}
        self.fleet_actions = [self.runners[n] for n in cfg.fleet.actions if n in self.runners] \
            if cfg.fleet is not None else []
        # the same memory across reloads (a running JailRunner holds it); `or` would replace an empty one,
        # whose len() is 0, and the runner's lines would no longer reach the actions
        old_mem = self.memories
        self.memories = {j.name: m if (m := old_mem.get(j.name)) is not None else MatchMemory(j.ipv6_prefix)
                         for j in cfg.jails if j.actions}
        # Keeping lines costs a jail whose every line is a failure 25-35 % of its matching (docs/actions.md):
        # only jails with an action that shows them keep any. A reload may change that either way.
        for name, memory in self.memories.items():
            memory.keep = any(shows_lines(r.cfg, f2b) for r in self.jail_actions[name])
        return changed

    def memory(self, jail: str) -> MatchMemory | None:
        return self.memories.get(jail)

    def _start(self, r: ActionRunner, after: asyncio.Task[None] | None = None) -> None:
        assert self._tg is not None
        self._tasks[r.cfg.name] = self._tg.create_task(self._life(r, after), name=f"action-{r.cfg.name}")

    @staticmethod
    async def _life(r: ActionRunner, after: asyncio.Task[None] | None) -> None:
        if after is not None:  # the runner this one replaces runs its actionstop first, as in fail2ban
            await asyncio.wait({after})  # (not gather: cancelling this must not cancel that)
        await r.run()

    def _stop(self, name: str, r: ActionRunner) -> asyncio.Task[None] | None:
        """Retire a runner in a task of its own: its workers run what it had queued (up to RELOAD_DRAIN
        seconds; the rest is counted as skipped), then they are cancelled and its actionstop runs; returns that
        task (None when the hub is not running: the workers are cancelled at once)."""
        t = self._tasks.pop(name, None)
        if t is None:
            return None
        if self._tg is None:
            t.cancel()
            return None
        return self._retire(self._stop_after(t, r, RELOAD_DRAIN), name)

    def _retire(self, coro: Coroutine[None, None, None], name: str) -> asyncio.Task[None]:
        assert self._tg is not None
        task = self._tg.create_task(coro, name=f"action-{name}-stop")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        return task

    async def _stop_after(self, t: asyncio.Task[None], r: ActionRunner, drain: float) -> None:
        if not t.done():
            self._draining.add(r)
            idle = asyncio.ensure_future(r.idle())
            hurry = asyncio.ensure_future(self._hurry.wait())
            try:
                await asyncio.wait({idle, hurry}, timeout=drain, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self._draining.discard(r)
                idle.cancel()
                hurry.cancel()
                await asyncio.gather(idle, hurry, return_exceptions=True)
            t.cancel()  # what is still queued is counted as skipped ("stopping") by the runner
        await asyncio.wait({t})
        await r.stop()

    def _rename(self, r: ActionRunner, names: tuple[str, ...]) -> None:
        """A kept runner serves other jails after a reload: actionstop for the names gone, actionstart for the
        new ones (a jail added or removed starts or stops its actions in fail2ban)."""
        gone = [n for n in r.names if n not in names]
        new = [n for n in names if n not in r.names]
        r.names = names
        if self._tg is not None and r.life is not None and (gone or new):
            self._retire(self._restart_names(r, gone, new), r.cfg.name)

    @staticmethod
    async def _restart_names(r: ActionRunner, gone: list[str], new: list[str]) -> None:
        await r.stop(gone)
        if r.life is not None and not r.life.start_on_demand:
            await r.start(new)

    async def shutdown(self, grace: float, budget: float) -> None:
        """The daemon's stop, once the last bans were offered: the queues get `grace` seconds to drain (what is
        left then is counted as skipped), then every fail2ban action runs its actionstop, all in parallel within
        `budget` seconds (a buffered mail action mails what its buffer holds). A runner a reload retired just
        before and still draining gets the same `grace` (not what is left of RELOAD_DRAIN), so its actionstop
        runs beside the others within `budget`."""
        retiring = set(self._retiring)  # the done callbacks shrink the live set while we wait
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(self.idle(), *(r.idle() for r in self._draining)), grace)
        self._hurry.set()
        workers = list(self._tasks.values())
        self._tasks.clear()
        for t in workers:
            t.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        end = asyncio.get_running_loop().time() + budget
        await asyncio.gather(*(r.stop(budget=budget) for r in self.runners.values()))
        if retiring:  # a reload's actionstop still running: it gets what is left of the budget
            await asyncio.wait(retiring, timeout=max(0.0, end - asyncio.get_running_loop().time()))

    async def run(self) -> None:
        """Run every action's workers until cancelled; then the HTTP session is closed."""
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                self._hurry.clear()
                for r in self.runners.values():
                    self._start(r)
                await asyncio.Event().wait()  # the runners live in tg; this task only keeps it open
        finally:
            self._tg = None
            close = getattr(self.execute, "close", None)
            if close is not None:
                await close()

    async def idle(self) -> None:
        """Until every action has run what it had queued."""
        await asyncio.gather(*(r.idle() for r in self.runners.values()))

    # -- events -------------------------------------------------------------------------------------------

    @staticmethod
    def _offer(runners: Sequence[ActionRunner], event: str, n: int,
               make: Callable[[int], ActionEvent]) -> None:
        """Offer `n` events, built by `make(i)` only for the runners that can take them."""
        made: dict[int, ActionEvent] = {}  # each event built once, whichever runners take it

        def get(i: int) -> ActionEvent:
            ev = made.get(i)
            if ev is None:
                ev = made[i] = make(i)
            return ev

        for r in runners:
            if not r.accepts(event):
                continue
            room = min(n, r.room())
            for i in range(room):
                r.submit(get(i))
            if n > room:
                r.skip(n - room, "rate" if r.room() == 0 and not r.paced else "queue_full")

    def jail_bans(self, bans: Sequence[Ban], now: float) -> None:
        """The kernel holds these jail bans (kernel/sink.py `on_applied`)."""
        by_jail: dict[str, list[Ban]] = {}
        for b in bans:
            if self.jail_actions.get(b.jail):
                by_jail.setdefault(b.jail, []).append(b)
        for jail, bs in by_jail.items():
            memory = self.memories.get(jail)

            def make(i: int, bs: list[Ban] = bs, memory: MatchMemory | None = memory) -> ActionEvent:
                b = bs[i]
                recent = memory.take(b.target) if memory is not None else None
                return self._ban_event(b, now, recent.failures if recent else 0, recent.lines if recent else (),
                                       recent.fields if recent else ())

            self._offer(self.jail_actions[jail], "ban", len(bs), make)
            if memory is not None:  # lines of bans no runner took are not kept waiting
                for b in bs:
                    memory.take(b.target)

    def _ban_event(self, b: Ban, now: float, failures: int = 0, lines: tuple[str, ...] = (),
                   fields: tuple[tuple[str, str], ...] = ()) -> ActionEvent:
        return ActionEvent("ban", format_target(b.target), b.jail, b.blocklist, b.origin, b.reason,
                           None if b.until is None else _left(b.until, now), b.until, now, failures, lines,
                           fields, self.host)

    def unbanned(self, items: Iterable[tuple[str, IPNet, str, str, str]], now: float) -> None:
        """Jail bans that ended here: (jail, target, blocklist, origin, reason) - an unban or the ban's end."""
        by_jail: dict[str, list[tuple[str, IPNet, str, str, str]]] = {}
        for it in items:
            if self.jail_actions.get(it[0]):
                by_jail.setdefault(it[0], []).append(it)
        for jail, its in by_jail.items():
            def make(i: int, its: list[tuple[str, IPNet, str, str, str]] = its) -> ActionEvent:
                j, target, blocklist, origin, reason = its[i]
                return ActionEvent("unban", format_target(target), j, blocklist, origin, reason, None, None, now,
                                   host=self.host)

            self._offer(self.jail_actions[jail], "unban", len(its), make)

    def fleet_bans(self, n: int, make: Callable[[int], tuple[str, float | None, str]], blocklist: str,
                   now: float) -> None:
        """`n` bans received from other hosts are in the kernel; `make(i)`: (address, until, reason)."""
        def event(i: int) -> ActionEvent:
            addr, until, reason = make(i)
            return ActionEvent("ban", addr, "fleet", blocklist, "remote", reason,
                               None if until is None else _left(until, now), until, now, host=self.host)

        self._offer(self.fleet_actions, "ban", n, event)

    def fleet_unbans(self, nets: Sequence[IPNet], blocklist: str, now: float) -> None:
        self._offer(self.fleet_actions, "unban", len(nets), lambda i: ActionEvent(
            "unban", format_target(nets[i]), "fleet", blocklist, "remote", "fleet-wide unban", time=now,
            host=self.host))

    def feed_changes(self, feed: FeedConfig, added: Sequence[tuple[int, int]], removed: Sequence[tuple[int, int]],
                     now: float) -> None:
        """A feed refresh in the kernel added and removed these entries ((IP version, net key)s)."""
        runners = self.feed_actions.get(feed.name)
        if not runners:
            return
        until = ban_end(feed.ban_timeout, now)
        duration = None if until is None else _left(until, now)
        why = f"feed {feed.name}"

        def text(vk: tuple[int, int]) -> str:
            return format_target(key_net(vk[1], vk[0]))

        self._offer(runners, "ban", len(added), lambda i: ActionEvent(
            "ban", text(added[i]), "", feed.blocklist, "feed", why, duration, until, now, host=self.host))
        self._offer(runners, "unban", len(removed), lambda i: ActionEvent(
            "unban", text(removed[i]), "", feed.blocklist, "feed", why, time=now, host=self.host))


__all__ = ["ActionHub", "shows_lines"]
