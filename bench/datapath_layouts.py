"""Prototype kernel layouts for nftblockd's drop decision, written as plain `nft -f` text, measured per packet.

No project code: each layout is a table in nft syntax, loaded into the receiving namespace of bench/dplab.py
and measured against a single plain rule at the same hook and against no filtering, with banned (hit) and
innocent (miss) sources, every packet checked on the counter of the rule meant to handle it. The results and
the decision are in docs/datapath.md.

    python bench/datapath_layouts.py [--rounds 5] [--seconds 1] [--elements 100000] [--only cur2,shared]
                                     [--kinds example,hash,interval] [--hook prerouting|ingress]
    python bench/datapath_layouts.py --primitives   # what one lookup or compare costs (amplified x16)
    python bench/datapath_layouts.py --explain      # why issue 14's two harnesses disagreed

Workloads (--kinds): `example` is the example config at work (a jail's 1,000 hosts in `default`, a 50k-entry
feed's aggregate in `feeds`); `hash` and `interval` put --elements addresses or ranges in one blocklist.

Layouts (IPv4 traffic; each has the IPv6 twins of its sets and rules, empty, as nftblockd would):
  cur2      the layout before issue 14 with the example config's two blocklists: allowlist interval set, then each
            blocklist's hash and interval sets in turn (10 rules, 5 IPv4 lookups on a miss)
  cur1      the same with one blocklist (6 rules, 3 IPv4 lookups)
  shared    one hash and one interval set per family shared by all blocklists, allowlist rules first
  after     `shared`, with the allowlist checked after a match instead of before every packet:
            `ip saddr @all_ip4 ip saddr != @allow4 counter drop` (2 IPv4 lookups on a miss)
  fam       `after`, split by family first (`meta nfproto vmap`): IPv4 packets never see the IPv6 rules
  oneset    hosts and ranges in one interval set per family, allowlist after (1 IPv4 lookup on a miss)
  vmap      one interval verdict map per family: allowlist ranges `accept`, bans `jump bl_<name>` (a chain
            that counts and drops: one lookup, per-blocklist counters)
  concat    `after` with the interval set keyed `ip saddr . meta l4proto` (a concatenation: the kernel picks
            the pipapo backend instead of the rbtree)
  perbl     per-blocklist sets kept, allowlist after, one rule per set (2 blocklists: 4 IPv4 lookups):
            what nftblockd used first after issue 14
  feedint   `perbl`, with the feed-owned blocklist's single addresses in its interval set (3 lookups): what
            nftblockd uses, except that it also leaves out the rules of empty sets (here `default_net4`: 2)
"""

from __future__ import annotations

import argparse
import bisect
import ipaddress
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.dplab import (
    COUNT_COMMENT,
    MISS,
    Config,
    Lab,
    Traffic,
    by_config,
    feed_keys,
    host_keys,
    net_text,
    range_keys,
    run_rounds,
    v4,
)

ALLOW4 = "127.0.0.0/8, 10.200.0.2"  # loopback and the receiver's own address, as allowlist_self makes it
ALLOW6 = "::1"
PRE = "type filter hook prerouting priority raw; policy accept;"
INGRESS = 'type filter hook ingress device "veth1" priority -500; policy accept;'
SIZE = 4_194_304


def hosts(n: int) -> tuple[list[str], Traffic]:
    keys, traffic = host_keys(n)
    return [v4(k) for k in keys], traffic


def ranges(n: int) -> tuple[list[str], Traffic]:
    keys, traffic = range_keys(n)
    return [net_text(k) for k in keys], traffic


def feed_aggregate() -> tuple[list[str], list[str], Traffic]:
    """The aggregate of a 50k-entry IPv4 feed as (hosts, ranges), 198.18.0.0/16 among the ranges."""
    want, traffic = feed_keys("feeds")
    return [v4(k) for k in want["feeds_ip4"]], [net_text(k) for k in want["feeds_net4"]], traffic


def _coverage(nets: list[str]) -> Callable[[str], bool]:
    spans = sorted((int(n.network_address), int(n.broadcast_address)) for n in map(ipaddress.ip_network, nets))
    starts = [a for a, _ in spans]

    def covered(addr: str) -> bool:
        i = bisect.bisect_right(starts, int(ipaddress.ip_address(addr))) - 1
        return i >= 0 and spans[i][1] >= int(ipaddress.ip_address(addr))
    return covered


