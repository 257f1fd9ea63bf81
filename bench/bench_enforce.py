"""Enforcement benchmarks: bulk load/delete through the batcher vs `nft -f`, CLI bulk, latency, throughput, memory.

Everything runs in private network namespaces made here. Each figure is measured against a reference taken in
the same run (nft -f of the same elements into an identical set), median of several rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import record
from nftblockd.allowlist import Allowlist
from nftblockd.config import parse_config
from nftblockd.kernel.enforcer import Enforcer
from nftblockd.kernel.netlink import NftSocket
from nftblockd.kernel.ruleset import plan_ruleset
from nftblockd.kernel.writer import KernelWriter
from nftblockd.neverban import never_ban_range
from tests.helpers.daemon import DaemonProc
from tests.helpers.netns import NetNS, inside
from tests.helpers.package import write_entry_script

ROUNDS = int(os.environ.get("NFTBLOCK_BENCH_ROUNDS", "3"))
CLI_FAMILY = int(os.environ.get("NFTBLOCK_BENCH_CLI_FAMILY", "0"))  # 4 or 6: only that `ban -` row (0: both)
CONFIG = "blocklists: {default: {timeout: 1h, size: 2000000}}\nallowlist_self: false\nreconcile: {interval: 1h}\n"


def addresses(n: int, seed: int = 1) -> list[str]:
    rnd = random.Random(seed)
    out: set[int] = set()
    while len(out) < n:
        a = rnd.randrange(0x0B000000, 0xDF000000)
        if never_ban_range(4, a, a) is None:  # loopback and link-local are refused, as from any source
            out.add(a)
    return [str(ipaddress.IPv4Address(a)) for a in out]


def addresses6(n: int, seed: int = 1) -> list[str]:
    """Distinct global IPv6 addresses as attackers show them: a few per random /48, random interface ids,
    written as ipaddress writes them (the canonical text a log or a blocklist file holds)."""
    rnd = random.Random(seed)
    out: dict[int, None] = {}
    while len(out) < n:
        net = rnd.randrange(0x2001_0000_0000, 0x2C00_0000_0000) << 80  # inside 2000::/3
        for _ in range(rnd.randrange(1, 5)):
            a = net | rnd.randrange(1 << 16) << 64 | rnd.getrandbits(64)
            if never_ban_range(6, a, a) is None:
                out[a] = None
    return [str(ipaddress.IPv6Address(a)) for a in list(out)[:n]]


def children_cpu() -> float:
    """CPU seconds (user + system) of every waited-for child process so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) of a running process."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def nft_reference(addrs: list[str], delete: list[str] | None = None,
                  cpu: list[float] | None = None, version: int = 4) -> tuple[float, float | None]:
    """Seconds for `nft -f` to add `addrs` (and then to delete `delete`) in a fresh namespace; the add's CPU
    seconds (the `nft` process's, kernel time included) are appended to `cpu` when given."""
    ns = NetNS("nbb")
    try:
        ns.run("nft", "-f", "-", input=f"table inet ref {{\n set s {{ type ipv{version}_addr; size 2000000; "
               "flags timeout; }\n}\n")
        with tempfile.NamedTemporaryFile("w", suffix=".nft", delete=False) as f:
            f.write("add element inet ref s { " + ", ".join(f"{a} timeout 3600s" for a in addrs) + " }\n")
            add_file = f.name
        c0 = children_cpu()
        t0 = time.perf_counter()
        ns.run("nft", "-f", add_file)
        add_s = time.perf_counter() - t0
        if cpu is not None:
            cpu.append(children_cpu() - c0)
        del_s = None
        if delete:
            with tempfile.NamedTemporaryFile("w", suffix=".nft", delete=False) as f:
                f.write("delete element inet ref s { " + ", ".join(delete) + " }\n")
                del_file = f.name
            t0 = time.perf_counter()
            ns.run("nft", "-f", del_file)
            del_s = time.perf_counter() - t0
            os.unlink(del_file)
        os.unlink(add_file)
        return add_s, del_s
    finally:
        ns.delete()


@contextlib.asynccontextmanager
async def running_enforcer() -> AsyncIterator[Enforcer]:
    """An Enforcer with its batcher running, on a fresh table in a fresh namespace."""
    ns = NetNS("nbb")
    cfg = parse_config(CONFIG)
    plan = plan_ruleset(cfg)
    with inside(ns):
        sock = NftSocket()
    enf = Enforcer(cfg, plan, Allowlist(), lambda: KernelWriter(plan, sock))
    stop = asyncio.Event()
    try:
        await enf.start()
        runner = asyncio.create_task(enf.batcher.run(stop))
        yield enf
        stop.set()
        await runner
    finally:
        await enf.close()
        ns.delete()


