"""The scale ladder (issue #38): each bulk path at 1k, 10k, 100k and 1M items next to its floor measured at the
same size in the same run, as a table and a log-log plot (bench/results/scale.png, one line per path, its
floor dashed in the same colour), so a cost that grows faster than the work shows as a bent line.

As shipped: the process sets the kernel's PR_SET_MDWE first (what the unit's MemoryDenyWriteExecute=yes
sets; inherited by every daemon, `nft` and redis-server it starts), so PCRE2 runs interpreted as under the
packaged unit. NFTBLOCK_BENCH_SCALE_JIT=1 leaves it off.

Paths (ours -> floor):
- burst: n attackers, three "Failed password" lines each, one write to a tailed log -> all n in the kernel
  (bench/setwatch.py counts), a real daemon in a namespace -> the same bytes scanned by the sshd filter in
  this process plus ONE netlink transaction of the n addresses (bench_e2e's floors). Each attacker's lines
  are consecutive: an interleaved burst of more distinct attackers than the tracker's `max_tracked` (100,000)
  counting records is bounded by design (tracker.py's header), so past 100k it is not a scale figure;
- ban: `nftblock ban --timeout 1h -` of n addresses (parsed, in the kernel, saved) -> `nft -f` of the same
  elements into an identical set;
- restart: the daemon holding those n bans stopped, its table deleted (a reboot), started -> READY=1 ->
  `nft -f` of n elements with their own timeouts (bench_ops' reference);
- publish: n bans in the outbox -> acknowledged by a local redis-server -> an XADD pipeline of the same
  entries (bench_fleetpub);
- catchup: n bans in the stream -> applied to the in-memory kernel by the receive loop -> XREAD of them;
- feed: a feed of n prefixes (5:2 IPv4:IPv6, bench/feedgen) parsed, sanitised, aggregated and loaded into
  a fresh table -> `nft -f` of the same sets.

Each path records its largest size's time against its floor, and the per-item cost at the largest size over
that at 10k (target <= 1.5). One round per size (the 1M points take minutes); wall clock, so the machine's
load is printed beside them. NFTBLOCK_BENCH_SCALE_SIZES and NFTBLOCK_BENCH_SCALE_PATHS pick a subset;
`NFTBLOCK_BENCH_ONLY=scale make bench` runs the ladder alone; NFTBLOCK_BENCH_SCALE_KEEP=1 keeps the other
paths' points of the last run (bench/results/scale.json) in the table and the plot.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import gc
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
JIT = os.environ.get("NFTBLOCK_BENCH_SCALE_JIT") == "1"
# before anything compiles a regex: PCRE2 decides JIT or not at compile time
SHIPPED = not JIT and ctypes.CDLL(None).prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) == 0

from bench import bench_e2e, bench_enforce, bench_fleetpub, bench_ops  # noqa: E402
from bench.common import record, settle  # noqa: E402
from bench.feedgen import make_entries  # noqa: E402
from nftblockd.daemon.root import tune_gc  # noqa: E402
from nftblockd.detect.filterload import load_filter  # noqa: E402
from tests.helpers.daemon import DaemonProc  # noqa: E402
from tests.helpers.netns import NetNS  # noqa: E402
from tests.helpers.redis import RedisServer  # noqa: E402

SIZES = [int(x) for x in os.environ.get("NFTBLOCK_BENCH_SCALE_SIZES", "1000,10000,100000,1000000").split(",")]
PATHS = os.environ.get("NFTBLOCK_BENCH_SCALE_PATHS", "burst,ban,restart,publish,catchup,feed").split(",")
PLOT = HERE / "results" / "scale.png"
SIZE = 2_000_000  # every set here holds the largest size


@dataclass(frozen=True, slots=True)
class Point:
    path: str
    n: int
    ours: float
    floor: float
    load: float  # the 1-minute load average when it was taken


def _load() -> float:
    return os.getloadavg()[0]


# -- burst -----------------------------------------------------------------------------------------------------

def burst_config(log: Path) -> str:
    return f"""
