"""Tracker and allowlist benchmarks: hits per second, bytes per tracked offender, allowlist lookups.

Pure CPU, no kernel, no namespaces. The workload is 1,000,000 hits from 100,000 addresses (90 % IPv4, 10 %
IPv6 in a /64-grouping jail) over one simulated hour: 80 % of the hits spread evenly over every address
(background scanning, mostly COUNTED and STALE-free), 20 % from 1,000 brute forcers that get banned and then
hammer on (ALREADY_BANNED). Hits are built before the clock starts: only `Tracker.observe` is timed.
Bytes per offender come from tracemalloc, with the hits built and freed inside the traced region so the
failure-time floats the tracker keeps alive are counted.
"""

from __future__ import annotations

import gc
import ipaddress
import os
import random
import statistics
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import record
from nftblockd.addr import IPAddr, IPNet
from nftblockd.allowlist import Allowlist, build_allowlist
from nftblockd.detect.tracker import JailPolicy, Kind, Tracker
from nftblockd.events import Hit


def is_allowlisted(allow: tuple[IPNet, ...], net: IPNet) -> bool:
    """The linear scan an allowlist is compared with: does any entry overlap `net`?"""
    return any(a.version == net.version and a.overlaps(net) for a in allow)

ROUNDS = int(os.environ.get("NFTBLOCK_BENCH_ROUNDS", "3"))
HITS = 1_000_000
ADDRESSES = 100_000
T0 = 1_700_000_000.0


def make_addresses(n: int, rnd: random.Random) -> list[IPAddr]:
    out: list[IPAddr] = []
    seen: set[int] = set()
    while len(out) < n:
        if len(out) % 10 == 9:
            # 10 hosts per /64 prefix: the jail groups them, so there are fewer IPv6 offenders than addresses
            net = 0x2001_0DB8_0000_0000 | rnd.getrandbits(24)
            x = (net << 64) | rnd.getrandbits(64)
            if x not in seen:
                seen.add(x)
                out.append(ipaddress.IPv6Address(x))
        else:
            x = rnd.getrandbits(32) | 0x01000000
            # Scanners come from public space: never-ban space (224/3, 127/8, 169.254/16: neverban.py) would
            # measure the refusal path instead of counting and banning.
            if x >> 29 == 7 or x >> 24 == 127 or x >> 16 == 0xA9FE:
                continue
            if x not in seen:
                seen.add(x)
                out.append(ipaddress.IPv4Address(x))
    return out


def make_allowlist(rnd: random.Random, n: int = 1000) -> Allowlist:
    nets: list[IPNet] = [ipaddress.IPv4Network((rnd.getrandbits(32), 24), strict=False) for _ in range(n)]
    return build_allowlist(nets, [ipaddress.IPv4Address("198.51.100.1")], include_self=True)


def policies() -> list[JailPolicy]:
    return [JailPolicy("sshd", maxretry=5, findtime=600.0, bantime=3600.0, ipv6_prefix=64)]


def workload(rnd: random.Random) -> tuple[list[Hit], list[float]]:
    addrs = make_addresses(ADDRESSES, rnd)
    brute = rnd.sample(addrs, 1000)
    hits: list[Hit] = []
    nows: list[float] = []
    step = 3600.0 / HITS
    for i in range(HITS):
        a = brute[rnd.randrange(1000)] if rnd.random() < 0.2 else addrs[rnd.randrange(ADDRESSES)]
        now = T0 + i * step
        hits.append(Hit("sshd", a, now))
        nows.append(now)
    return hits, nows


CHUNK = 10_000
FLOOR = "floor loop: int(host) + dict store, interleaved"


def timed(observe: Callable[[Hit, float], object], hits: list[Hit], nows: list[float]) -> tuple[float, float]:
    """Seconds spent in `observe` and in the floor loop over the same hits.

    The two alternate chunk by chunk, so a busy machine slows both alike and their ratio stays meaningful.
    The floor is the least any tracker must do per hit: read the address as an int, store a time under it.
    """
    d: dict[int, float] = {}
    ours = ref = 0.0
    gc.collect()
    for s in range(0, len(hits), CHUNK):
        hh, nn = hits[s:s + CHUNK], nows[s:s + CHUNK]
        t0 = time.perf_counter()
        for h, now in zip(hh, nn, strict=True):
            observe(h, now)
        t1 = time.perf_counter()
        for h, now in zip(hh, nn, strict=True):
            d[int(h.host)] = now
        t2 = time.perf_counter()
        ours += t1 - t0
        ref += t2 - t1
    return ours, ref