def _random_hosts(n: int, seed: int) -> list[str]:
    return [v4(k) for k in host_keys(65536 + n, seed)[0][65536:]]


# -- nft text ------------------------------------------------------------------------------------------------

def _set(name: str, typ: str, flags: str, elems: list[str], *, timeout: bool = True, vmap: str = "") -> str:
    kind = f"map {name} {{\n  type {typ} : verdict;" if vmap else f"set {name} {{\n  type {typ};"
    fl = ",".join(f for f in (flags, "timeout" if timeout else "") if f)
    out = f" {kind}\n  size {SIZE};\n" + (f"  flags {fl};\n" if fl else "") + ("  timeout 1h;\n" if timeout else "")
    if elems:
        suffix = f" : {vmap}" if vmap else ""
        out += "  elements = { " + ", ".join(e + suffix for e in elems) + " }\n"
    return out + " }\n"


def _table(name: str, body: str) -> str:
    return f"table inet {name} {{\n{body}}}\n"


def _chain(name: str, hook: str, rules: list[str]) -> str:
    return f" chain {name} {{\n" + (f"  {hook}\n" if hook else "") + "".join(f"  {r}\n" for r in rules) + " }\n"


Contents = dict[str, tuple[list[str], list[str]]]  # blocklist -> (hosts, ranges)
Layout = Callable[[str, str, Contents], tuple[str, dict[str, str]]]  # -> (nft text, blocklist -> its comment)


def _allow() -> str:
    return (_set("allow_net4", "ipv4_addr", "interval", ALLOW4.split(", "), timeout=False)
            + _set("allow_net6", "ipv6_addr", "interval", [ALLOW6], timeout=False))


def _family_sets(prefix: str, h: list[str], r: list[str], *, concat: bool = False) -> str:
    net4 = _set(f"{prefix}_net4", "ipv4_addr . inet_proto", "interval", [f"{x} . 0-255" for x in r]) if concat \
        else _set(f"{prefix}_net4", "ipv4_addr", "interval", r)
    return (_set(f"{prefix}_ip4", "ipv4_addr", "", h) + _set(f"{prefix}_ip6", "ipv6_addr", "", []) + net4
            + _set(f"{prefix}_net6", "ipv6_addr", "interval", []))


def _drops(prefix: str, comment: str, *, allow_after: bool, concat: bool = False, hosts: bool = True) -> list[str]:
    out = []
    for proto, v, kind in (("ip", 4, "ip"), ("ip6", 6, "ip"), ("ip", 4, "net"), ("ip6", 6, "net")):
        if kind == "ip" and not hosts:
            continue
        match = f"{proto} saddr . meta l4proto" if concat and kind == "net" and v == 4 else f"{proto} saddr"
        allow = f" {proto} saddr != @allow_net{v}" if allow_after else ""
        out.append(f'{match} @{prefix}_{kind}{v}{allow} counter drop comment "{comment}"')
    return out


_ALLOW_FIRST = ["ip saddr @allow_net4 accept", "ip6 saddr @allow_net6 accept"]


def perblocklist(*, allow_after: bool, hosts_in_ranges: tuple[str, ...] = ()) -> Layout:
    """Each blocklist's own four sets, looked up in turn (today's layout when the allowlist comes first).

    Blocklists named in `hosts_in_ranges` keep their single addresses in their interval set (as /32) and have
    no hash-set rule: what a feed-owned blocklist could do, saving one lookup per packet."""
    def make(name: str, hook: str, contents: Contents) -> tuple[str, dict[str, str]]:
        body = _allow()
        rules = [] if allow_after else list(_ALLOW_FIRST)
        for bl, (h, r) in contents.items():
            merge = bl in hosts_in_ranges
            body += _family_sets(bl, [] if merge else h, r + h if merge else r)
            rules += _drops(bl, f"bl {bl}", allow_after=allow_after, hosts=not merge)
        return _table(name, body + _chain("pre", hook, rules)), {bl: f"bl {bl}" for bl in contents}
    return make


def one_blocklist(name: str, hook: str, contents: Contents) -> tuple[str, dict[str, str]]:
    """Today's layout with everything in one blocklist (the default config)."""
    h = [x for c in contents.values() for x in c[0]]
    r = [x for c in contents.values() for x in c[1]]
    text, _ = perblocklist(allow_after=False)(name, hook, {"default": (h, r)})
    return text, {bl: "bl default" for bl in contents}


