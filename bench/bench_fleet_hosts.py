"""The cost of the per-host origin design (schema 2) at 1,000 simulated hosts, on one local redis-server.

1,000 hosts' keys are filled directly (each host's stream and `active` set, BANS_PER_HOST bans each), then one
receiver (the real fleet service and link, a fake kernel) measures what the design adds over one shared stream:

- discovery: one `members()` (SCAN ... TYPE stream over the whole database);
- catch-up without a cursor: the snapshot of 1,000 owners' keys, applied (the whole service path);
- an idle `XREAD` over 1,000 streams (no BLOCK): the client's time per call and the server's `usec_per_call`;
- one ban from one host to the receiver following 1,000 streams (`XREAD BLOCK`), p50/p99 of 200;
- the checks once a second: `server_views` of one batch (CHECK_BATCH streams) and `health`;
- the server's CPU those imply for a fleet of 1,000 hosts, each doing its idle XREAD once a second, a batch of
  checks once a second and a SCAN every DISCOVER_PER_MEMBER * 1,000 seconds.

NFTBLOCK_BENCH_FLEET_HOSTS (default 1000) and NFTBLOCK_BENCH_FLEET_HOST_BANS (default 100) change the sizes.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from redis.asyncio import Redis  # noqa: E402

from bench.common import record  # noqa: E402
from nftblockd.allowlist import build_allowlist  # noqa: E402
from nftblockd.fleet.codec import FleetEvent, encode  # noqa: E402
from nftblockd.fleet.link import Keys, RedisLink  # noqa: E402
from nftblockd.fleet.service import DISCOVER_PER_MEMBER, FleetService, check_batch  # noqa: E402
from tests.helpers.fleet import FakeSink, fleet_config  # noqa: E402
from tests.helpers.redis import RedisServer  # noqa: E402
from tests.helpers.store import memory_store  # noqa: E402

HOSTS = int(os.environ.get("NFTBLOCK_BENCH_FLEET_HOSTS", "1000"))
BANS = int(os.environ.get("NFTBLOCK_BENCH_FLEET_HOST_BANS", "100"))
NAME = "hosts"
SUBSCRIBERS = 200  # doorbell subscribers PUBLISH's cost per subscriber is measured with


async def fill(url: str, now: float) -> None:
    r = Redis.from_url(url)
    try:
        for h in range(HOSTS):
            k = Keys.for_fleet(NAME, f"h{h:04d}")
            pipe = r.pipeline(transaction=False)
            pairs: dict[str, float] = {}
            for i in range(BANS):
                net = ipaddress.ip_network((0x0A000000 + h * BANS + i, 32))
                ev = FleetEvent("ban", net, now + 3600 + i * 0.001, f"h{h:04d}", i + 1, "jail:sshd", int(now * 1000))
                pipe.xadd(k.events, encode(ev))  # type: ignore[arg-type]
                pairs[str(net.network_address)] = ev.until
            pipe.zadd(k.active, pairs)
            await pipe.execute()
    finally:
        await r.aclose()


async def commandstats(r: Redis) -> dict[str, float]:
    info: Any = await r.info("commandstats")
    return {k.removeprefix("cmdstat_"): float(v["usec_per_call"]) for k, v in info.items()}


async def measure(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    now = time.time()
    t0 = time.perf_counter()
    await fill(url, now)
    print(f"filled {HOSTS} hosts x {BANS} bans in {time.perf_counter() - t0:.1f} s", flush=True)
    admin = Redis.from_url(url)
    await admin.config_resetstat()
    cfg = fleet_config(NAME, "recv", url)
    link = RedisLink(cfg)
    await link.connect()
    try:
        t0 = time.perf_counter()
        owners = await link.members()
        out["scan"] = time.perf_counter() - t0
        assert len(owners) == HOSTS, len(owners)
        # catch-up without a cursor: the service's own path (discovery, views, snapshot of every owner, apply)
        sink = FakeSink()
        svc = FleetService(cfg, link, memory_store(), sink, build_allowlist([]), cursor_interval=0.0)
        t0 = time.perf_counter()
        await svc._catch_up()
        out["catchup"] = time.perf_counter() - t0
        assert len(sink.fleet) == HOSTS * BANS, len(sink.fleet)
        cursors = dict(svc._cursors)
        # an idle XREAD over every stream, no BLOCK: nothing new
        assert link.reader is not None
        scan_us = (await commandstats(admin)).get("scan", 0.0)
        await admin.config_resetstat()
        t0 = time.perf_counter()
        for _ in range(50):
            await link.reader.execute_command(  # type: ignore[no-untyped-call]
                "XREAD", "COUNT", 1000, "STREAMS", *[link.keys.events_of(o) for o in cursors],
                *[f"{ms}-{seq}" for ms, seq in cursors.values()])
        out["xread_client"] = (time.perf_counter() - t0) / 50
        out["xread_server_us"] = (await commandstats(admin)).get("xread", 0.0)
        # the checks of one maintenance
        batch = {o: cursors[o] for o in list(cursors)[:check_batch(HOSTS)]}
        t0 = time.perf_counter()
        for _ in range(20):
            await link.server_views(batch)
            await link.health(time.time())
        out["checks_client"] = (time.perf_counter() - t0) / 20
        # one ban from one host to this receiver, which blocks in XREAD over every stream
        lat: list[float] = []
        sender = Redis.from_url(url)
        await link.read(dict(cursors), 1000, 10)  # (the first read sweeps every stream: not a rung read)
        stats_checks = await commandstats(admin)
        await admin.config_resetstat()
        sender_host = f"h{HOSTS // 2:04d}"
        k = Keys.for_fleet(NAME, sender_host)
        after = dict(cursors)
        try:
            for i in range(200):
                reading = asyncio.ensure_future(link.read(after, 1000, 2000))
                await asyncio.sleep(0.002)  # the read is blocked at the server
                t0 = time.perf_counter()
                pipe = sender.pipeline(transaction=True)  # as a host publishes: the entry, then the ring
                pipe.xadd(k.events, {"v": "2", "op": "ban", "net": f"11.0.{i // 256}.{i % 256}",
                                     "until": repr(now + 60), "origin": sender_host, "oseq": str(i),
                                     "src": "cli", "ts": "0"})
                pipe.publish(k.bell, sender_host)
                await pipe.execute()
                got = await reading
                lat.append(time.perf_counter() - t0)
                for o, es in got:
                    after[o] = es[-1][0]
        finally:
            await sender.aclose()
        lat.sort()
        out["one_p50"], out["one_p99"] = lat[len(lat) // 2], lat[int(len(lat) * 0.99)]
        stats = await commandstats(admin)
        out["scan_server_us"] = scan_us
        out["xinfo_server_us"] = stats_checks.get("xinfo|stream", stats_checks.get("xinfo", 0.0))
        out["xrange_server_us"] = stats_checks.get("xrange", 0.0)
        out["xread1_server_us"] = stats.get("xread", 0.0)  # the rung reads: one stream each
        # PUBLISH's cost per subscriber: SUBSCRIBERS clients on the bell, 200 rings
        subs = [Redis.from_url(url).pubsub() for _ in range(SUBSCRIBERS)]
        for sub in subs:
            await sub.subscribe(k.bell)
        await admin.config_resetstat()
        for _ in range(200):
            await admin.publish(k.bell, sender_host)
        out["publish_per_sub_us"] = (await commandstats(admin)).get("publish", 0.0) / SUBSCRIBERS
        for sub in subs:
            await sub.aclose()
        scans = out["scan_server_us"] * (HOSTS * 4 // 1000 + 1)  # a SCAN call per 1,000 keys (4 keys a host)
        # a fleet of HOSTS hosts: each one idle XREAD (over every stream) and one batch of checks per second,
        # and a full discovery every DISCOVER_PER_MEMBER * HOSTS seconds
        checks = check_batch(HOSTS) * (out["xinfo_server_us"] + out["xrange_server_us"])
        per_s = HOSTS * (out["xread_server_us"] / RedisLink.sweep_every(HOSTS) + checks
                         + scans / max(1.0, DISCOVER_PER_MEMBER * HOSTS))
        out["server_cpu"] = per_s / 1e6
        # each publish (one MULTI) rings every follower, which reads that one stream: the server's time per
        # publish for the whole fleet (a blocked XREAD over every stream, as before the doorbell, ran again over
        # all of them for each follower: HOSTS * xread_server_us)
        out["wake_cpu_s"] = HOSTS * (out["publish_per_sub_us"] + out["xread1_server_us"]) / 1e6
        out["wake_cpu_s_blocked_xread"] = HOSTS * out["xread_server_us"] / 1e6
    finally:
        await link.close()
        await admin.aclose()
    return out


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="nbb-fleethosts-"))
    server = RedisServer(tmp / "redis").start()
    try:
        m = asyncio.run(measure(server.url))
    finally:
        server.kill()
    for k, v in m.items():
        print(f"{k}: {v:.6f}", flush=True)
    note = f"{HOSTS} hosts x {BANS} bans, one receiver, local redis-server"
    record(f"fleet at {HOSTS} hosts: catch-up without a cursor (snapshot of every host) -> applied", m["catchup"],
           "s", note=note + "; fake kernel")
    record(f"fleet at {HOSTS} hosts: discovery (SCAN of the stream keys)", m["scan"] * 1000, "ms", note=note)
    record(f"fleet at {HOSTS} hosts: idle XREAD over every stream, client", m["xread_client"] * 1000, "ms",
           note=note + f"; server {m['xread_server_us']:.0f} us per call")
    record(f"fleet at {HOSTS} hosts: one ban -> a receiver following every stream, p99", m["one_p99"] * 1000, "ms",
           note=note + f"; p50 {m['one_p50'] * 1000:.2f} ms")
    record(f"fleet at {HOSTS} hosts: server time per publish (a ring to every follower, one XREAD each)",
           m["wake_cpu_s"] * 1000, "ms", reference="every follower blocked in XREAD over every stream",
           reference_value=m["wake_cpu_s_blocked_xread"] * 1000,
           note=note + f"; PUBLISH {m['publish_per_sub_us']:.2f} us per subscriber, XREAD of one stream "
           f"{m['xread1_server_us']:.1f} us, of {HOSTS} streams {m['xread_server_us']:.0f} us")
    record(f"fleet at {HOSTS} hosts: server CPU of the followers' reads, checks and discovery", m["server_cpu"],
           "cores", note=note + f"; per host: a sweep XREAD every {RedisLink.sweep_every(HOSTS):.0f} s, "
           f"{check_batch(HOSTS)} stream checks a second "
           f"({m['xinfo_server_us']:.1f} + {m['xrange_server_us']:.1f} us), a SCAN every "
           f"{DISCOVER_PER_MEMBER * HOSTS:.0f} s")


if __name__ == "__main__":
    main()
