"""Fleet mode at kernel level: three real daemons (A, B, C), each in its own network namespace, share bans through
one real redis-server in a fourth namespace, reached over veth pairs (tests/helpers/fleetlab.py). Figures:

- engine floor: raw XADD -> XREAD (3 blocking readers) at 1,000 entries/s, redis-py + hiredis, from A's
  namespace over its veth; and the floor of a replay: XREAD COUNT 1000 through 100,000 entries, nothing else
- propagation at a steady 1,000 bans/s decided on A: one attacker's failures written to A's tailed log every
  millisecond; each ban timed from its arrival in A's kernel set (A applies locally first, then publishes)
  to its arrival in B's and C's, p50 / p99. (How long A's own jail path takes from the log line to A's
  kernel at that rate is printed beside it: that is the local path, not the fleet's.) Observed by
  bench/setwatch.py --timeline in A, B and C: a kernel element count per millisecond. Bans reach each set in
  the order A applied them (stream order), so the i-th ban arrived when the count first reached base + i:
  per-ban times, to within the 1 ms poll, for one cheap GETSET per poll (listing the elements, or a netlink
  monitor, would load the receivers being timed)
- a 10,000-attacker burst (bench/authlog.py, realistic auth.log) written to A's tailed log in one write:
  last write -> all 10,000 in C's kernel set, next to the same burst's last write -> all in A's own kernel
- catch-up: C stopped while A bans 100,000 addresses (`nftblock ban -`), C restarted: its READY=1 (the fleet
  link connects then) -> all 100,000 in C's kernel set, next to the replay floor

The per-origin rate cap is raised for the lab (an operator expecting 100k-ban bursts does the same).
Rounds (NFTBLOCK_BENCH_FLEET_ROUNDS, default 3), each on a fresh lab and running every figure once (so the
figures interleave), and their medians: the machine is shared.
NFTBLOCK_BENCH_FLEET_SECONDS (default 5) is the length of each steady-rate run.
NFTBLOCK_BENCH_FLEET_PARTS (default "floor,propagation,burst,catchup") runs a subset of the figures; with
NFTBLOCK_BENCH_FLEET_TRACE=1 the propagation run also prints where its time goes, per hop (A's kernel -> the
stream entry's id, the server's clock in ms -> B's and C's kernel; one clock: the same machine).
"""

# Raw Redis replies (execute_command, the RESP parser) are untyped; the benchmark reads them by shape.
# mypy: disable-error-code="attr-defined, union-attr, index, arg-type, var-annotated, assignment, str-unpack"
from __future__ import annotations

import asyncio
import ipaddress
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from redis.asyncio import Redis  # noqa: E402

from bench.authlog import burst as realistic_burst  # noqa: E402
from bench.common import record, settle  # noqa: E402
from tests.helpers.fleetlab import FleetLab  # noqa: E402
from tests.helpers.netns import NetNS, inside, wait_for  # noqa: E402

SECONDS = float(os.environ.get("NFTBLOCK_BENCH_FLEET_SECONDS", "5"))
ROUNDS = int(os.environ.get("NFTBLOCK_BENCH_FLEET_ROUNDS", "3"))
PARTS = set(os.environ.get("NFTBLOCK_BENCH_FLEET_PARTS", "floor,propagation,burst,catchup").split(","))
TRACE = os.environ.get("NFTBLOCK_BENCH_FLEET_TRACE", "") == "1"
RATE = 1000
WATCH = HERE / "setwatch.py"
SETS4 = "default_ip4"
SETS = "default_ip4,default_net6"


async def read_latencies(r: Redis, key: str, start: Any, n: int, field: bytes, sent: dict[bytes, float],
                         lat: list[float]) -> None:
    """The floor's reader: XREAD `key` from `start` until `n` entries arrived, appending to `lat` each entry's
    time since `sent[<its field>]` was stamped."""
    last, got = start, 0
    while got < n:
        res = await r.xread({key: last}, count=1000, block=2000)
        now = time.perf_counter()
        for _, entries in res or []:
            for eid, fields in entries:
                lat.append(now - sent[fields[field]])
                last = eid
                got += 1


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * p))]


