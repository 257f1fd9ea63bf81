"""Threat feeds into the kernel: initial load, a 1 % churn refresh, and peak memory of a 1M-entry feed.

What a feed costs nftblockd end to end, on a realistic FireHOL-style feed from bench/feedgen.py (50,000 IPv4 +
20,000 IPv6 entries: single addresses, /24s, nesting, adjacency, duplicates, some special space):

- parse → sanitise → aggregate → `feeds._desired`, each stage timed on its own;
- the LOAD: `Enforcer.sync_sets` of that aggregate into a fresh table in a fresh network namespace (state,
  encoding and the one kernel transaction), against `nft -f` of the same elements into identical sets
  (interval+timeout sets like `feeds_net4/net6`, hash+timeout sets for single addresses) in another fresh
  namespace, interleaved in the same run;
- a REFRESH with 1 % churn (1 % of the feed's entries dropped, as many new ones added, re-parsed and
  re-aggregated), applied to the loaded table the way the feed manager does (`feeds.manager.apply_desired`:
  the diff against the previous aggregate, feeds/delta.py, then one transaction), as a share of the full load
  (issue 10 asked <= 0.05 of it; the kernel's own floor for the delta alone is 0.11-0.18 of the load on 6.18,
  so that target is judged only in a run whose floor leaves room for it and is informational otherwise:
  docs/datapath.md);
- the kernel's own FLOOR for that refresh, in the same table: the same deletions and additions in the same
  sets, encoded by the same writer before the clock starts, sent as one transaction and timed from send to
  the answer of the barrier that follows it. The interval backend (6.18's nft_set_rbtree.c) rebuilds the
  lookup array of every interval set a transaction touched from the whole tree at commit, and scans the
  whole tree for expired elements first when its gc interval (1 s) has passed: the first refresh, seconds
  after the load, and a real one, hours after the last, pay that scan, so the floor is taken with the scan
  due for that comparison: NFTBLOCK_BENCH_FEED_GC_REPEAT pairs per round (default 8), each side undone and
  redone 1.2 s later, the order alternating. Before either side's timed part the churned copy goes through
  the feed pipeline again (parse to `_desired`, untimed), as a real refresh's apply always follows it: ours
  applies that fresh aggregate (its new key objects, the interpreter warm), the floor sends its pre-encoded
  delta after the same work. The ratio is the median of the pairs' own ratios (`paired_ratio`), not the
  ratio of two medians: the shared VM's speed drifts between pairs, and one pair of single samples per round
  swung the ratio between 0.8 and 1.6. The first refresh after the load has no floor beside it and is not
  in the pairs (row refresh_1pct_s only). The refresh and the floor are also undone and redone
  NFTBLOCK_BENCH_FEED_REPEAT times (default 5), interleaved, each right after a commit to the same sets (no
  scan due). The same delta is also applied once by `nft -f` to the reference sets
  (NFTBLOCK_BENCH_FEED_NFT_DELTA=0 skips it: nft 1.0.6 takes ~45 s for it). (bench/feeds_commit_probe.py
  takes the backend apart: fixed cost per touched set, ordering, splitting, the timeout flag, the gc
  interval, the other layout.)
- both of the above without element timeouts (the feed default, `ban_timeout` unset) and with them
  (`ban_timeout: 1d`), where kept entries are re-sent only once past half of their life: a third sync,
  planned 0.6 d later, shows that renewal;
- peak RSS growth while parsing and aggregating a 1,000,000-entry feed, in a subprocess (clean high-water mark).

After every load and refresh, the kernel's sets are checked against the expected aggregate: element counts from
NFTA_SET_COUNT and the full content from `nft -j list set` (the reference sets' content too), so no figure
comes from a load that did not happen. Everything runs inside private network namespaces made here.

    python bench/bench_feeds_kernel.py          # NFTBLOCK_BENCH_ROUNDS=3 by default
"""

from __future__ import annotations

import asyncio
import gc
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import paired_ratio, record
from bench.feedgen import make_entries
from nftblockd.feeds.aggregate import Aggregate, aggregate, sanitise
from nftblockd.feeds.delta import AppliedSets, diff_sorted
from nftblockd.feeds.manager import _desired, apply_desired
from nftblockd.feeds.parse import parse_feed

