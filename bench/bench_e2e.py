"""End to end: a burst of distinct attackers appended to a tailed log in one write → time until every one of
them is in the kernel sets, measured from the last write. Two shapes:

- realistic (bench/authlog.py): 10,000 attackers reaching maxretry (3) over the seven or so lines OpenSSH
  and PAM write per connection, ~10 % of them IPv6, 1,000 near-miss addresses one failure short (which
  must NOT be banned: checked in the kernel after every line was read), scanners, logins and other
  daemons' lines (~20 %): about 100,000 lines;
- synthetic: 3 identical "Failed password" lines per attacker and nothing else (the previous benchmark).

The synthetic burst of 1,000 also goes to a real fail2ban-server with its nftables action, in its own
namespace, in the same run.

Both are observed the same way: bench/setwatch.py, inside the namespace, polls the kernel set's element
count every 2 ms and reports when it reaches the burst's size. (Polling the daemons' own status would
make the observer compete with the work it times.)

The realistic burst's FLOOR is measured in the same run, after each daemon run (so both meet the same load):
what any daemon must at least do with those bytes, done by the same code with nothing around it:
- parse: the very same bytes decoded, split into lines and matched by the jail's filter on its native core
  (`Filter.scan` over the whole burst in one call, the engine the daemon runs; no tracker, no tail);
- kernel: ONE netlink transaction adding every address the daemon bans (IPv4 hosts to default_ip4, IPv6 /64s
  to default_net6, each with the jail's timeout) to the daemon's own sets in a fresh namespace, encoded by
  the daemon's writer before the clock starts, timed from send to the kernel's answer.
The row's ratio is ours / (parse + kernel).

The realistic row runs twice: first as shipped, in a child process that sets the kernel's PR_SET_MDWE (what
the unit's MemoryDenyWriteExecute=yes sets; its daemons inherit it, so PCRE2 runs interpreted, and so does
the floor's scan), target < 0.15 s (issue #38); then with PCRE2's JIT in this process.
"""

from __future__ import annotations

import ctypes
import gc
import ipaddress
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.authlog import burst as realistic_burst
from bench.common import record, settle
from nftblockd.config import parse_config
from nftblockd.control.client import ControlClient
from nftblockd.detect.filterload import load_filter
from nftblockd.detect.matcher import MatchContext
from nftblockd.kernel.bans import OpSpec
from nftblockd.kernel.netlink import NftSocket
from nftblockd.kernel.ruleset import plan_ruleset
from nftblockd.kernel.writer import KernelWriter
from tests.helpers.daemon import DaemonProc
from tests.helpers.netns import NetNS, inside

N = int(os.environ.get("NFTBLOCK_BENCH_E2E_N", "10000"))
F2B_N = int(os.environ.get("NFTBLOCK_BENCH_F2B_N", "1000"))


def burst(n: int, seed: int) -> str:
    stamp = time.strftime("%b %e %H:%M:%S")
    base = 0x0B000000 + seed * 1_000_003
    lines = []
    pid = 10_000
    for rnd in range(3):
        for i in range(n):
            pid += 1
            a = ipaddress.IPv4Address(base + i * 7)
            lines.append(f"{stamp} host sshd[{pid}]: Failed password for invalid user u{i} from {a} port "
                         f"{30000 + rnd} ssh2\n")
    return "".join(lines)


WATCH = Path(__file__).resolve().parent / "setwatch.py"


