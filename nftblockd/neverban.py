"""Address space nftblockd never bans, and the special-purpose space feeds are cleaned of: one table for both.

Pure: no IO, no clock. Every path a ban can come from asks this module before the ban exists: the tracker
(log lines), the control API (`nftblock ban`, the fail2ban actions), `import-fail2ban`, the feed sanitiser
(`feeds.aggregate`) and the fleet helper. The enforcer asks again, as the last guard before the kernel.

Two kinds of entries (`SPECIAL_V4`, `SPECIAL_V6`: network, what it is, never):

- **never** (`never=True`): unspecified and "this network", loopback, link-local, multicast, reserved space and
  the limited broadcast. No packet legitimately comes *from* these addresses, so banning one blocks nobody
  and only ever hurts: `0.0.0.0` (DHCP), `fe80::/10` (neighbour discovery, routers), `ff02::1`, loopback.
  Refused from every path, with the reason, and cut out of every feed even with `allow_special`.
- **special** (`never=False`): private, CGNAT, documentation, benchmarking and other special-purpose space.
  An attacker on the LAN or behind CGNAT *is* in it, so jails and the CLI may ban it. Feeds are cleaned of it
  unless `allow_special` (a public feed listing 10.0.0.0/8 locks users out of their own LAN).

What "refused" means for a range: a ban target that *overlaps* never-ban space is refused whole, as with the
allowlist (`192.0.0.0/2` contains all of multicast). Feeds cut never-ban space out of their entries instead
(see `feeds.aggregate`): a list is not wrong as a whole because one entry is too wide.

IPv4-mapped IPv6 (`::ffff:224.0.0.1`) is read as the IPv4 address it maps, as everywhere else.
"""

from __future__ import annotations

import ipaddress
from bisect import bisect_left
from collections.abc import Iterable

from nftblockd.addr import IPAddr, IPNet, first_octets, flagged, normalise_network

__all__ = [
    "NEVER_BAN",
    "SPECIAL_V4",
    "SPECIAL_V6",
    "never_ban_keys",
    "never_ban_range",
    "never_ban_reason",
]

# (network, what it is, never banned by anything)
SPECIAL_V4: tuple[tuple[str, str, bool], ...] = (
    ("0.0.0.0/8", "\"this network\" (RFC 1122)", True),
    ("0.0.0.0/32", "the unspecified address (RFC 1122)", True),
    ("10.0.0.0/8", "private (RFC 1918)", False),
    ("100.64.0.0/10", "shared address space / CGNAT (RFC 6598)", False),
    ("127.0.0.0/8", "loopback (RFC 1122)", True),
    ("169.254.0.0/16", "link-local (RFC 3927)", True),
    ("172.16.0.0/12", "private (RFC 1918)", False),
    ("192.0.0.0/24", "IETF protocol assignments (RFC 6890)", False),
    ("192.0.2.0/24", "documentation TEST-NET-1 (RFC 5737)", False),
    ("192.88.99.0/24", "6to4 relay anycast (RFC 7526)", False),
    ("192.168.0.0/16", "private (RFC 1918)", False),
    ("198.18.0.0/15", "benchmarking (RFC 2544)", False),
    ("198.51.100.0/24", "documentation TEST-NET-2 (RFC 5737)", False),
    ("203.0.113.0/24", "documentation TEST-NET-3 (RFC 5737)", False),
    ("224.0.0.0/4", "multicast (RFC 5771)", True),
    ("240.0.0.0/4", "reserved (RFC 1112)", True),
    ("255.255.255.255/32", "the limited broadcast address (RFC 919)", True),
)
SPECIAL_V6: tuple[tuple[str, str, bool], ...] = (
    ("::/128", "the unspecified address (RFC 4291)", True),
    ("::1/128", "loopback (RFC 4291)", True),
    ("::ffff:0:0/96", "IPv4-mapped (RFC 4291; such entries are read as IPv4)", False),
    ("64:ff9b:1::/48", "local-use NAT64 (RFC 8215)", False),
    ("100::/64", "discard-only (RFC 6666)", False),
    ("2001:2::/48", "benchmarking (RFC 5180)", False),
    ("2001:db8::/32", "documentation (RFC 3849)", False),
    ("3fff::/20", "documentation (RFC 9637)", False),
    ("fc00::/7", "unique local (RFC 4193)", False),
    ("fe80::/10", "link-local (RFC 4291)", True),
    ("fec0::/10", "site-local, deprecated (RFC 3879)", False),
    ("ff00::/8", "multicast (RFC 4291)", True),
)

NEVER_BAN: tuple[IPNet, ...] = tuple(
    ipaddress.ip_network(cidr) for table in (SPECIAL_V4, SPECIAL_V6) for cidr, _, never in table if never)