ROUNDS = int(os.environ.get("NFTBLOCK_BENCH_ROUNDS", "3"))
N4, N6 = 50_000, 20_000
BIG = int(os.environ.get("NFTBLOCK_BENCH_FEED_BIG", "1000000"))
CHURN = 0.01
REPEAT = int(os.environ.get("NFTBLOCK_BENCH_FEED_REPEAT", "5"))  # floor and refresh, redone per round
NFT_DELTA = os.environ.get("NFTBLOCK_BENCH_FEED_NFT_DELTA", "1") != "0"  # the refresh by nft -f (~45 s)
LAYOUTS = os.environ.get("NFTBLOCK_BENCH_FEED_LAYOUTS", "1") != "0"  # also time the hosts-in-hash layout
GC_DUE = 1.2  # s: past the interval backend's default gc interval (1 s), so its next commit scans the tree
GC_REPEAT = int(os.environ.get("NFTBLOCK_BENCH_FEED_GC_REPEAT", "8"))  # gc-due pairs per round (~3 s each)
BLOCKLIST = "feeds"
SIZE = 1_048_576
BAN_TIMEOUT = 86_400.0  # the "with timeouts" variant: ban_timeout: 1d
CONFIG = (f"blocklists: {{{BLOCKLIST}: {{timeout: 1h, size: {SIZE}}}}}\n"
          "allowlist_self: false\nreconcile: {interval: 1h}\n")
HEADER = ("#\n# bench_feed\n#\n# ipv4 hash:net ipset\n#\n"
          "# Synthetic feed from bench/feedgen.py for bench_feeds_kernel.py\n#\n")


# -- feeds --------------------------------------------------------------------------------------------------

def feeds() -> tuple[str, str, int]:
    """(base feed text, the same feed after 1 % churn, entries changed each way)."""
    base = make_entries(N4, N6, seed=1)
    rng = random.Random(7)
    churn = int(len(base) * CHURN)
    drop = set(rng.sample(range(len(base)), churn))
    fresh = make_entries(int(N4 * CHURN), int(N6 * CHURN), seed=1001)  # new entries, same mix
    kept = [e for i, e in enumerate(base) if i not in drop]
    changed = kept + fresh
    rng.shuffle(changed)
    return HEADER + "\n".join(base) + "\n", HEADER + "\n".join(changed) + "\n", churn


def stages(body: str) -> tuple[dict[str, float], Aggregate, dict[str, list[int]]]:
    t0 = time.perf_counter()
    parsed = parse_feed(body)
    t1 = time.perf_counter()
    s = sanitise(parsed.v4, parsed.v6)
    t2 = time.perf_counter()
    agg = aggregate([s])
    t3 = time.perf_counter()
    desired = _desired(agg, BLOCKLIST)
    t4 = time.perf_counter()
    return ({"parse": t1 - t0, "sanitise": t2 - t1, "aggregate": t3 - t2, "desired": t4 - t3, "total": t4 - t0},
            agg, desired)


# -- what the kernel should hold -------------------------------------------------------------------------------

def expected_text(desired: dict[str, list[int]]) -> dict[str, set[str]]:
    """Set name -> elements as `nft -j` spells them ("1.2.3.4", "10.0.0.0/8", "2001:db8::/32")."""
    out: dict[str, set[str]] = {}
    for name, keys in desired.items():
        v6 = name.endswith("6")
        cls: Callable[[int], Any] = ipaddress.IPv6Address if v6 else ipaddress.IPv4Address
        if "_net" in name:  # a single address in an interval set (a feed's hosts) is shown without /32
            full = 128 if v6 else 32
            out[name] = {f"{cls(k >> 8)}/{k & 0xFF}" if k & 0xFF != full else str(cls(k >> 8)) for k in keys}
        else:
            out[name] = {str(cls(k)) for k in keys}
    return out


def verify_content(ns: Any, table: str, want: dict[str, set[str]], what: str) -> None:
    for name, elems in want.items():
        have = set(ns.set_elements(table, name))
        if have != elems:
            missing, extra = sorted(elems - have)[:3], sorted(have - elems)[:3]
            raise AssertionError(f"{what}: set {name} holds {len(have)} elements, expected {len(elems)} "
                                 f"(missing e.g. {missing}, unexpected e.g. {extra})")


# -- ours: Enforcer.sync_sets in a fresh namespace -----------------------------------------------------------

class Timed:
    """Wraps a bound method on one instance and adds up the wall time of its calls."""

    def __init__(self, obj: Any, attr: str) -> None:
        self.total = 0.0
        self.calls = 0
        orig = getattr(obj, attr)

        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                self.total += time.perf_counter() - t0
                self.calls += 1

        setattr(obj, attr, wrapper)


