"""What one kernel transaction of a feed refresh costs, and what changes it: a probe of the interval set
backend's commit (kernel 6.18, net/netfilter/nft_set_rbtree.c), not a `make bench` figure.

Since the interval backend answers lookups from a sorted array (`nft_rbtree_lookup` is a bsearch over
`priv->array`), a transaction that inserts into or deactivates an element of an interval set allocates the
next array (`nft_array_may_resize`: about half the element count + 10,240 slots, zeroed) and its commit walks
the WHOLE tree to fill it (`nft_rbtree_commit`), every few seconds with a garbage-collection walk before
that (`nft_rbtree_gc_scan`, once `nft_set_gc_interval` has passed since the last one). So a refresh of a
large interval set pays for the whole set however small the change. The probe times, on the aggregate of the
70k-entry feed of bench_feeds_kernel.py (about 54k elements), each transaction pre-encoded and sent by
`NftSocket.transact` (send → commit → the GETGEN barrier's answer), forward and back again R times,
interleaved, medians:

  refresh           the 1 % churn refresh (deletions then additions, per set), one transaction: the floor
  adds first        the same messages, every addition before any deletion
  per set           one transaction per set (the sum of both)
  dels, then adds   deletions in one transaction, additions in the next (the sum)
  1 range           one range added to the IPv4 interval set: the fixed cost of touching it
  1 host (hash)     one address added to the IPv4 hash set: a set without a rebuild
  empty batch       BEGIN + END and the barrier: the transaction itself
  ..., gc due       the same after waiting past the 1 s gc interval (a real refresh: hours apart); the
                    others are timed right after a commit to the same sets, when no scan is due
  gc interval 1h    the refresh on sets made with NFTA_SET_GC_INTERVAL 1 h (the commit scans at most hourly)
  no timeout flag   the refresh on sets made without NFT_SET_TIMEOUT (feeds without ban_timeout could)
  hosts in hash     the refresh with the layout before #14: single addresses in the hash sets, ranges only
                    in the interval sets

    python bench/feeds_commit_probe.py          # NFTBLOCK_PROBE_REPS=9
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_feeds_kernel import BLOCKLIST, feeds, hosts_in_hash, stages
from nftblockd.config import parse_config
from nftblockd.feeds.delta import diff_sorted
from nftblockd.kernel import nfmsg as m
from nftblockd.kernel import ruleset as rs
from nftblockd.kernel.bans import DELETE, OpSpec
from nftblockd.kernel.batcher import Group
from nftblockd.kernel.netlink import NftSocket
from nftblockd.kernel.ruleset import Ruleset, plan_ruleset, set_name
from nftblockd.kernel.writer import KernelWriter
from tests.helpers.netns import NetNS, inside

REPS = int(os.environ.get("NFTBLOCK_PROBE_REPS", "9"))
ADD = OpSpec(True, None, "")

Delta = dict[str, tuple[list[int], list[int]]]  # set name -> (added, removed)


def delta(old: dict[str, list[int]], new: dict[str, list[int]]) -> Delta:
    return {name: diff_sorted(old[name], new[name]) for name in new}


def table(ns: NetNS, name: str, timeout_flag: bool, gc_interval_ms: int | None = None) -> KernelWriter:
    cfg = parse_config(f"table: inet {name}\nblocklists: {{{BLOCKLIST}: {{timeout: 1h, size: 1048576}}}}\n"
                       "allowlist_self: false\n")
    plan = plan_ruleset(cfg)
    if not timeout_flag:
        plan = Ruleset(plan.table, tuple(replace(s, timeout=False) for s in plan.sets), plan.chains)
    with inside(ns):
        w = KernelWriter(plan, NftSocket(), protect=False)
    if gc_interval_ms is None:
        w.setup([])
        return w
    orig = rs.encode_set

    def with_gc(table: str, s: rs.SetSpec, set_id: int, seq: int) -> bytes:
        """The set as the project makes it, plus NFTA_SET_GC_INTERVAL (the kernel takes it with the timeout
        flag only)."""
        msg = orig(table, s, set_id, seq)
        if not s.timeout:
            return msg
        return m.message(m.NFT_MSG_NEWSET, m.NLM_F_REQUEST | m.NLM_F_CREATE, seq, m.NFPROTO_INET,
                         msg[20:] + m.be32(m.NFTA_SET_GC_INTERVAL, gc_interval_ms))

    rs.encode_set = with_gc  # for this one setup only
    try:
        w.setup([])
    finally:
        rs.encode_set = orig
    return w


def load(w: KernelWriter, want: dict[str, list[int]]) -> None:
    res = w.write([Group(name, keys, [ADD] * len(keys)) for name, keys in want.items() if keys])
    assert not res.failed, f"refused {len(res.failed)}"
    counts = w.set_counts()
    for name, keys in want.items():
        assert counts[name] == len(keys), (name, counts[name], len(keys))


def encode(w: KernelWriter, d: Delta, *, adds_first: bool = False) -> list[bytes]:
    """The delta's messages as the writer makes them (per set: deletions, then additions)."""
    names: list[str] = []
    keys: list[int] = []
    specs: list[OpSpec] = []
    for name, (added, removed) in d.items():
        for ks, spec in ((removed, DELETE), (added, ADD)):
            names += [name] * len(ks)
            keys += ks
            specs += [spec] * len(ks)
    msgs, _where = w._encode(names, keys, specs, range(len(keys)), int(time.time() * 1000), set())
    out = [sm.data for sm in msgs]
    if adds_first:
        out.sort(key=lambda b: int.from_bytes(b[4:6], "little") & 0xFF != 12)  # NEWSETELEM (12) first
    return out


