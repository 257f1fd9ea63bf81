"""Addresses and ranges that must never be banned, answered in O(log n) per lookup.

An `Allowlist` is an immutable value built once (from the global `allowlist:`, a jail's `ignoreip:` and the
machine's own addresses, which the daemon discovers and passes in) and then queried for every hit and every
ban. This module is pure: it never looks up the machine's addresses itself, never does IO and never reads the
clock.

How a lookup works: CIDRs either nest or are disjoint, so after dropping every entry that lies inside a wider
one the remaining entries of one family are disjoint integer ranges. Sorted by their first address, the only
entry that can overlap a queried range [first, last] is the one with the greatest start <= last, found with
one `bisect`. Thousands of entries therefore cost the same ~microsecond as ten (docs/why.md #16: allowlists
grow, and a linear scan over them per hit is what makes them slow).

What "allowlisted" means: a ban target (an address or a range) is refused when it *overlaps* any entry, not
only when it lies inside one — banning 2001:db8::/64 would lock out an allowed 2001:db8::7 just as surely as
banning the address itself. The entry returned is the widest configured network that overlaps, so log lines
can say which entry protected whom.
"""

from __future__ import annotations

import ipaddress
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

from nftblockd.addr import IPAddr, IPNet, first_octets, normalise_address, normalise_network, ones, top_halves

# Always protected when the operator keeps `allowlist_self` on: a daemon that bans its own loopback cuts off
# local services talking to themselves (CrowdSec banned 127.0.0.1, docs/why.md #16).
LOOPBACK: tuple[IPNet, ...] = (ipaddress.IPv4Network("127.0.0.0/8"), ipaddress.IPv6Network("::1/128"))


PREFIX_BITS = 16  # the bulk test's table has one byte per /16 (IPv4) or per /16 of IPv6 space: 64 KiB


@dataclass(frozen=True, slots=True)
class _Ranges:
    """Disjoint inclusive integer ranges of one family, sorted by start; `nets[i]` is the entry of range i.
    `touched[p]` is 1 when some range covers part of the prefix p (the top PREFIX_BITS bits of an address)."""

    starts: tuple[int, ...] = ()
    ends: tuple[int, ...] = ()
    nets: tuple[IPNet, ...] = ()
    touched: bytes = b""
    shift: int = 0  # address bits below the prefix: 16 for IPv4, 112 for IPv6
    octets: bytes = b""  # IPv4: `octets[o]` is 1 when some range covers part of o.0.0.0/8 (addr.flagged's table)

    def find(self, first: int, last: int) -> IPNet | None:
        i = bisect_right(self.starts, last) - 1
        if i >= 0 and self.ends[i] >= first:
            return self.nets[i]
        return None

    def hosts_among(self, keys: Iterable[int]) -> list[int]:
        """The addresses among `keys` that some range covers, in order: one table look-up per key in a C-level
        loop, the bisect only for keys whose prefix a range touches (`find` per key cost ~0.4 us, 40 ms of a
        100,000-address bulk ban)."""
        if not self.starts:
            return []
        touched, shift, find = self.touched, self.shift, self.find
        if self.octets:  # IPv4: the first octets of all keys through `octets` at once, then the few flagged
            keys = keys if isinstance(keys, list) else list(keys)
            marks = first_octets(keys).translate(self.octets)
            if marks.count(1) > len(keys) >> 4:
                # many keys share a first octet an entry touches (this host's own 10.x address and a batch of
                # 10.x bans): their /16 instead, all at once (for 100,000 such keys a find per flagged key took
                # 63 ms, this 8 ms)
                marks = bytes(map(touched.__getitem__, top_halves(keys)))
            return [k for k in map(keys.__getitem__, ones(marks)) if touched[k >> shift] and find(k, k) is not None]
        return [k for k in keys if touched[k >> shift] and find(k, k) is not None]


