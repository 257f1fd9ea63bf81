"""Turn parsed feed entries into the minimal set of CIDRs to block, and diff it against what is installed.

Pure: no IO, no clock. Runs on 50k to 1M entries, so it works on integers (addr's net keys from
`feeds.parse`, inclusive `(start, end)` ranges), never on `ipaddress` objects in its loops;
`ipaddress.collapse_addresses` is far too slow at that size (see bench/bench_feeds.py for the figures).

The rules, applied per feed by `sanitise` (each feed has its own `Policy`):

1. **Too broad.** An entry shorter than the family's minimum prefix (default /8 for IPv4, /16 for IPv6; never
   /0, whatever the config says) is refused whole and counted `too_broad`. It is not split into allowed
   pieces: a feed that lists `0.0.0.0/1` is broken, and blocking half the Internet in /8s would be no better.
2. **Special-purpose space** (private, loopback, link-local, CGNAT, documentation, benchmarking, multicast,
   reserved; the tables are `neverban.SPECIAL_V4/V6`, shared with every other path a ban can come from) is
   *cut out* of entries, not grounds to refuse them: FireHOL level1 lists 10.0.0.0/8 and 192.168.0.0/16 on
   purpose, and users locked themselves out of their own LANs with it. An entry wholly inside special space
   is dropped and counted `special`; an entry that merely contains some (a /8 around 100.64.0.0/10) is kept
   minus the special part and counted `special_trimmed`. `Policy.allow_special` turns this off, except for
   the never-ban ranges (unspecified, "this network", loopback, link-local, multicast, reserved, broadcast),
   which nothing may ever block.
3. **The allowlist** (config `allowlist:` plus the host's own addresses, passed in) is cut out the same way:
   wholly allowlisted entries are dropped (`allowlisted`), overlapping ones split (`allowlist_trimmed`).
   An allowlisted address is never blocked by a feed.
   An entry both partly special and partly allowlisted counts once, in the first matching of: special,
   allowlisted, special_trimmed, allowlist_trimmed.

Each feed's result is merged (overlapping and adjacent entries become one range) and converted back into
the fewest aligned CIDRs (greedy largest-aligned block, which is optimal). `aggregate` then unions the
sanitised CIDRs of every feed that targets one blocklist the same way. `Aggregate.singles()` (/32, /128
→ hash sets) and `Aggregate.prefixes()` (→ interval sets) split the result; `diff(current, desired)` gives
`(to_add, to_remove)`.
"""

from __future__ import annotations

import ipaddress
from bisect import bisect_left, bisect_right
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, TypeVar

from nftblockd.addr import IPNet, Range, key_net, key_range, net_key
from nftblockd.neverban import SPECIAL_V4, SPECIAL_V6

__all__ = [
    "SPECIAL_V4",
    "SPECIAL_V6",
    "Aggregate",
    "Policy",
    "SanitiseStats",
    "Sanitised",
    "aggregate",
    "collapse",
    "diff",
    "merge_ranges",
    "ranges_to_cidrs",
    "sanitise",
]



# -- values -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Policy:
    """Per-feed sanitising policy (from `FeedConfig`). A minimum below 1 is read as 1: /0 is never allowed."""

    min_prefix_v4: int = 8
    min_prefix_v6: int = 16
    allow_special: bool = False


@dataclass(frozen=True, slots=True)
class SanitiseStats:
    """Entries refused or trimmed, by reason (see the module docstring)."""

    entries: int = 0  # entries looked at (both families, duplicates included)
    too_broad: int = 0
    special: int = 0
    special_trimmed: int = 0
    allowlisted: int = 0
    allowlist_trimmed: int = 0

    @property
    def refused(self) -> int:
        """Entries that contributed nothing to the blocklist."""
        return self.too_broad + self.special + self.allowlisted

    def __add__(self, other: SanitiseStats) -> SanitiseStats:
        return SanitiseStats(*(a + b for a, b in zip(self._tuple(), other._tuple(), strict=True)))

    def _tuple(self) -> tuple[int, ...]:
        return (self.entries, self.too_broad, self.special, self.special_trimmed, self.allowlisted,
                self.allowlist_trimmed)

    def as_dict(self) -> dict[str, int]:
        return {
            "entries": self.entries, "too_broad": self.too_broad, "special": self.special,
            "special_trimmed": self.special_trimmed, "allowlisted": self.allowlisted,
            "allowlist_trimmed": self.allowlist_trimmed,
        }