# -- the engine's own floor ------------------------------------------------------------------------------


async def _floor(url: str) -> tuple[float, float]:
    prod = Redis.from_url(url)
    readers = [Redis.from_url(url) for _ in range(3)]
    key = "floor:events"
    await prod.delete(key)
    n = int(SECONDS * RATE)
    sent: dict[bytes, float] = {}
    lat: list[float] = []

    tasks = [asyncio.create_task(read_latencies(r, key, b"0-0", n, b"i", sent, lat)) for r in readers]
    await asyncio.sleep(0.2)
    t0 = time.perf_counter()
    for i in range(n):  # one connection, one XADD at a time (~0.3 ms): a stall never piles up connections
        delay = t0 + i / RATE - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        k = str(i).encode()
        sent[k] = time.perf_counter()
        await prod.xadd(key, {"i": k})
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    await prod.delete(key)
    for c in (prod, *readers):
        await c.aclose()
    return statistics.median(lat), pct(lat, 0.99)


async def _replay_floor(url: str, key: str, n: int) -> float:
    """XREAD COUNT 1000 from the start of `key` until `n` entries are read: the engine's part of a replay."""
    r = Redis.from_url(url)
    t0 = time.perf_counter()
    last, got = b"0-0", 0
    while got < n:
        res = await r.xread({key: last}, count=1000)
        entries = res[0][1] if res else []
        if not entries:
            break
        got += len(entries)
        last = entries[-1][0]
    took = time.perf_counter() - t0
    await r.aclose()
    return took


def in_ns(ns: NetNS, coro: Any) -> Any:
    """Run a coroutine with its sockets in `ns` (this thread joins the namespace for the run)."""
    with inside(ns):
        return asyncio.run(coro)


# -- observing kernel sets -------------------------------------------------------------------------------


