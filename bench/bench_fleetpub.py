"""Fleet publishing and catch-up in-process, against one local redis-server (started here on a free loopback port,
killed by PID), each next to its floor measured in the same run:

- publish: 100,000 bans queued in the outbox of a real state database (a temporary file) -> all acknowledged by
  the server and marked published (`FleetService._publish_pending`, the publisher's loop), next to the floor:
  the same entries (the same stream fields) written by a plain `XADD` pipeline, 1,000 per round trip
- catch-up with distinct ends: 100,000 bans from another host, every ban with its own end (a jail's bans: each
  ends bantime after its own detection), replayed from the stream into a real Enforcer over the in-memory kernel
  (tests/helpers/fakekernel.py, with the real writer's encoder run over such adds here, `EncodingSetWriter`,
  so it costs no less than the real writer's Python side; persistence a no-op) by the fleet service's receive
  loop: from `run()` to all 100,000 applied, next to the floor: `XREAD` through the same entries as the receive
  loop reads them (the same client, parser and counts, the reply left as the parser gives it, as the link does)

The store's own part of a round is linear in the rows read (`_fleet_pending`); the rest is redis-py packing
the MULTI (~30 % of the samples in py-spy) and parsing its replies (~14 %). The floor uses redis-py too.
Both run with the daemon's collector settings (`daemon.tune_gc`).
Rounds (NFTBLOCK_BENCH_FLEETPUB_ROUNDS, default 3) interleave figure and floor; medians are recorded. The
catch-up's rounds (NFTBLOCK_BENCH_CATCHUP_ROUNDS, default 5) each run the floor then the catch-up; its ratio
is the median of the rounds' own ratios (`paired_ratio`): the floor drifts between rounds (0.16-0.30 s on
this machine) by more than the ratio moves within one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import operator
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from redis.asyncio import Redis  # noqa: E402

from bench.common import paired_ratio, record, settle  # noqa: E402
from nftblockd.addr import IPNet  # noqa: E402
from nftblockd.allowlist import Allowlist  # noqa: E402
from nftblockd.config import FleetConfig, parse_config  # noqa: E402
from nftblockd.daemon.root import tune_gc  # noqa: E402
from nftblockd.events import FleetChange, LocalBan  # noqa: E402
from nftblockd.fleet.codec import FleetEvent, encode  # noqa: E402
from nftblockd.fleet.link import CHUNK, Keys, RedisLink  # noqa: E402
from nftblockd.fleet.service import CATCHUP_COUNT, READ_COUNT, FleetService, format_cursors  # noqa: E402
from nftblockd.kernel import nfmsg  # noqa: E402
from nftblockd.kernel.bans import TimedSpecs  # noqa: E402
from nftblockd.kernel.batcher import Group  # noqa: E402
from nftblockd.kernel.fleetsink import EnforcerFleetSink  # noqa: E402
from nftblockd.kernel.ruleset import plan_ruleset  # noqa: E402
from nftblockd.kernel.setwriter import WriteResult  # noqa: E402
from nftblockd.state.change import StateChange  # noqa: E402
from nftblockd.state.store import Store  # noqa: E402
from tests.helpers.fakekernel import FakeSetWriter, running_enforcer  # noqa: E402
from tests.helpers.redis import RedisServer  # noqa: E402

ROUNDS = int(os.environ.get("NFTBLOCK_BENCH_FLEETPUB_ROUNDS", "3"))
CATCHUP_ROUNDS = int(os.environ.get("NFTBLOCK_BENCH_CATCHUP_ROUNDS", "5"))
N = int(os.environ.get("NFTBLOCK_BENCH_FLEETPUB_N", "100000"))


class EncodingSetWriter(FakeSetWriter):
    """The fake kernel, paying what the real writer's Python side pays for a catch-up's adds before it applies
    them: the remaining times and one struct pack per element (`KernelWriter._mixed_hash_adds`,
    `nfmsg.timed_hash_messages`). The fake itself stays a model (the unit tests need no encoder)."""

    def write(self, groups: Sequence[Group], now_ms: int | None = None) -> WriteResult:
        at = int(self.clock() * 1000) if now_ms is None else now_ms
        sets = {s.name: s for s in self.plan.sets}
        for g in groups:
            spec = sets.get(g.set_name)
            if isinstance(g.specs, TimedSpecs) and spec is not None and not spec.interval:
                remaining = list(map(operator.sub, g.specs.ends_ms, itertools.repeat(at)))
                nfmsg.timed_hash_messages(nfmsg.NFT_MSG_NEWSETELEM, nfmsg.NFPROTO_INET, self.plan.table, g.set_name,
                                          g.keys, spec.key_len, remaining, 1, nfmsg.NLM_F_REQUEST)
        return FakeSetWriter.write(self, groups, now_ms)


class NullSink:
    async def apply_fleet(self, change: FleetChange) -> None:
        pass

    async def fleet_view(self) -> tuple[dict[IPNet, float], dict[IPNet, LocalBan]]:
        return {}, {}

    async def settled(self) -> None:
        pass


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
    key = Keys.for_fleet(name, "a").events
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


async def fill_stream(url: str, name: str, n: int, now: float) -> None:
    """`n` bans from host "b" in its stream, each ban with its own end (a millisecond apart)."""
    key = Keys.for_fleet(name, "b").events
    r = Redis.from_url(url)
    try:
        for i in range(0, n, CHUNK):
            pipe = r.pipeline(transaction=False)
            for j, a in enumerate(addrs(min(CHUNK, n - i), 0x0A000000 + i)):
                pipe.xadd(key, encode(FleetEvent(  # type: ignore[arg-type]
                    "ban", ipaddress.ip_network(a), now + 3600 + (i + j) * 0.001, "b", i + j + 1, "jail:sshd",
                    int(now * 1000))))
            await pipe.execute()
    finally:
        await r.aclose()


async def replay_floor(url: str, name: str, n: int) -> float:
    """XREAD from the start of the stream until `n` entries are read, as the receive loop reads: the same client
    and parser, the reply as the parser hands it (the link sets no callback for XREAD: redis-py's rebuilds every
    entry as a dict, ~0.1 s per 100k, which the daemon does not pay), READ_COUNT then CATCHUP_COUNT per read."""
    key = Keys.for_fleet(name, "b").events
    r = Redis.from_url(url)
    r.set_response_callback("XREAD", lambda response, **_options: response)
    try:
        t0 = time.perf_counter()
        last, got, count = b"0-0", 0, READ_COUNT
        while got < n:
            res: Any = await r.xread({key: last}, count=count)
            entries = (next(iter(res.values())) if isinstance(res, dict) else res[0][1]) if res else []
            if not entries:
                break
            got += len(entries)
            last = entries[-1][0]
            count = CATCHUP_COUNT if len(entries) >= READ_COUNT else READ_COUNT
        return time.perf_counter() - t0
    finally:
        await r.aclose()


async def catch_up_once(url: str, tmp: Path, name: str, db: str, n: int, limit_s: float = 600) -> float:
    """Seconds from the receive loop's start to all `n` bans of the stream applied to the (in-memory) kernel;
    the set is sized for `n` (the default's 262,144 would refuse the rest of a million, bench_scale)."""
    size = f"{{size: {max(n, 262144)}}}"
    cfg = parse_config(f"blocklists: {{default: {size}}}\nallowlist: []\nallowlist_self: false\n")
    fake = EncodingSetWriter(plan_ruleset(cfg), clock=time.time)

    async def persist(change: StateChange) -> None:
        pass

    store = Store.open(tmp / f"{db}.db", synchronous="normal", verify=False)
    r = Redis.from_url(url)
    run_id = (await r.info("server"))["run_id"]
    await r.aclose()
    # a host that was away since b's stream began: a replay of it
    store.set_fleet_cursor(name, run_id, format_cursors({"b": (0, 0)}))
    fcfg = FleetConfig(name=name, host_id="c", url=url, rate=1e7, burst=10**7)
    link = RedisLink(fcfg)
    try:
        async with running_enforcer(cfg, fake, persist=persist) as enforcer:
            sink = EnforcerFleetSink(enforcer, "default", clock=time.time)
            svc = FleetService(fcfg, link, store, sink, Allowlist.from_networks([]), clock=time.time)
            t0 = time.perf_counter()
            task = asyncio.create_task(svc.run())
            try:
                deadline = time.monotonic() + limit_s
                while sink.applied < n:
                    if task.done():
                        task.result()
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"catch-up applied {sink.applied} of {n} in {limit_s} s")
                    await asyncio.sleep(0.002)
                took = time.perf_counter() - t0
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await svc.close()
        assert len(fake.sets["default_ip4"]) >= n and svc.stats.replays == 1, svc.stats
        return took
    finally:
        await link.close()
        store.close()


