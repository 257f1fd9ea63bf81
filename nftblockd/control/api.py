"""The control socket's command handler: protocol requests in, enforcer calls out.

Knows the protocol's argument and result shapes (control/protocol.py) and the enforcer's API; it owns no
state of its own apart from what `status` reports.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from nftblockd import __version__
from nftblockd.addr import (
    AddressError,
    HostBitsError,
    IPNet,
    format_host,
    format_target,
    host_net,
    parse_target,
    split_hosts,
    split_packed6,
    unpack_hosts,
)
from nftblockd.control.protocol import (
    BanArgs,
    BanItem,
    CheckArgs,
    ControlError,
    FeedsRefreshArgs,
    ListArgs,
    UnbanArgs,
    UniformItems,
    ban_entry,
    parse_args,
    resolve_timeout,
)
from nftblockd.control.server import Peer
from nftblockd.control.wire import one_line
from nftblockd.durations import ban_end
from nftblockd.events import Ban, Decision, Origin, Unban
from nftblockd.kernel.bans import BanOutcome
from nftblockd.kernel.enforcer import BulkResult, Enforcer
from nftblockd.neverban import never_ban_range

Extra = Callable[[], dict[str, Any]]
Banned = Callable[[list[tuple[IPNet, float | None, str]], float], None]  # (target, end, src) applied here, now
Unbanned = Callable[[list[IPNet], str], None]  # targets an operator unbanned, src
Adopted = Callable[[list[Ban], float], None]  # bans taken over from fail2ban for a jail, applied here, now
_APPLIED = (BanOutcome.ADDED, BanOutcome.EXTENDED, BanOutcome.ABSORBED)
BULK_THRESHOLD = 64  # from this many targets on, single addresses take the bulk path
# Targets of one request that are neither addresses nor CIDRs before the request is refused whole: a raw
# client's `ban` of 1M invalid targets stalled the event loop for 5 s and peaked at 650 MB of refusals.
MAX_INVALID_TARGETS = 1000



def _add_packed(a: BanArgs, keys: dict[int, list[int]], texts: dict[int, dict[int, str]]) -> None:
    """A bulk ban's `hosts4`/`hosts6`, already packed by the client (no text to parse), added to the host
    keys `split_hosts` read from its `targets` (duplicates are merged by the state); an IPv4-mapped address
    is the IPv4 address, as in text. Spelled canonically when the answer echoes the targets."""
    mapped, packed6 = split_packed6(a.hosts6) if a.hosts6 else ([], [])
    for version, packed in ((4, unpack_hosts(a.hosts4, 4) + mapped if a.hosts4 else mapped), (6, packed6)):
        if packed:
            keys[version] = packed + keys[version] if keys[version] else packed
            if a.reply != "counts":
                spelled = texts[version]
                spelled.update((k, format_host(k, version)) for k in packed if k not in spelled)


def _reply(out: dict[str, Any], reply: str, key: str) -> dict[str, Any]:
    """`reply: counts`: `key` (applied, removed) becomes `<key>_count`; the failures stay listed."""
    if reply == "counts":
        done = out.pop(key)
        out[f"{key}_count"] = done if isinstance(done, int) else len(done)
    return out


class ControlAPI:
    def __init__(self, enforcer: Enforcer, *, default_blocklist: str,
                 status_extra: Extra | None = None,
                 feeds: Callable[[], list[dict[str, Any]]] | None = None,
                 feeds_refresh: Callable[[str, bool], Awaitable[dict[str, Any]]] | None = None,
                 reload: Callable[[], Awaitable[tuple[bool, str]]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.enforcer = enforcer
        self._reload = reload
        self.default_blocklist = default_blocklist
        self._clock = clock  # wall clock: ban ends, `expires_in`, uptime (tests freeze it)
        self.started = clock()
        self._status_extra = status_extra
        self._feeds = feeds
        self._feeds_refresh = feeds_refresh
        self._feed_owned: set[str] = set()
        self._fleet: Extra | None = None
        self._banned: Banned | None = None
        self._unbanned: Unbanned | None = None
        # Bans taken over from fail2ban (`origin: fail2ban` with a jail, as `nftblock import-fail2ban` sends
        # them), once applied: the daemon makes them the jail's own (tracker state, escalation history)
        self.adopted: Adopted | None = None
        self.check_more: Callable[[IPNet], Awaitable[dict[str, Any]]] | None = None

    async def __call__(self, cmd: str, args: dict[str, Any], peer: Peer) -> dict[str, Any]:
        parsed = parse_args(cmd, args)
        if cmd == "ping":
            return {"pong": True, "version": __version__}
        if cmd == "ban":
            assert isinstance(parsed, BanArgs)
            return await self.ban(parsed)
        if cmd == "unban":
            assert isinstance(parsed, UnbanArgs)
            return await self.unban(parsed)
        if cmd == "list":
            assert isinstance(parsed, ListArgs)
            return self.list(parsed)
        if cmd == "check":
            assert isinstance(parsed, CheckArgs)
            return await self._check(parsed)
        if cmd == "status":
            return await self.status()
        if cmd == "feeds":
            return {"feeds": self._feeds() if self._feeds else []}
        if cmd == "fleet":
            return {"fleet": self._fleet() if self._fleet else None}
        if cmd == "reload":
            if self._reload is None:
                raise ControlError("unavailable", "this daemon cannot reload (started without a config file)")
            ok, message = await self._reload()
            if not ok:
                raise ControlError("refused", message)
            return {"reloaded": True, "message": message}
        if cmd in ("feeds_refresh", "feeds_accept"):
            assert isinstance(parsed, FeedsRefreshArgs)
            if self._feeds_refresh is None:
                raise ControlError("not_found", f"no feed named {parsed.name!r} (no feeds configured)")
            try:
                return await self._feeds_refresh(parsed.name, cmd == "feeds_accept")
            except LookupError as exc:  # feeds.manager.FeedNotFound: a name or held copy that does not exist
                raise ControlError("not_found", str(exc)) from None
        raise ControlError("bad_request", f"unknown command {cmd!r}")

    def set_feeds(self, status: Callable[[], list[dict[str, Any]]],
                  refresh: Callable[[str, bool], Awaitable[dict[str, Any]]], owned: set[str]) -> None:
        self._feeds = status
        self._feeds_refresh = refresh
        self._feed_owned = owned

    def set_fleet(self, status: Extra, banned: Banned, unbanned: Unbanned) -> None:
        """Fleet mode: what `fleet` reports, and where bans and unbans made here go once applied."""
        self._fleet = status
        self._banned = banned
        self._unbanned = unbanned

    def _blocklist(self, name: str | None, *, writing: bool = False) -> str:
        bl = name or self.default_blocklist
        if writing and bl in self._feed_owned:
            raise ControlError("unknown_set", f"blocklist {bl!r} is managed by feeds; ban into another blocklist")
        try:
            self.enforcer.cfg.blocklist(bl)
        except KeyError:
            known = ", ".join(b.name for b in self.enforcer.cfg.blocklists)
            raise ControlError("unknown_set", f"unknown set {bl!r} (blocklists: {known})") from None
        return bl

    def _families(self) -> dict[str, int]:
        """Set name -> IP version, from the set specs (the family is data, never read off a set's name)."""
        return {s.name: s.version for s in self.enforcer.plan.sets}

    async def ban(self, a: BanArgs) -> dict[str, Any]:
        blocklist = self._blocklist(a.blocklist, writing=True)
        if a.hosts4 or a.hosts6 or (len(a.items) >= BULK_THRESHOLD and
                        (a.uniform or len({(i.timeout, i.reason, i.jail) for i in a.items}) == 1)):
            return _reply(await self.ban_bulk(a, blocklist), a.reply, "applied")
        if len(a.items) > MAX_INVALID_TARGETS:
            _refuse_many_invalid("ban", [item.target for item in a.items], len(a.items))
        return _reply(await self._ban_one_by_one(a.items, blocklist, a.origin), a.reply, "applied")

    async def _ban_one_by_one(self, items: Sequence[BanItem], blocklist: str, origin_text: str) -> dict[str, Any]:
        default_timeout = self.enforcer.cfg.blocklist(blocklist).timeout
        now = self._clock()
        decisions: list[Decision] = []
        refused: list[dict[str, Any]] = []
        comment = ""
        host_bits = 0
        for item in items:
            try:
                target = parse_target(item.target)
            except AddressError as exc:
                # host bits set: refused like any invalid target, never widened; counted apart (docs/addresses.md)
                host_bits += isinstance(exc, HostBitsError)
                refused.append({"target": item.target, "code": "invalid_address", "message": str(exc)})
                continue
            until = ban_end(resolve_timeout(item.timeout, default_timeout), now)
            origin = "fail2ban" if origin_text == "fail2ban" else "cli"
            decisions.append(Ban(target, blocklist, until, origin, item.reason, item.jail))  # type: ignore[arg-type]
            comment = comment or item.reason
        self.enforcer.count_refused("host_bits", host_bits)
        results = await self.enforcer.apply(decisions, comment=comment[:200], now=now)
        if self.adopted is not None and origin_text == "fail2ban":
            taken = [d for d, r in zip(decisions, results, strict=True)
                     if isinstance(d, Ban) and d.jail and r.code is None and r.outcome in _APPLIED]
            if taken:
                self.adopted(taken, now)
        if self._banned is not None:
            self._banned([(d.target, d.until, d.origin) for d, r in zip(decisions, results, strict=True)
                          if isinstance(d, Ban) and r.code is None and r.outcome in _APPLIED], now)
        applied = []
        notes = []
        for r in results:
            if r.code is None:
                applied.append(format_target(r.target))
                if r.message:
                    notes.append({"target": format_target(r.target), "message": r.message})
            else:
                refused.append({"target": format_target(r.target), "code": r.code, "message": r.message})
        out: dict[str, Any] = {"applied": applied, "refused": refused}
        if notes:
            out["notes"] = notes
        return out

    def _adopt_hosts(self, res: BulkResult, family: dict[str, int], blocklist: str, until: float | None,
                     item: BanItem | UniformItems, now: float) -> None:
        """`adopted` for what a bulk ban of fail2ban's applied (`res`): each address one Ban of `item`'s jail."""
        assert self.adopted is not None
        taken = [Ban(host_net(k, family[c.set_name]), blocklist, until, "fail2ban", item.reason, item.jail)
                 for c in res.changes for k in (*c.new, *c.extended) if (c.set_name, k) not in res.failed]
        if taken:
            self.adopted(taken, now)

    async def ban_bulk(self, a: BanArgs, blocklist: str) -> dict[str, Any]:
        """Many targets with the same timeout and reason: single addresses take the set-at-a-time path.

        With `reply: counts` the applied targets are only counted (`applied` is then a count until `_reply`
        renames it): echoing 100,000 strings was a tenth of `nftblock ban -`'s time on both ends."""
        first = a.items if isinstance(a.items, UniformItems) else a.items[0]  # the one timeout, reason, jail
        default_timeout = self.enforcer.cfg.blocklist(blocklist).timeout
        now = self._clock()
        until = ban_end(resolve_timeout(first.timeout, default_timeout), now)
        given = a.items.targets if isinstance(a.items, UniformItems) else [item.target for item in a.items]
        keys, texts, rest_at = split_hosts(given, spelled=a.reply != "counts")
        _refuse_many_invalid("ban", [given[i] for i in rest_at], len(given))
        rest = [a.items[i] for i in rest_at]
        if a.hosts4 or a.hosts6:
            _add_packed(a, keys, texts)
        origin = "fail2ban" if a.origin == "fail2ban" else "cli"
        res = await self.enforcer.ban_hosts(blocklist, keys, until, origin=origin, reason=first.reason,
                                            jail=first.jail, comment=first.reason[:200], now=now)
        refused: list[dict[str, Any]] = []
        for version, never in res.never_ban.items():
            for k in dict.fromkeys(never):  # a key given twice is refused once
                t = format_host(k, version)
                refused.append({"target": t, "code": "never_ban",
                                "message": f"{t} is never banned: {never_ban_range(version, k, k)}"})
        allow = self.enforcer.allow
        for version, allowed in res.allowlisted.items():
            for k in dict.fromkeys(allowed):
                t = format_host(k, version)  # the entry is looked up again only for the refused
                refused.append({"target": t, "code": "allowlisted",
                                "message": f"{t} is allowlisted ({allow.contains_range(version, k, k)}); never banned"})
        failed_keys = set()
        family = self._families()
        if self.adopted is not None and origin == "fail2ban" and first.jail:
            self._adopt_hosts(res, family, blocklist, until, first, now)
        if self._banned is not None:
            self._banned([(host_net(k, family[c.set_name]), until, origin) for c in res.changes
                          for k in (*c.new, *c.extended) if (c.set_name, k) not in res.failed], now)
        for (set_name, k), (code, msg) in res.failed.items():
            version = family[set_name]
            failed_keys.add((version, k))
            refused.append({"target": format_host(k, version), "code": code, "message": msg})
        out: dict[str, Any] = {"refused": refused}
        if a.reply == "counts":
            out["applied"] = sum(len(c.new) + len(c.extended) + len(c.unchanged) for c in res.changes) - \
                len(failed_keys)
        else:
            applied: list[str] = []
            for c in res.changes:
                version = family[c.set_name]
                spelled = texts[version]
                for part in (c.new, c.extended, c.unchanged):
                    applied += [spelled[k] for k in part if (version, k) not in failed_keys] if failed_keys \
                        else map(spelled.__getitem__, part)
            out["applied"] = applied
        if rest:
            for i in range(0, len(rest), BULK_THRESHOLD - 1):
                more = await self._ban_one_by_one(rest[i:i + BULK_THRESHOLD - 1], blocklist, a.origin)
                out["applied"] += len(more["applied"]) if a.reply == "counts" else more["applied"]
                out["refused"] += more["refused"]
                if "notes" in more:
                    out.setdefault("notes", []).extend(more["notes"])
        return out

    async def unban(self, a: UnbanArgs) -> dict[str, Any]:
        blocklists = [self._blocklist(a.blocklist)] if a.blocklist else [b.name for b in self.enforcer.cfg.blocklists]
        if len(a.targets) >= BULK_THRESHOLD:
            return _reply(await self.unban_bulk(a, blocklists), a.reply, "removed")
        return _reply(await self._unban_one_by_one(a, blocklists), a.reply, "removed")

    async def _unban_one_by_one(self, a: UnbanArgs, blocklists: list[str]) -> dict[str, Any]:
        decisions: list[Decision] = []
        bad: list[dict[str, Any]] = []
        origin: Origin = "fail2ban" if a.origin == "fail2ban" else "cli"
        for t in a.targets:
            try:
                target = parse_target(t)
            except AddressError as exc:
                bad.append({"target": t, "code": "invalid_address", "message": str(exc)})
                continue
            decisions += [Unban(target, bl, origin, jail=a.jail) for bl in blocklists]
        results = await self.enforcer.apply(decisions)
        if self._unbanned is not None:  # fleet-wide, whether this host held the ban or not
            self._unbanned(list({d.target: None for d in decisions}), origin)
        removed: dict[str, None] = {}
        not_found: dict[str, str] = {}
        for r in results:
            name = format_target(r.target)
            if r.outcome is BanOutcome.REMOVED:
                removed[name] = None
            elif r.message and (name not in not_found or "inside" in r.message):
                not_found[name] = r.message
            else:
                not_found.setdefault(name, r.message)
        nf = [t for t in not_found if t not in removed]
        out: dict[str, Any] = {"removed": list(removed), "not_found": nf}
        msgs = {t: not_found[t] for t in nf if "inside" in not_found[t]}
        if msgs:
            out["messages"] = msgs
        if bad:
            out["refused"] = bad
        return out

    async def unban_bulk(self, a: UnbanArgs, blocklists: list[str]) -> dict[str, Any]:
        keys, texts, rest_at = split_hosts(a.targets)
        rest = [a.targets[i] for i in rest_at]
        _refuse_many_invalid("unban", rest, len(a.targets))
        removed: dict[str, None] = {}
        family = self._families()
        if self._unbanned is not None:
            self._unbanned([host_net(k, v) for v, ks in keys.items() for k in ks], a.origin)
        for bl in blocklists:
            for set_name, gone, _missing in await self.enforcer.unban_hosts(bl, keys, origin=a.origin,
                                                                             jail=a.jail):
                spelled = texts[family[set_name]]
                removed.update(dict.fromkeys(spelled[k] for k in gone))
        out: dict[str, Any] = {"removed": list(removed), "not_found": [
            t for v in (4, 6) for t in texts[v].values() if t not in removed]}
        for i in range(0, len(rest), BULK_THRESHOLD - 1):
            more = await self._unban_one_by_one(UnbanArgs(tuple(rest[i:i + BULK_THRESHOLD - 1]), a.blocklist,
                                                          a.origin, a.jail), blocklists)
            out["removed"] += more["removed"]
            out["not_found"] += more["not_found"]
            if "messages" in more:
                out.setdefault("messages", {}).update(more["messages"])
            if "refused" in more:
                out.setdefault("refused", []).extend(more["refused"])
        return out

    def list(self, a: ListArgs) -> dict[str, Any]:
        bl = self._blocklist(a.blocklist) if a.blocklist else None
        now = self._clock()
        bans = [ban_entry(info, now) for info in self.enforcer.state.iter_bans(bl)
                if info.until is None or info.until > now]
        bans.sort(key=lambda b: (b["blocklist"], b["set"], b["target"]))
        return {"bans": bans}

    async def _check(self, a: CheckArgs) -> dict[str, Any]:
        out = self.check(a)
        if self.check_more is not None:  # fleet counting: which hosts saw it (asks the fleet server)
            out.update(await self.check_more(parse_target(out["target"])))
        return out

    def check(self, a: CheckArgs) -> dict[str, Any]:
        try:
            target: IPNet = parse_target(a.target)
        except AddressError as exc:
            raise ControlError("invalid_address", str(exc)) from None
        now = self._clock()
        allow = self.enforcer.allow.contains(target)
        bans = [ban_entry(info, now) for info in self.enforcer.state.covering(target)
                if info.until is None or info.until > now]
        return {"target": format_target(target), "allowlisted": None if allow is None else str(allow), "bans": bans}

    async def status(self) -> dict[str, Any]:
        e = self.enforcer
        counts = await e.kernel_counts()
        ours = e.state.counts()
        sets = []
        for s in e.plan.sets:
            sets.append({
                "name": s.name, "blocklist": s.blocklist or "allow", "family": f"ipv{s.version}",
                "kind": s.kind, "elements": counts.get(s.name), "tracked": ours.get(s.name), "size": s.size,
            })
        b = e.batcher
        out: dict[str, Any] = {
            "version": __version__,
            "uptime": round(self._clock() - self.started, 3),
            "table": f"inet {e.plan.table}",
            "kernel": e.features.describe() if e.features is not None else {},
            "sets": sets,
            "batches": {"flushes": b.flushes, "ops": b.ops_flushed, "pending": b.pending(),
                        "failures": b.failures, "last_seconds": round(e.counters.last_batch_seconds, 6),
                        "max_ops": b.max_ops, "delay": b.delay},
            "errors": {"kernel": {str(k): v for k, v in e.counters.kernel_errors.items()},
                       "set_full": e.counters.set_full, "refused": e.counters.refused,
                       "allowlisted": e.counters.allowlisted, "rebuilds": e.counters.rebuilds,
                       "drift_repaired": e.counters.drift_repaired, "adopted": e.counters.adopted,
                       "unbannable_removed": e.counters.unbannable_removed},
            "jails": [],
            "feeds": self._feeds() if self._feeds else [],
        }
        if self._status_extra:
            out.update(self._status_extra())
        return out


def _refuse_many_invalid(cmd: str, texts: Sequence[str], total: int) -> None:
    """ControlError (nothing applied) once more than MAX_INVALID_TARGETS of `texts` are not targets: the scan
    stops there, so a request of a million invalid strings costs a thousand parses, not a million refusals."""
    bad = 0
    first = ""
    for t in texts:
        try:
            parse_target(t)
        except AddressError:
            bad += 1
            first = first or t
            if bad > MAX_INVALID_TARGETS:
                raise ControlError("bad_request", f"{cmd}: more than {MAX_INVALID_TARGETS} of the {total} "
                                   f"targets are not addresses or CIDR ranges (the first: "
                                   f"{one_line(first, 60)!r}); nothing was applied") from None