allowlist_self: false
reconcile: {{interval: 1h}}
blocklists: {{default: {{timeout: 1h, size: {SIZE}}}}}
jails:
  sshd: {{files: ["{log}"], filter: sshd, maxretry: 3, findtime: 10m, bantime: 1h}}
"""


def grouped_burst(n: int, seed: int) -> bench_e2e.Burst:
    """n attackers, each one's three failures in a row (see the module docstring)."""
    stamp = time.strftime("%b %e %H:%M:%S")
    base = 0x0B000000 + seed * 1_000_003
    lines: list[str] = []
    banned: list[str] = []
    pid = 10_000
    for i in range(n):
        a = base + i * 7
        addr = f"{a >> 24 & 255}.{a >> 16 & 255}.{a >> 8 & 255}.{a & 255}"
        banned.append(addr)
        for rnd in range(3):
            pid += 1
            lines.append(f"{stamp} host sshd[{pid}]: Failed password for invalid user u{i} from {addr} port "
                         f"{30000 + rnd} ssh2\n")
    text = "".join(lines)
    return bench_e2e.Burst(text, len(lines), n, 0, (), tuple(banned))


def floor_parse(b: bench_e2e.Burst) -> float:
    flt = load_filter("sshd")
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        found = flt.scan(b.text.split("\n"), time.time(), None)
        took = time.perf_counter() - t0
    finally:
        gc.enable()
    assert len(found) >= 3 * b.v4, len(found)
    return took


def burst(n: int) -> tuple[float, float]:
    shape = grouped_burst(n, 1)
    run = bench_e2e.ours(lambda _n, _s: shape, n, conf=burst_config, timeout=600)
    floor = floor_parse(shape) + bench_e2e.floor_kernel(shape, conf=burst_config)
    return run.seconds, floor


# -- ban and restart, one daemon ---------------------------------------------------------------------------

BAN_CONFIG = f"""
blocklists: {{default: {{timeout: 1h, size: {SIZE}}}}}
allowlist_self: false
reconcile: {{interval: 1h}}
"""


def ban_and_restart(n: int, tmp: Path) -> dict[str, tuple[float, float]]:
    addrs = bench_enforce.addresses(n, seed=3)
    ns = NetNS("nbs")
    d = DaemonProc(ns, tmp / f"ban{n}", BAN_CONFIG)
    out: dict[str, tuple[float, float]] = {}
    try:
        d.start()
        settle()
        t0 = time.perf_counter()
        res = d.cli("ban", "--timeout", "1h", "-", input="\n".join(addrs) + "\n")
        ban_s = time.perf_counter() - t0
        assert res.returncode == 0, res.stderr[-500:]
        out["ban"] = (ban_s, bench_enforce.nft_reference(addrs)[0])
        if "restart" in PATHS:
            assert d.stop() == 0
            ns.nft("delete", "table", "inet", "nftblock")
            settle()
            t0 = time.monotonic()
            d.start(timeout=600)
            ready = time.monotonic() - t0
            count = int(d.cli_json("status")["sets"][2]["elements"])
            assert count == n, count
            out["restart"] = (ready, bench_ops.nft_load_reference(n))
    finally:
        d.close()
        ns.delete()
    return out


# -- fleet -------------------------------------------------------------------------------------------------

def publish(n: int, url: str, tmp: Path) -> tuple[float, float]:
    settle()
    fl = asyncio.run(bench_fleetpub.xadd_floor(url, f"sf{n}", n))
    asyncio.run(bench_fleetpub._flush(url))
    settle()
    pub = asyncio.run(bench_fleetpub.publish_once(url, tmp, f"sp{n}", n))
    asyncio.run(bench_fleetpub._flush(url))
    return pub, fl


def catchup(n: int, url: str, tmp: Path) -> tuple[float, float]:
    asyncio.run(bench_fleetpub.fill_stream(url, f"sc{n}", n, time.time()))
    settle()
    fl = asyncio.run(bench_fleetpub.replay_floor(url, f"sc{n}", n))
    settle()
    up = asyncio.run(bench_fleetpub.catch_up_once(url, tmp, f"sc{n}", f"scdb{n}", n))
    asyncio.run(bench_fleetpub._flush(url))
    return up, fl


