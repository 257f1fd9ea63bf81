"""Per-packet cost of nftblockd's drop decision, against one plain rule and against the kernel's own lookup
in a set holding the same elements (the floor), at the same hook, and against no filter.

The test bed is bench/dplab.py: two private namespaces joined by a veth pair, bench/udpflood.c sending
46-byte UDP packets with random sources from one pinned CPU, every configuration a table loaded once and kept
dormant except while measured, every packet verified on the counter of the rule meant to handle it.

Configurations, all in the same run:
  baseline                     no filtering (the counting chain after ours counts and drops)
  plain <hook> hit / miss      `ip saddr 198.18.0.0/16 counter drop`, alone, at prerouting priority raw or at
                               ingress on the receiving device: the reference
  floor <hook> <kind> <n>      ONE bare rule `ip saddr @s counter drop` on a set holding exactly the elements
                               below (same kind, flags and size as nftblockd's set; no allowlist, no other
                               set), at the same hook: what the kernel's lookup itself costs. "vs floor" is
                               what nftblockd's layout adds above it.
  nftblockd <hook> <kind> <n>  the real ruleset (plan_ruleset + KernelWriter.setup, the example config's two
                               blocklists `default` and `feeds`, allowlist 127.0.0.0/8, ::1 and the receiver's
                               own address), with n elements (1, 100k, 1M) in `default`'s hash set (single
                               addresses) or interval set (ranges), or the 50k-entry feed aggregate in `feeds`
                               as the feed manager loads it (hosts and ranges in its interval set). Only the
                               sets holding something have a rule. "ingress" is `chain: {ingress: [veth1]}`:
                               the ingress chain and the prerouting chain (which skips what came in on veth1).
  split feed                   the feed's aggregate with its single addresses in the hash set and only its
                               ranges in the interval set (the layout before #14, with the rules of the sets
                               that hold something: two lookups for the feed instead of one), loaded by the
                               project's writer like `nftblockd`; compared per round with `nftblockd ... feed`
                               (prerouting; NFTBLOCK_BENCH_DP_SPLIT=0 leaves it out)
  before <kind>                the layout this branch replaced (a rule for each of the 8 blocklist sets, the
                               feed's single addresses in its hash set, allowlist after), same elements, as nft
                               text (prerouting; NFTBLOCK_BENCH_DP_BEFORE=0 leaves it out)
Hit traffic comes from 198.18.0.0/16 (every source banned: in the hash set each packet looks up another
element; with one element, the flood comes from that one address), miss traffic from 198.19.0.0/16 (never
banned: every lookup misses, the common case).

Figures: CPU ns per packet end to end (the sender's CPU time, which with veth includes the receiver's softirq
work, plus ksoftirqd's on that CPU) is the robust one while other processes share the machine; packets per
second of wall-clock time is what a quiet machine shows. Each configuration's figure is the median over
interleaved rounds; "vs plain" is the median of per-round ratios to the plain rule at the same hook with the
same traffic, "vs floor" the same to the floor with the same elements, hook and traffic, "+ns" the median of
per-round differences from the baseline.

    python bench/bench_datapath.py
    # defaults: NFTBLOCK_BENCH_DP_ROUNDS=5 NFTBLOCK_BENCH_DP_SECONDS=0.6
    #           NFTBLOCK_BENCH_DP_SIZES=1,100000,1000000 NFTBLOCK_BENCH_DP_HOOKS=prerouting,ingress
    #           NFTBLOCK_BENCH_DP_BEFORE=1 NFTBLOCK_BENCH_DP_SPLIT=1
"""

from __future__ import annotations

import ipaddress
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import record
from bench.datapath_layouts import PRE, perblocklist, plain
from bench.dplab import (
    COUNT_COMMENT,
    DST_DEV,
    DST_IP,
    HIT,
    MISS,
    Config,
    Lab,
    Sample,
    Traffic,
    by_config,
    feed_keys,
    host_keys,
    net_text,
    range_keys,
    run_rounds,
    v4,
)
from nftblockd.config import parse_config
from nftblockd.kernel.bans import OpSpec
from nftblockd.kernel.batcher import Group
from nftblockd.kernel.links import Links
from nftblockd.kernel.netlink import NftSocket
from nftblockd.kernel.ruleset import (
    INGRESS_PRIORITY,
    ChainSpec,
    Ruleset,
    RuleSpec,
    SetSpec,
    encode_ruleset,
    plan_ruleset,
)
from nftblockd.kernel.writer import KernelWriter
from tests.helpers.netns import inside

