"""Fleet mode, client to client through a real redis-server on loopback (no kernel yet: the receiving hosts
apply to an in-memory sink; the kernel part is added when fleet mode is wired into the daemon).

- engine floor: raw XADD -> XREAD (3 blocking readers) latency at 1,000 entries/s, redis-py + hiredis
- propagation at 1,000 bans/s: FleetService.submit_bans on host A -> apply_fleet on B and C (outbox write,
  MULTI publish, XREAD, decode, trust gate), p50 / p99, with the floor as reference
- catch-up of a host that missed 100,000 bans: reconnect -> all applied (replay), with hiredis and with
  redis-py's pure-Python parser (why hiredis is in the `fleet` extra)
- snapshot of 100,000 active bans: reconnect after a trim -> reconcile applied

Everything runs in one process and one event loop (server apart), so producer and consumers share a core:
treat the figures as upper bounds. NFTBLOCK_BENCH_FLEET_SECONDS shortens the steady-rate runs.
"""

# Raw Redis replies (execute_command, the RESP parser) are untyped; the benchmark reads them by shape.
# mypy: disable-error-code="attr-defined, str-unpack, union-attr, index, assignment, var-annotated, arg-type"
from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from redis.asyncio import Redis  # noqa: E402
from redis.asyncio.connection import _AsyncRESP2Parser  # noqa: E402

from bench.common import record  # noqa: E402
from nftblockd.allowlist import build_allowlist  # noqa: E402
from nftblockd.fleet.catchup import FleetChange  # noqa: E402
from nftblockd.fleet.link import Keys, RedisLink  # noqa: E402
from nftblockd.fleet.service import FleetService  # noqa: E402
from nftblockd.state.store import Store  # noqa: E402
from tests.helpers.fleet import FakeSink, fleet_config, until  # noqa: E402
from tests.helpers.redis import RedisServer  # noqa: E402
from tests.helpers.store import memory_store  # noqa: E402

SECONDS = float(os.environ.get("NFTBLOCK_BENCH_FLEET_SECONDS", "5"))
RATE = 1000


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * p))]