# -- feed --------------------------------------------------------------------------------------------------

FEED_CONFIG = f"blocklists: {{feeds: {{timeout: 1h, size: {SIZE}}}}}\nallowlist: []\nallowlist_self: false\n"


async def feed_ours(body: str) -> tuple[float, dict[str, list[int]]]:
    from nftblockd.allowlist import Allowlist
    from nftblockd.config import parse_config
    from nftblockd.feeds.aggregate import aggregate, sanitise
    from nftblockd.feeds.delta import AppliedSets
    from nftblockd.feeds.manager import _desired, apply_desired
    from nftblockd.feeds.parse import parse_feed
    from nftblockd.kernel.enforcer import Enforcer
    from nftblockd.kernel.netlink import NftSocket
    from nftblockd.kernel.ruleset import plan_ruleset
    from nftblockd.kernel.writer import KernelWriter
    from tests.helpers.netns import inside

    ns = NetNS("nbs")
    cfg = parse_config(FEED_CONFIG)
    plan = plan_ruleset(cfg)
    try:
        with inside(ns):
            sock = NftSocket()
        enf = Enforcer(cfg, plan, Allowlist(), lambda: KernelWriter(plan, sock))
        await enf.start()
        try:
            settle()
            t0 = time.perf_counter()
            parsed = parse_feed(body)
            desired = _desired(aggregate([sanitise(parsed.v4, parsed.v6)]), "feeds")
            res = await apply_desired(enf, AppliedSets(), desired, time.time() + 3600, reason="bench", now=time.time())
            took = time.perf_counter() - t0
            assert not res.failed, res.failed
            counts = await enf.kernel_counts()
            for name, keys in desired.items():
                assert counts[name] == len(keys), (name, counts[name], len(keys))
            return took, desired
        finally:
            await enf.close()
    finally:
        ns.delete()


