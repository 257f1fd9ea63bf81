"""The fleet counting service: jails hand it their counted failures; it sends them to the server in batches and
hands the bans its calls decided to the daemon (fleet/counting.py has the rules and the script).

- Batching. `failure()` only adds to a dict (offender -> failures) and wakes the loop; the loop sends
  whatever gathered, in one script call, as soon as the previous call returned. At a trickle a failure goes
  out alone, at once; under a burst the calls grow instead of queueing. At most `MAX_BATCH` offenders per
  call; at most `MAX_PENDING` offenders wait (beyond: counted `dropped`).
- Decisions. A ban this host's call decided is handed to `on_decided` (the daemon applies it here, through
  the enforcer); the other hosts get it from the event stream, where the script put it.
- Server down. Failures gathered while the server is unreachable are dropped and counted (`lost`): counted
  later, on the server's clock, they would land in the wrong window. Local detection (each jail's own
  maxretry) never depends on this service. It reconnects with the fleet's backoff (0.5 s doubling to 30 s)
  and counting resumes.

Never raises out of `run()` for a server problem; never touches the kernel or the database.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: the counting loop and its reconnects)
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from nftblockd.addr import IPAddr, IPNet, format_target
from nftblockd.config import FleetConfig
from nftblockd.fleet.counting import (
    CountPolicy,
    Decided,
    build_call,
    count_key,
    decision_key,
    offender,
    parse_reply,
    parse_seen,
)
from nftblockd.fleet.link import LinkError

log = logging.getLogger("nftblockd.fleet")

MAX_BATCH = 2000
MAX_PENDING = 100_000
BACKOFF_FIRST = 0.5
BACKOFF_CAP = 30.0
SEEN_TIMEOUT = 2.0


class Counter(Protocol):
    async def connect(self) -> None: ...
    async def close(self) -> None: ...
    async def count(self, keys: Sequence[str], argv: Sequence[str]) -> Any: ...
    async def seen(self, decision_key: str, count_key: str) -> tuple[Any, list[Any]]: ...


@dataclass(slots=True)
class CountStats:
    connected: bool = False
    sent: int = 0  # failures sent to the server
    accepted: int = 0  # ... counted there
    limited: int = 0  # ... refused by this host's rate limit
    skipped: int = 0  # ... of offenders already banned fleet-wide
    malformed: int = 0  # members no host of ours wrote, removed from count keys
    bad_reply: int = 0  # decisions in a reply that did not parse
    decided: int = 0  # bans this host's calls decided
    lost: int = 0  # failures dropped while the server was unreachable
    dropped: int = 0  # failures dropped because MAX_PENDING offenders were waiting
    calls: int = 0
    last_error: str = ""


class FleetCounter:
    def __init__(self, cfg: FleetConfig, link: Counter, policies: Mapping[str, CountPolicy],
                 on_decided: Callable[[list[Decided]], None]) -> None:
        self.cfg = cfg
        self.link = link
        self.policies = dict(policies)
        self.on_decided = on_decided
        self.stats = CountStats()
        self._by_src = {f"count:{j}": j for j in policies}
        self._pending: dict[tuple[str, str], int] = {}
        self._wake = asyncio.Event()
        self._online = False

    def failure(self, jail: str, host: IPAddr) -> None:
        """A jail counted a failure of `host` (hot path: a dict update; never raises)."""
        p = self.policies.get(jail)
        if p is None:
            return
        key = (jail, offender(host, p.ipv6_prefix))
        pending = self._pending
        n = pending.get(key)
        if n is None:
            if len(pending) >= MAX_PENDING:
                self.stats.dropped += 1
                return
            pending[key] = 1
        else:
            pending[key] = n + 1
        self._wake.set()

    async def run(self) -> None:
        delay = BACKOFF_FIRST
        down_logged = False
        while True:
            try:
                await self.link.connect()
                self._online = self.stats.connected = True
                if down_logged:
                    log.info("fleet %s: counting failures again", self.cfg.name)
                    down_logged = False
                delay = BACKOFF_FIRST
                self._drop_pending()  # gathered while offline: see the module rules
                while True:
                    await self._wake.wait()
                    self._wake.clear()
                    while self._pending:
                        await self._send()
            except LinkError as exc:
                self._online = self.stats.connected = False
                self.stats.last_error = str(exc)
                if not down_logged:
                    log.warning("fleet %s: counting paused, server unreachable (%s); local detection goes on",
                                self.cfg.name, exc)
                    down_logged = True
                await self.link.close()
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, BACKOFF_CAP)

    def _drop_pending(self) -> None:
        self.stats.lost += sum(self._pending.values())
        self._pending.clear()

    async def _send(self) -> None:
        items: dict[tuple[str, str], int] = {}
        pending = self._pending
        for key in list(pending)[:MAX_BATCH]:
            items[key] = pending.pop(key)
        n = sum(items.values())
        self.stats.sent += n
        self.stats.calls += 1
        keys, argv = build_call(self.cfg.name, self.cfg.host_id, self.cfg.count_rate, self.cfg.count_burst,
                                self.cfg.history, items, self.policies)
        try:
            raw = await self.link.count(keys, argv)
        except LinkError:
            self.stats.lost += n
            raise
        r = parse_reply(raw, self._by_src)
        st = self.stats
        st.accepted += r.accepted
        st.limited += r.limited
        st.skipped += r.skipped
        st.malformed += r.malformed
        st.bad_reply += r.bad_reply
        if r.decided:
            st.decided += len(r.decided)
            try:
                self.on_decided(r.decided)
            except Exception:
                log.exception("applying %d fleet-counted bans failed", len(r.decided))

    async def seen(self, target: IPNet) -> dict[str, Any]:
        """For `nftblock check`: per jail with fleet counting, which hosts saw failures of `target` (pending
        count and, when decided, the decision)."""
        if not self._online:
            return {"error": "not connected to the fleet server"}
        single = target.prefixlen == target.max_prefixlen
        out: dict[str, Any] = {}
        try:
            for jail, p in self.policies.items():
                text = offender(target.network_address, p.ipv6_prefix) if single else format_target(target)
                decision, members = await asyncio.wait_for(
                    self.link.seen(decision_key(self.cfg.name, jail, text), count_key(self.cfg.name, jail, text)),
                    SEEN_TIMEOUT)
                if decision is not None or members:
                    out[jail] = parse_seen(decision, members)
        except (LinkError, TimeoutError) as exc:
            return {"error": str(exc) or "timed out"}
        return out

    def status(self) -> dict[str, Any]:
        d = asdict(self.stats)
        d["pending"] = sum(self._pending.values())
        d["jails"] = {j: {"fleet_maxretry": p.maxretry, "fleet_findtime": p.findtime} for j, p in self.policies.items()}
        return d


__all__ = ["CountStats", "FleetCounter"]