def _ranges(nets: list[IPNet], bits: int) -> _Ranges:
    """`nets` sorted by (first address, prefix length): an enclosing network precedes what it encloses."""
    starts: list[int] = []
    ends: list[int] = []
    kept: list[IPNet] = []
    for net in nets:
        first = int(net.network_address)
        last = int(net.broadcast_address)
        if ends and first <= ends[-1]:
            continue  # nested inside the previous kept entry (CIDRs never partially overlap)
        starts.append(first)
        ends.append(last)
        kept.append(net)
    shift = bits - PREFIX_BITS
    if not starts:
        return _Ranges(shift=shift)
    touched = bytearray(1 << PREFIX_BITS)
    for first, last in zip(starts, ends, strict=True):
        lo, hi = first >> shift, last >> shift
        touched[lo:hi + 1] = b"\x01" * (hi - lo + 1)
    octets = b""
    if bits == 32:
        per = 1 << (PREFIX_BITS - 8)  # prefixes per first octet
        octets = bytes(1 if any(touched[o * per:(o + 1) * per]) else 0 for o in range(256))
    return _Ranges(tuple(starts), tuple(ends), tuple(kept), bytes(touched), shift, octets)


def _sort_key(net: IPNet) -> tuple[int, int, int]:
    return net.version, int(net.network_address), net.prefixlen


@dataclass(frozen=True, slots=True)
class Allowlist:
    """An immutable set of allowed networks. Build it with `from_networks`, not the constructor."""

    networks: tuple[IPNet, ...] = ()  # every entry given, normalised, deduplicated and sorted
    v4: _Ranges = _Ranges()
    v6: _Ranges = _Ranges()

    @classmethod
    def from_networks(cls, entries: Iterable[IPNet | IPAddr]) -> Allowlist:
        """Accepts networks and bare addresses; IPv4-mapped IPv6 entries become IPv4 (addr.normalise_*)."""
        nets: set[IPNet] = set()
        for e in entries:
            if isinstance(e, ipaddress.IPv4Address | ipaddress.IPv6Address):
                nets.add(ipaddress.ip_network(normalise_address(e)))
            else:
                nets.add(normalise_network(e))
        ordered = sorted(nets, key=_sort_key)
        return cls(
            networks=tuple(ordered),
            v4=_ranges([n for n in ordered if n.version == 4], 32),
            v6=_ranges([n for n in ordered if n.version == 6], 128),
        )

    def union(self, *others: Allowlist | Iterable[IPNet | IPAddr]) -> Allowlist:
        """A new allowlist with the entries of `self` and of every other allowlist or iterable of networks."""
        entries: list[IPNet | IPAddr] = list(self.networks)
        for o in others:
            entries.extend(o.networks if isinstance(o, Allowlist) else o)
        return Allowlist.from_networks(entries)

    def contains(self, target: IPAddr | IPNet) -> IPNet | None:
        """The allow entry that covers the address or overlaps the network `target`, or None."""
        if isinstance(target, ipaddress.IPv4Address | ipaddress.IPv6Address):
            a = normalise_address(target)
            first = last = int(a)
            version = a.version
        else:
            n = normalise_network(target)
            first, last = int(n.network_address), int(n.broadcast_address)
            version = n.version
        return self.contains_range(version, first, last)

    def contains_range(self, version: int, first: int, last: int) -> IPNet | None:
        """The integer form of `contains` for hot paths: `first`..`last` inclusive, already normalised."""
        return (self.v4 if version == 4 else self.v6).find(first, last)

    def hosts_among(self, version: int, keys: Iterable[int]) -> list[int]:
        """The single addresses (host keys of IP `version`, normalised) among `keys` that an entry covers, in
        order: `contains_range(version, k, k) is not None` for many keys at once (bulk bans)."""
        return (self.v4 if version == 4 else self.v6).hosts_among(keys)

    def __contains__(self, target: object) -> bool:
        if not isinstance(target, ipaddress.IPv4Address | ipaddress.IPv6Address | ipaddress.IPv4Network
                          | ipaddress.IPv6Network):
            return False
        return self.contains(target) is not None

    def __len__(self) -> int:
        return len(self.networks)


EMPTY = Allowlist()


def build_allowlist(configured: Iterable[IPNet], own: Iterable[IPNet | IPAddr] = (), *,
                    include_self: bool = True) -> Allowlist:
    """The global allowlist: the configured entries plus, with `include_self` (config `allowlist_self`), the
    machine's own addresses as discovered by the daemon and loopback."""
    entries: list[IPNet | IPAddr] = list(configured)
    if include_self:
        entries.extend(own)
        entries.extend(LOOPBACK)
    return Allowlist.from_networks(entries)


__all__ = ["EMPTY", "LOOPBACK", "Allowlist", "build_allowlist"]
