"""`nftblock ban` as a process, what fail2ban's shell action (packaging/fail2ban/action.d/nftblock.conf) runs
once per ban, against an `nft add element` process doing the same to a plain set. Target: at most 5 times the
`nft` process's wall time.

Both commands run in the daemon's private network namespace: this thread setns()s into it and starts each
process with posix_spawn, the cheapest way to start one, so the figures are the processes' own. The nftblock
script is the one the package installs (packaging/entry-script.sh, Debian's /usr/bin/python3 -IS) with this
checkout as its library directory, and its arguments are the shell action's. Its time includes the round trip
to the daemon: the daemon answers once the kernel acknowledged the ban (batch delay 2 ms, as configured in
the example config; a lone ban that finds the batcher idle is flushed at once, so the second figure, delay 0,
should match the first within noise). `nft` writes to a set of its own in the same namespace. The two alternate, after a
warm-up, so both see the same machine; medians of N each.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import record, settle
from tests.helpers.daemon import DaemonProc
from tests.helpers.netns import NetNS, inside
from tests.helpers.package import write_entry_script

N = int(os.environ.get("NFTBLOCK_BENCH_CLI_N", "200"))
WARMUP = 10
CONFIG = """
blocklists: {default: {timeout: 1h, size: 65536}}
allowlist_self: false
batch: {delay: %s}
reconcile: {interval: 1h}
"""


def spawn_wall(argv: list[str]) -> float:
    """Wall time of one process, from posix_spawn to its exit; raises if it failed."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        t0 = time.perf_counter()
        pid = os.posix_spawn(argv[0], argv, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
                             file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 1)])
        _, status = os.waitpid(pid, 0)
        dt = time.perf_counter() - t0
    finally:
        os.close(devnull)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv} failed with {os.waitstatus_to_exitcode(status)}")
    return dt


def measure(script: Path, nft: str, work: Path, delay: str) -> tuple[list[float], list[float], list[float]]:
    """(nftblock ban, nft add element, python3 -IS -c pass) wall times against a daemon with this batch delay."""
    ns = NetNS()
    d = DaemonProc(ns, work / f"d-{delay}", CONFIG % delay).start()
    a: list[float] = []
    b: list[float] = []
    floor: list[float] = []
    try:
        ns.nft("add", "table", "inet", "ref")
        ns.nft("add", "set", "inet", "ref", "s", "{ type ipv4_addr; flags timeout; size 65536; }")

        def ip(i: int) -> str:
            return f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"

        def ours(i: int) -> list[str]:  # as packaging/fail2ban/action.d/nftblock.conf runs it
            return [str(script), "--socket", d.socket, "ban", ip(i), "--timeout", "600s", "--set", "default",
                    "--comment", "f2b sshd", "--jail", "sshd", "--origin", "fail2ban"]

        def theirs(i: int) -> list[str]:
            return [nft, "add", "element", "inet", "ref", "s", f"{{ {ip(i)} timeout 600s }}"]

        settle()
        with inside(ns):
            for i in range(WARMUP):
                spawn_wall(ours(i))
                spawn_wall(theirs(i))
            for i in range(WARMUP, WARMUP + N):
                a.append(spawn_wall(ours(i)))
                b.append(spawn_wall(theirs(i)))
                if i % 4 == 0:
                    floor.append(spawn_wall(["/usr/bin/python3", "-IS", "-c", "pass"]))
        assert len(d.cli_json("list")["bans"]) == WARMUP + N  # every ban arrived
    finally:
        d.close()
        ns.delete()
    return a, b, floor


def main() -> int:
    nft = subprocess.run(["sh", "-c", "command -v nft"], capture_output=True, text=True).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="nbcli-", dir="/tmp"))
    script = write_entry_script(work, "nftblock")
    ms = 1000.0
    a, b, floor = measure(script, nft, work, "2ms")
    ours_ms, theirs_ms = statistics.median(a) * ms, statistics.median(b) * ms
    record("nftblock ban process (fail2ban shell action), median", ours_ms, "ms",
           reference="nft add element process", reference_value=theirs_ms, target="ratio <= 5",
           note=f"median of {N}, daemon batch delay 2ms (the example config); p90 "
                f"{statistics.quantiles(a, n=10)[-1] * ms:.1f} ms vs {statistics.quantiles(b, n=10)[-1] * ms:.1f} ms")
    record("python3 -IS -c pass process (the interpreter's floor), median", statistics.median(floor) * ms, "ms",
           reference="nft add element process", reference_value=theirs_ms)
    # The same with no batch window at all: a lone ban after idle skips the window, so this should match.
    a0, b0, _ = measure(script, nft, work, "0ms")
    record("nftblock ban process, daemon batch delay 0, median", statistics.median(a0) * ms, "ms",
           reference="nft add element process", reference_value=statistics.median(b0) * ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