"""The never-ban networks, as `ipaddress` objects (for allowlist-style lookups and documentation)."""


def _describe(cidr: str, what: str) -> str:
    """"multicast (RFC 5771)" of 224.0.0.0/4 → "multicast 224.0.0.0/4 (RFC 5771)"."""
    name, paren, rest = what.partition(" (")
    return f"{name} {cidr}{paren}{rest}"


def _table(version: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...]]:
    """Sorted starts, ends and descriptions of the never-ban ranges of one family, nested ones dropped
    (255.255.255.255 lies inside 240.0.0.0/4) after their text is kept for an exact match."""
    rows = sorted(  # by start, the enclosing range before what it encloses
        (int(n.network_address), n.prefixlen, int(n.broadcast_address), _describe(cidr, what))
        for cidr, what, never in (SPECIAL_V4 if version == 4 else SPECIAL_V6) if never
        for n in (ipaddress.ip_network(cidr),)
    )
    starts: list[int] = []
    ends: list[int] = []
    texts: list[str] = []
    for first, _plen, last, text in rows:
        if ends and first <= ends[-1]:
            continue  # nested in the previous range: the wider one answers (exact texts are kept below)
        starts.append(first)
        ends.append(last)
        texts.append(text)
    return tuple(starts), tuple(ends), tuple(texts)


_RANGES = {4: _table(4), 6: _table(6)}
# Exact addresses with a text of their own, more precise than the range that holds them.
_EXACT: dict[tuple[int, int], str] = {
    (n.version, int(n.network_address)): what
    for table in (SPECIAL_V4, SPECIAL_V6) for cidr, what, never in table if never
    for n in (ipaddress.ip_network(cidr),) if n.num_addresses == 1
}


def never_ban_range(version: int, first: int, last: int) -> str | None:
    """Why the inclusive integer range [first, last] of IP `version` must never be banned, or None.

    The integer form of `never_ban_reason` for callers that already hold ints (already normalised: an
    IPv4-mapped address must have been turned into IPv4 by the caller).
    """
    starts, ends, texts = _RANGES[version]
    i = bisect_left(ends, first)  # the first range not wholly below `first` (ranges are disjoint and sorted)
    if i == len(ends) or starts[i] > last:
        return None
    if first == last:
        return _EXACT.get((version, first), texts[i])
    if starts[i] <= first and last <= ends[i]:
        return texts[i]
    return f"it overlaps {texts[i]}"


def never_ban_reason(target: IPNet | IPAddr) -> str | None:
    """Why `target` (an address or a network) must never be banned, or None when it may be.

    The reason is a phrase such as "multicast 224.0.0.0/4 (RFC 5771)" or "it overlaps multicast 224.0.0.0/4
    (RFC 5771)", made to follow "<target> is never banned: ".
    """
    net = normalise_network(ipaddress.ip_network(target) if not isinstance(
        target, ipaddress.IPv4Network | ipaddress.IPv6Network) else target)
    first = int(net.network_address)
    return never_ban_range(net.version, first, first | ((1 << (net.max_prefixlen - net.prefixlen)) - 1))


# For bulk requests: the first octet of an IPv4 address decides for nearly every address, so one table look-up
# per key filters a million addresses in ~40 ms; only the octets that hold a never-ban range are looked at
# closely (0, 127, 169, 224-255).
_V4_SUSPECT = bytes(
    1 if any(s >> 24 <= o <= e >> 24 for s, e in zip(_RANGES[4][0], _RANGES[4][1], strict=True)) else 0
    for o in range(256))


def never_ban_keys(version: int, keys: Iterable[int]) -> list[int]:
    """The addresses among `keys` (single addresses as ints, IP `version`) that must never be banned, in
    order. IPv4: the first octets of all keys through the suspect table at once (addr.flagged), the few
    suspects then one by one."""
    if version == 4:
        keys = keys if isinstance(keys, list) else list(keys)
        return [k for k in map(keys.__getitem__, flagged(first_octets(keys), _V4_SUSPECT))
                if never_ban_range(4, k, k) is not None]
    # IPv6: every range lies in a first octet of 0x00, 0xfe or 0xff (::, ::1, fe80::/10, ff00::/8): two
    # comparisons per key find the suspects, the bisect runs for those only (a third of the time for 100,000)
    return [k for k in keys if (k < _V6_LOW or k >= _V6_HIGH) and never_ban_range(6, k, k) is not None]


_V6_LOW, _V6_HIGH = 1 << 120, 0xFE << 120  # below and from: where the IPv6 never-ban ranges lie (checked below)
assert all(e < _V6_LOW or s >= _V6_HIGH for s, e in zip(_RANGES[6][0], _RANGES[6][1], strict=True))
