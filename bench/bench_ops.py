"""Operations benchmarks: restart with 1,000,000 saved bans to READY=1, metrics scrape time with 1,000,000
banned elements, and the idle daemon's CPU and wake-ups.

The daemon runs in a private network namespace; "reboot" is simulated by deleting its table after a stop
(the kernel sets are empty after a reboot), so the restart has to put every saved ban back before READY.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import record
from nftblockd.neverban import never_ban_range
from tests.helpers.daemon import DaemonProc
from tests.helpers.netns import NetNS, inside

N = int(os.environ.get("NFTBLOCK_BENCH_OPS_N", "1000000"))
CONFIG = """
blocklists: {default: {timeout: 1h, size: 2000000}}
allowlist_self: false
reconcile: {interval: 30s}
metrics: {listen: "127.0.0.1:9789"}
"""


def addresses(n: int) -> list[str]:
    rnd = random.Random(5)
    out: set[int] = set()
    while len(out) < n:
        a = rnd.randrange(0x0B000000, 0xDF000000)
        if never_ban_range(4, a, a) is None:  # loopback and link-local are refused, as from any source
            out.add(a)
    return [str(ipaddress.IPv4Address(a)) for a in out]


def scrape(ns: NetNS) -> tuple[float, int]:
    with inside(ns):
        conn = http.client.HTTPConnection("127.0.0.1", 9789, timeout=30)
        conn.connect()
    t0 = time.perf_counter()
    conn.request("GET", "/metrics")
    body = conn.getresponse().read()
    dt = time.perf_counter() - t0
    conn.close()
    return dt, len(body)


def cpu_and_wakeups(pid: int, seconds: float) -> tuple[float, float]:
    """(CPU seconds per second, voluntary+involuntary context switches per second) over all threads."""
    def sample() -> tuple[float, int]:
        ticks = os.sysconf("SC_CLK_TCK")
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(stat[11]) + int(stat[12])) / ticks
        switches = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    switches += int(line.split()[1])
        return cpu, switches

    c0, s0 = sample()
    time.sleep(seconds)  # measuring an idle process over a fixed window, not waiting for a result
    c1, s1 = sample()
    return (c1 - c0) / seconds, (s1 - s0) / seconds


def row_saved_db(path: Path, n: int) -> None:
    """A state database holding `n` jail bans saved one row each, every one with its own end: what jail bans
    (saved one decision at a time) leave behind, and what every database written before bulk rows holds."""
    from nftblockd.state.store import Store

    path.parent.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(6)
    now = time.time()
    with Store.open(path) as st:
        keys = [int(ipaddress.IPv4Address(a)) for a in addresses(n)]
        for i in range(0, n, 100_000):  # one row per ban: each its own end (~ a week of sshd bans)
            st.commit(save_packed=[("default", [k.to_bytes(4, "big")], now + 3600 + rnd.random() * 7 * 86400, "jail",
                                    "5 failures in 10m", "sshd") for k in keys[i:i + 100_000]], created=now)


def nft_load_reference(n: int) -> float:
    """Seconds for `nft -f` to load the same kind of elements (n IPv4 addresses, each with its own timeout of
    1 h to a week) into an identical set in a fresh namespace: what the restore's kernel part is up against."""
    rnd = random.Random(6)
    ns = NetNS("nbb")
    try:
        ns.run("nft", "-f", "-", input="table inet ref {\n set s { type ipv4_addr; size 2000000; flags timeout; }\n}\n")
        with tempfile.NamedTemporaryFile("w", suffix=".nft", delete=False) as f:
            f.write("add element inet ref s { " + ", ".join(
                f"{a} timeout {3600 + int(rnd.random() * 7 * 86400)}s" for a in addresses(n)) + " }\n")
            path = f.name
        t0 = time.perf_counter()
        ns.run("nft", "-f", path)
        secs = time.perf_counter() - t0
        os.unlink(path)
        return secs
    finally:
        ns.delete()


def compile_bytecode() -> None:
    """Byte-compile the package as an installed nftblockd is (Debian's py3compile), so that a restart times
    the daemon and not the compiling of its sources: with PYTHONDONTWRITEBYTECODE set (as on this machine)
    every start compiled all of them again, ~0.3 s of READY."""
    import compileall

    compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "nftblockd"), quiet=1)


