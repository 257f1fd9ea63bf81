"""The real control API on a real Enforcer over the in-memory SetWriter (tests/helpers/fakekernel.py), for
unit tests without root: `api_rig()` builds it from a config text, with a frozen wall clock the test moves;
`serve()` puts it behind a real ControlServer on a UNIX socket and records the requests the server hands it.

Nothing here answers a command: every answer comes from nftblockd.control.api.ControlAPI. Fake is only what
the daemon would hand the API: the kernel (FakeSetWriter), the feeds (a status/refresh pair with fixed rows)
and, when a test passes one, the daemon's extra status (jails, store).
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nftblockd.addr import format_target, parse_target
from nftblockd.allowlist import build_allowlist
from nftblockd.config import Config, parse_config
from nftblockd.control.api import ControlAPI
from nftblockd.control.server import ControlServer, Peer
from nftblockd.events import Ban, BanInfo, Origin
from nftblockd.kernel.enforcer import Enforcer
from nftblockd.kernel.ruleset import Ruleset, plan_ruleset
from nftblockd.service.metrics import Metrics
from tests.helpers.fakekernel import FakeSetWriter

NOW = 1_900_000_000.0  # the rig's wall clock starts here


@dataclass(slots=True)
class Clock:
    """The wall clock of the API, the enforcer's decisions and the fake kernel: it moves only when told."""

    now: float = NOW

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(slots=True)
class FakeFeeds:
    """What FeedManager gives the API (`status`, `refresh`, the blocklists it owns), with fixed rows.
    An unknown name raises LookupError worded as FeedManager's FeedNotFound."""

    feeds: list[dict[str, Any]]
    owned: set[str] = field(default_factory=set)
    refreshed: list[tuple[str, bool]] = field(default_factory=list)  # (name, accept)

    def status(self) -> list[dict[str, Any]]:
        return [dict(f) for f in self.feeds]

    async def refresh(self, name: str, accept: bool) -> dict[str, Any]:
        self.refreshed.append((name, accept))
        for f in self.feeds:
            if f["name"] == name:
                return {"feed": dict(f)}
        names = ", ".join(f["name"] for f in self.feeds) or "none"
        raise LookupError(f"no feed named {name!r} (feeds: {names})")


@dataclass(slots=True)
class ApiRig:
    cfg: Config
    plan: Ruleset
    fake: FakeSetWriter
    enforcer: Enforcer
    api: ControlAPI
    clock: Clock
    metrics: Metrics | None
    feeds: FakeFeeds | None
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # requests served by `serve()`

    async def seed(self, target: str, blocklist: str = "default", *, until: float | None = None,
                   origin: Origin = "cli", reason: str = "", jail: str = "") -> None:
        """A ban put in place through the enforcer, as a jail, a feed or a restore would (not the API)."""
        ban = Ban(parse_target(target), blocklist, until, origin, reason, jail)
        [res] = await self.enforcer.apply([ban], now=self.clock())
        assert res.code is None, res.message

    def bans(self, blocklist: str | None = None) -> dict[tuple[str, str], BanInfo]:
        """The enforcer's bans by (canonical target, blocklist)."""
        return {(format_target(b.target), b.blocklist): b for b in self.enforcer.state.iter_bans(blocklist)}

    def in_kernel(self, set_name: str) -> set[str]:
        """Addresses the fake kernel holds in a single-address set (`<blocklist>_ip4`/`_ip6`)."""
        make = ipaddress.IPv4Address if set_name.endswith("4") else ipaddress.IPv6Address
        return {str(make(k)) for k in self.fake.elements(set_name)}


@asynccontextmanager
async def api_rig(config: str, *, default_blocklist: str = "default", metrics: Metrics | None = None,
                  feeds: FakeFeeds | None = None, status_extra: Callable[[], dict[str, Any]] | None = None,
                  reload: Callable[[], Awaitable[tuple[bool, str]]] | None = None,
                  now: float = NOW) -> AsyncIterator[ApiRig]:
    """A started enforcer (its batcher running) and the API on it; everything closed on exit.
    The allowlist never includes the host's own addresses (no netlink read), whatever the config says."""
    cfg = parse_config(config)
    plan = plan_ruleset(cfg)
    clock = Clock(now)
    fake = FakeSetWriter(plan, clock=clock)
    enforcer = Enforcer(cfg, plan, build_allowlist(cfg.allowlist, include_self=False), lambda: fake,
                        metrics=metrics)
    api = ControlAPI(enforcer, default_blocklist=default_blocklist, status_extra=status_extra, reload=reload,
                     clock=clock)
    if feeds is not None:
        api.set_feeds(feeds.status, feeds.refresh, feeds.owned)
    await enforcer.start()
    stop = asyncio.Event()
    batcher = asyncio.create_task(enforcer.batcher.run(stop))
    try:
        yield ApiRig(cfg, plan, fake, enforcer, api, clock, metrics, feeds)
    finally:
        stop.set()
        await batcher
        await enforcer.close()


@asynccontextmanager
async def serve(rig: ApiRig, path: Path) -> AsyncIterator[Path]:
    """The rig's API behind a real ControlServer at `path`; each request is appended to `rig.calls` as the
    server decoded it, then answered by the API."""

    async def handler(cmd: str, args: dict[str, Any], peer: Peer) -> dict[str, Any]:
        rig.calls.append((cmd, args))
        return await rig.api(cmd, args, peer)

    srv = ControlServer(path, handler)
    await srv.start()
    try:
        yield srv.path
    finally:
        await srv.close()