def _set_delta(old: dict[str, list[int]], new: dict[str, list[int]]) -> dict[str, tuple[list[int], list[int]]]:
    """Set name -> (added, removed) from `old` to `new`: what `feeds/delta.py` plans for a refresh."""
    return {name: diff_sorted(old[name], new[name]) for name in new}


def _encode_delta(w: Any, d: dict[str, tuple[list[int], list[int]]], until: float | None) -> list[bytes]:
    """The delta's messages as the writer encodes a refresh (per set: deletions, then additions)."""
    from nftblockd.kernel.bans import DELETE, OpSpec

    add = OpSpec(True, None if until is None else int(until * 1000), "")
    names: list[str] = []
    keys: list[int] = []
    specs: list[OpSpec] = []
    for name, (added, removed) in d.items():
        for ks, spec in ((removed, DELETE), (added, add)):
            names += [name] * len(ks)
            keys += ks
            specs += [spec] * len(ks)
    msgs, _where = w._encode(names, keys, specs, range(len(keys)), int(time.time() * 1000), set())
    return [sm.data for sm in msgs]


def hosts_in_hash(desired: dict[str, list[int]]) -> dict[str, list[int]]:
    """The layout before #14, for comparison: a feed's single addresses in its hash sets, only its ranges in its
    interval sets."""
    out: dict[str, list[int]] = {}
    for v, full in ((4, 32), (6, 128)):
        nets = desired[f"{BLOCKLIST}_net{v}"]
        out[f"{BLOCKLIST}_ip{v}"] = [k >> 8 for k in nets if k & 0xFF == full]
        out[f"{BLOCKLIST}_net{v}"] = [k for k in nets if k & 0xFF != full]
    return out


def same(desired: dict[str, list[int]]) -> dict[str, list[int]]:
    return desired


