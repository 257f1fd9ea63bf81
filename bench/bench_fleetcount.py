"""Fleet counting (fleet/counting.py: every host counts every member's failure stream itself), measured:

(a) Distributed attack on three real daemons (tests/helpers/fleetlab.py; local maxretry 5, fleet_maxretry 3):
    N attackers (NFTBLOCK_BENCH_FC_ATTACKERS, default 1,000) each fail once on A and once on B (all counted
    before the timed part), then once on C, paced at NFTBLOCK_BENCH_FC_RATE lines/s: C's line is the crossing
    one. Timed: C's line written -> the ban in each host's kernel set (every host decides it from the streams),
    p50 / p99 over all hosts and attackers; 0 missed is checked, and N near-miss addresses (failed on A and B
    only: 2 fleet-wide) must not be banned anywhere. Observed with bench/setwatch.py --timeline as in
    bench_fleet.py.
(b) The burst written at once (#34 item 5), three fresh daemons with the default `count: {rate: 100, burst:
    1000}`: 1,000 attackers failing once on each of A, B and C, every line written to each host's log in one
    write at once, plus 100 near misses on A and B. Timed: the writes -> all 1,000 in all three kernels; missed
    and near misses banned are checked.
"""

# Raw Redis replies (execute_command, the RESP parser) are untyped; the benchmark reads them by shape.
# mypy: disable-error-code="attr-defined,union-attr,index,arg-type,no-untyped-call,misc,str-unpack,assignment"
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


from bench.bench_fleet import Timeline, arrivals, pct, total  # noqa: E402
from bench.common import record, settle  # noqa: E402
from tests.helpers.fleetlab import FleetLab  # noqa: E402
from tests.helpers.netns import wait_for  # noqa: E402

ATTACKERS = int(os.environ.get("NFTBLOCK_BENCH_FC_ATTACKERS", "1000"))
LINE_RATE = float(os.environ.get("NFTBLOCK_BENCH_FC_RATE", "500"))
HOSTS = int(os.environ.get("NFTBLOCK_BENCH_FC_HOSTS", "1000"))
FPS = float(os.environ.get("NFTBLOCK_BENCH_FC_FPS", "10000"))
SIM_SECONDS = float(os.environ.get("NFTBLOCK_BENCH_FC_SECONDS", "10"))
READERS = int(os.environ.get("NFTBLOCK_BENCH_FC_READERS", "10"))
SET4 = "default_ip4"

_pid = iter(range(10_000, 10**7))


def line(addr: str, stamp: str) -> str:
    return f"{stamp} web1 sshd[{next(_pid)}]: Failed password for invalid user admin from {addr} port 4242 ssh2\n"


# -- (a) three daemons ---------------------------------------------------------------------------------------


def distributed(lab: FleetLab) -> tuple[list[float], int, int]:
    """(per ban and host: C's crossing line -> that host's kernel, missed, innocents banned)."""
    hosts = ("a", "b", "c")
    attackers = [f"10.60.{i // 256}.{i % 256}" for i in range(ATTACKERS)]
    near = [f"10.61.{i // 256}.{i % 256}" for i in range(ATTACKERS)]
    stamp = time.strftime("%b %e %H:%M:%S")
    before = {h: lab.fleet(h)["counting"]["accepted"] for h in hosts}
    for h in ("a", "b"):
        with lab.logs[h].open("a") as f:
            f.write("".join(line(x, stamp) for x in attackers + near))
    for h in ("a", "b"):
        wait_for(lambda h=h: lab.fleet(h)["counting"]["accepted"] - before[h] >= 2 * ATTACKERS, 60, 0.1,
                 f"{h}'s failures counted")
    base = {h: total(lab, h, SET4) for h in hosts}
    watches = {h: Timeline(lab.nss[h], SET4, base[h] + ATTACKERS, 120) for h in hosts}
    sent: list[float] = []
    with lab.logs["c"].open("a") as f:
        t0 = time.monotonic()
        for i, x in enumerate(attackers):
            delay = t0 + i / LINE_RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            f.write(line(x, stamp))
            f.flush()
            sent.append(time.monotonic())
    lat: list[float] = []
    missed = 0
    for h in hosts:
        points, seen = watches[h].points()
        if seen is None:
            missed += base[h] + ATTACKERS - (points[-1][1] if points else base[h])
            continue
        mine = [t - s for t, s in zip(arrivals(points, base[h], ATTACKERS), sent, strict=True)]
        print(f"  {h}: p50/p99 {pct(mine, 0.5) * 1000:.1f}/{pct(mine, 0.99) * 1000:.1f} ms", flush=True)
        lat += mine
    innocents = sum(1 for h in hosts for x in lab.banned(h) if x.startswith("10.61."))
    return lat, missed, innocents