def shared(*, allow_after: bool, concat: bool = False, family_split: bool = False) -> Layout:
    """One hash and one interval set per family for all blocklists (the origin would be in element comments)."""
    def make(name: str, hook: str, contents: Contents) -> tuple[str, dict[str, str]]:
        h = [x for c in contents.values() for x in c[0]]
        r = [x for c in contents.values() for x in c[1]]
        body = _allow() + _family_sets("all", h, r, concat=concat)
        rules = ([] if allow_after else list(_ALLOW_FIRST)) + _drops("all", "bl", allow_after=allow_after,
                                                                      concat=concat)
        if family_split:
            body += _chain("pre", hook, ["meta nfproto vmap { ipv4 : jump v4, ipv6 : jump v6 }"])
            body += _chain("v4", "", rules[0::2]) + _chain("v6", "", rules[1::2])
        else:
            body += _chain("pre", hook, rules)
        return _table(name, body), {bl: "bl" for bl in contents}
    return make


def oneset(name: str, hook: str, contents: Contents) -> tuple[str, dict[str, str]]:
    """Hosts and ranges of all blocklists in one interval set per family: one lookup on a miss."""
    elems = [x for c in contents.values() for part in c for x in part]
    body = _allow() + _set("all_net4", "ipv4_addr", "interval", elems) + _set("all_net6", "ipv6_addr", "interval", [])
    rules = _drops("all", "bl", allow_after=True, hosts=False)
    return _table(name, body + _chain("pre", hook, rules)), {bl: "bl" for bl in contents}


def vmap(name: str, hook: str, contents: Contents) -> tuple[str, dict[str, str]]:
    """One interval verdict map per family: allowlist `accept`, bans `jump bl_<blocklist>` (counter, drop)."""
    elems = [f"{a} : accept" for a in ALLOW4.split(", ")]
    elems += [f"{x} : jump bl_{bl}" for bl, c in contents.items() for part in c for x in part]
    body = (f" map v4 {{\n  type ipv4_addr : verdict;\n  size {SIZE};\n  flags interval,timeout;\n"
            "  elements = { " + ", ".join(elems) + " }\n }\n")
    body += (f" map v6 {{\n  type ipv6_addr : verdict;\n  size {SIZE};\n  flags interval,timeout;\n"
             f"  elements = {{ {ALLOW6} : accept }}\n }}\n")
    body += _chain("pre", hook, ["ip saddr vmap @v4", "ip6 saddr vmap @v6"])
    for bl in contents:
        body += _chain(f"bl_{bl}", "", [f'counter drop comment "bl {bl}"'])
    return _table(name, body), {bl: f"bl {bl}" for bl in contents}


LAYOUTS: dict[str, Layout] = {
    "cur2": perblocklist(allow_after=False),
    "cur1": one_blocklist,
    "perbl": perblocklist(allow_after=True),
    "feedint": perblocklist(allow_after=True, hosts_in_ranges=("feeds",)),
    "shared": shared(allow_after=False),
    "after": shared(allow_after=True),
    "fam": shared(allow_after=True, family_split=True),
    "concat": shared(allow_after=True, concat=True),
    "oneset": oneset,
    "vmap": vmap,
}


def workloads(kinds: list[str], n: int) -> list[tuple[str, Contents, list[tuple[str, str, Traffic]]]]:
    """(kind, contents, [(hit name, blocklist hit, traffic)]) for each kind of set contents."""
    out: list[tuple[str, Contents, list[tuple[str, str, Traffic]]]] = []
    for kind in kinds:
        if kind == "hash":
            h, hit = hosts(n)
            out.append((kind, {"default": (h, []), "feeds": ([], [])}, [("hit", "default", hit)]))
        elif kind == "interval":
            r, hit = ranges(n)
            out.append((kind, {"default": ([], []), "feeds": ([], r)}, [("hit", "feeds", hit)]))
        elif kind == "example":
            # the example config at work: a jail's 1,000 banned hosts in `default`, a 50k-entry feed's
            # aggregate in `feeds`; floods from one banned host and from a banned feed range
            fh, fr, _ = feed_aggregate()
            fr = [x for x in fr if x != "198.18.0.0/16"] + ["198.18.128.0/17"]
            # jail hosts outside the feed (in one structure for all blocklists, an overlap would be refused)
            covered = _coverage(fh + fr)
            jail = ["198.18.0.1", *[a for a in _random_hosts(1200, 21) if not covered(a)][:999]]
            out.append((kind, {"default": (jail, []), "feeds": (fh, fr)},
                        [("jailhit", "default", Traffic("198.18.0.1", 0)),
                         ("feedhit", "feeds", Traffic("198.18.128.0", 15))]))
    return out