@dataclass(frozen=True, slots=True)
class Sanitised:
    """One feed after sanitising: its minimal CIDR set as net keys, sorted, per family (as in `Aggregate`).

    Net keys rather than ranges because the daemon keeps one of these per feed for re-aggregation, and an
    int is a third of a tuple of two.
    """

    v4: list[int]
    v6: list[int]
    stats: SanitiseStats

    @property
    def v4_addresses(self) -> int:
        return sum(1 << (32 - (k & 0xFF)) for k in self.v4)


@dataclass(frozen=True, slots=True)
class Aggregate:
    """The minimal CIDR set for one blocklist: net keys per family, sorted and disjoint.

    The kernel sync works from `v4`/`v6` (a feed-owned blocklist's interval sets hold them all, single
    addresses included); the methods below build `ipaddress` objects, ≈5 µs each.
    """

    v4: list[int]
    v6: list[int]

    def __len__(self) -> int:
        return len(self.v4) + len(self.v6)

    def singles(self) -> list[IPNet]:
        """/32 and /128 entries (for hash sets)."""
        v4 = [key_net(k, 4) for k in self.v4 if k & 0xFF == 32]
        return v4 + [key_net(k, 6) for k in self.v6 if k & 0xFF == 128]

    def prefixes(self) -> list[IPNet]:
        """Everything wider than one address (for interval sets)."""
        v4 = [key_net(k, 4) for k in self.v4 if k & 0xFF != 32]
        return v4 + [key_net(k, 6) for k in self.v6 if k & 0xFF != 128]

    def networks(self) -> list[IPNet]:
        return [key_net(k, 4) for k in self.v4] + [key_net(k, 6) for k in self.v6]


# -- integer range kernels ----------------------------------------------------------------------------------


def merge_ranges(ranges: Iterable[Range]) -> list[Range]:
    """Sort and merge overlapping and adjacent inclusive ranges."""
    out: list[Range] = []
    cs = ce = -2  # sentinel: no range can touch it
    for s, e in sorted(ranges):
        if s <= ce + 1:
            if e > ce:
                ce = e
        else:
            if ce >= 0:
                out.append((cs, ce))
            cs, ce = s, e
    if ce >= 0:
        out.append((cs, ce))
    return out


# The last address of a net key is its start plus _SPAN[bits][prefixlen]: a list lookup costs what the shift
# and subtraction of `1 << (bits - prefixlen)) - 1` would (measured on 1M keys), and keeps the loops short.
_SPAN = {bits: [(1 << (bits - p)) - 1 for p in range(bits + 1)] for bits in (32, 128)}


def _merged(keys: Iterable[int], bits: int, min_prefix: int = 0,
            tally: list[int] | None = None) -> Iterator[Range]:
    """The merged ranges of *sorted* net keys, skipping those shorter than /`min_prefix`.

    This is the hot loop: one pass, no tuple per entry, the width check folded in; the count of skipped
    entries is added to `tally[0]` when the iteration ends. A generator, so that ranges flow into the
    subtraction and the CIDR conversion without a list of a million tuples in between.
    """
    span = _SPAN[bits]
    cs = ce = -2  # sentinel: no range can touch it
    broad = 0
    for k in keys:
        p = k & 0xFF
        if p < min_prefix:
            broad += 1
            continue
        s = k >> 8
        if s <= ce + 1:
            e = s + span[p]
            if e > ce:
                ce = e
        else:
            if ce >= 0:
                yield cs, ce
            cs = s
            ce = s + span[p]
    if ce >= 0:
        yield cs, ce
    if tally is not None:
        tally[0] += broad


