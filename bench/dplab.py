"""A test bed for per-packet measurements: two private namespaces, one veth pair, a UDP flood, rule counters.

Used by bench/bench_datapath.py (the `make bench` table) and bench/datapath_layouts.py (the layout
prototypes of docs/datapath.md). It never touches the machine's own ruleset or interfaces: both ends of the
veth pair live in namespaces made here and removed at exit, and all traffic goes from one to the other.

How a figure is taken
---------------------
* The sender, bench/udpflood.c (compiled here), writes 46-byte raw IPv4+UDP packets with random sources in
  a given network, pinned to one CPU. With veth, the receiver's whole netfilter path runs in softirq on the
  sender's CPU, inside its send call, so the sender's packets per second measure sender + receiver work:
  ns/packet = 1e9 / pps, and a configuration's cost is its difference from the baseline measured in the
  same round.
* Every configuration is a table loaded once, before the first round, and then kept dormant (no hooks
  registered) except while it is measured; switching is one `nft add table` that sets or clears the flag.
  Large sets are built once, and every configuration is measured with the same memory in use.
* A counting chain (`inet dplab_count`, prerouting priority 100: after raw and after a filter-priority
  chain) counts and drops what got through; a configuration names the rule that must count every packet
  (by its comment), and every other counter of the active table must stay at zero. A round whose counters
  disagree with that raises: a figure is only kept when the packets were handled where intended.
* Rounds are interleaved: every configuration once per round, the order rotated each round, so a change
  in the machine's load shifts all of them alike, and ratios are taken within a round.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.netns import NetNS, inside

SRC_IP, DST_IP = "10.200.0.1", "10.200.0.2"
SRC_DEV, DST_DEV = "veth0", "veth1"
COUNT_TABLE = "dplab_count"
COUNT_COMMENT = "dplab delivered"
MAX_PACKETS = 50_000_000  # a cap in case the path is far faster than expected


@dataclass(frozen=True, slots=True)
class Traffic:
    """Where the flood's sources come from: `bits` random low bits below `net` (0: one source)."""

    net: str
    bits: int


@dataclass(frozen=True, slots=True)
class Config:
    """One measured configuration.

    `table` is the name of a table loaded with `Lab.load` (None: only the counting chain, the baseline);
    `expect` is the comment of the rules that must count every packet, or "chain/comment" for one chain's
    (COUNT_COMMENT: the counting chain); `also` names other comments that must count every packet `times`
    times (rules that count and let the packet go on, as in an amplified measurement of one lookup). Every
    other counter must stay at zero.
    """

    name: str
    table: str | None
    traffic: Traffic
    expect: str
    family: str = "inet"
    also: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Sample:
    config: str
    round: int
    sent: int
    seconds: float  # wall clock
    cpu: float  # CPU seconds of the sender plus what ksoftirqd ran on its CPU meanwhile
    counted: int

    @property
    def pps(self) -> float:
        """Packets per second of wall-clock time: what a quiet machine shows."""
        return self.counted / self.seconds

    @property
    def ns(self) -> float:
        """CPU nanoseconds per packet, end to end: stable while other processes share the CPU."""
        return 1e9 * self.cpu / self.counted


# -- what is banned ------------------------------------------------------------------------------------------
#
# Hit traffic comes from 198.18.0.0/16, miss traffic from 198.19.0.0/16 (RFC 2544 benchmarking space). No set
# element made below touches 198.19.0.0/16; every element of the hit traffic's /16 is banned.

HIT = Traffic("198.18.0.0", 16)
MISS = Traffic("198.19.0.0", 16)
_HIT_LO, _KEEP_OUT_HI = 0xC6120000, 0xC613FFFF  # 198.18.0.0 .. 198.19.255.255


def host_keys(n: int, seed: int = 11) -> tuple[list[int], Traffic]:
    """`n` single addresses (ints): all 65,536 of 198.18.0.0/16 when n allows (each hit packet looks up
    another element), the rest random elsewhere; below 65,536, 198.18.0.1 and a flood from it alone."""
    if n < 65536:
        return [_HIT_LO + 1, *_random_hosts(n - 1, seed)], Traffic("198.18.0.1", 0)
    return list(range(_HIT_LO, _HIT_LO + 65536)) + _random_hosts(n - 65536, seed), HIT


