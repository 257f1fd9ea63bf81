"""The fleet counting service: jails hand it their counted failures; it appends them to this host's own failure
stream, reads every member's, and hands the bans its `Tally` decides to the daemon (fleet/counting.py has the
keys and the counting rules).

- Sending. `failure()` only adds to a dict (offender -> failures, first and last seen) and wakes the sender;
  the sender appends whatever gathered, in one round trip, as soon as the previous one returned. It paces itself
  to `count.rate` failures/s with a burst of `count.burst` (this host's own token bucket, its own clock): what
  the bucket does not allow yet waits in the queue (counted `deferred`) and goes out as it refills; nothing
  over the cap is dropped. At most `MAX_PENDING` offenders wait (beyond: counted `dropped`). A failure waits
  at most its jail's `fleet_findtime`: older, it could no longer count (counted `lost`).
- Receiving. One connection loops `XREAD BLOCK` over every member's failure stream (found by `SCAN` every
  `DISCOVER` seconds, at most `MAX_MEMBERS`), from `fleet_findtime` before the server's time on the first
  connect; the host of an entry is the stream it sits in. Each entry goes through `Tally.add`; the bans it
  completes (every host decides the same ones) go to `on_decided`.
- Server away. Failures keep queueing (each with the time it was seen, written as its age when sent), and are
  sent after the heal if still inside `fleet_findtime`; the reader continues from its cursors, so what the
  others sent meanwhile is counted too. Reconnects follow the ban link's schedule (`retry.retry_delay`: 0.2 s
  for the first 10 s of an outage, 0.5 s until 2 min), so counting is back within a second of a heal. Local
  detection (each jail's own maxretry) never depends on this service.

Never raises out of `run()` for a server problem; never touches the kernel or the database; reads the clock
only through `clock`.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: the counting loops and their reconnects)
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from nftblockd.addr import IPAddr, IPNet, format_target
from nftblockd.config import FleetConfig
from nftblockd.fleet.counting import (
    MAX_ITEMS,
    CountPolicy,
    Decided,
    Tally,
    encode_items,
    fail_key,
    fail_pattern,
    host_of_key,
    offender,
    parse_entry,
)
from nftblockd.fleet.countlink import CountEngine, Read
from nftblockd.fleet.link import FUTURE_MS, LinkError
from nftblockd.fleet.retry import retry_delay

log = logging.getLogger("nftblockd.fleet")

MAX_PENDING = 100_000  # offenders waiting to be sent
MAX_MEMBERS = 10_000  # failure streams read
DISCOVER = 2.0  # seconds between two looks for new members' streams
READ_COUNT = 1000  # entries per XREAD
TRIM_EVERY = 10.0  # seconds between two age trims of this host's stream


@dataclass(slots=True)
class CountStats:
    connected: bool = False
    sent: int = 0  # failures this host appended to its stream
    deferred: int = 0  # ... that waited for this host's rate cap first (sent later, never dropped)
    lost: int = 0  # ... that waited longer than fleet_findtime (a long outage) and were not sent
    dropped: int = 0  # ... dropped because MAX_PENDING offenders were waiting
    accepted: int = 0  # failures of all members counted here
    limited: int = 0  # ... refused: over their host's rate cap (a host that does not pace itself)
    skipped: int = 0  # ... of offenders banned already
    malformed: int = 0  # entry items that do not parse (never counted)
    future: int = 0  # entries whose id is more than FUTURE_MS ahead of the server's clock (never counted)
    evicted: int = 0  # offenders forgotten for memory
    decided: int = 0  # fleet-counted bans decided here (every host decides each one)
    crossed: int = 0  # ... of them crossed by this host's failure (this host publishes those)
    members: int = 0  # failure streams read
    connects: int = 0
    last_error: str = ""


class _Wait:
    __slots__ = ("capped", "first", "k", "last")

    def __init__(self, k: int, first: float, last: float, capped: bool = False) -> None:
        self.k, self.first, self.last = k, first, last
        self.capped = capped  # it waited for the rate cap (counted `deferred` when sent)


class FleetCounter:
    def __init__(self, cfg: FleetConfig, link: CountEngine, policies: Mapping[str, CountPolicy],
                 on_decided: Callable[[list[Decided]], None], *, clock: Callable[[], float] = time.monotonic,
                 discover: float = DISCOVER) -> None:
        self.cfg = cfg
        self.link = link
        self.policies = dict(policies)
        self.on_decided = on_decided
        self.clock = clock
        self.discover = discover
        self.stats = CountStats()
        self.tally = Tally(policies, cfg.count_rate, cfg.count_burst)
        self.key = fail_key(cfg.name, cfg.host_id)
        self._window_ms = int(max(p.findtime for p in policies.values()) * 1000) if policies else 0
        self._pending: dict[tuple[str, str], _Wait] = {}
        self._wake = asyncio.Event()
        self._tokens = float(cfg.count_burst)
        self._tokens_at = clock()
        self._cursors: dict[str, str] = {}
        self._server_ms = 0  # the server's time at the last connect, and when (this clock) it was read
        self._server_at = 0.0
        self._last_id_ms = 0
        self._trimmed_at = -TRIM_EVERY

    def failure(self, jail: str, host: IPAddr) -> None:
        """A jail counted a failure of `host` (hot path: a dict update; never raises)."""
        p = self.policies.get(jail)
        if p is None:
            return
        key = (jail, offender(host, p.ipv6_prefix))
        w = self._pending.get(key)
        now = self.clock()
        if w is None:
            if len(self._pending) >= MAX_PENDING:
                self.stats.dropped += 1
                return
            self._pending[key] = _Wait(1, now, now)
        else:
            w.k += 1
            w.last = now
        self._wake.set()

    async def run(self) -> None:
        down_since: float | None = None
        while True:
            try:
                self._server_ms = await self.link.connect()
                self._server_at = self.clock()
                st = self.stats
                st.connected = True
                st.connects += 1
                if down_since is not None:
                    log.info("fleet %s: counting failures again after %.1f s", self.cfg.name,
                             self.clock() - down_since)
                    down_since = None
                self._wake.set()  # what queued while away goes out now
                await self._online()
            except LinkError as exc:
                self.stats.connected = False
                self.stats.last_error = str(exc)
                now = self.clock()
                if down_since is None:
                    log.warning("fleet %s: counting paused, server unreachable (%s); failures are queued and "
                                "local detection goes on", self.cfg.name, exc)
                    down_since = now
                await self.link.close()
                await asyncio.sleep(retry_delay(now - down_since) * random.uniform(0.8, 1.2))

    async def _online(self) -> None:
        """The sender and the reader until one of them fails (LinkError, or a bug): both are stopped, and the
        failure raised. (Not a TaskGroup: one whose child fails while it is being cancelled raises the failure and
        loses the cancellation.)"""
        tasks = [asyncio.ensure_future(self._send_loop()), asyncio.ensure_future(self._read_loop())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in done:
            exc = t.exception()
            if exc is not None:
                raise exc

    # -- sending -----------------------------------------------------------------------------------------

    def _refill(self, now: float) -> float:
        cfg = self.cfg
        self._tokens = min(float(cfg.count_burst), self._tokens + (now - self._tokens_at) * cfg.count_rate)
        self._tokens_at = now
        return self._tokens

    def _expire(self, now: float) -> None:
        for key in [k for k, w in self._pending.items() if now - w.last > self.policies[k[0]].findtime]:
            self.stats.lost += self._pending.pop(key).k

    async def _send_loop(self) -> None:
        # an empty entry makes the stream exist, so the others find this member before its first failure
        await self._append({"": []})
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = self.clock()
            self._expire(now)
            tokens = self._refill(now)
            # over the cap: wait for a tenth of the burst (or all that waits), not for each token
            need = min(sum(w.k for w in self._pending.values()), max(1, self.cfg.count_burst // 10))
            if tokens < need:
                for w in self._pending.values():
                    w.capped = True
                await asyncio.sleep((need - tokens) / self.cfg.count_rate)
                continue
            budget = int(tokens)
            by_jail: dict[str, list[tuple[str, int, int]]] = {}
            taken: list[tuple[tuple[str, str], _Wait, int]] = []
            for key, w in list(self._pending.items()):
                if budget <= 0:
                    break
                k = min(w.k, budget)
                budget -= k
                taken.append((key, w, k))
                age = int((now - w.first) * 1000)
                by_jail.setdefault(key[0], []).append((key[1], k, age if age >= 1000 else 0))
                if k == w.k:
                    del self._pending[key]
                else:
                    w.k -= k
            n = sum(k for _key, _w, k in taken)
            self._tokens -= n
            try:
                await self._append(by_jail)
            except LinkError:
                for key, w, k in taken:  # back at the head of the queue, with the time they were seen
                    cur = self._pending.get(key)
                    if cur is None:
                        self._pending[key] = _Wait(k, w.first, w.last, w.capped)
                    else:
                        cur.k += k
                        cur.first = min(cur.first, w.first)
                self._pending = dict(sorted(self._pending.items(), key=lambda kv: kv[1].first))
                raise
            self.stats.sent += n
            self.stats.deferred += sum(k for _key, w, k in taken if w.capped)
            if budget <= 0:
                for w in self._pending.values():
                    w.capped = True

    async def _append(self, by_jail: Mapping[str, list[tuple[str, int, int]]]) -> None:
        entries = [encode_items(j, items[i:i + MAX_ITEMS]) for j, items in by_jail.items()
                   for i in range(0, max(1, len(items)), MAX_ITEMS)]
        now = self.clock()
        trim = None
        if self._last_id_ms and now - self._trimmed_at >= TRIM_EVERY:
            trim = f"{max(0, self._last_id_ms - self._window_ms)}-0"
            self._trimmed_at = now
        last = await self.link.append(self.key, entries, trim)
        ms = last.partition("-")[0]
        if ms.isdigit():
            self._last_id_ms = int(ms)

    # -- receiving -----------------------------------------------------------------------------------------

    def _server_now_ms(self) -> int:
        return self._server_ms + int((self.clock() - self._server_at) * 1000)

    def _tally_read(self, got: Read) -> list[Decided]:
        """One read's entries into the tally (cursors moved past each); the crossings they made."""
        decided: list[Decided] = []
        # a member chooses its own ids (XADD with an explicit id): one far ahead would end a ban decades on
        future = self._server_now_ms() + FUTURE_MS
        for key, entries in got:
            host = host_of_key(self.cfg.name, key)
            if host is None:
                continue
            for sid, fields in entries:
                self._cursors[key] = sid
                ms = sid.partition("-")[0]
                parsed = parse_entry(fields, self.policies) if ms.isdigit() else ([], 1)
                if parsed is None:
                    continue
                if ms.isdigit() and int(ms) > future:
                    self.stats.future += 1
                    continue
                items, bad = parsed
                self.stats.malformed += bad
                if items:
                    decided += self.tally.add(host, int(ms), items)
        return decided

    async def _read_loop(self) -> None:
        name = self.cfg.name
        next_look = self.clock()
        floor = f"{max(0, self._server_now_ms() - self._window_ms)}-0"
        for k, cur in self._cursors.items():  # after a long outage: nothing older than the window
            if int(cur.partition("-")[0]) < int(floor.partition("-")[0]):
                self._cursors[k] = floor
        while True:
            if self.clock() >= next_look:
                for k in await self.link.members(fail_pattern(name), MAX_MEMBERS,
                                                 lambda k: host_of_key(name, k) is not None):
                    if k not in self._cursors:
                        self._cursors[k] = f"{max(0, self._server_now_ms() - self._window_ms)}-0"
                self.stats.members = len(self._cursors)
                next_look = self.clock() + self.discover
            block = max(1, int(min(1.0, max(0.0, next_look - self.clock())) * 1000))
            decided = self._tally_read(await self.link.read(self._cursors, READ_COUNT, block))
            self._sync_tally()
            if decided:
                now_s = self._server_now_ms() / 1000
                live = [d for d in decided if d.until > now_s]  # a replay's old crossings: over already
                self.stats.decided += len(live)
                self.stats.crossed += sum(1 for d in live if d.by == self.cfg.host_id)
                if live:
                    try:
                        self.on_decided(live)
                    except Exception:
                        log.exception("applying %d fleet-counted bans failed", len(live))

    def _sync_tally(self) -> None:
        t, st = self.tally.stats, self.stats
        st.accepted, st.limited, st.skipped, st.evicted = t.accepted, t.limited, t.skipped, t.evicted

    # -- for the operator ---------------------------------------------------------------------------------

    def forget(self, net: IPNet) -> None:
        """A ban of `net` was lifted: its fleet count starts from nothing."""
        for jail in self.policies:
            self.tally.forget(jail, format_target(net) if net.prefixlen != net.max_prefixlen
                              else str(net.network_address))

    async def seen(self, target: IPNet) -> dict[str, Any]:
        """For `nftblock check`: per jail with fleet counting, which hosts' failures of `target` this host counts
        (and, while banned, the decision)."""
        single = target.prefixlen == target.max_prefixlen
        out: dict[str, Any] = {}
        for jail, p in self.policies.items():
            text = offender(target.network_address, p.ipv6_prefix) if single else format_target(target)
            v = self.tally.seen(jail, text)
            if v:
                out[jail] = v
        return out

    def status(self) -> dict[str, Any]:
        d = asdict(self.stats)
        d["pending"] = sum(w.k for w in self._pending.values())
        d["tracked"] = len(self.tally)
        d["jails"] = {j: {"fleet_maxretry": p.maxretry, "fleet_findtime": p.findtime, "share": p.share}
                      for j, p in self.policies.items()}
        return d


__all__ = ["CountStats", "FleetCounter"]