def outcome_mix(hits: list[Hit], nows: list[float], allow: Allowlist) -> str:
    kinds: Counter[Kind] = Counter()
    tr = Tracker(policies(), allow)
    for h, now in zip(hits, nows, strict=True):
        kinds[tr.observe(h, now).kind] += 1
    return ", ".join(f"{k.value} {v / len(hits):.1%}" for k, v in kinds.most_common())


def bench_throughput(rnd: random.Random, allow: Allowlist) -> None:
    hits, nows = workload(rnd)
    rounds = []
    tracker = Tracker(policies(), allow)
    for _ in range(ROUNDS):
        tracker = Tracker(policies(), allow)
        rounds.append(timed(tracker.observe, hits, nows))
    ours = statistics.median(r[0] for r in rounds)
    ref = statistics.median(r[1] for r in rounds)
    record("tracker.observe 1M hits / 100k addresses", HITS / ours, "hits/s", reference=FLOOR,
           reference_value=HITS / ref,
           note=f"{ours:.2f} s median of {ROUNDS}; mix: {outcome_mix(hits, nows, allow)}; 1000 allow CIDRs; "
                f"{tracker.tracked} records at the end, {tracker.evictions} evictions")
    record("tracker.observe per hit (mixed workload)", ours / HITS * 1e9, "ns", reference=FLOOR,
           reference_value=ref / HITS * 1e9)

    # The already-banned storm alone: 1000 banned offenders, 1M hits.
    tr = Tracker(policies(), allow)
    banned = make_addresses(1000, rnd)
    for a in banned:
        for _ in range(5):
            tr.observe(Hit("sshd", a, T0), T0)
    storm = [Hit("sshd", banned[rnd.randrange(1000)], T0 + 1) for _ in range(HITS)]
    rounds = [timed(tr.observe, storm, [T0 + 1] * HITS) for _ in range(ROUNDS)]
    assert tr.observe(storm[0], T0 + 1).kind is Kind.ALREADY_BANNED
    record("tracker.observe already-banned storm", HITS / statistics.median(r[0] for r in rounds), "hits/s",
           reference=FLOOR, reference_value=HITS / statistics.median(r[1] for r in rounds),
           note="1M hits from 1000 banned offenders (fail2ban's 'already banned' storm)")


def bytes_per_offender(failures: int, v6: bool) -> float:
    rnd = random.Random(5)
    gc.collect()
    tracemalloc.start()
    tr = Tracker([JailPolicy("sshd", maxretry=failures + 1, ipv6_prefix=128)], max_tracked=10 * ADDRESSES)
    before = tracemalloc.get_traced_memory()[0]
    for i in range(ADDRESSES):
        a: IPAddr = ipaddress.IPv6Address((0x2001_0DB8 << 96) | rnd.getrandbits(64)) if v6 \
            else ipaddress.IPv4Address(0x0A000000 + i)
        for k in range(failures):
            t = T0 + i * 0.001 + k * 0.0001  # a fresh float per failure, as real hits bring
            tr.observe(Hit("sshd", a, t), t + 0.5)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert tr.tracked == ADDRESSES, tr.tracked
    return (after - before) / ADDRESSES


def bench_memory() -> None:
    for failures, v6 in ((1, False), (4, False), (1, True), (4, True)):
        fam = "IPv6" if v6 else "IPv4"
        record(f"tracker bytes per tracked {fam} offender, {failures} failure(s)",
               bytes_per_offender(failures, v6), "bytes",
               note=f"tracemalloc over {ADDRESSES} offenders; failure times and int keys included")


def bench_allowlist(rnd: random.Random) -> None:
    nets: list[IPNet] = [
        ipaddress.IPv4Network((rnd.getrandbits(32), rnd.choice((16, 20, 24, 28, 32))), strict=False)
        for _ in range(5000)
    ]
    allow = Allowlist.from_networks(nets)
    as_tuple = tuple(nets)
    probes = [ipaddress.IPv4Address(rnd.getrandbits(32)) for _ in range(20_000)]
    probe_nets = [ipaddress.ip_network(p) for p in probes]
    t0 = time.perf_counter()
    for p in probes:
        allow.contains(p)
    ours = (time.perf_counter() - t0) / len(probes)
    sample = probe_nets[:500]
    t0 = time.perf_counter()
    for n in sample:
        is_allowlisted(as_tuple, n)
    linear = (time.perf_counter() - t0) / len(sample)
    record("allowlist.contains, 5000 CIDRs", 1 / ours, "lookups/s",
           reference="linear scan", reference_value=1 / linear)


def main() -> None:
    rnd = random.Random(42)
    allow = make_allowlist(rnd)
    bench_throughput(rnd, allow)
    bench_memory()
    bench_allowlist(rnd)


if __name__ == "__main__":
    main()