def range_keys(n: int, seed: int = 12) -> tuple[list[int], Traffic]:
    """`n` disjoint ranges as interval-set keys (start << 8 | prefix length): 16,384 /30s tiling
    198.18.0.0/16 when n allows, and /28s at random elsewhere, none adjacent; below 16,384, 198.18.0.0/16."""
    if n < 16384:
        return [_HIT_LO << 8 | 16, *_random_ranges(n - 1, seed)], HIT
    return [(_HIT_LO + 4 * i) << 8 | 30 for i in range(16384)] + _random_ranges(n - 16384, seed), HIT


def _outside(a: int) -> bool:
    return not _HIT_LO <= a <= _KEEP_OUT_HI and a >> 24 not in (10, 127)


def _random_hosts(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    out: set[int] = set()
    while len(out) < n:
        a = rng.randrange(0x0B000000, 0xDF000000)
        if _outside(a):
            out.add(a)
    return list(out)


def _random_ranges(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    out: set[int] = set()
    while len(out) < n:
        block = rng.randrange(0x0B000000 >> 5, 0xDF000000 >> 5)  # a /27, of which the first /28 is banned
        if _outside(block << 5) and _outside((block << 5) | 31):
            out.add(block)
    return [(b << 5) << 8 | 28 for b in out]


def feed_keys(blocklist: str) -> tuple[dict[str, list[int]], Traffic]:
    """A 50,000-entry IPv4 feed (bench/feedgen.py) parsed, sanitised and aggregated the way the feed manager
    does, as set name -> keys for `blocklist`, with the hit traffic's 198.18.0.0/16 among its ranges."""
    from bench.feedgen import make_feed
    from nftblockd.feeds.aggregate import aggregate, sanitise
    from nftblockd.feeds.manager import _desired
    from nftblockd.feeds.parse import parse_feed

    parsed = parse_feed(make_feed(50_000, 0, seed=1))
    want = _desired(aggregate([sanitise(parsed.v4, parsed.v6)]), blocklist)
    net4 = f"{blocklist}_net4"
    want[net4] = [k for k in want[net4] if _outside(k >> 8)] + [_HIT_LO << 8 | 16]
    want[f"{blocklist}_ip4"] = [k for k in want[f"{blocklist}_ip4"] if _outside(k)]
    return want, HIT


def v4(a: int) -> str:
    return f"{a >> 24}.{a >> 16 & 255}.{a >> 8 & 255}.{a & 255}"


def net_text(key: int) -> str:
    return f"{v4(key >> 8)}/{key & 255}"


class Lab:
    """Sender and receiver namespaces joined by one veth pair; the counting chain in the receiver."""

    def __init__(self, cpu: int | None = None) -> None:
        self.cpu = sorted(os.sched_getaffinity(0))[-1] if cpu is None else cpu
        self.src: NetNS | None = None
        self.dst: NetNS | None = None
        self.tmp = Path(tempfile.mkdtemp(prefix="dplab-"))
        self.binary = ""
        self.tables: dict[str, str] = {}  # name -> family
        self.active: str | None = None
        self._nl: RuleCounters | None = None
        self._ksoftirqd = _ksoftirqd_pid(self.cpu)

    def __enter__(self) -> Lab:
        # a SIGTERM (timeout, Ctrl-C from a wrapper) unwinds through close(): no namespace is left behind
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _build(self) -> None:
        self.binary = str(self.tmp / "udpflood")
        subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-o", self.binary,
                        str(Path(__file__).with_name("udpflood.c"))], check=True, capture_output=True, text=True)
        self.src = NetNS("dpl")
        self.dst = NetNS("dpl")
        # made inside the sender's namespace with the peer moved straight into the receiver's: the host
        # never sees either end
        self.src.run("ip", "link", "add", SRC_DEV, "type", "veth", "peer", "name", DST_DEV, "netns",
                     self.dst.name)
        self.src.run("ip", "addr", "add", f"{SRC_IP}/24", "dev", SRC_DEV)
        self.dst.run("ip", "addr", "add", f"{DST_IP}/24", "dev", DST_DEV)
        self.src.run("ip", "link", "set", SRC_DEV, "up")
        self.dst.run("ip", "link", "set", DST_DEV, "up")
        # a permanent neighbour entry: no ARP exchange inside a measurement
        mac = json.loads(self.dst.run("ip", "-j", "link", "show", DST_DEV).stdout)[0]["address"]
        self.src.run("ip", "neigh", "replace", DST_IP, "lladdr", mac, "dev", SRC_DEV, "nud", "permanent")
        self.dst.run("nft", "-f", "-", input=(
            f"table inet {COUNT_TABLE} {{\n chain count {{\n  type filter hook prerouting priority 100; "
            f"policy accept;\n  meta l4proto udp counter drop comment \"{COUNT_COMMENT}\"\n }}\n}}\n"))
        for ns, dev in ((self.src, SRC_DEV), (self.dst, DST_DEV)):
            names = sorted(link["ifname"] for link in json.loads(ns.run("ip", "-j", "link", "show").stdout))
            assert names == sorted(["lo", dev]), f"{ns.name} has interfaces {names}"

    def close(self) -> None:
        if self._nl is not None:
            self._nl.close()
            self._nl = None
        for ns in (self.src, self.dst):
            if ns is not None:
                ns.delete()  # takes the veth pair and every table in it along
        self.src = self.dst = None
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- tables ------------------------------------------------------------------------------------------

    def nft(self, text: str) -> None:
        assert self.dst is not None
        path = self.tmp / "ruleset.nft"
        path.write_text(text)
        r = self.dst.run("nft", "-f", str(path), check=False)
        if r.returncode:
            raise RuntimeError(f"nft -f refused the ruleset: {r.stderr.strip()[:2000]}")

    def load(self, name: str, text: str, family: str = "inet") -> None:
        """Load a table (nft syntax, the table `family name` itself included) and leave it dormant."""
        self.nft(text)
        self.tables[name] = family
        self.set_dormant(name, True)

    def adopt(self, name: str, family: str = "inet") -> None:
        """Take a table some other code made in the receiver (e.g. nftblockd's writer) and make it dormant."""
        self.tables[name] = family
        self.set_dormant(name, True)

    def set_dormant(self, name: str, dormant: bool) -> None:
        flags = " { flags dormant; }" if dormant else ""
        self.nft(f"add table {self.tables[name]} {name}{flags}\n")

    def activate(self, name: str | None) -> None:
        if self.active == name:
            return
        if self.active is not None:
            self.set_dormant(self.active, True)
            self.active = None
        if name is not None:
            self.set_dormant(name, False)
            self.active = name

    def counters(self, table: str, family: str = "inet") -> dict[str, int]:
        """"chain/comment" -> packets of every rule with a counter in `table` (without a comment: chain/#n).

        Read with a GETRULE dump of our own: `nft list chain` also fetches every set element first, which
        takes minutes with a million of them."""
        assert self.dst is not None
        if self._nl is None:
            with inside(self.dst):
                self._nl = RuleCounters()
        return self._nl.read(table, _FAMILIES[family])

    # -- measuring ---------------------------------------------------------------------------------------

    def send(self, traffic: Traffic, seconds: float) -> tuple[int, float, float]:
        """(packets sent, wall seconds, CPU seconds of the sender + its CPU's ksoftirqd)."""
        assert self.src is not None
        cmd = ["ip", "netns", "exec", self.src.name, "taskset", "-c", str(self.cpu), self.binary, DST_IP,
               f"{seconds:g}", str(MAX_PACKETS), traffic.net, str(traffic.bits)]
        soft0 = _runtime_ns(self._ksoftirqd)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 15, check=True)
        soft = (_runtime_ns(self._ksoftirqd) - soft0) / 1e9
        parts = out.stdout.split()
        return int(parts[1]), float(parts[3]), float(parts[7]) + soft

    def measure(self, cfg: Config, seconds: float, rnd: int) -> Sample:
        self.activate(cfg.table)
        tables = [(COUNT_TABLE, "inet")] + ([(cfg.table, cfg.family)] if cfg.table else [])
        before = {t: self.counters(t, f) for t, f in tables}
        sent, secs, cpu = self.send(cfg.traffic, seconds)
        after = {t: self.counters(t, f) for t, f in tables}
        gained: dict[str, int] = {}
        for t, _f in tables:
            for k, v in after[t].items():
                gained[k] = gained.get(k, 0) + v - before[t].get(k, 0)
        def matches(key: str, want: str) -> bool:  # key is "chain/comment"
            return key == want or key.split("/", 1)[1] == want

        counted = sum(v for k, v in gained.items() if matches(k, cfg.expect))
        others = {k: times for k in gained for want, times in cfg.also if matches(k, want)}
        stray = {k: v for k, v in gained.items() if not matches(k, cfg.expect) and v != others.get(k, 0) * counted}
        stray.update({want: 0 for want, _t in cfg.also if not any(matches(k, want) for k in gained)})
        if sent <= 0 or stray or counted < 0.98 * sent:
            raise AssertionError(f"{cfg.name}: sent {sent}, counted {counted} on {cfg.expect!r}, elsewhere {stray}")
        return Sample(cfg.name, rnd, sent, secs, cpu, counted)


