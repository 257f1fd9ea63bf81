"""Feed pipeline benchmarks (the pure part): parse → sanitise → aggregate → diff, time and peak memory.

Feeds come from bench/feedgen.py (FireHOL-style, shuffled, with overlaps, adjacency, duplicates and some
special space). The reference is what one would write with the standard library: `addr.parse_target` per
line and `ipaddress.collapse_addresses` per family, on the same text, in the same run.

    python bench/bench_feeds.py            # 50k+20k feed, and a 1M-entry feed (NFTBLOCK_BENCH_FEED_BIG)
"""

from __future__ import annotations

import gc
import ipaddress
import os
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median_time, record
from bench.feedgen import make_feed
from nftblockd.addr import AddressError, IPNet, parse_target
from nftblockd.feeds.aggregate import Aggregate, aggregate, diff, sanitise
from nftblockd.feeds.parse import parse_feed

ROUNDS = int(os.environ.get("NFTBLOCK_BENCH_ROUNDS", "3"))
BIG = int(os.environ.get("NFTBLOCK_BENCH_FEED_BIG", "1000000"))


def pipeline(body: str) -> Aggregate:
    parsed = parse_feed(body)
    return aggregate([sanitise(parsed.v4, parsed.v6)])


def reference(body: str) -> list[IPNet]:
    """The standard-library way: parse_target per line, collapse_addresses per family (no sanitising)."""
    v4: list[ipaddress.IPv4Network] = []
    v6: list[ipaddress.IPv6Network] = []
    for line in body.splitlines():
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            net = parse_target(text)
        except AddressError:
            continue
        if isinstance(net, ipaddress.IPv4Network):
            v4.append(net)
        else:
            v6.append(net)
    return [*ipaddress.collapse_addresses(v4), *ipaddress.collapse_addresses(v6)]


def stages(body: str) -> dict[str, float]:
    t0 = time.perf_counter()
    parsed = parse_feed(body)
    t1 = time.perf_counter()
    s = sanitise(parsed.v4, parsed.v6)
    t2 = time.perf_counter()
    agg = aggregate([s])
    t3 = time.perf_counter()
    return {"parse": t1 - t0, "sanitise": t2 - t1, "aggregate": t3 - t2, "total": t3 - t0,
            "entries": parsed.entries, "cidrs": len(agg)}


def median_stages(body: str, rounds: int) -> dict[str, float]:
    runs = [stages(body) for _ in range(rounds)]
    return {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in runs[0]}


def peak_memory(body: str) -> tuple[int, int]:
    """(peak bytes traced while the pipeline runs, bytes still held by its result)."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        agg = pipeline(body)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del agg
    return peak - base, held - base


def main() -> None:
    # -- a typical large feed: 50k IPv4 + 20k IPv6 -----------------------------------------------------
    body = make_feed(50_000, 20_000, seed=1)
    st = median_stages(body, ROUNDS)
    ref = median_time(lambda: reference(body), max(1, ROUNDS))
    record("feeds.70k.parse_s", st["parse"], "s", note="50k IPv4 + 20k IPv6 FireHOL-style lines")
    record("feeds.70k.sanitise_s", st["sanitise"], "s")
    record("feeds.70k.aggregate_s", st["aggregate"], "s", note=f"{int(st['cidrs'])} CIDRs out")
    record("feeds.70k.pipeline_s", st["total"], "s", reference="parse_target + ipaddress.collapse_addresses",
           reference_value=ref, note="ours also sanitises (special space, min prefix)")

    # aggregation alone: our integer merge vs collapse_addresses on already-parsed networks
    parsed = parse_feed(body)
    nets = parsed.networks()
    v4 = [n for n in nets if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in nets if isinstance(n, ipaddress.IPv6Network)]
    ours = median_time(lambda: aggregate([sanitise(parsed.v4, parsed.v6)]), ROUNDS)
    theirs = median_time(
        lambda: (list(ipaddress.collapse_addresses(v4)), list(ipaddress.collapse_addresses(v6))), ROUNDS)
    record("feeds.70k.sanitise_aggregate_s", ours, "s", reference="ipaddress.collapse_addresses",
           reference_value=theirs)

    # -- a 1M-entry feed ----------------------------------------------------------------------------------
    big = make_feed(BIG, 0, seed=2)
    st = median_stages(big, 1)
    record("feeds.1m.parse_s", st["parse"], "s", note=f"{BIG} IPv4 lines, shuffled")
    record("feeds.1m.sanitise_s", st["sanitise"], "s")
    record("feeds.1m.aggregate_s", st["aggregate"], "s", note=f"{int(st['cidrs'])} CIDRs out")
    record("feeds.1m.pipeline_s", st["total"], "s")
    record("feeds.1m.per_entry_us", st["total"] / BIG * 1e6, "us")
    lines = big.splitlines()
    halves = [parse_feed("\n".join(lines[i::2])) for i in (0, 1)]  # the same entries as two feeds
    parts = [sanitise(h.v4, h.v6) for h in halves]
    t0 = time.perf_counter()
    union = aggregate(parts)
    record("feeds.1m.aggregate_2_feeds_s", time.perf_counter() - t0, "s",
           note=f"union of two 500k feeds: {len(parts[0].v4)} + {len(parts[1].v4)} -> {len(union)} CIDRs")
    peak, held = peak_memory(big)
    record("feeds.1m.peak_memory_mb", peak / 1e6, "MB", note="tracemalloc peak of parse+sanitise+aggregate, "
           f"excluding the {len(big) / 1e6:.1f} MB body")
    record("feeds.1m.result_memory_mb", held / 1e6, "MB", note="the Aggregate kept (packed ints)")

    # -- diff of two consecutive versions of the 1M feed (1% churn), on packed ints ---------------------
    a = pipeline(big)
    churn = max(1, BIG // 100)
    changed = "\n".join(lines[churn:]) + "\n" + make_feed(churn, 0, seed=3)
    b = pipeline(changed)
    t0 = time.perf_counter()
    to_add, to_remove = diff(a.v4, b.v4)
    record("feeds.1m.diff_s", time.perf_counter() - t0, "s",
           note=f"{len(a.v4)} vs {len(b.v4)} CIDRs: +{len(to_add)} -{len(to_remove)}")


if __name__ == "__main__":
    main()