def timed(w: KernelWriter, batches: list[list[bytes]]) -> float | None:
    """Seconds to send and commit `batches` in turn; None when the first is refused (nothing changed)."""
    t0 = time.perf_counter()
    for i, msgs in enumerate(batches):
        out = w.sock.transact(msgs)
        if not out.committed:
            assert i == 0, out.errors[:1]
            return None
    return time.perf_counter() - t0


def main() -> None:
    body, body2, _churn = feeds()
    _st, _agg, base = stages(body)
    _st, _agg, churned = stages(body2)
    fwd, back = delta(base, churned), delta(churned, base)
    h_base, h_churned = hosts_in_hash(base), hosts_in_hash(churned)
    h_fwd, h_back = delta(h_base, h_churned), delta(h_churned, h_base)
    ns = NetNS("nbp")
    try:
        w = table(ns, "probe_int", True)  # the variants of ordering and splitting
        r0 = table(ns, "probe_ref", True)  # the refresh alone, so that each compared table sees only its own
        nt = table(ns, "probe_nt", False)
        hh = table(ns, "probe_hash", True)
        g1 = table(ns, "probe_gc", True, gc_interval_ms=3_600_000)
        load(w, base)
        load(r0, base)
        load(g1, base)
        load(nt, base)
        load(hh, h_base)
        n = {k: len(v) for k, v in base.items()}
        print(f"interval layout: {n}; hash layout: { {k: len(v) for k, v in h_base.items()} }")
        print(f"refresh: {sum(len(a) for a, _ in fwd.values())} added, {sum(len(r) for _, r in fwd.values())} "
              f"removed; in the hash layout {sum(len(a) for a, _ in h_fwd.values())} / "
              f"{sum(len(r) for _, r in h_fwd.values())}")
        net4 = set_name(BLOCKLIST, 4, True)
        ip4 = set_name(BLOCKLIST, 4, False)
        one_range: Delta = {net4: ([(198 << 24 | 51 << 16 | 100 << 8) << 8 | 24], [])}
        one_host: Delta = {ip4: ([198 << 24 | 51 << 16 | 100 << 8 | 7], [])}
        undo = {name: (r, a) for name, (a, r) in one_range.items()}
        undo_h = {name: (r, a) for name, (a, r) in one_host.items()}
        per_set = [{name: d} for name, d in fwd.items() if d[0] or d[1]]
        per_set_back = [{name: d} for name, d in back.items() if d[0] or d[1]]
        # name -> (writer, forward batches, back batches)
        cases: dict[str, tuple[KernelWriter, Callable[[], list[list[bytes]]], Callable[[], list[list[bytes]]]]] = {
            "refresh": (r0, lambda: [encode(r0, fwd)], lambda: [encode(r0, back)]),
            "adds first": (w, lambda: [encode(w, fwd, adds_first=True)], lambda: [encode(w, back)]),
            "per set": (w, lambda: [encode(w, d) for d in per_set], lambda: [encode(w, d) for d in per_set_back]),
            "dels, then adds": (w, lambda: [encode(w, {k: ([], r) for k, (_a, r) in fwd.items()}),
                                            encode(w, {k: (a, []) for k, (a, _r) in fwd.items()})],
                                lambda: [encode(w, back)]),
            "1 range": (w, lambda: [encode(w, one_range)], lambda: [encode(w, undo)]),
            "1 host (hash)": (w, lambda: [encode(w, one_host)], lambda: [encode(w, undo_h)]),
            "empty batch": (w, lambda: [[]], lambda: [[]]),
            "no timeout flag": (nt, lambda: [encode(nt, fwd)], lambda: [encode(nt, back)]),
            "hosts in hash": (hh, lambda: [encode(hh, h_fwd)], lambda: [encode(hh, h_back)]),
            "gc interval 1h": (g1, lambda: [encode(g1, fwd)], lambda: [encode(g1, back)]),
        }
        times: dict[str, list[float]] = {k: [] for k in cases}
        due = {"refresh": r0, "no timeout flag": nt, "hosts in hash": hh, "gc interval 1h": g1}
        times |= {f"{k}, gc due": [] for k in due}
        refused: set[str] = set()
        names = list(cases)
        for r in range(REPS):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                wr, f, b = cases[name]
                fb, bb = f(), b()  # encoded before the clock starts
                if timed(wr, fb) is None:  # refused as a whole: nothing changed, nothing to undo
                    refused.add(name)
                    continue
                timed(wr, bb)  # these two: the backend's gc scan (if due) is done, the next is not due
                fb, bb = f(), b()
                t = timed(wr, fb)
                assert t is not None
                times[name].append(t)
                timed(wr, bb)
            time.sleep(1.2)  # past the backend's gc interval (1 s unless the set says otherwise): a scan is due
            for name in (list(due) if r % 2 == 0 else list(due)[::-1]):
                wr, f, b = cases[name]
                fb, bb = f(), b()
                t = timed(wr, fb)
                assert t is not None
                times[f"{name}, gc due"].append(t)
                timed(wr, bb)
            print(f"round {r + 1}/{REPS}: " + ", ".join(f"{k} {v[-1] * 1e3:.1f}" for k, v in times.items() if v),
                  flush=True)
        for wr, want in ((w, base), (r0, base), (nt, base), (hh, h_base), (g1, base)):
            counts = wr.set_counts()
            for name, keys in want.items():
                assert counts[name] == len(keys), (name, counts[name], len(keys))
        ref = statistics.median(times["refresh"])
        print(f"\n{'transaction(s)':<20} {'ms':>7} {'vs refresh':>10}   (median of {REPS}, min-max)")
        for name, ts in times.items():
            if not ts:
                print(f"{name:<20} refused by the kernel (EEXIST: an added range meets a deleted one's bound)")
                continue
            med = statistics.median(ts)
            print(f"{name:<20} {med * 1e3:>7.2f} {med / ref:>10.2f}   {min(ts) * 1e3:.2f}-{max(ts) * 1e3:.2f}")
        for wr in (w, r0, nt, hh, g1):
            wr.close()
    finally:
        ns.delete()


if __name__ == "__main__":
    main()
