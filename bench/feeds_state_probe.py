"""What a feed refresh's ban-state work costs on the way to the kernel: a probe, not a `make bench` figure.

Each sample runs the next copy's pipeline first (bench_feeds_kernel.py's 70k feed and its 1 % churned copy,
alternating, as `FeedManager.sync` does just before `apply_desired`), diffs it against the copy applied
before (`AppliedSets.plan`), then times `BanState.apply_delta` for every set in thread CPU time:

  deferred   `apply_delta` as the refresh runs it: a bulk change's additions wait for the first reader
  eager      `apply_delta` and the read that enters them at once (the work before round seven)
  settle     that read alone, as the first reader after a refresh pays it

The two variants alternate; medians of R samples each. It touches no kernel and needs no root.

    python bench/feeds_state_probe.py          # NFTBLOCK_PROBE_REPS=30
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_feeds_kernel import CONFIG, feeds, stages
from nftblockd.config import parse_config
from nftblockd.feeds.delta import AppliedSets
from nftblockd.kernel.bans import BanState
from nftblockd.kernel.ruleset import plan_ruleset

REPS = int(os.environ.get("NFTBLOCK_PROBE_REPS", "30"))


def main() -> None:
    base, churned, _ = feeds()
    state = BanState(plan_ruleset(parse_config(CONFIG)))
    applied = AppliedSets()
    first = stages(base)[2]
    for name, keys in first.items():
        state.replace_set(name, keys, None)
    applied.record(first, None, 0, None)
    samples: dict[str, list[float]] = {"deferred": [], "eager": [], "settle": []}
    for i in range(2 * REPS):
        eager = i % 4 in (1, 2)  # the variants alternate, each after either copy
        desired = stages(churned if i % 2 == 0 else base)[2]
        deltas = applied.plan(desired, None, 0)
        assert deltas is not None
        t0 = time.thread_time_ns()
        for name, (added, removed, renewed) in deltas.items():
            state.apply_delta(name, added, removed, renewed, None)
        t1 = time.thread_time_ns()
        for name in desired:
            _ = state.sets[name].entries
        t2 = time.thread_time_ns()
        applied.record(desired, None, 0, deltas)
        if eager:
            samples["eager"].append((t2 - t0) / 1e6)
        else:
            samples["deferred"].append((t1 - t0) / 1e6)
            samples["settle"].append((t2 - t1) / 1e6)
    for name, xs in samples.items():
        print(f"{name:10s} {statistics.median(xs):.3f} ms  (q1 {statistics.quantiles(xs)[0]:.3f}, "
              f"q3 {statistics.quantiles(xs)[2]:.3f}, n={len(xs)})")


if __name__ == "__main__":
    main()