def plain(name: str, hook: str) -> str:
    return _table(name, _chain("pre", hook, ['ip saddr 198.18.0.0/16 counter drop comment "plain"']))


AMP = 16  # rules per chain in an amplified measurement


def primitives(hook: str) -> list[tuple[str, str, Traffic, int]]:
    """Tables that repeat one cheap operation AMP times per packet: (name, nft text, traffic, hits per packet).

    Small structures stay in the cache, so repeating the lookup measures what it costs when hot, which is
    what a tiny allowlist or an empty set costs in practice. Large sets are not amplified (every repeat after
    the first would hit the cache): they are measured one rule at a time."""
    hit = Traffic("198.18.0.0", 16)
    small_hosts = [v4(0xC6120000 + i) for i in range(0, 65536, 256)]  # 256 hosts, none hit by random sources
    ops = {
        "other-family rule": ("", "ip6 saddr @e6", MISS, 0),
        "plain compare, miss": ("", "ip saddr 198.18.0.0/16", MISS, 0),
        "plain compare, hit": ("", "ip saddr 198.18.0.0/16", hit, AMP),
        "empty hash lookup": (_set("eh", "ipv4_addr", "", []), "ip saddr @eh", MISS, 0),
        "empty interval lookup": (_set("ei", "ipv4_addr", "interval", []), "ip saddr @ei", MISS, 0),
        "allowlist-size interval lookup": (_set("al", "ipv4_addr", "interval", ALLOW4.split(", "), timeout=False),
                                           "ip saddr @al", MISS, 0),
        "256-host hash lookup, miss": (_set("sh", "ipv4_addr", "", small_hosts), "ip saddr @sh", MISS, 0),
        "hit, then allowlist check": (_set("hr", "ipv4_addr", "interval", ["198.18.0.0/16"])
                                      + _set("al", "ipv4_addr", "interval", ALLOW4.split(", "), timeout=False),
                                      "ip saddr @hr ip saddr != @al", hit, AMP),
        "hit in a 1-range interval set": (_set("hr", "ipv4_addr", "interval", ["198.18.0.0/16"]), "ip saddr @hr",
                                          hit, AMP),
    }
    out = []
    for i, (label, (sets, match, traffic, hits)) in enumerate(ops.items()):
        body = sets + _set("e6", "ipv6_addr", "", []) if "e6" in match else sets
        rules = [f'{match} counter comment "amp"'] * AMP
        out.append((label, _table(f"p{i}", body + _chain("pre", hook, rules)), traffic, hits))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--elements", type=int, default=100_000)
    ap.add_argument("--kinds", default="example,hash,interval")
    ap.add_argument("--only", default="")
    ap.add_argument("--hook", default="prerouting", choices=("prerouting", "ingress"))
    ap.add_argument("--primitives", action="store_true", help="amplified costs of cheap operations instead")
    ap.add_argument("--explain", action="store_true", help="why issue 14's two harnesses disagreed")
    args = ap.parse_args()
    hook = PRE if args.hook == "prerouting" else INGRESS
    if args.primitives:
        return run_primitives(args, hook)
    if args.explain:
        return run_explain(args)
    names = [n for n in LAYOUTS if not args.only or n in args.only.split(",")]
    configs: list[Config] = [Config("baseline", None, MISS, COUNT_COMMENT)]
    t0 = time.monotonic()
    with Lab() as lab:
        lab.load("plain", plain("plain", hook))
        configs += [Config("plain/hit", "plain", Traffic("198.18.0.0", 16), "plain"),
                    Config("plain/miss", "plain", MISS, COUNT_COMMENT)]
        for kind, contents, hits in workloads(args.kinds.split(","), args.elements):
            for n in names:
                table = f"{n}_{kind}"
                text, comments = LAYOUTS[n](table, hook, contents)
                lab.load(table, text)
                configs += [Config(f"{table}/{hit}", table, traffic, comments[bl]) for hit, bl, traffic in hits]
                configs.append(Config(f"{table}/miss", table, MISS, COUNT_COMMENT))
        print(f"loaded {len(lab.tables)} tables in {time.monotonic() - t0:.0f}s; {len(configs)} configurations",
              flush=True)
        samples = run_rounds(lab, configs, args.rounds, args.seconds)
    report(samples, args)