class Timeline:
    """bench/setwatch.py --timeline in a namespace: (time, count) at each change until `n`."""

    def __init__(self, ns: NetNS, sets: str, n: int, timeout: float, interval: float = 0.001) -> None:
        self.proc = ns.popen(sys.executable, str(WATCH), "--timeline", "nftblock", sets, str(n), str(timeout),
                             str(interval), stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the set watcher did not start")

    def result(self) -> tuple[list[tuple[float, int]], float]:
        points, seen = self.points()
        if seen is None:
            raise RuntimeError("the kernel set never reached its count in time")
        return points, seen

    def points(self) -> tuple[list[tuple[float, int]], float | None]:
        """The timeline, and when the count was reached (None: the watcher timed out)."""
        out, _ = self.proc.communicate(timeout=300)
        lines = out.strip().splitlines()
        points = [(float(t), int(c)) for t, c in (ln.split() for ln in lines[:-1] if ln.strip())]
        return points, None if not lines or lines[-1] == "timeout" else float(lines[-1])


def reached(points: list[tuple[float, int]], count: int) -> float | None:
    return next((t for t, c in points if c >= count), None)


def arrivals(points: list[tuple[float, int]], base: int, n: int) -> list[float]:
    """When the i-th of n bans arrived: the first time the count reached base + i + 1."""
    out: list[float] = []
    j = 0
    for i in range(n):
        while points[j][1] < base + i + 1:
            j += 1
        out.append(points[j][0])
    return out


def total(lab: FleetLab, host: str, sets: str = SETS) -> int:
    st = lab.daemons[host].cli_json("status")
    names = sets.split(",")
    return sum(int(s["elements"] or 0) for s in st["sets"] if s["name"] in names)


# -- the figures -----------------------------------------------------------------------------------------

_pid = iter(range(10_000, 10**7))


def attacker_lines(addr: str, stamp: str, maxretry: int) -> str:
    return "".join(f"{stamp} web1 sshd[{next(_pid)}]: Failed password for invalid user admin from {addr} "
                   f"port {40000 + i} ssh2\n" for i in range(maxretry))


def propagation(lab: FleetLab, round_no: int) -> tuple[list[float], list[float]]:
    """(per ban: A's kernel -> B's and C's kernel, per ban: line written on A -> A's kernel)."""
    n = int(SECONDS * RATE)
    base = {h: total(lab, h, SETS4) for h in ("a", "b", "c")}
    watches = {h: Timeline(lab.nss[h], SETS4, base[h] + n, 120) for h in ("a", "b", "c")}
    # 10/8: never drawn by bench/authlog.py's attackers, so no round's count is short of a collision
    addrs = [f"10.{50 + round_no}.{i // 256 % 256}.{i % 256}" for i in range(n)]
    stamp = time.strftime("%b %e %H:%M:%S")
    texts = [attacker_lines(a, stamp, lab.maxretry) for a in addrs]
    sent: list[float] = []
    with lab.logs["a"].open("a") as f:
        t0 = time.monotonic()
        for i, text in enumerate(texts):
            delay = t0 + i / RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            f.write(text)
            f.flush()
            sent.append(time.monotonic())
    at = {}
    for h in ("a", "b", "c"):
        points, _ = watches[h].result()
        at[h] = arrivals(points, base[h], n)
    fleet = [t - a for h in ("b", "c") for t, a in zip(at[h], at["a"], strict=True)]
    local = [a - s for a, s in zip(at["a"], sent, strict=True)]
    if TRACE:
        trace_hops(lab, at, n)
    return fleet, local


def trace_hops(lab: FleetLab, at: dict[str, list[float]], n: int) -> None:
    """Where propagation's time goes: the last n stream entries from A, in order, are the bans in the order
    A's kernel got them. An entry's id is the server's clock (ms) at its XADD, its `ts` A's decision time;
    CLOCK_MONOTONIC (the watchers') is put on the wall clock by one offset taken here."""
    off = time.time() - time.monotonic()
    assert lab.server is not None
    url = f"redis://10.210.1.1:{lab.server.port}/0"

    async def ids() -> list[bytes]:
        r = Redis.from_url(url)
        got = await r.xrevrange(lab.events_key, count=2 * n)
        await r.aclose()
        mine = [f for _eid, f in got if f.get(b"origin") == b"a"]
        if len({f[b"net"]  for f in mine}) < len(mine):
            print(f"trace: {len(mine)} entries from A, {len({f.get(b'oseq') for f in mine})} oseqs: "
                  "some published twice", flush=True)
        return [bytes(eid) for eid, fields in reversed(got) if fields.get(b"origin") == b"a"]

    xadd = [int(i.split(b"-")[0]) / 1000 for i in in_ns(lab.nss["a"], ids())][-n:]
    if len(xadd) < n:
        print(f"trace: {len(xadd)} entries of {n}", flush=True)
        return
    pub = [x - (a + off) for x, a in zip(xadd, at["a"], strict=True)]
    recv = [t + off - x for h in ("b", "c") for t, x in zip(at[h], xadd, strict=True)]
    ms = [f"{pct(v, q) * 1000:.1f}" for v in (pub, recv) for q in (0.5, 0.9, 0.99)]
    print(f"trace: A kernel -> XADD p50/p90/p99 {'/'.join(ms[:3])} ms; XADD -> B,C kernel {'/'.join(ms[3:])} ms"
          " (stream ids: 1 ms resolution)", flush=True)


def burst(lab: FleetLab, seed: int) -> tuple[float, float] | None:
    b = realistic_burst(10_000, 1_000, maxretry=lab.maxretry, seed=seed, stamp=time.strftime("%b %e %H:%M:%S"))
    n = len(b.banned)
    base = {h: total(lab, h) for h in ("a", "c")}
    watches = {h: Timeline(lab.nss[h], SETS, base[h] + n, 60, 0.002) for h in ("a", "c")}
    with lab.logs["a"].open("a") as f:
        f.write(b.text)
    t_last = time.monotonic()
    pa, seen_a = watches["a"].points()
    pc, seen_c = watches["c"].points()
    if seen_a is None:
        # seen in some rounds on the shared machine: A's own jail bans a few attackers fewer than the burst
        # holds (its detection path, before the fleet: C then holds exactly what A holds). The figure is
        # then "last write -> C holds every ban A made", and the shortfall is printed
        got = (pa[-1][1] if pa else base["a"]) - base["a"]
        print(f"burst seed {seed}: A's jail banned {got} of {n} attackers; timing what it banned", flush=True)
        explain_shortfall(lab, b)
        seen_a = reached(pa, base["a"] + got)
        seen_c = reached(pc, base["c"] + got)
        if seen_a is None or seen_c is None or got < n * 0.99:
            return None
    elif seen_c is None:
        return None
    return seen_c - t_last, seen_a - t_last


def explain_shortfall(lab: FleetLab, b: Any) -> None:
    """Print which burst attackers A's kernel lacks and what A's jail and `check` say of them: the shortfall
    was seen in loaded rounds only and never reproduced on an idle machine, so the evidence is kept when it
    happens (listing the sets is fine here: this is the failure path, not the timed one)."""
    have = lab.banned("a", "default_ip4") | lab.banned("a", "default_net6")
    want = {str(ipaddress.ip_network(f"{a}/64", strict=False)) if ":" in a else a for a in b.banned}
    missing = sorted(want - have)
    jail = lab.daemons["a"].cli_json("status")["jails"][0]
    keys = ("lines", "matched", "failures", "decided", "bans", "ban_refused", "already_banned", "allowlisted",
            "never_ban", "stale")
    print(f"  missing {len(missing)}: {missing[:10]}; A's jail: " + ", ".join(f"{k} {jail.get(k)}" for k in keys),
          flush=True)
    for m in missing[:3]:
        r = lab.daemons["a"].cli("check", m.split("/")[0])
        print(f"  check {m}: {(r.stdout or r.stderr).strip()}", flush=True)


def catch_up(lab: FleetLab, round_no: int) -> tuple[float, float]:
    n = 100_000
    c = lab.daemons["c"]
    base = total(lab, "c", SETS4)
    c.stop()
    addrs = "\n".join(f"10.{100 + 2 * round_no + i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(n)) + "\n"
    r = lab.daemons["a"].cli("ban", "-", "--timeout", "1h", input=addrs)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: lab.fleet("a")["outbox"] == 0 and lab.fleet("a")["published"] >= n, 120, 0.1, "published")
    wait_for(lambda: total(lab, "b", SETS4) >= base + n, 120, 0.1, "B has them")  # the stream holds them all
    assert lab.server is not None
    url = f"redis://10.210.3.1:{lab.server.port}/0"
    replay_floor = in_ns(lab.nss["c"], _replay_floor(url, lab.events_key, n))
    settle(0.2, 0.5, 10)
    watch = Timeline(lab.nss["c"], SETS4, base + n, 120, 0.002)
    c.start()
    t_ready = time.monotonic()
    _, seen = watch.result()
    st = lab.fleet("c")
    assert st["replays"] >= 1 and st["snapshots"] == 0, st
    return seen - t_ready, replay_floor


Round = tuple[tuple[float, float] | None, tuple[list[float], list[float]] | None, tuple[float, float] | None,
              tuple[float, float] | None]


def one_round(rnd: int) -> Round:
    """Every figure once (of NFTBLOCK_BENCH_FLEET_PARTS), on a fresh lab (a lab carrying the previous rounds'
    230k bans would time more than the fleet: the kernel sets and the state database grow round after round)."""
    tmp = Path(tempfile.mkdtemp(prefix="nbb-fleet-"))
    lab = FleetLab(tmp, fleet="bench", maxretry=3, allowlist="[]",
                   fleet_extra="trust: {rate: 1000000, burst: 1000000}", jail_extra="ipv6_prefix: 64")
    lab.start()
    floor = prop = bst = cu = None
    try:
        assert lab.server is not None
        url_a = f"redis://10.210.1.1:{lab.server.port}/0"
        if "floor" in PARTS:
            settle()
            floor = in_ns(lab.nss["a"], _floor(url_a))
        if "propagation" in PARTS:
            settle()
            prop = propagation(lab, rnd)
        if "burst" in PARTS:
            settle()
            bst = burst(lab, rnd + 1)
        if "catchup" in PARTS:
            settle()
            cu = catch_up(lab, rnd)
    finally:
        lab.close()
    said = [f"round {rnd + 1}:"]
    if floor is not None:
        said.append(f"floor p50/p99 {floor[0] * 1000:.2f}/{floor[1] * 1000:.2f} ms;")
    if prop is not None:
        p, loc = prop
        said.append(f"propagation p50/p99 {pct(p, 0.5) * 1000:.2f}/{pct(p, 0.99) * 1000:.2f} ms "
                    f"(line -> A's kernel p50/p99 {pct(loc, 0.5) * 1000:.1f}/{pct(loc, 0.99) * 1000:.1f} ms);")
    if "burst" in PARTS:
        said.append(f"burst C {bst[0]:.3f} s (A {bst[1]:.3f} s);" if bst else "burst incomplete;")
    if cu is not None:
        said.append(f"catch-up {cu[0]:.3f} s (replay floor {cu[1]:.3f} s)")
    print(" ".join(said), flush=True)
    return floor, prop, bst, cu


def main() -> None:
    if os.geteuid() != 0:
        print("bench_fleet needs root (namespaces)")
        return
    floors, props, bursts, catchups = [], [], [], []
    for rnd in range(ROUNDS):  # interleaved: every figure sees the machine's state of each round
        floor, prop, bst, cu = one_round(rnd)
        if floor is not None:
            floors.append(floor)
        if prop is not None:
            props.append(prop)
        if bst is not None:
            bursts.append(bst)
        if cu is not None:
            catchups.append(cu)
    med = statistics.median
    f50 = med(f[0] for f in floors) if floors else None
    f99 = med(f[1] for f in floors) if floors else None
    if f50 is not None and f99 is not None:
        record("fleet engine floor: XADD -> XREAD, 3 readers, 1k/s, p50", f50 * 1000, "ms")
        record("fleet engine floor: XADD -> XREAD, 3 readers, 1k/s, p99", f99 * 1000, "ms")
    if props:
        p50, p99 = med(pct(p, 0.5) for p, _l in props), med(pct(p, 0.99) for p, _l in props)
        l50, l99 = med(pct(lo, 0.5) for _p, lo in props), med(pct(lo, 0.99) for _p, lo in props)
        local = (f"; for context, log line written on A -> A's own kernel p50 {l50 * 1000:.1f} ms, "
                 f"p99 {l99 * 1000:.1f} ms")
        ref50 = {} if f50 is None else {"reference": "engine floor p50", "reference_value": f50 * 1000}
        ref99 = {} if f99 is None else {"reference": "engine floor p99", "reference_value": f99 * 1000}
        record("fleet propagation A kernel -> B,C kernel at 1k bans/s, p50", p50 * 1000, "ms",
               note=f"median of {ROUNDS} rounds{local}", **ref50)
        record("fleet propagation A kernel -> B,C kernel at 1k bans/s, p99", p99 * 1000, "ms", target="< 20 ms",
               note=f"median of {ROUNDS} rounds{local}", **ref99)
    if bursts:
        record("fleet burst 10k attackers on A's log: last write -> all in C's kernel", med(b[0] for b in bursts),
               "s", reference="the same burst in A's own kernel", reference_value=med(b[1] for b in bursts),
               target="< 2 s", note=f"median of the {len(bursts)} complete rounds of {ROUNDS}")
    if catchups:
        record("fleet catch-up: C restarted after missing 100k bans -> all in its kernel",
               med(c[0] for c in catchups), "s", reference="replay floor (XREAD of the 100k entries)",
               reference_value=med(c[1] for c in catchups), target="< 2 s",
               note=f"from the restarted daemon's READY=1; median of {ROUNDS} rounds")


if __name__ == "__main__":
    main()