def feed(n: int) -> tuple[float, float]:
    from bench import bench_feeds_kernel as bfk

    body = bfk.HEADER + "\n".join(make_entries(n * 5 // 7, n - n * 5 // 7, seed=5)) + "\n"
    took, desired = asyncio.run(feed_ours(body))
    settle()
    ref, _ = bfk.nft_reference(desired, None, 3600.0)
    return took, ref


# -- the ladder --------------------------------------------------------------------------------------------

def ladder() -> list[Point]:
    tmp = Path(tempfile.mkdtemp(prefix="nbb-scale-"))
    points: list[Point] = []

    def add(path: str, n: int, got: tuple[float, float]) -> None:
        p = Point(path, n, got[0], got[1], _load())
        points.append(p)
        print(f"{path:<8} {n:>9,}  ours {p.ours:9.3f} s  floor {p.floor:9.3f} s  ({p.ours / p.floor:5.2f}x)  "
              f"{p.ours / n * 1e6:8.2f} us/item  load {p.load:.1f}", flush=True)

    server = RedisServer(tmp / "redis").start() if {"publish", "catchup"} & set(PATHS) else None
    try:
        for n in SIZES:
            if "burst" in PATHS:
                add("burst", n, burst(n))
            if {"ban", "restart"} & set(PATHS):
                for path, got in ban_and_restart(n, tmp).items():
                    if path in PATHS:
                        add(path, n, got)
            if server is not None and "publish" in PATHS:
                add("publish", n, publish(n, server.url, tmp))
            if server is not None and "catchup" in PATHS:
                add("catchup", n, catchup(n, server.url, tmp))
            if "feed" in PATHS:
                add("feed", n, feed(n))
    finally:
        if server is not None:
            server.kill()
    return points


def table(points: list[Point]) -> str:
    sizes = sorted({p.n for p in points})
    rows = [f"{'path':<8} " + " ".join(f"{n:>22,}" for n in sizes) + "   per item, largest / 10k (ours, floor)"]
    for path in dict.fromkeys(p.path for p in points):
        by = {p.n: p for p in points if p.path == path}
        cells = " ".join(f"{by[n].ours:>9.3f} /{by[n].floor:>9.3f} s" if n in by else " " * 22 for n in sizes)
        grow = growth(list(by.values()))
        rows.append(f"{path:<8} {cells}   " + (f"{grow[0]:.2f}, {grow[1]:.2f}" if grow else ""))
    return "\n".join(rows)


def growth(points: list[Point]) -> tuple[float, float] | None:
    """(ours, floor): the per-item cost at the largest size over the per-item cost at 10k."""
    by = {p.n: p for p in points}
    top = max(by)
    if 10_000 not in by or top <= 10_000:
        return None
    a, b = by[top], by[10_000]
    return (a.ours / a.n) / (b.ours / b.n), (a.floor / a.n) / (b.floor / b.n)


def plot(points: list[Point], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (the dev extra has it): no plot", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(8, 6))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, name in enumerate(dict.fromkeys(p.path for p in points)):
        ps = sorted((p for p in points if p.path == name), key=lambda p: p.n)
        c = colours[k % len(colours)]
        ax.plot([p.n for p in ps], [p.ours for p in ps], "o-", color=c, label=name)
        ax.plot([p.n for p in ps], [p.floor for p in ps], "x--", color=c, alpha=0.6, label=f"{name} floor")
    lo = min(p.n for p in points)
    hi = max(p.n for p in points)
    ref = min(min(p.ours, p.floor) for p in points if p.n == lo)
    ax.plot([lo, hi], [ref, ref * hi / lo], ":", color="grey", label="linear (slope 1)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("items (attackers, bans, prefixes)")
    ax.set_ylabel("seconds")
    mode = "as shipped (PCRE2 interpreted)" if SHIPPED else "PCRE2 with its JIT"
    ax.set_title(f"nftblockd scale ladder, {mode}; dashed: each path's floor")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return True


def main() -> None:
    tune_gc()
    print(f"scale ladder, {'as shipped: PR_SET_MDWE set, PCRE2 interpreted' if SHIPPED else 'PCRE2 with its JIT'}; "
          f"sizes {SIZES}, paths {PATHS}, load {_load():.1f}", flush=True)
    points = ladder()
    saved = HERE / "results" / "scale.json"
    if os.environ.get("NFTBLOCK_BENCH_SCALE_KEEP") == "1" and saved.exists():  # re-run some paths, keep the rest
        kept = [Point(**d) for d in json.loads(saved.read_text())]
        points = [p for p in kept if p.path not in PATHS] + points
    print("\n" + table(points), flush=True)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "scale.json").write_text(json.dumps([dataclasses.asdict(p) for p in points], indent=1) + "\n")
    if plot(points, PLOT):
        print(f"plot: {PLOT.relative_to(HERE.parent)}", flush=True)
    mode = "" if SHIPPED else ", JIT"
    for path in dict.fromkeys(p.path for p in points):
        ps = [p for p in points if p.path == path]
        top = max(ps, key=lambda p: p.n)
        record(f"scale {path} {top.n:,}{mode}", top.ours, "s", reference=f"{path} floor at {top.n:,}",
               reference_value=top.floor, note=f"one round, load {top.load:.1f}; bench/results/scale.png")
        by = {p.n: p for p in ps}
        if path == "publish" and 100_000 in by and 1_000_000 in by:  # issue #38: 1M within 12x the 100k time
            record(f"scale publish{mode}: 1M time / 100k time", by[1_000_000].ours / by[100_000].ours, "x",
                   target="<= 12", reference="the XADD floor's own 1M / 100k",
                   reference_value=by[1_000_000].floor / by[100_000].floor)
        grow = growth(ps)
        if grow is not None:
            record(f"scale {path}{mode}: per item at {top.n:,} / at 10k", grow[0], "x", target="<= 1.5",
                   reference="the floor's own growth", reference_value=grow[1],
                   note="per-item cost ratio; the reference is the floor's, where the kernel's own cost grows")


if __name__ == "__main__":
    main()
