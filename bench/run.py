"""`make bench`: run every bench/bench_*.py in turn (each in its own process), then print the table.

Each script records its figures with bench.common.record into bench/results.json, next to a reference
measured in the same run where one exists. NFTBLOCK_BENCH_ONLY=enforce,ops runs a subset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.common import settle, target_met  # noqa: E402

ORDER = ["enforce", "ops", "e2e", "matcher", "feeds", "feeds_kernel", "tail", "tracker", "store", "cli", "scale"]


def main() -> int:
    results = HERE / "results.json"
    results.unlink(missing_ok=True)
    only = [x for x in os.environ.get("NFTBLOCK_BENCH_ONLY", "").split(",") if x]
    scripts = sorted(HERE.glob("bench_*.py"), key=lambda p: (ORDER.index(p.stem[6:]) if p.stem[6:] in ORDER
                                                               else 99, p.name))
    failed = []
    for script in scripts:
        if only and script.stem[6:] not in only:
            continue
        waited = settle()
        print(f"\n### {script.name}" + (f" (after {waited:.1f}s for the machine to settle)" if waited > 1 else ""),
              flush=True)
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, str(script)], cwd=HERE.parent)
        print(f"### {script.name}: exit {rc} after {time.monotonic() - t0:.0f}s", flush=True)
        if rc:
            failed.append(script.name)
    print("\n" + "=" * 110)
    print(f"{'benchmark':<60} {'value':>12} {'unit':<9} {'reference':>12} {'ratio':>8}  target")
    missed = []
    entries = json.loads(results.read_text()) if results.exists() else []
    for e in entries:
        ref = f"{e['reference_value']:.4g}" if "reference_value" in e else ""
        ratio = f"{e['ratio']:.3f}" if e.get("ratio") is not None else ""
        met = target_met(e) if "target" in e else None
        verdict = {True: " (met)", False: " (NOT MET)", None: ""}[met]
        if met is False:
            missed.append(e["name"])
        print(f"{e['name'][:60]:<60} {e['value']:>12.4g} {e['unit']:<9} {ref:>12} {ratio:>8}  "
              f"{e.get('target', '')}{verdict}")
    judged = sum(1 for e in entries if "target" in e and target_met(e) is not None)
    print(f"\ntargets: {judged - len(missed)} of {judged} met" + "".join(f"\n  not met: {n}" for n in missed))
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