def _subtract(ranges: Iterable[Range], holes: list[Range]) -> Iterator[Range]:
    """`ranges` minus `holes`; both sorted and disjoint. Untouched ranges pass through as they are."""
    j, n = 0, len(holes)
    for r in ranges:
        s, e = r
        while j < n and holes[j][1] < s:
            j += 1
        if j == n or holes[j][0] > e:
            yield r
            continue
        k = j
        while k < n and holes[k][0] <= e:
            hs, he = holes[k]
            if hs > s:
                yield s, hs - 1
            if he >= e:
                s = e + 1
                break
            s = he + 1
            k += 1
        if s <= e:
            yield s, e


def ranges_to_cidrs(ranges: Iterable[Range], bits: int) -> list[int]:
    """Each inclusive range as the fewest aligned CIDRs, as net keys; sorted if the ranges are."""
    out: list[int] = []
    append = out.append
    whole = 1 << bits
    top = bits + 1  # a block of 2**h addresses is a /(bits - h), and (2**h).bit_length() is h + 1
    for s, e in ranges:
        if s == e:
            append(s << 8 | bits)
            continue
        while s <= e:
            size = s & -s if s else whole
            fit = 1 << ((e - s + 1).bit_length() - 1)
            if size > fit:
                size = fit
            append(s << 8 | (top - size.bit_length()))
            s += size
    return out


def _relation(s: int, e: int, ranges: list[Range], ends: list[int]) -> int:
    """0: [s, e] misses `ranges`; 1: overlaps; 2: lies inside one of them (they are merged)."""
    j = bisect_left(ends, s)
    if j == len(ranges) or ranges[j][0] > e:
        return 0
    return 2 if ranges[j][0] <= s and e <= ranges[j][1] else 1


def _classify(keys: list[int], special: list[Range], allow: list[Range], bits: int,
              min_prefix: int) -> tuple[int, int, int, int]:
    """Count sorted net keys by how they meet special and allowlisted space.

    Only entries that can touch an excluded range are looked at: those starting inside it, and those
    starting at most one maximal block before it.
    """
    span = _SPAN[bits]
    touching: set[int] = set()
    reach = span[min_prefix]
    for xs, xe in chain(special, allow):
        lo = bisect_left(keys, max(0, xs - reach) << 8)
        hi = bisect_right(keys, xe << 8 | 0xFF)
        for i in range(lo, hi):
            k = keys[i]
            p = k & 0xFF
            if p >= min_prefix and (k >> 8) + span[p] >= xs:
                touching.add(i)
    sp_ends = [e for _, e in special]
    al_ends = [e for _, e in allow]
    n_special = n_allowed = n_special_trim = n_allow_trim = 0
    for i in touching:
        s = keys[i] >> 8
        e = s + span[keys[i] & 0xFF]
        sp = _relation(s, e, special, sp_ends)
        al = _relation(s, e, allow, al_ends)
        if sp == 2:
            n_special += 1
        elif al == 2:
            n_allowed += 1
        elif sp:
            n_special_trim += 1
        else:
            n_allow_trim += 1
    return n_special, n_special_trim, n_allowed, n_allow_trim


def _allow_ranges(allow: Iterable[IPNet]) -> tuple[list[Range], list[Range]]:
    v4: list[Range] = []
    v6: list[Range] = []
    for net in allow:
        (v4 if net.version == 4 else v6).append(key_range(net_key(net), net.version))
    return merge_ranges(v4), merge_ranges(v6)