async def ours(desired: dict[str, list[int]], body2: str, ban_timeout: float | None,
               check_content: bool, layout: Callable[[dict[str, list[int]]], dict[str, list[int]]] = same,
               gc_repeat: int = GC_REPEAT) -> dict[str, Any]:
    """Load `desired` into a fresh table with sync_sets, then refresh it from the churned feed `body2` (both
    in `layout`); then the same refresh again, interleaved with the kernel's floor for it."""
    desired = layout(desired)
    from nftblockd.allowlist import Allowlist
    from nftblockd.config import parse_config
    from nftblockd.kernel.enforcer import Enforcer
    from nftblockd.kernel.netlink import NftSocket
    from nftblockd.kernel.ruleset import plan_ruleset
    from nftblockd.kernel.writer import KernelWriter
    from tests.helpers.netns import NetNS, inside

    ns = NetNS("nbk")
    cfg = parse_config(CONFIG)
    plan = plan_ruleset(cfg)
    enf = None
    try:
        with inside(ns):
            sock = NftSocket()
        enf = Enforcer(cfg, plan, Allowlist(), lambda: KernelWriter(plan, sock))
        await enf.start()
        assert enf.writer is not None
        apply_t = Timed(enf.writer, "write")
        tx_t = Timed(sock, "transact")  # the socket the writer was built with
        out: dict[str, Any] = {}

        applied = AppliedSets()

        async def sync(want: dict[str, list[int]], what: str, later: float = 0.0, verify: bool = True) -> None:
            until = None if ban_timeout is None else time.time() + later + ban_timeout
            apply_t.total = tx_t.total = 0.0
            c0 = time.process_time()
            t0 = time.perf_counter()
            res = await apply_desired(enf, applied, want, until, reason="bench", now=time.time() + later)
            secs = time.perf_counter() - t0
            cpu = time.process_time() - c0
            assert not res.failed, f"{what}: the kernel refused {res.failed} elements"
            counts = await enf.kernel_counts()
            for name, keys in want.items():
                assert counts[name] == len(keys), f"{what}: {name} count {counts[name]} != {len(keys)}"
            if check_content and verify:
                verify_content(ns, plan.table, expected_text(want), what)
            out[what] = {"s": secs, "cpu": cpu, "apply": apply_t.total, "kernel": tx_t.total, "added": res.added,
                         "removed": res.removed, "elements": sum(len(k) for k in want.values())}

        await sync(desired, "load")
        loaded = time.monotonic()
        gc.collect()
        st2, _agg2, desired2 = stages(body2)
        desired2 = layout(desired2)
        # a real refresh comes hours after the last commit, when the interval backend's gc scan is due (1 s
        # after its last one): let it be due here too, whatever the checks above took
        await asyncio.sleep(max(0.0, GC_DUE - (time.monotonic() - loaded)))
        await sync(desired2, "refresh")
        out["refresh_pipeline"] = st2["total"]

        # The kernel's own floor for this refresh, in this table: the same delta (the same deletions and
        # additions in the same sets, encoded by the same writer) sent as pre-encoded batches, timed from send
        # to the barrier's answer. Undone and redone REPEAT times, interleaved with our own refresh done again
        # the same way, so both meet the same table and the same backend state (see the module docstring).
        fwd = _set_delta(desired, desired2)
        back = _set_delta(desired2, desired)
        w = enf.writer
        assert isinstance(w, KernelWriter)

        def raw(d: dict[str, tuple[list[int], list[int]]]) -> tuple[float, float]:
            """(wall seconds, CPU seconds of this process: the commit runs in the sending thread)"""
            msgs = _encode_delta(w, d, until)  # built before the clock starts
            c0 = time.process_time()
            t0 = time.perf_counter()
            res = sock.transact(msgs)
            secs = time.perf_counter() - t0
            cpu = time.process_time() - c0
            assert res.committed, f"raw delta refused: {res.errors[:1]}"
            return secs, cpu

        until = None if ban_timeout is None else time.time() + ban_timeout
        # pairs[k][i]: the i-th pair's figure k; each pair is ours and the floor next to each other, the order
        # alternating, so the ratio is taken per pair (bench.common.paired_ratio)
        pairs: dict[str, list[float]] = {k: [] for k in ("again", "floor", "again_cpu", "floor_cpu", "ours_gc",
                                                         "floor_gc", "ours_gc_cpu", "floor_gc_cpu")}
        for rep in range(REPEAT):
            for who in (("ours", "raw") if rep % 2 == 0 else ("raw", "ours")):
                if who == "ours":
                    await sync(desired, "back", verify=False)
                    await sync(desired2, "again", verify=False)
                    pairs["again"].append(out["again"]["s"])
                    pairs["again_cpu"].append(out["again"]["cpu"])
                else:
                    await enf.kernel(raw, back)
                    await enf.kernel_counts()  # as `sync` does after its write: the same steps between the two
                    secs, c = await enf.kernel(raw, fwd)
                    pairs["floor"].append(secs)
                    pairs["floor_cpu"].append(c)
        # and with the backend's garbage-collection scan due, as for a real refresh (hours after the last):
        # each side undone, then GC_DUE later redone, ours and the floor interleaved GC_REPEAT times. Before
        # either side's timed part, the churned copy goes through the feed pipeline again (parse, sanitise,
        # aggregate, _desired; untimed), as a real refresh's apply always follows it: ours applies that fresh
        # aggregate, the floor sends its pre-encoded delta, both right after the same work (module docstring)
        for rep in range(max(1, gc_repeat)):
            for who in (("raw", "ours") if rep % 2 == 0 else ("ours", "raw")):
                if who == "ours":
                    await sync(desired, "back", verify=False)
                    await asyncio.sleep(GC_DUE)
                    fresh = layout(stages(body2)[2])
                    await sync(fresh, "again", verify=False)
                    pairs["ours_gc"].append(out["again"]["s"])
                    pairs["ours_gc_cpu"].append(out["again"]["cpu"])
                else:
                    await enf.kernel(raw, back)
                    await enf.kernel_counts()
                    await asyncio.sleep(GC_DUE)
                    layout(stages(body2)[2])
                    secs, c = await enf.kernel(raw, fwd)
                    pairs["floor_gc"].append(secs)
                    pairs["floor_gc_cpu"].append(c)
        counts = await enf.kernel_counts()
        for name, keys in desired2.items():
            assert counts[name] == len(keys), f"after the floor: {name} count {counts[name]} != {len(keys)}"
        out["pairs"] = pairs
        if ban_timeout is not None:
            # the refresh that finds every element past half of its life: each kept one is renewed (what every
            # refresh did before); `later` moves the planner's clock, the kernel's timeouts are relative anyway
            await sync(desired, "renewal", later=ban_timeout * 0.6)
        return out
    finally:
        if enf is not None:
            await enf.close()
        ns.delete()


# -- reference: nft -f of the same elements into identical sets ----------------------------------------------