ROUNDS = int(os.environ.get("NFTBLOCK_BENCH_DP_ROUNDS", "5"))
SECONDS = float(os.environ.get("NFTBLOCK_BENCH_DP_SECONDS", "0.6"))
SIZES = [int(x) for x in os.environ.get("NFTBLOCK_BENCH_DP_SIZES", "1,100000,1000000").split(",") if x]
HOOKS = [x for x in os.environ.get("NFTBLOCK_BENCH_DP_HOOKS", "prerouting,ingress").split(",") if x]
BEFORE = ("hash 100k", "interval 100k", "feed") if os.environ.get("NFTBLOCK_BENCH_DP_BEFORE", "1") != "0" else ()
SPLIT = os.environ.get("NFTBLOCK_BENCH_DP_SPLIT", "1") != "0"
ALLOW = ["127.0.0.0/8", DST_IP + "/32", "::1/128"]
INGRESS_HOOK = f'type filter hook ingress device "{DST_DEV}" priority -500; policy accept;'


def label(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k" if n >= 1000 else str(n)


def workloads() -> list[tuple[str, str, dict[str, list[int]], Traffic]]:
    """(name, blocklist hit, set name -> keys, hit traffic)."""
    out = []
    for n in SIZES:
        keys, traffic = host_keys(n)
        out.append((f"hash {label(n)}", "default", {"default_ip4": keys}, traffic))
        keys, traffic = range_keys(n)
        out.append((f"interval {label(n)}", "default", {"default_net4": keys}, traffic))
    want, traffic = feed_keys("feeds")
    out.append(("feed", "feeds", want, traffic))
    return out


def load_nftblockd(lab: Lab, table: str, hook: str, content: dict[str, list[int]]) -> None:
    """The real ruleset, made by the project's writer in the receiving namespace, with `content` in its sets."""
    assert lab.dst is not None
    chain = f"chain: {{ingress: [{DST_DEV}]}}\n" if hook == "ingress" else ""
    cfg = parse_config(f"table: inet {table}\nblocklists:\n  default: {{timeout: 1h, size: 2097152}}\n"
                       f"  feeds: {{timeout: permanent, size: 2097152}}\nallowlist_self: false\n{chain}")
    plan = plan_ruleset(cfg)
    with inside(lab.dst):
        w = KernelWriter(plan, NftSocket(), protect=False, links=Links())  # unowned: the bed toggles it dormant
    try:
        w.setup([ipaddress.ip_network(a) for a in ALLOW])
        until_ms = int((time.time() + 3600) * 1000)
        for name, keys in content.items():
            spec = OpSpec(True, None if name.startswith("feeds") else until_ms, "")
            for i in range(0, len(keys), 200_000):
                part = keys[i:i + 200_000]
                res = w.write([Group(name, part, [spec] * len(part))])
                assert not res.failed, f"{table}: the kernel refused {len(res.failed)} elements of {name}"
        counts = w.set_counts()
        for name, keys in content.items():
            assert counts[name] == len(keys), (table, name, counts[name], len(keys))
        assert sum(n or 0 for n in counts.values()) == sum(map(len, content.values())) + 3, counts  # + allowlist
    finally:
        w.close()
    lab.adopt(table)


def split_hosts(content: dict[str, list[int]]) -> dict[str, list[int]]:
    """A feed blocklist's content with its single addresses moved from the interval set to the hash set."""
    out: dict[str, list[int]] = {}
    for name, keys in content.items():
        if name.endswith("_net4"):
            out[name[:-5] + "_ip4"] = [k >> 8 for k in keys if k & 0xFF == 32]
            out[name] = [k for k in keys if k & 0xFF != 32]
    return out


def load_floor(lab: Lab, table: str, hook: str, content: dict[str, list[int]]) -> None:
    """One set with the same elements (of the one set nftblockd fills), one bare rule on it, at `hook`."""
    assert lab.dst is not None
    (name, keys), = ((n, k) for n, k in content.items() if k)
    s = SetSpec("s", 4, name.endswith("net4"), True, 2097152, "floor")
    rule = RuleSpec(4, "s", "drop", True, "floor")
    chain = ChainSpec("prerouting", "prerouting", -300, None, (rule,)) if hook == "prerouting" else \
        ChainSpec(f"ingress_{DST_DEV}", "ingress", INGRESS_PRIORITY, DST_DEV, (rule,))
    plan = Ruleset(table, (s,), (chain,))
    with inside(lab.dst):
        sock = NftSocket()
    w = KernelWriter(plan, sock, protect=False)  # no setup: the writer only adds elements here
    try:
        out = sock.transact(encode_ruleset(plan, 0, sock.next_seq(100)))
        assert out.committed, out.errors
        spec = OpSpec(True, None if name.startswith("feeds") else int((time.time() + 3600) * 1000), "")
        for i in range(0, len(keys), 200_000):
            part = keys[i:i + 200_000]
            assert not w.write([Group("s", part, [spec] * len(part))]).failed
        assert w.set_counts() == {"s": len(keys)}
    finally:
        w.close()
    lab.adopt(table)


def load_before(lab: Lab, table: str, content: dict[str, list[int]]) -> None:
    """The same elements in the layout this branch replaced, written as nft text: a rule for each of the
    blocklists' 8 sets (allowlist after), the feed's single addresses in its hash set."""
    hosts: dict[str, list[str]] = {}
    ranges: dict[str, list[str]] = {}
    for bl in ("default", "feeds"):
        nets = content.get(f"{bl}_net4", [])
        hosts[bl] = [v4(k) for k in content.get(f"{bl}_ip4", [])] + [v4(k >> 8) for k in nets if k & 255 == 32]
        ranges[bl] = [net_text(k) for k in nets if k & 255 != 32]
    text, _ = perblocklist(allow_after=True)(table, PRE, {bl: (hosts[bl], ranges[bl]) for bl in hosts})
    lab.load(table, text)


def main() -> None:
    t_start = time.monotonic()
    configs = [Config("baseline", None, MISS, COUNT_COMMENT)]
    with Lab() as lab:
        for hook in HOOKS:
            lab.load(f"plain_{hook}", plain(f"plain_{hook}", PRE if hook == "prerouting" else INGRESS_HOOK))
            configs += [Config(f"plain {hook} hit", f"plain_{hook}", HIT, "plain"),
                        Config(f"plain {hook} miss", f"plain_{hook}", MISS, COUNT_COMMENT)]
        for name, bl, content, traffic in workloads():
            slug = name.replace(" ", "_")
            for hook in HOOKS:
                table = f"nbd_{hook[:3]}_{slug}"
                load_nftblockd(lab, table, hook, content)
                chain = "prerouting" if hook == "prerouting" else f"ingress_{DST_DEV}"
                expect = f"{chain}/nftblockd blocklist {bl}"
                configs += [Config(f"nftblockd {hook} {name} hit", table, traffic, expect),
                            Config(f"nftblockd {hook} {name} miss", table, MISS, COUNT_COMMENT)]
                floor = f"floor_{hook[:3]}_{slug}"
                load_floor(lab, floor, hook, content)
                configs += [Config(f"floor {hook} {name} hit", floor, traffic, "floor"),
                            Config(f"floor {hook} {name} miss", floor, MISS, COUNT_COMMENT)]
            if name == "feed" and SPLIT and "prerouting" in HOOKS:
                load_nftblockd(lab, "split_feed", "prerouting", split_hosts(content))
                expect = f"prerouting/nftblockd blocklist {bl}"
                configs += [Config("split prerouting feed hit", "split_feed", traffic, expect),
                            Config("split prerouting feed miss", "split_feed", MISS, COUNT_COMMENT)]
            if name in BEFORE and "prerouting" in HOOKS:
                load_before(lab, f"old_{slug}", content)
                configs += [Config(f"before prerouting {name} hit", f"old_{slug}", traffic, f"bl {bl}"),
                            Config(f"before prerouting {name} miss", f"old_{slug}", MISS, COUNT_COMMENT)]
        print(f"{len(configs)} configurations loaded in {time.monotonic() - t_start:.0f}s; {ROUNDS} rounds x "
              f"{SECONDS:g} s", flush=True)
        samples = run_rounds(lab, configs, ROUNDS, SECONDS)
        cpu = lab.cpu
    report(samples, cpu, time.monotonic() - t_start)


def report(samples: list[Sample], cpu: int, elapsed: float) -> None:
    by = by_config(samples)
    base = {s.round: s for s in by["baseline"]}
    base_ns = statistics.median(s.ns for s in by["baseline"])
    common = (f"{ROUNDS} interleaved rounds x {SECONDS:g} s, sender pinned to CPU {cpu}, 46-byte UDP; CPU ns per "
              "packet end to end (sender + its softirq), medians of per-round figures")
    print(f"\n{'configuration':<42} {'kpps':>7} {'ns/pkt':>7} {'+ns':>6} {'vs plain':>8} {'vs floor':>8}")
    for name, ss in by.items():
        ns = statistics.median(s.ns for s in ss)
        pps = statistics.median(s.pps for s in ss)
        delta = statistics.median(s.ns - base[s.round].ns for s in ss)
        ref = None
        if name != "baseline":
            parts = name.split()
            ref = f"plain {'prerouting' if parts[0] == 'before' else parts[1]} {parts[-1]}"
        line = f"{name:<42} {pps / 1e3:>7.1f} {ns:>7.0f} {delta:>+6.0f}"
        slug = "datapath." + name.replace(" ", ".")
        if ref is None or ref == name:
            print(line, flush=True)
            record(slug, ns, "ns", note=f"{name}: {pps:.0f} pps wall clock, {delta:+.0f} ns over no filtering "
                   f"({base_ns:.0f} ns); {common}")
            continue
        refs = {s.round: s.ns for s in by[ref]}
        ratio = statistics.median(s.ns / refs[s.round] for s in ss)
        floor = "floor " + " ".join(name.split()[1:]) if name.split()[0] in ("nftblockd", "before") else None
        if name.split()[0] == "split":  # against the layout in use, same hook and traffic
            floor = "nftblockd " + " ".join(name.split()[1:])
        vs_floor = ""
        if floor is not None and floor in by:
            frefs = {s.round: s.ns for s in by[floor]}
            fratio = statistics.median(s.ns / frefs[s.round] for s in ss)
            vs_floor = f"; median per-round ratio to {floor} {fratio:.3f}"
            print(f"{line} {ratio:>8.3f} {fratio:>8.3f}", flush=True)
            if name.startswith("split"):
                diff = statistics.median(s.ns - frefs[s.round] for s in ss)
                vs_floor += f", median per-round difference {diff:+.0f} ns"
                record(slug + ".vs_layout", ns, "ns", reference=f"{floor} (ns/packet)",
                       reference_value=statistics.median(frefs.values()),
                       note=f"{name} (the feed's hosts in its hash set) against the layout in use (all in its "
                            f"interval set), same hook and traffic: what the extra lookup costs{vs_floor}; {common}")
            else:
                record(slug + ".vs_floor", ns, "ns", reference=f"{floor} (ns/packet)",
                       reference_value=statistics.median(frefs.values()),
                       target="ratio <= 1.10" if name.startswith("nftblockd") else None,
                       note=f"{name} against the kernel's own lookup in a set with the same elements, same hook: "
                            f"what the layout adds{vs_floor}; {common}")
        else:
            print(f"{line} {ratio:>8.3f}", flush=True)
        record(slug, ns, "ns", reference=f"{ref} (ns/packet)", reference_value=statistics.median(refs.values()),
               target="ratio <= 1.10" if name.startswith("nftblockd") else None,
               note=f"{name}: {pps:.0f} pps wall clock, {delta:+.0f} ns over no filtering ({base_ns:.0f} ns); "
                    f"median per-round ratio to {ref} {ratio:.3f}{vs_floor}; {common}")
    print(f"done in {elapsed:.0f}s", flush=True)


if __name__ == "__main__":
    main()
