"""Fleet test tools: a fake enforcer (`FakeSink`) and a `Host` bundling one fleet service with its state.

`FakeSink` keeps what a kernel set would: fleet-origin elements (net -> end) and local-origin bans
(net -> LocalBan), applying `FleetChange`s by the rules `FleetSink` documents, and records every call so a
test can check that one received batch was one transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from nftblockd.addr import IPNet, host_net
from nftblockd.allowlist import Allowlist, build_allowlist
from nftblockd.config import FleetConfig
from nftblockd.fleet.catchup import FleetBan, FleetChange, LocalBan
from nftblockd.fleet.link import RedisLink
from nftblockd.fleet.service import FleetService
from nftblockd.state.store import Store
from tests.helpers.store import memory_store


class FakeSink:
    def __init__(self) -> None:
        self.fleet: dict[IPNet, float] = {}
        self.origin: dict[IPNet, str] = {}
        self.local: dict[IPNet, LocalBan] = {}
        self.calls: list[FleetChange] = []

    async def apply_fleet(self, change: FleetChange) -> None:
        self.calls.append(change)
        bans = list(change.bans)
        bans += [FleetBan(host_net(k, h.version), e, h.origin) for h in change.hosts
                 for k, e in zip(h.keys, h.ends, strict=True)]
        for b in bans:
            lb = self.local.get(b.net)
            if lb is not None and lb.until >= b.until:
                continue
            if self.fleet.get(b.net, -math.inf) < b.until:
                self.fleet[b.net] = b.until
                self.origin[b.net] = b.origin
        for u in change.unbans:
            if u.owner is not None:  # a host's unban: only a fleet ban that host made
                if u.net in self.fleet and self.origin.get(u.net) == u.owner:
                    del self.fleet[u.net]
                continue
            self.fleet.pop(u.net, None)
            lb = self.local.get(u.net)
            if lb is not None and u.at is not None and lb.created < u.at:
                del self.local[u.net]

    async def fleet_view(self) -> tuple[Mapping[IPNet, float], Mapping[IPNet, LocalBan]]:
        return dict(self.fleet), dict(self.local)

    async def settled(self) -> None:
        pass  # applied and saved alike at once

    def has(self, net: IPNet) -> bool:
        return net in self.fleet or net in self.local


def fleet_config(name: str, host: str, url: str, **kw: object) -> FleetConfig:
    return replace(FleetConfig(name=name, host_id=host, url=url), **kw)  # type: ignore[arg-type]


class Host:
    """One fleet member without a kernel: service + FakeSink + its own state store."""

    def __init__(self, cfg: FleetConfig, *, store: Store | None = None, allow: Allowlist | None = None,
                 clock: Callable[[], float] = time.time, block_ms: int = 1000) -> None:
        self.cfg = cfg
        self.sink = FakeSink()
        self.store = store or memory_store()
        self.link = RedisLink(cfg, block_ms=block_ms)
        self.service = FleetService(cfg, self.link, self.store, self.sink, allow or build_allowlist([]),
                                    clock=clock, cursor_interval=0.0)
        self.task: asyncio.Task[None] | None = None

    def start(self) -> Host:
        self.task = asyncio.create_task(self.service.run())
        return self

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None
        await self.service.close()


async def joined(*hosts: Host, limit: float = 15.0) -> None:
    """Until every host is connected and follows every other's stream (schema 2: one per host, found by
    discovery, `FleetService._maintain`)."""
    await until(lambda: all(h.service.stats.connected and h.service.stats.members >= len(hosts) for h in hosts),
                limit, "all hosts follow each other")


async def until(pred: Callable[[], bool], limit: float = 15.0, what: str = "condition") -> None:
    """Poll `pred` every 10 ms for at most `limit` seconds (a bound, not a sleep)."""
    deadline = time.monotonic() + limit
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {limit}s")
        await asyncio.sleep(0.01)