async def ours_bulk(addrs: list[str], delete: list[str]) -> tuple[float, float]:
    async with running_enforcer() as enf:
        # what a bulk caller hands over: addresses as ints (the CLI benchmark below includes parsing text)
        until = time.time() + 3600
        keys = [int(ipaddress.IPv4Address(a)) for a in addrs]
        t0 = time.perf_counter()
        res = await enf.ban_hosts("default", {4: keys}, until)
        add_s = time.perf_counter() - t0
        assert not res.failed
        counts = await enf.kernel_counts()
        assert counts["default_ip4"] == len(addrs), counts
        dkeys = [int(ipaddress.IPv4Address(a)) for a in delete]
        t0 = time.perf_counter()
        await enf.unban_hosts("default", {4: dkeys})
        del_s = time.perf_counter() - t0
        counts = await enf.kernel_counts()
        assert counts["default_ip4"] == len(addrs) - len(delete), counts
        return add_s, del_s


async def throughput(n: int, chunk: int) -> float:
    """Elements/s from the in-process API into the kernel, many concurrent callers, no waiting between."""
    async with running_enforcer() as enf:
        until = time.time() + 3600
        addrs = [int(ipaddress.IPv4Address(a)) for a in addresses(n, seed=7)]
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(enf.ban_hosts("default", {4: addrs[i:i + chunk]}, until))
                 for i in range(0, n, chunk)]
        await asyncio.gather(*tasks)
        secs = time.perf_counter() - t0
        assert (await enf.kernel_counts())["default_ip4"] == n
        return n / secs


def cli_bulk(d: DaemonProc, script: Path, version: int = 4) -> None:
    """`nftblock ban -` of 100,000 addresses of IP `version` (parsed, in the kernel, saved with
    synchronous=full) against `nft -f` of the same elements into an identical set (ipv4_addr or ipv6_addr),
    alternating, median of the rounds. IPv4 lines go packed in `hosts4`, IPv6 lines in `hosts6`. The command is
    the script the package installs (packaging/entry-script.sh) with this checkout as its library, as
    bench_cli.py runs it; the daemon answers once the kernel acknowledged and the state database saved.
    CPU seconds are reported beside the wall times (the machine may be shared): the CLI process's and the
    daemon's (all its threads, kernel time of its commits included) against the `nft` process's."""
    assert d.proc is not None  # `ip netns exec` execs the daemon: this pid is the daemon's
    ours, ref = [], []
    cli_cpu: list[float] = []
    daemon_cpu: list[float] = []
    ref_cpu: list[float] = []
    for r in range(max(ROUNDS, 5)):
        addrs = addresses(100_000, seed=100 + r) if version == 4 else addresses6(100_000, seed=600 + r)
        text = "\n".join(addrs) + "\n"
        if r % 2:
            ref.append(nft_reference(addrs, cpu=ref_cpu, version=version)[0])
        c0, dc0 = children_cpu(), proc_cpu(d.proc.pid)
        t0 = time.perf_counter()
        out = subprocess.run([str(script), "--socket", d.socket, "ban", "--timeout", "1h", "-"], input=text,
                             capture_output=True, text=True, timeout=120)
        ours.append(time.perf_counter() - t0)
        cli_cpu.append(children_cpu() - c0)
        daemon_cpu.append(proc_cpu(d.proc.pid) - dc0)
        assert out.returncode == 0 and out.stdout == "banned 100000 targets (for 1h)\n", (out.stdout, out.stderr)
        if r % 2 == 0:
            ref.append(nft_reference(addrs, cpu=ref_cpu, version=version)[0])
        assert d.cli("unban", "-", input=text).returncode == 0
    med = statistics.median
    fam = f"IPv{version}"
    record(f"cli ban - (stdin) 100k {fam} with timeouts", med(ours), "s",
           reference="nft -f", reference_value=med(ref), target="ratio <= 0.8" if version == 4 else "ratio <= 1.0",
           note=f"median of {len(ours)} alternating rounds; ours {min(ours):.3f}-{max(ours):.3f} s, nft -f "
                f"{min(ref):.3f}-{max(ref):.3f} s; CPU (medians): nftblock {med(cli_cpu):.3f} s + daemon "
                f"{med(daemon_cpu):.3f} s, nft {med(ref_cpu):.3f} s")
    record(f"cli ban - (stdin) 100k {fam}, CPU seconds (CLI + daemon)", med(cli_cpu) + med(daemon_cpu), "s",
           reference="nft -f process CPU", reference_value=med(ref_cpu),
           note="the daemon's CPU includes the kernel's work for its commits, as the nft process's does")