def catch_up_rounds(url: str, tmp: Path) -> tuple[list[float], list[float]]:
    ups: list[float] = []
    floors: list[float] = []
    now = time.time()
    asyncio.run(fill_stream(url, "cu", N, now))
    for rnd in range(CATCHUP_ROUNDS):
        settle()
        fl = asyncio.run(replay_floor(url, "cu", N))
        settle()
        up = asyncio.run(catch_up_once(url, tmp, "cu", f"cu{rnd}", N))
        print(f"round {rnd + 1}: catch-up of {N} bans with distinct ends {up:.3f} s; XREAD floor {fl:.3f} s "
              f"({up / fl:.2f}x)", flush=True)
        ups.append(up)
        floors.append(fl)
    return ups, floors


def main() -> None:
    tune_gc()  # the daemon's collector settings (daemon/root.py): a burst's short-lived objects are not collected often
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
        ups, up_floors = catch_up_rounds(server.url, tmp)
    finally:
        server.kill()
    med = statistics.median
    record(f"fleet publish {N // 1000}k bans from the outbox -> acknowledged", med(pubs), "s",
           reference="XADD pipeline of the same entries", reference_value=med(floors), target="<= 2x",
           note=f"median of {ROUNDS} rounds, in-process, local redis-server")
    ratio = paired_ratio(ups, up_floors)
    print(f"catch-up: median {med(ups):.3f} s, floor median {med(up_floors):.3f} s, median of the rounds' ratios "
          f"{ratio:.2f}x (ratio of the medians {med(ups) / med(up_floors):.2f}x)", flush=True)
    record(f"fleet catch-up of {N // 1000}k bans with distinct ends -> all applied (fake kernel)", med(ups), "s",
           reference="XREAD of the same entries, raw reply", reference_value=med(up_floors), target="<= 1.5x",
           ratio=ratio, note=f"median of {CATCHUP_ROUNDS} rounds, ratio: median of the per-round ratios, in-process, "
           "local redis-server, in-memory kernel")


async def _flush(url: str) -> None:
    r = Redis.from_url(url)
    await r.flushall()
    await r.aclose()


if __name__ == "__main__":
    main()