class SetWatch:
    """bench/setwatch.py running in `ns`: started before the burst, read after it."""

    def __init__(self, ns: NetNS, table: str, set_name: str, n: int, timeout: float) -> None:
        self.proc = ns.popen(sys.executable, str(WATCH), table, set_name, str(n), str(timeout),
                             stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the set watcher did not start")

    def seen_at(self) -> float:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        self.proc.wait()
        if line in ("", "timeout"):
            raise RuntimeError("the burst never reached the kernel set in time")
        return float(line)


@dataclass(frozen=True, slots=True)
class Burst:
    text: str
    lines: int
    v4: int  # attackers that must end up in default_ip4 ...
    v6: int  # ... and in default_net6 (by /64)
    near_misses: tuple[str, ...] = ()  # addresses that must not
    banned: tuple[str, ...] = ()  # the attackers (realistic only: the floor's kernel transaction)


def synthetic(n: int, seed: int) -> Burst:
    text = burst(n, seed)
    return Burst(text, text.count("\n"), n, 0)


def realistic(n: int, seed: int) -> Burst:
    b = realistic_burst(n, n // 10, seed=seed, stamp=time.strftime("%b %e %H:%M:%S"))
    return Burst(b.text, b.lines, len(b.banned) - b.ipv6, b.ipv6, b.near_misses, b.banned)


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Run:
    seconds: float  # last write -> all in the kernel
    cpu: float  # CPU seconds the daemon used in that time (on a busy machine, the steadier figure)


def config(log: Path) -> str:
    return f"""
allowlist_self: false
reconcile: {{interval: 1h}}
jails:
  sshd: {{files: ["{log}"], filter: sshd, maxretry: 3, findtime: 10m, bantime: 1h}}
"""


def ours(make: Callable[[int, int], Burst], n: int, conf: Callable[[Path], str] = config,
         timeout: float = 120) -> Run:
    """`conf`, `timeout`: the daemon's config for the log and the bound on the wait (bench_scale's 1M)."""
    tmp = Path(tempfile.mkdtemp(prefix="nbb-e2e-"))
    ns = NetNS("nbb")
    log = tmp / "auth.log"
    log.write_text("")
    d = DaemonProc(ns, tmp / "d", conf(log))
    try:
        d.start()
        client = ControlClient(d.socket, 10)
        b = make(n, 1)
        settle()  # the previous run's namespace is still being torn down by the kernel
        # IPv6 offenders are banned by /64 (the jail's default ipv6_prefix): they land in the interval set
        watch = SetWatch(ns, "nftblock", "default_ip4,default_net6", b.v4 + b.v6, timeout)
        assert d.proc is not None
        cpu0 = process_cpu(d.proc.pid)
        with log.open("a") as f:
            f.write(b.text)
        t_last = time.monotonic()
        took = watch.seen_at() - t_last
        cpu = process_cpu(d.proc.pid) - cpu0  # read just after: includes a few ms past the last ban
        # every line read (bounded wait), then the kernel holds exactly the attackers: no near-miss
        deadline = time.monotonic() + timeout / 2
        while True:
            st = client.call("status", {})
            if sum(j["lines"] for j in st["jails"]) >= b.lines or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        sizes = {s["name"]: s["elements"] for s in st["sets"]}
        if (sizes["default_ip4"], sizes["default_net6"]) != (b.v4, b.v6):
            raise RuntimeError(f"banned {sizes['default_ip4']} + {sizes['default_net6']}, expected {b.v4} + {b.v6}")
        if b.near_misses:
            banned = set(ns.set_elements("nftblock", "default_ip4")) | set(ns.set_elements("nftblock", "default_net6"))
            wrong = banned & {str(ipaddress.ip_network(f"{a}/64", strict=False)) if ":" in a else a
                              for a in b.near_misses}
            if wrong:
                raise RuntimeError(f"{len(wrong)} near-miss addresses were banned, e.g. {sorted(wrong)[:3]}")
        return Run(took, cpu)
    finally:
        d.close()
        ns.delete()


@dataclass(frozen=True, slots=True)
class Floor:
    parse: float  # the jail's filter on its native core over the burst's bytes (decode, split, one scan)
    kernel: float  # one transaction adding every banned address with its timeout: send -> answer

    @property
    def total(self) -> float:
        return self.parse + self.kernel


def floor_parse(b: Burst) -> float:
    """The burst's bytes matched by the daemon's sshd filter on its native core, in one call: the best of 3,
    with the garbage collector off (the core's own work, not the collector's passes over its results)."""
    flt = load_filter("sshd")
    if flt.scanner == "re":
        raise RuntimeError("the native matcher core is not built: the floor would not be the floor")
    data = b.text.encode()
    now = time.time()
    best = math.inf
    for _ in range(3):
        ctx = MatchContext() if flt.uses_context else None
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            found = flt.scan(data.decode().split("\n"), now, ctx)
            best = min(best, time.perf_counter() - t0)
        finally:
            gc.enable()
    if len(found) < 3 * len(b.banned):
        raise RuntimeError(f"the floor's scan found {len(found)} failures for {len(b.banned)} attackers x 3")
    return best


def floor_kernel(b: Burst, conf: Callable[[Path], str] = config) -> float:
    """One transaction adding the burst's banned addresses (as the daemon bans them: IPv4 hosts, IPv6 /64s),
    with the jail's timeout, to the daemon's own sets in a fresh namespace; checked by the kernel's count."""
    plan = plan_ruleset(parse_config(conf(Path("/nonexistent/auth.log"))))
    ns = NetNS("nbf")
    try:
        with inside(ns):
            sock = NftSocket()
        try:
            w = KernelWriter(plan, sock, protect=False)
            w.setup([])
            names: list[str] = []
            keys: list[int] = []
            for a in b.banned:
                if ":" in a:
                    names.append("default_net6")
                    keys.append(int(ipaddress.ip_network(f"{a}/64", strict=False).network_address) << 8 | 64)
                else:
                    names.append("default_ip4")
                    keys.append(int(ipaddress.IPv4Address(a)))
            now_ms = int(time.time() * 1000)
            add = OpSpec(True, now_ms + 3600_000)
            msgs, _where = w._encode(names, keys, [add] * len(keys), range(len(keys)), now_ms, set())
            data = [sm.data for sm in msgs]
            settle()
            t0 = time.perf_counter()
            out = sock.transact(data)
            took = time.perf_counter() - t0
            if not out.committed:
                raise RuntimeError(f"the floor's transaction was refused: {out.errors[:1]}")
            counts = sock.list_sets(plan.table)
            got = (counts["default_ip4"].count, counts["default_net6"].count)
            if got != (b.v4, b.v6) and None not in got:
                raise RuntimeError(f"the floor's transaction left {got} elements, expected {(b.v4, b.v6)}")
            return took
        finally:
            sock.close()
    finally:
        ns.delete()


def fail2ban(n: int) -> float | None:
    if not shutil.which("fail2ban-server"):
        return None
    tmp = Path(tempfile.mkdtemp(prefix="nbb-f2b-"))
    ns = NetNS("nbf")
    conf = tmp / "conf"
    conf.mkdir()
    for sub in ("action.d", "filter.d"):
        (conf / sub).symlink_to(f"/etc/fail2ban/{sub}")
    log = tmp / "auth.log"
    log.write_text("")
    (conf / "fail2ban.conf").write_text(f"""[Definition]
loglevel = INFO
logtarget = {tmp / "f2b.log"}
socket = {tmp / "f2b.sock"}
pidfile = {tmp / "f2b.pid"}
dbfile = {tmp / "f2b.sqlite3"}
""")
    (conf / "jail.conf").write_text(f"""[DEFAULT]
backend = polling
[sshd]
action = nftables-allports[name=sshd]
enabled = true
filter = sshd
logpath = {log}
maxretry = 3
findtime = 600
bantime = 3600
""")
    sock = str(tmp / "f2b.sock")
    server = ns.popen("fail2ban-server", "-f", "-x", "-c", str(conf), "-s", sock, "-p", str(tmp / "f2b.pid"),
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def banned() -> int:
        r = subprocess.run(["fail2ban-client", "-s", sock, "status", "sshd"], capture_output=True, text=True)
        m = re.search(r"Currently banned:\s+(\d+)", r.stdout)
        return int(m.group(1)) if m else -1

    try:
        deadline = time.monotonic() + 60
        while banned() < 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        watch = SetWatch(ns, "f2b-table", "addr-set-sshd", n, max(600, n * 0.05))
        with log.open("a") as f:
            f.write(synthetic(n, 2).text)
        t_last = time.monotonic()
        took = watch.seen_at() - t_last
        if banned() >= n:
            return took
        raise RuntimeError(f"fail2ban banned only {banned()} of {n}")
    finally:
        subprocess.run(["fail2ban-client", "-s", sock, "stop"], capture_output=True, timeout=600)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        ns.delete()


ROUNDS = int(os.environ.get("NFTBLOCK_BENCH_E2E_ROUNDS", "3"))


SHAPES = os.environ.get("NFTBLOCK_BENCH_E2E_SHAPES", "realistic,synthetic").split(",")


PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1


def main() -> None:
    # the median of a few fresh daemons: one run on this shared 2-core VM varies by +-15 %
    if "--shipped" in sys.argv:  # the child below: every daemon and the floor's scan as the unit runs them
        if ctypes.CDLL(None).prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
            print("the kernel has no PR_SET_MDWE: no as-shipped row", file=sys.stderr)
            return
        run_realistic(shipped=True)
        return
    if "realistic" in SHAPES:
        # as shipped first (MemoryDenyWriteExecute=yes: PCRE2 interpreted), in a child process whose
        # PR_SET_MDWE every daemon it starts inherits; then this process's, with the JIT
        subprocess.run([sys.executable, __file__, "--shipped"], check=True)
        run_realistic()
    if "synthetic" in SHAPES:
        run_synthetic()


def _runs(runs: list[Run]) -> str:
    return (f"median of {len(runs)} runs ({', '.join(f'{r.seconds:.3f}' for r in runs)} s; daemon CPU "
            f"{', '.join(f'{r.cpu:.2f}' for r in runs)} s)")


def run_realistic(shipped: bool = False) -> None:
    shape = realistic(N, 1)
    runs: list[Run] = []
    floors: list[Floor] = []
    for _ in range(ROUNDS):  # daemon, then floor: both meet the same load on this shared machine
        runs.append(ours(realistic, N))
        floors.append(Floor(floor_parse(shape), floor_kernel(shape)))
    fl = Floor(statistics.median(f.parse for f in floors), statistics.median(f.kernel for f in floors))
    print(f"realistic burst of {N:,} ({shape.lines:,} lines): {_runs(runs)}", flush=True)
    print(f"  floor: native parse {', '.join(f'{f.parse:.3f}' for f in floors)} s + one kernel transaction "
          f"{', '.join(f'{f.kernel:.3f}' for f in floors)} s", flush=True)
    mode = ", as shipped (PCRE2 interpreted)" if shipped else ", PCRE2 JIT"
    record(f"burst {N:,} attackers, realistic auth.log{mode}: last write -> all in kernel",
           statistics.median(r.seconds for r in runs), "s", target="< 0.15 s" if shipped else "< 0.3 s",
           reference="native parse + one kernel transaction", reference_value=fl.total,
           note=f"{shape.lines:,} lines in one write: {shape.v4:,} IPv4 + {shape.v6:,} IPv6 attackers at maxretry 3, "
                f"{len(shape.near_misses):,} near-misses (checked: none banned), other daemons' lines; {_runs(runs)}; "
                f"floor (medians): native parse {fl.parse:.3f} s + one transaction of {len(shape.banned):,} "
                f"{fl.kernel:.3f} s")


def run_synthetic() -> None:
    runs = [ours(synthetic, N) for _ in range(ROUNDS)]
    print(f"synthetic burst of {N:,}: {_runs(runs)}", flush=True)
    ours_small = ours(synthetic, F2B_N).seconds
    ref = fail2ban(F2B_N)
    record(f"burst {N:,} attackers x3 failures: last write -> all in kernel",
           statistics.median(r.seconds for r in runs), "s", target="< 0.3 s",
           note=f"synthetic: 3 identical lines per attacker; {_runs(runs)}")
    if ref is not None:
        record(f"burst {F2B_N:,} attackers x3 failures: last write -> all in kernel", ours_small, "s",
               reference="fail2ban-server (nftables-allports)", reference_value=ref,
               note=f"fail2ban measured on {F2B_N:,}: one nft process per ban")


if __name__ == "__main__":
    main()
