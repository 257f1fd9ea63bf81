"""Address codec benchmarks: each fast path of nftblockd/addr.py against its plain `ipaddress` version.

Pure CPU, a few seconds. Every figure is nanoseconds per address (or per line), the fast path and its plain
version timed alternately over the same inputs (median of ROUNDS), so a busy machine slows both alike. The
agreement of each pair is tested in tests/unit/test_addr.py; this says what the fast path buys.
"""

from __future__ import annotations

import ipaddress
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import alternating, record
from bench.feedgen import make_entries
from nftblockd import addr
from nftblockd.cli.targets import canonical_target

ROUNDS = int(os.environ.get("NFTBLOCK_BENCH_ROUNDS", "5"))
N = 50_000


def per_item(fast: Callable[[], Any], plain: Callable[[], Any], n: int) -> tuple[float, float]:
    """(fast, plain) nanoseconds per item, each the median of ROUNDS alternating runs."""
    f, p = alternating(fast, plain, ROUNDS)
    return f / n * 1e9, p / n * 1e9


def compare(name: str, fast: Callable[[], Any], plain: Callable[[], Any], n: int, reference: str,
            note: str = "") -> None:
    ours, ref = per_item(fast, plain, n)
    record(f"addr.{name}_ns", ours, "ns", reference=reference, reference_value=ref, note=note)


def _plain_key(text: str) -> int | None:
    """parse_key's plain version: the feed holds a few entries with host bits set, which both refuse."""
    try:
        return addr.net_key(addr.parse_target(text))
    except addr.AddressError:
        return None


def main() -> None:
    rnd = random.Random(7)
    v4_keys = [rnd.getrandbits(32) for _ in range(N)]
    v6_keys = [0x2001_0DB8 << 96 | rnd.getrandbits(64) for _ in range(N)]
    v4_text = [str(ipaddress.IPv4Address(k)) for k in v4_keys]
    mixed = [str(ipaddress.IPv6Address(k)) if i % 10 == 9 else t
             for i, (t, k) in enumerate(zip(v4_text, v6_keys, strict=True))]
    feed = make_entries(N, N // 4, seed=3)

    compare("parse_v4", lambda: [addr.parse_v4(t) for t in v4_text],
            lambda: [int(ipaddress.IPv4Address(t)) for t in v4_text], N, "int(IPv4Address(text))")
    compare("parse_host_int", lambda: [addr.parse_host_int(t) for t in mixed],
            lambda: [addr.parse_target(t) for t in mixed], N, "parse_target(text)",
            note="90 % IPv4, 10 % IPv6")
    compare("split_hosts", lambda: addr.split_hosts(mixed),
            lambda: [addr.parse_target(t) for t in mixed], N, "parse_target per address",
            note="per address of a bulk request, 90 % IPv4")
    compare("cli_canonical_target", lambda: [canonical_target(t) for t in v4_text],
            lambda: [addr.format_target(addr.parse_target(t)) for t in v4_text], N,
            "format_target(parse_target(text))", note="per line of `nftblock ban -`")
    compare("parse_key", lambda: [addr.parse_key(t) for t in feed],
            lambda: [_plain_key(t) for t in feed], len(feed), "net_key(parse_target(text))",
            note="FireHOL-style feed lines, 80 % IPv4")
    compare("host_net4", lambda: [addr.host_net4(k) for k in v4_keys],
            lambda: [ipaddress.IPv4Network((k, 32)) for k in v4_keys], N, "IPv4Network((x, 32))")
    compare("host_net6", lambda: [addr.host_net6(k) for k in v6_keys],
            lambda: [ipaddress.IPv6Network((k, 128)) for k in v6_keys], N, "IPv6Network((x, 128))")
    compare("format_host4", lambda: [addr.format_host(k, 4) for k in v4_keys],
            lambda: [str(ipaddress.IPv4Address(k)) for k in v4_keys], N, "str(IPv4Address(x))")
    compare("format_host6", lambda: [addr.format_host(k, 6) for k in v6_keys],
            lambda: [str(ipaddress.IPv6Address(k)) for k in v6_keys], N, "str(IPv6Address(x))")
    packed = [addr.pack_target(addr.host_net4(k)) for k in v4_keys]
    compare("target_text", lambda: [addr.target_text(p) for p in packed],
            lambda: [addr.format_target(ipaddress.IPv4Network(p)) for p in packed], N,
            "format_target(IPv4Network(packed))")
    blob = b"".join(packed)
    compare("unpack_hosts4", lambda: addr.unpack_hosts(blob, 4),
            lambda: [int.from_bytes(blob[i:i + 4], "big") for i in range(0, len(blob), 4)], N,
            "int.from_bytes per address")
    # The bulk ban's never-ban and allowlist tests (100,000 addresses of `nftblock ban -` each pass through
    # both): the first octets of all keys through a table at once (addr.flagged) against the per-key look-up
    # the same table answers, on random public addresses with the default allowlist (loopback, a /16 and a /24
    # of the machine's own) so a few hundred keys are looked at closely. Unicast addresses as bench_enforce.py
    # bans them (1.0.0.0-223.255.255.255): random 32-bit keys would be 12 % multicast and reserved.
    from nftblockd.allowlist import Allowlist
    from nftblockd.neverban import _V4_SUSPECT, never_ban_keys, never_ban_range

    public = [rnd.randrange(0x01000000, 0xE0000000) for _ in range(N)]
    compare("never_ban_keys4", lambda: never_ban_keys(4, public),
            lambda: [k for k in public if _V4_SUSPECT[k >> 24] and never_ban_range(4, k, k) is not None], N,
            "first-octet table look-up per key", note="per address of a bulk ban (unicast addresses)")
    allow = Allowlist.from_networks([ipaddress.ip_network(n) for n in ("127.0.0.0/8", "10.20.0.0/16",
                                                                        "192.168.1.0/24")])
    compare("allowlist_hosts_among4", lambda: allow.hosts_among(4, public),
            lambda: [k for k in public if allow.v4.touched[k >> 16] and allow.v4.find(k, k) is not None], N,
            "/16 table look-up per key", note="per address of a bulk ban (unicast addresses), 3 entries")
    # A bulk ban's elements on the wire (the kernel thread encodes them between commits): the keys written into
    # a repeated template against one `head + key + tail` concatenation per element.
    from nftblockd.kernel import nfmsg

    tail = nfmsg._timeout_attrs(3_600_000, True)
    head = nfmsg.uniform_hash_messages(nfmsg.NFT_MSG_NEWSETELEM, nfmsg.NFPROTO_INET, "t", "s", [0], 4, 3_600_000,
                                       True, 1, 0)[0][-(12 + 4 + len(tail)):-(4 + len(tail))]
    compare("uniform_hash_messages4",
            lambda: nfmsg.uniform_hash_messages(nfmsg.NFT_MSG_NEWSETELEM, nfmsg.NFPROTO_INET, "nftblock",
                                                "default_ip4", public, 4, 3_600_000, True, 1, 0),
            lambda: b"".join([head + k.to_bytes(4, "big") + tail for k in public]), N,
            "head + key + tail per element", note="per element of a bulk ban's kernel batch")


if __name__ == "__main__":
    main()