def restart_from_rows(tmp: Path, rounds: int = 3) -> None:
    """READY after a reboot (table gone) with N jail bans saved one row each, and with the same bans once the
    daemon compacted them into bulk rows (after READY): a first restart from the rows lets the daemon compact
    them and gives the compacted database; then `rounds` rounds, each one restart from a fresh copy of each
    database, interleaved (the machine is shared: a burst of load hits both kinds alike). Medians of each."""
    import shutil

    template = tmp / "rows-template.db"
    row_saved_db(template, N)
    compacted_template = tmp / "compacted-template.db"
    ns = NetNS("nbb")
    d = DaemonProc(ns, tmp / "rows", CONFIG.replace("9789", "9790"))
    db = Path(d.state_dir) / "state.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    legacy: list[float] = []
    compacted: list[float] = []
    cpu: dict[str, list[float]] = {"legacy": [], "compacted": []}

    def fresh(source: Path) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
            if Path(f"{source}{suffix}").exists():  # a stopped daemon's WAL holds its last writes
                shutil.copyfile(f"{source}{suffix}", f"{db}{suffix}")

    def restart(kind: str) -> float:
        t0 = time.monotonic()
        d.start(timeout=120)
        ready = time.monotonic() - t0
        assert d.proc is not None  # `ip netns exec` execs the daemon: this pid is the daemon's
        stat = Path(f"/proc/{d.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu[kind].append((int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK"))  # CPU s until READY
        count = int(d.cli_json("status")["sets"][2]["elements"])
        assert count == N, count
        return ready

    try:
        fresh(template)
        legacy.append(restart("legacy"))  # this one compacts the rows (it logs when done) before stopping
        deadline = time.monotonic() + 120
        while "compacted into bulk rows" not in d.log() and time.monotonic() < deadline:
            time.sleep(0.2)  # polling the daemon's log for a line, bounded
        assert d.stop() == 0
        ns.nft("delete", "table", "inet", "nftblock")
        for suffix in ("", "-wal"):
            if Path(f"{db}{suffix}").exists():
                shutil.copyfile(f"{db}{suffix}", f"{compacted_template}{suffix}")
        for r in range(rounds):
            for kind, source in (("compacted", compacted_template), ("legacy", template)):
                if kind == "legacy" and r == rounds - 1:
                    break  # the first restart was a round of its own
                fresh(source)
                (legacy if kind == "legacy" else compacted).append(restart(kind))
                assert d.stop() == 0
                ns.nft("delete", "table", "inet", "nftblock")
    finally:
        d.close()
        ns.delete()
    lines = [line.split("nftblockd: ")[-1] for line in d.log().splitlines()
             if "restored" in line or "compacted" in line]
    restored = [x for x in lines if "restored" in x]
    ref = nft_load_reference(N)
    legacy_note = (f"median of {rounds} restarts interleaved with the compacted ones, each from a fresh copy "
                   f"({min(legacy):.2f}-{max(legacy):.2f} s; daemon CPU to READY "
                   f"{statistics.median(cpu['legacy']):.2f} s); jail bans with their own ends; "
                   f"{restored[0] if restored else ''}")
    record(f"restart with {N:,} bans saved one row each to READY=1", statistics.median(legacy), "s",
           reference=f"nft -f of {N:,} elements with timeouts", reference_value=ref, target="<= 3 s",
           note=legacy_note)
    compacted_note = (f"median of {rounds} restarts ({min(compacted):.2f}-{max(compacted):.2f} s; daemon CPU to "
                      f"READY {statistics.median(cpu['compacted']):.2f} s); "
                      + "; ".join(x for x in lines if "compacted" in x) + f"; first: {restored[1]}")
    record(f"restart with {N:,} row-saved bans, compacted after READY", statistics.median(compacted), "s",
           reference=f"nft -f of {N:,} elements with timeouts", reference_value=ref, target="<= 2.5 s",
           note=compacted_note)


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="nbb-ops-"))
    compile_bytecode()
    if os.environ.get("NFTBLOCK_BENCH_ROWS_ONLY"):  # only the row-saved restart
        restart_from_rows(tmp)
        return
    ns = NetNS("nbb")
    d = DaemonProc(ns, tmp / "d", CONFIG)
    try:
        d.start()
        assert d.proc is not None
        idle_cpu, idle_wakeups = cpu_and_wakeups(d.proc.pid, 20.0)
        record("idle daemon CPU (no bans, 20 s)", idle_cpu * 100, "%")
        record("idle daemon wake-ups (all threads)", idle_wakeups, "per s",
               note="watchdog off here; kernel generation check every 5 s with an owned table")
        addrs = addresses(N)
        for i in range(0, N, 250_000):
            out = d.cli("ban", "--timeout", "2h", "-", input="\n".join(addrs[i:i + 250_000]) + "\n")
            assert out.returncode == 0, out.stderr
        times = []
        size = 0
        for _ in range(5):
            dt, size = scrape(ns)
            times.append(dt)
        record(f"metrics scrape with {N:,} banned elements", statistics.median(times) * 1000, "ms",
               target="<= 50 ms", note=f"{size} bytes")
        busy_cpu, busy_wakeups = cpu_and_wakeups(d.proc.pid, 20.0)
        record(f"idle daemon CPU with {N:,} bans", busy_cpu * 100, "%")
        record(f"idle daemon wake-ups with {N:,} bans", busy_wakeups, "per s")
        assert d.stop() == 0
        ns.nft("delete", "table", "inet", "nftblock")  # what a reboot does to the kernel sets
        t0 = time.monotonic()
        d.start(timeout=120)
        ready = time.monotonic() - t0
        record(f"restart with {N:,} saved bans to READY=1", ready, "s", target="<= 5 s")
        count = int(d.cli_json("status")["sets"][2]["elements"])
        assert count == N, count
    finally:
        d.close()
        ns.delete()
    restart_from_rows(tmp)


if __name__ == "__main__":
    main()
