"""Generate realistic synthetic threat feeds for benchmarks (and for the kernel-load benchmark to reuse).

`make_feed(n_v4, n_v6, seed)` returns the text of a FireHOL-style netset: a `#` comment header, then one
address or CIDR per line. The mix is modelled on real lists: mostly single addresses, many /24s, some
/16 to /23; clusters in "hot" networks; nested prefixes, adjacent siblings that collapse, exact duplicates, a
few entries with host bits set and a sprinkle of private/special space (as FireHOL level1 has). The same seed
gives the same text.
"""

from __future__ import annotations

import ipaddress
import random

__all__ = ["make_entries", "make_feed"]

_SPECIAL_V4 = [ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "192.168.0.0/16", "172.16.0.0/12", "127.0.0.0/8", "169.254.0.0/16", "100.64.0.0/10",
    "224.0.0.0/3",
)]


def _v4text(n: int) -> str:
    return f"{n >> 24}.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"


def _public_v4(rng: random.Random) -> int:
    while True:
        first = rng.randint(1, 223)
        if first not in (10, 100, 127, 169, 172, 192, 198, 203):
            return first << 24 | rng.getrandbits(24)


def make_entries(n_v4: int, n_v6: int, seed: int = 0, *, shuffle: bool = True) -> list[str]:
    """The feed's entries as text, `n_v4` IPv4 and `n_v6` IPv6 ones."""
    rng = random.Random(seed)
    out: list[str] = []
    hot = [_public_v4(rng) & 0xFFF00000 for _ in range(max(1, n_v4 // 500))]  # clustered /12s
    recent: list[tuple[int, int]] = []
    for _ in range(n_v4):
        roll = rng.random()
        if roll < 0.05 and recent:  # nested inside an earlier prefix
            base, plen = rng.choice(recent)
            sub = rng.randint(plen, 32)
            addr = base | (rng.getrandbits(32 - plen) if plen < 32 else 0)
            net, plen = addr & (0xFFFFFFFF << (32 - sub)) & 0xFFFFFFFF, sub
        elif roll < 0.10 and recent:  # the adjacent sibling of an earlier prefix: collapses with it
            base, plen = rng.choice(recent)
            net = base ^ (1 << (32 - plen))
        elif roll < 0.11 and recent:  # an exact duplicate
            net, plen = rng.choice(recent)
        elif roll < 0.115:  # special-purpose space, as FireHOL level1 lists it
            special = rng.choice(_SPECIAL_V4)
            plen = rng.randint(max(special.prefixlen, 16), 32)
            addr = int(special.network_address) | rng.getrandbits(32 - special.prefixlen)
            net = addr & (0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF
        else:
            kind = rng.random()
            plen = 32 if kind < 0.6 else 24 if kind < 0.9 else rng.randint(16, 23)
            addr = (rng.choice(hot) | rng.getrandbits(20)) if rng.random() < 0.5 else _public_v4(rng)
            net = addr & (0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF
        if len(recent) < 4096:
            recent.append((net, plen))
        else:
            recent[rng.randrange(4096)] = (net, plen)
        text = _v4text(net)
        if plen != 32:
            if rng.random() < 0.002:  # host bits set: the parser refuses and counts these
                text = _v4text(net | rng.getrandbits(32 - plen))
            text += f"/{plen}"
        out.append(text)
    recent6: list[tuple[int, int]] = []
    for _ in range(n_v6):
        if recent6 and rng.random() < 0.1:
            base, plen = rng.choice(recent6)
            if plen < 128 and rng.random() < 0.5:
                sub = rng.randint(plen + 1, 128)
                net, plen = base | (rng.getrandbits(sub - plen) << (128 - sub)), sub
            else:
                net = base ^ (1 << (128 - plen))
        else:
            kind = rng.random()
            plen = 128 if kind < 0.4 else 64 if kind < 0.8 else rng.choice((32, 36, 40, 44, 48, 56))
            addr = (0x2000 | rng.getrandbits(13)) << 112 | rng.getrandbits(112)
            net = addr >> (128 - plen) << (128 - plen)
        if len(recent6) < 4096:
            recent6.append((net, plen))
        text = str(ipaddress.IPv6Address(net))
        out.append(text if plen == 128 else f"{text}/{plen}")
    if shuffle:
        rng.shuffle(out)
    else:
        out.sort(key=lambda t: (":" in t, ipaddress.ip_network(t, strict=False)))
    return out


def make_feed(n_v4: int, n_v6: int, seed: int = 0, *, shuffle: bool = True) -> str:
    """A FireHOL-style netset text with `n_v4` IPv4 and `n_v6` IPv6 entries."""
    header = (
        "#\n# bench_feed\n#\n# ipv4 hash:net ipset\n#\n"
        f"# Synthetic feed from bench/feedgen.py, seed {seed}: {n_v4} IPv4 and {n_v6} IPv6 entries.\n"
        "# Maintainer      : nftblockd benchmarks\n#\n"
    )
    return header + "\n".join(make_entries(n_v4, n_v6, seed, shuffle=shuffle)) + "\n"


if __name__ == "__main__":  # a quick look: python bench/feedgen.py 20 5
    import sys

    args = [int(a) for a in sys.argv[1:3]] + [20, 5][len(sys.argv[1:3]):]
    print(make_feed(args[0], args[1]))