def daemon_benches() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="nbb-"))
    ns = NetNS("nbb")
    d = DaemonProc(ns, tmp / "d", CONFIG)
    try:
        d.start()
        for version in (4, 6) if CLI_FAMILY == 0 else (CLI_FAMILY,):
            cli_bulk(d, write_entry_script(tmp, "nftblock"), version)
        if os.environ.get("NFTBLOCK_BENCH_CLI_ONLY"):
            return
        latency(d)
        memory(d, ns)
    finally:
        d.close()
        ns.delete()


def latency(d: DaemonProc, rate: int = 1000, seconds: float = 5.0) -> None:
    """Ban latency from a control request to the kernel's acknowledgement, at a steady request rate."""
    async def run() -> list[float]:
        conns = []
        for _ in range(16):
            r, w = await asyncio.open_unix_connection(d.socket)
            conns.append((r, w, asyncio.Lock()))
        lat: list[float] = []
        addrs = addresses(int(rate * seconds), seed=999)

        async def one(i: int, a: str) -> None:
            r, w, lock = conns[i % len(conns)]
            async with lock:
                t0 = time.perf_counter()
                w.write(json.dumps({"v": 1, "id": i, "cmd": "ban", "args": {"targets": [a], "timeout": 600}})
                        .encode() + b"\n")
                await w.drain()
                resp = json.loads(await r.readline())
                assert resp["ok"] and resp["result"]["applied"] == [a], resp
                lat.append(time.perf_counter() - t0)

        tasks = []
        start = time.perf_counter()
        for i, a in enumerate(addrs):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing the load generator, not waiting for a result
            tasks.append(asyncio.create_task(one(i, a)))
        await asyncio.gather(*tasks)
        for _r, w, _l in conns:
            w.close()
        return lat

    lat = sorted(asyncio.run(run()))
    p50 = lat[len(lat) // 2] * 1000
    p99 = lat[int(len(lat) * 0.99)] * 1000
    record("ban latency p50 @1000 bans/s (request -> kernel ack)", p50, "ms")
    record("ban latency p99 @1000 bans/s (request -> kernel ack)", p99, "ms", target="< 20 ms")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def memory(d: DaemonProc, ns: NetNS, n: int = 1_000_000) -> None:
    assert d.proc is not None
    d.cli("unban", "-", input="")
    before = rss_kib(d.proc.pid)
    addrs = addresses(n, seed=4242)
    for i in range(0, n, 250_000):
        out = d.cli("ban", "--timeout", "2h", "-", input="\n".join(addrs[i:i + 250_000]) + "\n")
        assert out.returncode == 0, out.stderr
    import gc
    gc.collect()
    after = rss_kib(d.proc.pid)
    record("daemon RSS per tracked ban (1,000,000 IPv4)", (after - before) * 1024 / n, "bytes",
           target="<= 200 bytes")


def main() -> None:
    if os.environ.get("NFTBLOCK_BENCH_CLI_ONLY"):  # only the `nftblock ban -` row
        daemon_benches()
        return
    ours_add, ours_del, ref_add, ref_del = [], [], [], []
    for r in range(ROUNDS):
        addrs = addresses(100_000, seed=r)
        dels = addrs[:10_000]
        a, b = asyncio.run(ours_bulk(addrs, dels))
        ra, rb = nft_reference(addrs, dels)
        ours_add.append(a)
        ours_del.append(b)
        ref_add.append(ra)
        ref_del.append(rb or 0.0)
    record("bulk ban 100k IPv4 with timeouts (batcher -> kernel)", statistics.median(ours_add), "s",
           reference="nft -f", reference_value=statistics.median(ref_add), target="ratio <= 0.6")
    record("bulk unban 10k of 100k (batcher -> kernel)", statistics.median(ours_del), "s",
           reference="nft -f", reference_value=statistics.median(ref_del), target="ratio <= 0.6")
    tput = asyncio.run(throughput(300_000, 1000))
    record("sustained ban throughput, in-process API -> kernel", tput, "elem/s", target=">= 100000")
    daemon_benches()


if __name__ == "__main__":
    main()