def _sanitise_family(entries: Sequence[int], bits: int, min_prefix: int, special: list[Range],
                     allow: list[Range]) -> tuple[list[int], SanitiseStats]:
    min_prefix = max(1, min(min_prefix, bits))
    keys = sorted(entries)
    n_special, n_special_trim, n_allowed, n_allow_trim = _classify(keys, special, allow, bits, min_prefix)
    holes = merge_ranges(special + allow)
    too_broad = [0]
    cidrs = ranges_to_cidrs(_subtract(_merged(keys, bits, min_prefix, too_broad), holes), bits)
    stats = SanitiseStats(
        entries=len(keys), too_broad=too_broad[0], special=n_special,
        special_trimmed=n_special_trim, allowlisted=n_allowed, allowlist_trimmed=n_allow_trim,
    )
    return cidrs, stats


def _table_ranges(table: tuple[tuple[str, str, bool], ...], *, never_only: bool) -> list[Range]:
    nets = [ipaddress.ip_network(cidr) for cidr, _, never in table if never or not never_only]
    return merge_ranges([key_range(net_key(n), n.version) for n in nets])


_EXCLUDE = {
    (4, False): _table_ranges(SPECIAL_V4, never_only=False),
    (4, True): _table_ranges(SPECIAL_V4, never_only=True),
    (6, False): _table_ranges(SPECIAL_V6, never_only=False),
    (6, True): _table_ranges(SPECIAL_V6, never_only=True),
}


# -- the pipeline -------------------------------------------------------------------------------------------


def sanitise(v4: Sequence[int], v6: Sequence[int], policy: Policy = Policy(),
             allow: Iterable[IPNet] = ()) -> Sanitised:
    """Apply the rules above to one feed's net keys (`ParseResult.v4`, `.v6`)."""
    allow4, allow6 = _allow_ranges(allow)
    r4, s4 = _sanitise_family(v4, 32, policy.min_prefix_v4, _EXCLUDE[4, policy.allow_special], allow4)
    r6, s6 = _sanitise_family(v6, 128, policy.min_prefix_v6, _EXCLUDE[6, policy.allow_special], allow6)
    return Sanitised(r4, r6, s4 + s6)


def aggregate(parts: Iterable[Sanitised]) -> Aggregate:
    """Union the sanitised feeds of one blocklist into the minimal CIDR set."""
    parts = list(parts)
    if len(parts) == 1:
        return Aggregate(parts[0].v4, parts[0].v6)  # one feed is already minimal
    v4 = _merged(sorted(chain.from_iterable(p.v4 for p in parts)), 32)
    v6 = _merged(sorted(chain.from_iterable(p.v6 for p in parts)), 128)
    return Aggregate(ranges_to_cidrs(v4, 32), ranges_to_cidrs(v6, 128))


def collapse(networks: Iterable[IPNet]) -> list[IPNet]:
    """`ipaddress.collapse_addresses` for mixed families, on integers (no sanitising)."""
    v4: list[int] = []
    v6: list[int] = []
    for net in networks:
        (v4 if net.version == 4 else v6).append(net_key(net))
    agg = Aggregate(ranges_to_cidrs(_merged(sorted(v4), 32), 32), ranges_to_cidrs(_merged(sorted(v6), 128), 128))
    return agg.networks()


T = TypeVar("T", bound=Hashable)


def _order(x: Any) -> Any:
    if isinstance(x, ipaddress.IPv4Network | ipaddress.IPv6Network):
        return (x.version, int(x.network_address), x.prefixlen)
    return x


def diff(current: Iterable[T], desired: Iterable[T]) -> tuple[list[T], list[T]]:
    """`(to_add, to_remove)`, each sorted, such that `(current - to_remove) | to_add == desired`.

    Elements are compared by equality: networks, or net keys of *one* family (IPv4 and IPv6 net keys
    can collide, so diff the families separately).
    """
    cur = current if isinstance(current, set | frozenset) else set(current)
    want = desired if isinstance(desired, set | frozenset) else set(desired)
    return sorted(want - cur, key=_order), sorted(cur - want, key=_order)