def run_explain(args: argparse.Namespace) -> None:
    """Issue 14's second harness found nftblockd at parity with its plain-rule reference, which was itself
    ~15 % slower than the first harness's. Measured here side by side, with 198.18.0.0/16 banned in an
    interval set as there: the old layout with one and with two blocklists (the example config), and the
    plain rule alone and with the old nftblockd table still hooked next to it (an owned table persists after
    the daemon stops, by design: a reference taken after a daemon run is a reference plus nftblockd)."""
    contents: Contents = {"default": ([], ["198.18.0.0/16"]), "feeds": ([], [])}
    configs = [Config("baseline", None, MISS, COUNT_COMMENT)]
    with Lab() as lab:
        lab.load("plain", plain("plain", PRE))
        cur2_text, comments = LAYOUTS["cur2"]("cur2", PRE, contents)
        lab.load("cur2", cur2_text)
        lab.load("cur1", LAYOUTS["cur1"]("cur1", PRE, contents)[0])
        lab.load("perbl", LAYOUTS["perbl"]("perbl", PRE, contents)[0])
        # the plain rule's chain first (priority raw - 1), the left-over nftblockd chain after it
        leftover = cur2_text.replace("table inet cur2 {\n", "table inet leftover {\n" + _chain(
            "plain", "type filter hook prerouting priority -301; policy accept;",
            ['ip saddr 198.18.0.0/16 counter drop comment "plain"']), 1)
        lab.load("leftover", leftover)
        hit = Traffic("198.18.0.0", 16)
        for name, expect in (("plain", "plain"), ("leftover", "plain"), ("cur2", comments["default"]),
                             ("cur1", "bl default"), ("perbl", "bl default")):
            configs += [Config(f"{name}/hit", name, hit, expect), Config(f"{name}/miss", name, MISS, COUNT_COMMENT)]
        samples = run_rounds(lab, configs, args.rounds, args.seconds)
    report(samples, args)


def run_primitives(args: argparse.Namespace, hook: str) -> None:
    configs = [Config("baseline", None, MISS, COUNT_COMMENT)]
    with Lab() as lab:
        for label, text, traffic, hits in primitives(hook):
            name = text.split()[2]
            lab.load(name, text)
            configs.append(Config(label, name, traffic, COUNT_COMMENT, also=(("amp", hits),) if hits else ()))
        samples = run_rounds(lab, configs, args.rounds, args.seconds)
    by = by_config(samples)
    base = {s.round: s.ns for s in by["baseline"]}
    print(f"\n{args.hook}: each operation {AMP} times per packet, {args.rounds} rounds x {args.seconds:g} s; "
          "CPU ns per operation = (ns/packet - baseline) / repeats, median of rounds [min, max]")
    for name, ss in by.items():
        if name == "baseline":
            print(f"{'baseline ns/packet':<36} {statistics.median(s.ns for s in ss):>7.0f}")
            continue
        per = sorted((s.ns - base[s.round]) / AMP for s in ss)
        print(f"{name:<36} {statistics.median(per):>7.1f}  [{per[0]:.1f}, {per[-1]:.1f}]", flush=True)


def report(samples: list, args: argparse.Namespace) -> None:  # type: ignore[type-arg]
    by = by_config(samples)
    rounds = sorted({s.round for s in samples})
    base = {s.round: s.ns for s in by["baseline"]}

    print(f"\n{args.hook}, {args.elements} elements, {len(rounds)} rounds x {args.seconds:g} s. kpps: wall clock; "
          "ns: CPU ns/packet end to end; +base: over no filtering; +plain and x plain: over / relative to the "
          "plain rule with the same traffic (medians of per-round figures)")
    print(f"{'configuration':<24} {'kpps':>7} {'ns':>6} {'+base':>6} {'+plain':>7} {'x plain':>7}")
    for name, ss in by.items():
        ns = statistics.median(s.ns for s in ss)
        d = statistics.median(s.ns - base[s.round] for s in ss)
        line = f"{name:<24} {statistics.median(s.pps for s in ss) / 1e3:>7.1f} {ns:>6.0f} {d:>+6.0f}"
        if name != "baseline":
            ref = "plain/miss" if name.endswith("/miss") else "plain/hit"
            refs = {s.round: s.ns for s in by[ref]}
            over = statistics.median(s.ns - refs[s.round] for s in ss)
            ratio = statistics.median(s.ns / refs[s.round] for s in ss)
            line += f" {over:>+7.0f} {ratio:>7.3f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