class TimedSink(FakeSink):
    """Records when each net arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[Any, float] = {}

    async def apply_fleet(self, change: FleetChange) -> None:
        await super().apply_fleet(change)
        t = time.perf_counter()
        for b in change.bans:
            self.seen.setdefault(b.net, t)


async def paced(n: int, fn: Any) -> None:
    """Call fn(i) n times at RATE per second (absolute schedule, no drift)."""
    t0 = time.perf_counter()
    for i in range(n):
        delay = t0 + i / RATE - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        fn(i)


async def floor(url: str) -> tuple[float, float]:
    prod = Redis.from_url(url)
    readers = [Redis.from_url(url) for _ in range(3)]
    key = "floor:events"
    n = int(SECONDS * RATE)
    sent: dict[bytes, float] = {}
    lat: list[float] = []

    async def read(r: Redis) -> None:
        last = b"0-0"  # the key is new: from the start, so no entry falls between two reads
        got = 0
        while got < n:
            res = await r.xread({key: last}, count=1000, block=2000)
            now = time.perf_counter()
            for _, entries in res or []:
                for eid, fields in entries:
                    lat.append(now - sent[fields[b"i"]])
                    last = eid
                    got += 1

    tasks = [asyncio.create_task(read(r)) for r in readers]
    await asyncio.sleep(0.2)
    pending: set[asyncio.Task[Any]] = set()

    def send(i: int) -> None:
        k = str(i).encode()
        sent[k] = time.perf_counter()
        t = asyncio.create_task(prod.xadd(key, {"i": k}))
        pending.add(t)
        t.add_done_callback(pending.discard)

    await paced(n, send)
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    for c in (prod, *readers):
        await c.aclose()
    return statistics.median(lat), pct(lat, 0.99)


def host(name: str, url: str, sink: Any = None, store: Store | None = None,
         extra: dict[str, Any] | None = None) -> FleetService:
    # the default per-origin cap (2,000/s, burst 20,000) would refuse a 100k burst published in a second or two;
    # an operator expecting such bursts raises it, as here
    cfg = fleet_config("bench", name, url, rate=1_000_000.0, burst=1_000_000)
    link = RedisLink(cfg, block_ms=2000, extra=extra)
    return FleetService(cfg, link, store or memory_store(), sink or FakeSink(), build_allowlist([]),
                        cursor_interval=1.0)


async def run_hosts(services: list[FleetService]) -> list[asyncio.Task[None]]:
    tasks = [asyncio.create_task(s.run()) for s in services]
    await until(lambda: all(s.stats.connected for s in services), what="connected")
    return tasks


async def stop(tasks: list[asyncio.Task[None]], services: list[FleetService]) -> None:
    for t in tasks:
        t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await t
    for s in services:
        await s.close()


def targets(n: int, base: str) -> list[ipaddress.IPv4Network]:
    b = int(ipaddress.IPv4Address(base))
    return [ipaddress.IPv4Network((b + i, 32)) for i in range(n)]


async def propagation(url: str) -> tuple[float, float]:
    sb, sc = TimedSink(), TimedSink()
    a, b, c = host("a", url), host("b", url, sb), host("c", url, sc)
    tasks = await run_hosts([a, b, c])
    n = int(SECONDS * RATE)
    nets = targets(n, "10.0.0.0")
    t_sub: dict[Any, float] = {}
    end = time.time() + 3600

    def ban(i: int) -> None:
        t_sub[nets[i]] = time.perf_counter()
        a.submit_bans([(nets[i], end, "jail:sshd")])

    await paced(n, ban)
    await until(lambda: len(sb.seen) == n and len(sc.seen) == n, limit=60, what="all propagated")
    lat = [s.seen[k] - t for s in (sb, sc) for k, t in t_sub.items()]
    await stop(tasks, [a, b, c])
    return statistics.median(lat), pct(lat, 0.99)


async def catch_up(url: str, n: int, parser: dict[str, Any] | None, trim: bool) -> float:
    """B follows, stops; A publishes n bans; (optionally the stream is trimmed); B reconnects -> all applied."""
    with tempfile.TemporaryDirectory() as d:
        store_b = Store.open(Path(d) / "b.db", synchronous="normal")
        sink = FakeSink()
        a, b = host("a", url), host("b", url, sink, store_b, parser)
        tasks = await run_hosts([a, b])
        await stop(tasks[1:], [b])
        end = time.time() + 3600
        a.submit_bans([(x, end, "jail:sshd") for x in targets(n, "11.0.0.0")])
        await until(lambda: a.stats.published >= n, limit=120, what="published")
        if trim:
            r = Redis.from_url(url)
            await r.xtrim(Keys.for_fleet("bench").events, maxlen=0)
            await r.aclose()
        b = host("b", url, sink, store_b, parser)
        t0 = time.perf_counter()
        tb = asyncio.create_task(b.run())
        await until(lambda: len(sink.fleet) >= n, limit=120, what="caught up")
        took = time.perf_counter() - t0
        # the sink fills inside catch-up, before the counters move: wait for those, untimed
        await until(lambda: b.stats.snapshots + b.stats.replays >= 1, what="catch-up counted")
        assert (b.stats.snapshots == 1) == trim, b.stats
        await stop([tasks[0], tb], [a, b])
        store_b.close()
        r = Redis.from_url(url)
        await r.flushall()
        await r.aclose()
        return took


async def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        srv = RedisServer(Path(d) / "redis").start()
        try:
            f50, f99 = await floor(srv.url)
            record("fleet engine floor: XADD -> XREAD, 3 readers, 1k/s, p50", f50 * 1000, "ms")
            record("fleet engine floor: XADD -> XREAD, 3 readers, 1k/s, p99", f99 * 1000, "ms")
            p50, p99 = await propagation(srv.url)
            record("fleet propagation A -> B,C at 1k bans/s (no kernel), p50", p50 * 1000, "ms",
                   reference="engine floor p50", reference_value=f50 * 1000)
            record("fleet propagation A -> B,C at 1k bans/s (no kernel), p99", p99 * 1000, "ms",
                   reference="engine floor p99", reference_value=f99 * 1000, target="< 50 ms with the kernel")
            n = 100_000
            pure = await catch_up(srv.url, n, {"parser_class": _AsyncRESP2Parser}, trim=False)
            hired = await catch_up(srv.url, n, None, trim=False)
            record("fleet catch-up: replay of 100k missed bans (no kernel), hiredis", hired, "s",
                   reference="pure-Python parser", reference_value=pure, target="< 2 s with the kernel")
            snap = await catch_up(srv.url, n, None, trim=True)
            record("fleet catch-up: snapshot of 100k active bans + reconcile (no kernel)", snap, "s")
        finally:
            srv.kill()
    _ = math


if __name__ == "__main__":
    asyncio.run(main())
