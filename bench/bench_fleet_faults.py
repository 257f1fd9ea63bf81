"""Fleet mode under server faults, at the sizes of issue #23 (tests/integration/test_fleet_faults.py runs short
versions and asserts them). Each figure is printed and recorded next to its target:

- Sentinel failover, the primary SIGKILLed under 200 bans/s, 6 cycles (primary + 2 replicas + 3 Sentinels with
  `down-after-milliseconds 1000`): the longest time B received nothing per cycle (target < 3 s), the election
  alone (kill -> the Sentinels name another primary), acknowledged bans missing on B (target 0)
- the same with `min-replicas-to-write 1`: missing (target 0), A's refused publishes, the drain after the
  producer stopped
- a 30,000-ban outbox (decided over 20 minutes of outage) flushed when the server returns: B's refusals
  (target 0), deferrals, time until all are on B
- real daemons in namespaces (tests/helpers/fleetlab.py): the server restarted empty while A is down (10,000 of
  A's bans; any that leave B's kernel: target 0); B partitioned from the server for 60 s while A bans 10,000
  (noticed: target < 3 s; heal -> all on B: target < 2 s)
- refusals (wrong CA either side, expired or missing client certificate, wrong password): the journal line
- a host publishing under another host's id: what B and the real owner do
- one host pushing 1,000,000 bans (trust cap raised, as an operator expecting that would): A's publish time,
  the server's memory, B's and C's catch-up

NFTBLOCK_BENCH_FAULTS_QUICK=1: small sizes (a smoke run of the script itself). NFTBLOCK_BENCH_FAULTS_ONLY=
failovers,backlog,lab_faults,refusals,spoof,million: those parts only.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.common import record  # noqa: E402
from tests.helpers import faults  # noqa: E402
from tests.helpers.fleetlab import FleetLab  # noqa: E402
from tests.helpers.netns import wait_for  # noqa: E402

QUICK = os.environ.get("NFTBLOCK_BENCH_FAULTS_QUICK") == "1"
ONLY = [x for x in os.environ.get("NFTBLOCK_BENCH_FAULTS_ONLY", "").split(",") if x]
CYCLES = 2 if QUICK else 6
BACKLOG = 3000 if QUICK else 30_000
LAB_BANS = 1000 if QUICK else 10_000
PARTITION = 8.0 if QUICK else 60.0
MILLION = 20_000 if QUICK else 1_000_000


def failovers(tmp: Path) -> None:
    for min_replicas in (False, True):
        label = "failover, min-replicas-to-write 1" if min_replicas else "failover"
        fig = asyncio.run(faults.failover(tmp / label.replace(" ", "_"), CYCLES, 200.0, min_replicas=min_replicas))
        print(f"{label}: stalls {[round(s, 2) for s in fig.stalls]} s, elections "
              f"{[round(s, 2) for s in fig.elections]} s; {fig.acknowledged} acknowledged, {fig.missing} missing on "
              f"B, {fig.removed} removed; {fig.refusals} refused publishes; drain {fig.drain:.2f} s", flush=True)
        record(f"fleet {label}: longest stall on B over {CYCLES} SIGKILL cycles", max(fig.stalls), "s",
               reference="Sentinel election alone (longest)", reference_value=max(fig.elections), target="< 3 s",
               note=f"median stall {statistics.median(fig.stalls):.2f} s at 200 bans/s")
        record(f"fleet {label}: acknowledged bans missing on B", fig.missing, "bans", target="0",
               note=f"of {fig.acknowledged}; {fig.refusals} publishes refused and retried")


def backlog(tmp: Path) -> None:
    fig = asyncio.run(faults.backlog(tmp / "backlog", BACKLOG))
    print(f"backlog: {fig}", flush=True)
    record(f"fleet {BACKLOG} backlogged bans: refused by B's gate", fig.refused, "bans", target="0",
           note=f"{fig.deferred} deferred and applied later; {fig.missing} missing")
    record(f"fleet {BACKLOG} backlogged bans: server back -> all on B", fig.delivered, "s")


def lab_faults(tmp: Path) -> None:
    lab = FleetLab(tmp / "lab", fleet="faults").start()
    try:
        empty = faults.empty_restart(lab, LAB_BANS)
        print(f"empty server: {empty}", flush=True)
        record(f"fleet server restarted empty, A down: A's {LAB_BANS} bans removed from B's kernel",
               empty.removed_on_b, "bans", target="0", note=f"{empty.polls} polls of B's set")
        part = faults.partition(lab, LAB_BANS, PARTITION)
        print(f"partition: {part}", flush=True)
        record(f"fleet partition {PARTITION:g} s: cut -> noticed by the cut-off host", part.noticed, "s",
               target="< 3 s")
        record(f"fleet partition {PARTITION:g} s: heal -> A's {LAB_BANS} bans on B", part.healed, "s", target="< 2 s")
    finally:
        lab.close()


def refusals(tmp: Path) -> None:
    for r in asyncio.run(faults.refusals(tmp / "refusals")):
        print(f"refusal, {r.case}: traceback={r.traceback}\n    {r.line}", flush=True)


def spoof(tmp: Path) -> None:
    fig = asyncio.run(faults.spoof(tmp / "spoof"))
    print(f"spoofed origin: M published {fig.n} bans as 'a': B applied {fig.applied_on_b} (as a's), A applied "
          f"{fig.applied_on_a} and counted {fig.own_seen_by_a} entries as its own (it published "
          f"{fig.published_by_a}); a forged unban of A's real ban removed it on B: {fig.unban_applied_on_b}",
          flush=True)


def million(tmp: Path) -> None:
    lab = FleetLab(tmp / "million", fleet="million", fleet_extra="trust: {rate: 10000000, burst: 10000000}",
                   set_size=2 * MILLION).start()
    try:
        addrs = "\n".join(f"10.{128 + i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(MILLION)) + "\n"
        t0 = time.monotonic()
        r = lab.daemons["a"].cli("ban", "-", "--timeout", "1h", input=addrs)
        assert r.returncode == 0, r.stderr
        t_kernel = time.monotonic() - t0
        wait_for(lambda: lab.fleet("a")["outbox"] == 0 and lab.fleet("a")["published"] >= MILLION, 1200, 0.5,
                 "A published")
        t_pub = time.monotonic() - t0
        mem = next(int(x.split(":")[1]) for x in lab.redis_cli("INFO", "memory").splitlines()
                   if x.startswith("used_memory:"))
        for h in ("b", "c"):
            wait_for(lambda h=h: lab.count(h) >= MILLION, 1200, 0.5, f"all on {h}")  # type: ignore[misc]
        t_all = time.monotonic() - t0
        print(f"1M: A's kernel {t_kernel:.1f} s, published {t_pub:.1f} s, on B and C {t_all:.1f} s; server "
              f"used_memory {mem / 2**20:.0f} MiB", flush=True)
        record(f"fleet {MILLION} bans pushed by A: `nftblock ban -` -> all on B and C", t_all, "s",
               reference="-> all published by A", reference_value=t_pub)
        record(f"fleet {MILLION} bans: the server's used_memory", mem / 2**20, "MiB")
    finally:
        lab.close()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nbfaults") as d:
        tmp = Path(d)
        for part in (failovers, backlog, lab_faults, refusals, spoof, million):
            if not ONLY or part.__name__ in ONLY:
                part(tmp)


if __name__ == "__main__":
    main()