def run_rounds(lab: Lab, configs: list[Config], rounds: int, seconds: float, *,
               quiet: bool = False) -> list[Sample]:
    """Every configuration once per round, in an order rotated each round."""
    samples: list[Sample] = []
    n = len(configs)
    for r in range(rounds):
        order = configs[r % n:] + configs[:r % n]
        if r % 2:
            order.reverse()  # rotate and alternate direction: no configuration always follows the same one
        t0 = time.monotonic()
        for cfg in order:
            samples.append(lab.measure(cfg, seconds, r))
        if not quiet:
            print(f"round {r + 1}/{rounds} ({time.monotonic() - t0:.0f}s)", flush=True)
    lab.activate(None)
    return samples


def by_config(samples: Iterable[Sample]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for s in samples:
        out.setdefault(s.config, []).append(s)
    return out


def _ksoftirqd_pid(cpu: int) -> int:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == f"ksoftirqd/{cpu}":
                    return int(pid)
            except OSError:
                continue
    raise RuntimeError(f"no ksoftirqd/{cpu}")


def _runtime_ns(pid: int) -> int:
    """A task's time on the CPU so far (the scheduler's sum_exec_runtime)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


# -- rule counters over netlink ------------------------------------------------------------------------------

_FAMILIES = {"inet": 1, "ip": 2, "netdev": 5}
_NLA = struct.Struct("=HH")
_HDR = struct.Struct("=IHHII")


def _attrs(buf: bytes) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    pos = 0
    while pos + 4 <= len(buf):
        length, kind = _NLA.unpack_from(buf, pos)
        if length < 4:
            break
        out.setdefault(kind & 0x3FFF, buf[pos + 4:pos + length])
        pos += (length + 3) & ~3
    return out


def _list(buf: bytes) -> list[bytes]:
    out = []
    pos = 0
    while pos + 4 <= len(buf):
        length, _kind = _NLA.unpack_from(buf, pos)
        if length < 4:
            break
        out.append(buf[pos + 4:pos + length])
        pos += (length + 3) & ~3
    return out


class RuleCounters:
    """A NETLINK_NETFILTER socket that dumps one table's rules and sums their counters by comment."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)  # NETLINK_NETFILTER
        self.sock.bind((0, 0))
        self.seq = 1

    def close(self) -> None:
        self.sock.close()

    def read(self, table: str, family: int) -> dict[str, int]:
        self.seq += 1
        name = table.encode() + b"\0"
        attr = _NLA.pack(4 + len(name), 1) + name + b"\0" * (-len(name) % 4)  # NFTA_RULE_TABLE
        body = struct.pack("=BBH", family, 0, 0) + attr
        # NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETRULE; NLM_F_REQUEST | NLM_F_DUMP
        self.sock.send(_HDR.pack(16 + len(body), (10 << 8) | 7, 0x301, self.seq, 0) + body)
        out: dict[str, int] = {}
        while True:
            buf = self.sock.recv(1 << 20)
            pos = 0
            while pos + 16 <= len(buf):
                length, mtype, _flags, seq, _pid = _HDR.unpack_from(buf, pos)
                payload = buf[pos + 16:pos + length]
                pos += (length + 3) & ~3
                if seq != self.seq:
                    continue
                if mtype == 3:  # NLMSG_DONE
                    return out
                if mtype == 2:  # NLMSG_ERROR
                    (err,) = struct.unpack_from("=i", payload)
                    if err:
                        raise OSError(-err, f"dumping the rules of table {table}")
                    continue
                a = _attrs(payload[4:])
                packets = None
                for expr in _list(a.get(4, b"")):  # NFTA_RULE_EXPRESSIONS
                    e = _attrs(expr)
                    if e.get(1, b"").rstrip(b"\0") == b"counter":
                        packets = (packets or 0) + struct.unpack(">Q", _attrs(e[2])[2])[0]  # NFTA_COUNTER_PACKETS
                if packets is None:
                    continue
                chain = a.get(2, b"").rstrip(b"\0").decode()  # NFTA_RULE_CHAIN
                key = f"{chain}/#{struct.unpack('>Q', a[3])[0]}"  # NFTA_RULE_HANDLE
                ud = a.get(7, b"")  # NFTA_RULE_USERDATA: TLVs, type 0 is the comment
                if len(ud) >= 2 and ud[0] == 0:
                    comment = ud[2:2 + ud[1]].rstrip(b"\0").decode()
                    key = f"{chain}/{comment}"
                out[key] = out.get(key, 0) + packets