def nft_reference(desired: dict[str, list[int]], desired2: dict[str, list[int]] | None, ban_timeout: float | None
                  ) -> tuple[float, float | None]:
    """(seconds of `nft -f` loading `desired` into identical sets in a fresh namespace, seconds of `nft -f`
    then applying the refresh's delta to `desired2`: one file of `delete element` and `add element` lines, one
    transaction; None when `desired2` is None). nft 1.0.6 takes ~45 s for that delta (its deletion of 543
    interval elements from a 54k-element set, in userspace; the 678 additions take 0.3 s), so it runs once."""
    from tests.helpers.netns import NetNS

    want = expected_text(desired)
    ns = NetNS("nbk")
    tail = "" if ban_timeout is None else f" timeout {int(ban_timeout)}s"

    def nft_file(lines: list[str]) -> float:
        with tempfile.NamedTemporaryFile("w", suffix=".nft", delete=False) as f:
            f.write("".join(lines))
            path = f.name
        try:
            t0 = time.perf_counter()
            res = ns.run("nft", "-f", path, check=False)
            secs = time.perf_counter() - t0
        finally:
            os.unlink(path)
        assert res.returncode == 0, res.stderr[:500]
        return secs

    def delta_lines(old: dict[str, set[str]], new: dict[str, set[str]]) -> list[str]:
        dels = [f"delete element inet ref {name} {{ " + ", ".join(sorted(old[name] - elems)) + " }\n"
                for name, elems in new.items() if old[name] - elems]
        adds = [f"add element inet ref {name} {{ " + ", ".join(e + tail for e in sorted(elems - old[name])) + " }\n"
                for name, elems in new.items() if elems - old[name]]
        return dels + adds

    try:
        decl = []
        for name in desired:
            typ = "ipv6_addr" if name.endswith("6") else "ipv4_addr"
            flags = "interval,timeout" if "_net" in name else "timeout"
            decl.append(f"  set {name} {{ type {typ}; size {SIZE}; flags {flags}; }}\n")
        ns.run("nft", "-f", "-", input="table inet ref {\n" + "".join(decl) + "}\n")
        lines = [f"add element inet ref {name} {{ " + ", ".join(e + tail for e in sorted(elems)) + " }\n"
                 for name, elems in want.items() if elems]
        secs = nft_file(lines)
        verify_content(ns, "ref", want, "nft -f reference")
        if desired2 is None:
            return secs, None
        want2 = expected_text(desired2)
        delta_secs = nft_file(delta_lines(want, want2))
        verify_content(ns, "ref", want2, "nft -f reference, refreshed")
        return secs, delta_secs
    finally:
        ns.delete()


# -- peak memory of a 1M-entry feed, in a child process --------------------------------------------------------

def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def memory_child(path: str) -> None:
    """Run in a fresh interpreter: RSS high-water growth and tracemalloc peak of parse+sanitise+aggregate."""
    import tracemalloc

    body = Path(path).read_text()
    gc.collect()
    rss_before = _status_kib("VmRSS")
    maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    hwm_reset = True
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        hwm_reset = False
    t0 = time.perf_counter()
    parsed = parse_feed(body)
    agg = aggregate([sanitise(parsed.v4, parsed.v6)])
    secs = time.perf_counter() - t0
    hwm = _status_kib("VmHWM")
    maxrss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_after = _status_kib("VmRSS")
    entries, cidrs = parsed.entries, len(agg)
    del parsed, agg
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    parsed = parse_feed(body)
    agg = aggregate([sanitise(parsed.v4, parsed.v6)])
    held, peak = tracemalloc.get_traced_memory()  # `held`: what the result (parsed, agg) keeps alive
    tracemalloc.stop()
    del parsed, agg
    print(json.dumps({
        "body_mb": len(body) / 1e6, "entries": entries, "cidrs": cidrs, "seconds": secs,
        "rss_before_kib": rss_before, "peak_growth_kib": (hwm - rss_before) if hwm_reset else None,
        "maxrss_delta_kib": maxrss_after - maxrss_before, "rss_after_kib": rss_after,  # see memory_1m's note
        "tracemalloc_peak_b": peak - base, "tracemalloc_held_b": held - base,
    }))


def memory_1m() -> dict[str, Any]:
    from bench.feedgen import make_feed

    with tempfile.NamedTemporaryFile("w", suffix=".netset", delete=False) as f:
        f.write(make_feed(BIG, 0, seed=2))
        path = f.name
    try:
        out = subprocess.run([sys.executable, __file__, "--memory-child", path], check=True, capture_output=True,
                             text=True, timeout=600)
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        os.unlink(path)


# -- main -----------------------------------------------------------------------------------------------------

