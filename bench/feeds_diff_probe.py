"""What a feed refresh's diff costs, set by set, as the feed manager runs it: a probe, not a `make bench` figure.

Each sample aggregates the churned copy of bench_feeds_kernel.py's 70k feed first (as `FeedManager.sync` does
just before `apply_desired`: the new keys are as warm as they are there), then times one diff of an interval
set's keys against the base copy's, in thread CPU time, the variants interleaved; medians of R samples:

  net4 list     `diff_sorted` over the two int lists (the walk before the packed keys)
  net4 packed   `diff_packed`: the old keys read from their int64 buffer, the new ones packed on the way
  net4 pack     `pack` of the new keys alone (what a full sync's first refresh adds once)
  net6 list     `diff_sorted` over the IPv6 lists (136-bit keys: no packing)
  plan          `AppliedSets.plan` of the whole refresh (both families), alternating base and churned copy

Run with the native extension built (`make venv`); it touches no kernel and needs no root.

    python bench/feeds_diff_probe.py          # NFTBLOCK_PROBE_REPS=20
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_feeds_kernel import BLOCKLIST, feeds, stages
from nftblockd.feeds import delta
from nftblockd.feeds.delta import AppliedSets, diff_packed, diff_sorted, pack
from nftblockd.kernel.ruleset import set_name

REPS = int(os.environ.get("NFTBLOCK_PROBE_REPS", "20"))


def main() -> None:
    if not delta.NATIVE:
        sys.exit("feeds/_sorted.c is not built: the probe times the native diff")
    base, churned, _ = feeds()
    old = stages(base)[2]
    net4, net6 = set_name(BLOCKLIST, 4, True), set_name(BLOCKLIST, 6, True)
    old4, old6 = old[net4], old[net6]
    old4_packed = pack(old4)
    assert old4_packed is not None
    variants: dict[str, Callable[[dict[str, list[int]]], object]] = {
        "net4 list": lambda new: diff_sorted(old4, new[net4]),
        "net4 packed": lambda new: diff_packed(old4_packed, old4, new[net4]),
        "net4 pack": lambda new: pack(new[net4]),
        "net6 list": lambda new: diff_sorted(old6, new[net6]),
    }
    samples: dict[str, list[float]] = {name: [] for name in [*variants, "plan"]}
    applied = AppliedSets()
    applied.record(old, None, 0, None)
    for i in range(REPS):
        order = list(variants) if i % 2 else list(reversed(variants))
        for name in order:
            new = stages(churned)[2]
            t0 = time.thread_time_ns()
            variants[name](new)
            samples[name].append((time.thread_time_ns() - t0) / 1e6)
        want = stages(churned if i % 2 == 0 else base)[2]
        t0 = time.thread_time_ns()
        plan = applied.plan(want, None, 0)
        samples["plan"].append((time.thread_time_ns() - t0) / 1e6)
        applied.record(want, None, 0, plan)
    print(f"{len(old4)} IPv4 and {len(old6)} IPv6 keys; thread CPU ms, medians of {REPS}")
    for name, xs in samples.items():
        print(f"  {name:12} {statistics.median(xs):.3f}  ({min(xs):.3f}-{max(xs):.3f})")


if __name__ == "__main__":
    main()