def part_a() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="nbb-fleetcount-"))
    lab = FleetLab(tmp, fleet="fcbench", maxretry=5, allowlist="[]",
                   fleet_extra="trust: {rate: 1000000, burst: 1000000}\n  count: {rate: 100000, burst: 100000}",
                   jail_extra="fleet_maxretry: 3")
    lab.start()
    try:
        assert lab.server is not None
        settle()
        lat, missed, innocents = distributed(lab)
    finally:
        lab.close()
    note = (f"{ATTACKERS} attackers, C's line paced at {LINE_RATE:.0f}/s; {missed} missed, {innocents} near-miss "
            f"innocents banned (of {ATTACKERS}, on 3 hosts)")
    print(f"(a) crossing line -> every kernel p50/p99 {pct(lat, 0.5) * 1000:.1f}/{pct(lat, 0.99) * 1000:.1f} ms; "
          f"{note}", flush=True)
    if lat:
        record("fleet count: crossing line on C -> ban in A,B,C kernels, p50", pct(lat, 0.5) * 1000, "ms",
               note=note)
        record("fleet count: crossing line on C -> ban in A,B,C kernels, p99", pct(lat, 0.99) * 1000, "ms",
               target="< 100 ms", note=note)
    record("fleet count: attackers missed", float(missed), "bans", target="0", note=note)
    record("fleet count: near-miss innocents banned", float(innocents), "bans", target="0", note=note)


# -- (b) the burst written at once -------------------------------------------------------------------------


def part_b() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="nbb-fcburst-"))
    lab = FleetLab(tmp, fleet="fcburst", maxretry=5, allowlist="[]", jail_extra="fleet_maxretry: 3")
    lab.start()
    hosts = ("a", "b", "c")
    attackers = [f"10.62.{i // 256}.{i % 256}" for i in range(ATTACKERS)]
    near = [f"10.63.{i // 256}.{i % 256}" for i in range(100)]
    try:
        settle()
        stamp = time.strftime("%b %e %H:%M:%S")
        base = {h: total(lab, h, SET4) for h in hosts}
        t0 = time.monotonic()
        for h in hosts:
            with lab.logs[h].open("a") as f:
                f.write("".join(line(x, stamp) for x in attackers + (near if h != "c" else [])))
        took: dict[str, float] = {}
        for h in hosts:
            wait_for(lambda h=h: total(lab, h, SET4) - base[h] >= ATTACKERS, 120, 0.02, f"the burst on {h}")
            took[h] = time.monotonic() - t0
        banned = {h: lab.banned(h) for h in hosts}
        missed = sum(1 for h in hosts for x in attackers if x not in banned[h])
        innocents = sum(1 for h in hosts for x in banned[h] if x.startswith("10.63."))
        counting = {h: lab.fleet(h)["counting"] for h in hosts}
    finally:
        lab.close()
    note = (f"{ATTACKERS} attackers x 3 hosts written at once, default count rate 100 burst 1000; {missed} missed, "
            f"{innocents} near misses banned; deferred a/b/c {'/'.join(str(counting[h]['deferred']) for h in hosts)}"
            f", dropped {sum(counting[h]['dropped'] for h in hosts)}")
    print(f"(b) burst at once: all banned on A/B/C in {'/'.join(f'{took[h]:.2f}' for h in hosts)} s; {note}",
          flush=True)
    record("fleet count: burst at once, all banned on every host", max(took.values()), "s", note=note)
    record("fleet count: burst at once, attackers missed", float(missed), "bans", target="0", note=note)


def main() -> None:
    if os.geteuid() != 0:
        print("bench_fleetcount needs root (namespaces)")
        return
    part_a()
    settle()
    part_b()


if __name__ == "__main__":
    main()
