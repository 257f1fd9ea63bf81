"""Shared helpers for benchmark scripts: every script records its figures through `record`.

Results are appended to bench/results.json (one object per benchmark: name, value, unit and, where there is a
reference measured in the same run, reference, reference_value and ratio = ours / reference).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(os.environ.get("NFTBLOCK_BENCH_RESULTS", Path(__file__).with_name("results.json")))


def record(name: str, value: float, unit: str, *, reference: str | None = None,
           reference_value: float | None = None, target: str | None = None, note: str = "",
           ratio: float | None = None) -> dict[str, Any]:
    """`ratio` (optional): the figure's ratio to its reference when it is not value / reference_value, e.g. the
    median of per-pair ratios of interleaved samples (`paired_ratio`), which a shared machine's drift between
    pairs does not move as it moves two separate medians."""
    entry: dict[str, Any] = {"name": name, "value": round(value, 6), "unit": unit}
    if reference is not None and reference_value is not None:
        entry["reference"] = reference
        entry["reference_value"] = round(reference_value, 6)
        if ratio is None:
            entry["ratio"] = round(value / reference_value, 4) if reference_value else None
        else:
            entry["ratio"] = round(ratio, 4)
    if target:
        entry["target"] = target
    if note:
        entry["note"] = note
    data: list[dict[str, Any]] = []
    if RESULTS.exists():
        try:
            data = json.loads(RESULTS.read_text())
        except ValueError:
            data = []
    data = [d for d in data if d.get("name") != name] + [entry]
    RESULTS.write_text(json.dumps(data, indent=2) + "\n")
    shown = f"  ratio {entry['ratio']:.3f} vs {reference} ({reference_value:.4g} {unit})" if "ratio" in entry \
        and entry["ratio"] is not None else ""
    tgt = f"  [target {target}]" if target else ""
    print(f"{name:<58} {value:>12.4g} {unit:<8}{shown}{tgt}", flush=True)
    return entry


def paired_ratio(ours: list[float], reference: list[float]) -> float:
    """The median of ours[i] / reference[i]: each pair taken next to each other (interleaved, the order
    alternating), so a machine that gets busier or quieter between pairs moves both halves of a pair alike."""
    if len(ours) != len(reference) or not ours:
        raise ValueError(f"paired_ratio needs pairs: {len(ours)} against {len(reference)} samples")
    return statistics.median(a / b for a, b in zip(ours, reference, strict=True))


def alternating(a: Callable[[], Any], b: Callable[[], Any], rounds: int) -> tuple[float, float]:
    """(a, b) in seconds, each the median of `rounds` runs taken in turn: a busy machine slows both alike."""
    ta: list[float] = []
    tb: list[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        a()
        t1 = time.perf_counter()
        b()
        t2 = time.perf_counter()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
    return statistics.median(ta), statistics.median(tb)


def median_time(fn: Callable[[], Any], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def settle(max_busy: float = 0.10, window: float = 0.5, limit: float = 60.0) -> float:
    """Wait until the machine is quiet (under `max_busy` of all CPUs over `window` s), at most `limit` s;
    returns how long it waited. The kernel tears a deleted namespace down in the background, and a table
    with a million elements takes seconds of a CPU: a timing taken during that measures the teardown."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        b0, t0_ = _cpu_times()
        time.sleep(window)
        b1, t1 = _cpu_times()
        if t1 > t0_ and (b1 - b0) / (t1 - t0_) < max_busy:
            break
    return time.monotonic() - t0


_SCALE = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_TARGET = re.compile(r"^\s*(?P<ratio>ratio\s*)?(?P<op><=|>=|<|>|≤|≥)\s*(?P<num>[0-9][0-9,]*(?:\.[0-9]+)?)\s*"
                     r"(?P<unit>[^\s0-9][^\s]*)?")


def target_met(entry: dict[str, Any]) -> bool | None:
    """Whether a recorded figure meets its target, or None when the target is not a simple bound.

    Targets are the strings the scripts record: "0", "< 20 ms", "<= 1.5 s for 1M", ">= 100000", "<= 2x" and
    "ratio <= 1.10" (the last two bound the ratio to the reference). A unit that differs from the figure's is
    converted between ns, us, ms and s; anything else (a bound with another unit, free text) is None, so the
    table never claims a verdict it did not compute.
    """
    target = str(entry.get("target", "")).strip()
    value = float(entry["value"])
    if target == "0":
        return value == 0
    m = _TARGET.match(target)
    if m is None:
        return None
    bound = float(m["num"].replace(",", ""))
    unit = m["unit"]
    if m["ratio"] or unit in ("x", "\u00d7"):
        if entry.get("ratio") is None:
            return None
        value = float(entry["ratio"])
    elif unit is not None and unit != entry["unit"]:
        if unit not in _SCALE or entry["unit"] not in _SCALE:
            return None
        bound = bound * _SCALE[unit] / _SCALE[entry["unit"]]
    op = {"≤": "<=", "≥": ">="}.get(m["op"], m["op"])
    return {"<": value < bound, "<=": value <= bound, ">": value > bound, ">=": value >= bound}[op]