def med(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> None:
    body, body2, churn = feeds()
    stage_runs = []
    runs: dict[str, list[dict[str, Any]]] = {"none": [], "ttl": []}
    refs: dict[str, list[float]] = {"none": [], "ttl": []}
    nft_delta: float | None = None
    hashed: list[dict[str, Any]] = []
    for r in range(ROUNDS):
        st, agg, desired = stages(body)
        stage_runs.append(st)
        desired2 = stages(body2)[2]
        gc.collect()
        for variant, tmo in (("none", None), ("ttl", BAN_TIMEOUT)):
            # the refresh by nft -f: once (see nft_reference), for the feed default
            delta_to = desired2 if (r == 0 and variant == "none" and NFT_DELTA) else None
            # alternate who goes first, so neither side always meets a warm (or a disturbed) machine
            if r % 2 == 0:
                runs[variant].append(asyncio.run(ours(desired, body2, tmo, check_content=True)))
                ref, d_secs = nft_reference(desired, delta_to, tmo)
            else:
                ref, d_secs = nft_reference(desired, delta_to, tmo)
                runs[variant].append(asyncio.run(ours(desired, body2, tmo, check_content=True)))
            refs[variant].append(ref)
            nft_delta = d_secs if d_secs is not None else nft_delta
            gc.collect()
        if LAYOUTS:  # the other layout, for the decision in docs/datapath.md (no nft -f reference: not ours)
            hashed.append(asyncio.run(ours(desired, body2, None, check_content=True, layout=hosts_in_hash,
                                           gc_repeat=1)))
            gc.collect()
        o = runs["none"][-1]
        print(f"round {r + 1}/{ROUNDS}: load {o['load']['s']:.3f}s (nft -f {refs['none'][-1]:.3f}s), refresh "
              f"{o['refresh']['s']:.4f}s; with timeouts: load {runs['ttl'][-1]['load']['s']:.3f}s (nft -f "
              f"{refs['ttl'][-1]:.3f}s), refresh {runs['ttl'][-1]['refresh']['s']:.3f}s", flush=True)

    counts = {k: len(v) for k, v in desired.items()}
    shape = ", ".join(f"{k} {v}" for k, v in counts.items())
    st = {k: med([s[k] for s in stage_runs]) for k in stage_runs[0]}
    record("feeds_kernel.70k.parse_s", st["parse"], "s", note=f"{N4} IPv4 + {N6} IPv6 FireHOL-style lines")
    record("feeds_kernel.70k.sanitise_s", st["sanitise"], "s")
    record("feeds_kernel.70k.aggregate_s", st["aggregate"], "s", note=f"{len(agg)} CIDRs: {shape}")
    record("feeds_kernel.70k.desired_s", st["desired"], "s", note="feeds._desired: aggregate -> set keys")
    record("feeds_kernel.70k.pipeline_s", st["total"], "s", note="parse + sanitise + aggregate + _desired")

    for variant, label in (("none", ""), ("ttl", "_ttl")):
        rs = runs[variant]
        load = med([x["load"]["s"] for x in rs])
        ref = med(refs[variant])
        kern = med([x["load"]["kernel"] for x in rs])
        enc = med([x["load"]["apply"] - x["load"]["kernel"] for x in rs])
        state = med([x["load"]["s"] - x["load"]["apply"] for x in rs])
        tmo_note = "no element timeouts (feed default)" if variant == "none" else \
            f"element timeouts (ban_timeout {int(BAN_TIMEOUT)}s)"
        record(f"feeds_kernel.70k.load{label}_s", load, "s", reference="nft -f", reference_value=ref,
               target="ratio <= 1.0",
               note=f"Enforcer.sync_sets of {len(agg)} elements into a fresh table, {tmo_note}; time split: "
                    f"state {state:.3f}s, encoding {enc:.3f}s, kernel transaction {kern:.3f}s; same sets by nft "
                    f"-f in another namespace; content verified with nft -j")
        record(f"feeds_kernel.70k.load{label}_kernel_s", kern, "s", reference="nft -f", reference_value=ref,
               note="the netlink transaction alone (send + commit + ack), part of the load above")
        record(f"feeds_kernel.70k.load{label}_e2e_s", st["total"] + load, "s",
               note="parse + sanitise + aggregate + _desired + sync_sets (nft -f has no such step: its input "
                    "is already aggregated)")
        refresh = med([x["refresh"]["s"] for x in rs])
        added = rs[-1]["refresh"]["added"]
        removed = rs[-1]["refresh"]["removed"]
        r_kern = med([x["refresh"]["kernel"] for x in rs])
        r_enc = med([x["refresh"]["apply"] - x["refresh"]["kernel"] for x in rs])
        r_state = med([x["refresh"]["s"] - x["refresh"]["apply"] for x in rs])
        resent = "" if variant == "none" else \
            "; no kept entry is past half of its life, so none is re-sent (row _renewal_ below: one that is)"
        # every round's pairs together (each list in pair order: paired_ratio needs them aligned)
        pr = {k: [t for x in rs for t in x["pairs"][k]] for k in rs[0]["pairs"]}
        pm = {k: med(v) for k, v in pr.items()}
        floor_gc, ours_gc, floor, again = pm["floor_gc"], pm["ours_gc"], pm["floor"], pm["again"]
        n_gc = len(pr["ours_gc"])
        # Issue 10's target for this row, 5 % of the full load, is below what the kernel itself charges for the
        # delta (its floor alone is 0.11-0.18 of the load on 6.18 with the gc scan due, 0.08-0.10 without, and
        # no better in the other layout: docs/datapath.md): judged only where the floor leaves room for it,
        # informational otherwise; the target that applies is the floor-relative one (_vs_floor rows)
        reachable = floor_gc / load < 0.05
        record(f"feeds_kernel.70k.refresh_1pct{label}_s", refresh, "s", reference="full load (sync_sets)",
               reference_value=load, target="ratio <= 0.05" if variant == "none" and reachable else None,
               note=f"{churn} of {N4 + N6} entries dropped and {churn} added -> +{added} -{removed} CIDRs"
                    f"{resent}; split: state {r_state:.4f}s, encoding {r_enc:.4f}s, kernel {r_kern:.4f}s. "
                    + ("" if reachable else
                       f"Informational: issue 10's target (<= 0.05 of the load) is out of reach on this kernel, "
                       f"whose own floor for this delta alone is {floor_gc / load:.3f} of the load in this run "
                       f"(docs/datapath.md); the target that applies is 1.1x that floor (_vs_floor rows)"))
        vs_floor: tuple[tuple[str, float, str, float, str, str, str], ...] = (
            ("", ours_gc, "kernel floor (same delta, pre-encoded)", floor_gc, "ours_gc", "floor_gc",
             f"the refresh against the kernel's own cost for the same delta: the same deletions and "
             f"additions in the same sets of the same table, encoded by the same writer before the clock "
             f"starts, one transaction timed from send to the barrier's answer, with the interval backend's "
             f"gc scan due as it is for a real refresh (hours after the last). {n_gc} pairs ({GC_REPEAT} "
             f"per round), each side undone and redone {GC_DUE}s later right after the churned copy's "
             f"pipeline, the order alternating; ratio: the median of the pairs' ratios, values: medians. "
             f"The floor alone is {floor_gc / load:.3f} of the full load; the refresh {ours_gc / load:.3f}"),
            ("_cpu", pm["ours_gc_cpu"], "kernel floor, CPU time", pm["floor_gc_cpu"], "ours_gc_cpu", "floor_gc_cpu",
             f"the row above in CPU seconds of the bench process (time.process_time: the commit runs in "
             f"the sending thread, so the kernel's work is counted; time other processes take from "
             f"the shared cores is not); same pairs. Without the gc scan (the _again_ row's pairs): ours "
             f"{pm['again_cpu'] * 1e3:.1f} ms, floor {pm['floor_cpu'] * 1e3:.1f} ms, ratio "
             f"{paired_ratio(pr['again_cpu'], pr['floor_cpu']):.3f}"),
        )
        for suffix, ours_v, ref_name, floor_v, ours_key, floor_key, row_note in vs_floor:
            record(f"feeds_kernel.70k.refresh_1pct{label}_vs_floor{suffix}_s", ours_v, "s", reference=ref_name,
                   reference_value=floor_v, target="ratio <= 1.1" if variant == "none" else None,
                   ratio=paired_ratio(pr[ours_key], pr[floor_key]), note=row_note)
        record(f"feeds_kernel.70k.refresh_1pct{label}_again_s", again, "s",
               reference="kernel floor, no gc scan due", reference_value=floor,
               ratio=paired_ratio(pr["again"], pr["floor"]),
               note=f"the same refresh undone and redone {REPEAT}x per round, interleaved with the floor undone "
                    f"and redone the same way (each right after a commit to the same sets, so no gc scan is due "
                    f"for either); ratio: median of the pairs' ratios. Floor without the scan: {floor / load:.3f} "
                    f"of the full load")
        if variant == "none" and nft_delta is not None:
            record("feeds_kernel.70k.refresh_1pct_nft_s", nft_delta, "s",
                   reference="kernel floor (same delta, pre-encoded)", reference_value=floor_gc,
                   note="the same delta by nft -f (one file of delete element + add element lines, one "
                        "transaction) on identical sets holding the same elements in another namespace, once per "
                        "run: nft 1.0.6 spends nearly all of it deleting the 543 interval elements in userspace "
                        "(the additions alone take ~0.3 s)")
        if variant == "ttl":
            ren = med([x["renewal"]["s"] for x in rs])
            record("feeds_kernel.70k.refresh_1pct_ttl_renewal_s", ren, "s", reference="full load (sync_sets)",
                   reference_value=load,
                   note=f"the churn undone {BAN_TIMEOUT * 0.6:.0f}s later: every kept entry is past half-life and "
                        f"renewed ({rs[-1]['renewal']['elements']} elements): once per half-life, not per refresh")
        record(f"feeds_kernel.70k.refresh_1pct{label}_e2e_s",
               med([x["refresh_pipeline"] + x["refresh"]["s"] for x in rs]), "s",
               reference="full load (sync_sets)", reference_value=load,
               note="parse + sanitise + aggregate + _desired + sync_sets of the churned feed")

    none = runs["none"]
    load = med([x["load"]["s"] for x in none])
    refresh = med([x["refresh"]["s"] for x in none])
    fl_gc = med([t for x in none for t in x["pairs"]["floor_gc"]])
    ratio_gc = paired_ratio([t for x in none for t in x["pairs"]["ours_gc"]],
                            [t for x in none for t in x["pairs"]["floor_gc"]])
    fl_ng = med([t for x in none for t in x["pairs"]["floor"]])
    again_s = med([t for x in none for t in x["pairs"]["again"]])
    print(f"refresh: {refresh / load:.3f} of the full load, {ratio_gc:.2f}x the kernel's floor for the "
          f"same delta (the floor alone: {fl_gc / load:.3f} of the full load with the gc scan due, "
          f"{fl_ng / load:.3f} without); redone: {again_s * 1e3:.1f} ms = floor {fl_ng * 1e3:.1f} ms + ours "
          f"{(again_s - fl_ng) * 1e3:.1f} ms", flush=True)
    if hashed:
        h_load = med([x["load"]["s"] for x in hashed])
        h_ref = med([x["refresh"]["s"] for x in hashed])
        h_fl = med([t for x in hashed for t in x["pairs"]["floor_gc"]])
        shape = ", ".join(f"{k} {len(v)}" for k, v in hosts_in_hash(desired).items())
        record("feeds_kernel.70k.refresh_1pct_hosts_in_hash_s", h_ref, "s",
               reference="full load in that layout", reference_value=h_load,
               note=f"the layout before #14 (single addresses in the hash sets, only ranges in the interval "
                    f"sets: {shape}), same feeds, same refresh, no element timeouts; its full load "
                    f"{h_load:.3f}s (the layout in use: {load:.3f}s); the kernel's floor for its refresh "
                    f"{h_fl:.4f}s = {h_fl / h_load:.3f} of its full load (in use: {fl_gc:.4f}s = {fl_gc / load:.3f}). "
                    "It costs one lookup more per packet: bench_datapath.py's split row")

    mem = memory_1m()
    if mem["peak_growth_kib"] is not None:
        record("feeds_kernel.1m.peak_rss_growth_mb", mem["peak_growth_kib"] * 1024 / 1e6, "MB",
               note=f"high-water RSS growth while parsing+sanitising+aggregating {mem['entries']} entries "
                    f"({mem['body_mb']:.1f} MB body already in memory, {mem['rss_before_kib'] / 1024:.0f} MiB RSS "
                    f"before) -> {mem['cidrs']} CIDRs in {mem['seconds']:.2f}s; fresh subprocess, VmHWM reset "
                    "through /proc/self/clear_refs (ru_maxrss cannot be used: across fork+exec it keeps the "
                    "parent's high-water mark)")
    record("feeds_kernel.1m.tracemalloc_peak_mb", mem["tracemalloc_peak_b"] / 1e6, "MB",
           note=f"Python allocations at the peak; {mem['tracemalloc_held_b'] / 1e6:.1f} MB still held by the "
                "parse result and aggregate")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--memory-child":
        memory_child(sys.argv[2])
    else:
        main()
