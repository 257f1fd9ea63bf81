"""Fleet publishing and catch-up in-process, against one local redis-server (started here on a free loopback port,
killed by PID), each next to its floor measured in the same run:

- publish: 100,000 bans queued in the outbox of a real state database (a temporary file) -> all acknowledged by
  the server and marked published (`FleetService._publish_pending`, the publisher's loop), next to the floor:
  the same entries (the same stream fields) written by a plain `XADD` pipeline, 1,000 per round trip

The store's own part of a round is linear in the rows read (`_fleet_pending`); the rest is redis-py packing
the MULTI (~30 % of the samples in py-spy) and parsing its replies (~14 %). The floor uses redis-py too.
Rounds (NFTBLOCK_BENCH_FLEETPUB_ROUNDS, default 3) interleave figure and floor; medians are recorded.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from redis.asyncio import Redis  # noqa: E402

from bench.common import record, settle  # noqa: E402
from nftblockd.addr import IPNet  # noqa: E402
from nftblockd.allowlist import Allowlist  # noqa: E402
from nftblockd.config import FleetConfig  # noqa: E402
from nftblockd.events import FleetChange, LocalBan  # noqa: E402
from nftblockd.fleet.codec import FleetEvent, encode  # noqa: E402
from nftblockd.fleet.link import CHUNK, Keys, RedisLink  # noqa: E402
from nftblockd.fleet.service import FleetService  # noqa: E402
from nftblockd.state.store import Store  # noqa: E402
from tests.helpers.redis import RedisServer  # noqa: E402

ROUNDS = int(os.environ.get("NFTBLOCK_BENCH_FLEETPUB_ROUNDS", "3"))
N = int(os.environ.get("NFTBLOCK_BENCH_FLEETPUB_N", "100000"))


class NullSink:
    async def apply_fleet(self, change: FleetChange) -> None:
        pass

    async def fleet_view(self) -> tuple[dict[IPNet, float], dict[IPNet, LocalBan]]:
        return {}, {}


def addrs(n: int, base: int = 0x0A000000) -> list[str]:
    return [f"{(a >> 24) & 255}.{(a >> 16) & 255}.{(a >> 8) & 255}.{a & 255}" for a in range(base, base + n)]


async def publish_once(url: str, tmp: Path, name: str, n: int) -> float:
    """Seconds from a full outbox of `n` bans to all of them acknowledged and marked published."""
    now = time.time()
    store = Store.open(tmp / f"{name}.db", synchronous="normal", verify=False)
    cfg = FleetConfig(name=name, host_id="a", url=url)
    link = RedisLink(cfg)
    try:
        store.fleet_enqueue(("ban", a, now + 3600 + i * 0.001, "jail:sshd", now) for i, a in enumerate(addrs(n)))
        svc = FleetService(cfg, link, store, NullSink(), Allowlist.from_networks([]), clock=time.time)
        await link.connect()
        svc._online.set()
        t0 = time.perf_counter()
        await svc._publish_pending()
        took = time.perf_counter() - t0
        assert store.fleet_outbox_size() == 0 and svc.stats.published == n, (svc.stats.published, n)
        return took
    finally:
        await link.close()
        store.close()


async def xadd_floor(url: str, name: str, n: int) -> float:
    """The same entries, encoded by the codec beforehand, by a plain XADD pipeline of CHUNK per round trip."""
    now = time.time()
    key = Keys.for_fleet(name).events
    fields = [encode(FleetEvent("ban", ipaddress.ip_network(a), now + 3600 + i * 0.001, "a", i + 1, "jail:sshd",
                                int(now * 1000))) for i, a in enumerate(addrs(n))]
    r = Redis.from_url(url)
    try:
        t0 = time.perf_counter()
        for i in range(0, n, CHUNK):
            pipe = r.pipeline(transaction=False)
            for f in fields[i:i + CHUNK]:
                pipe.xadd(key, f)  # type: ignore[arg-type]
            await pipe.execute()
        return time.perf_counter() - t0
    finally:
        await r.aclose()


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="nbb-fleetpub-"))
    server = RedisServer(tmp / "redis").start()
    pubs: list[float] = []
    floors: list[float] = []
    try:
        for rnd in range(ROUNDS):
            settle()
            fl = asyncio.run(xadd_floor(server.url, f"floor{rnd}", N))
            settle()
            pub = asyncio.run(publish_once(server.url, tmp, f"pub{rnd}", N))
            print(f"round {rnd + 1}: publish {N} from the outbox {pub:.3f} s; XADD pipeline floor {fl:.3f} s "
                  f"({pub / fl:.2f}x)", flush=True)
            pubs.append(pub)
            floors.append(fl)
            asyncio.run(_flush(server.url))  # keep the server small between rounds
    finally:
        server.kill()
    med = statistics.median
    record(f"fleet publish {N // 1000}k bans from the outbox -> acknowledged", med(pubs), "s",
           reference="XADD pipeline of the same entries", reference_value=med(floors), target="<= 2x",
           note=f"median of {ROUNDS} rounds, in-process, local redis-server")


async def _flush(url: str) -> None:
    r = Redis.from_url(url)
    await r.flushall()
    await r.aclose()


if __name__ == "__main__":
    main()
