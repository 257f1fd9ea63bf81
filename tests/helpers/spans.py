"""What an address or CIDR text says, as ints, for the "never widened" properties of every target parser.

Independent of nftblockd.addr on purpose: it reads the text with `ipaddress.ip_interface`, which keeps the
address as written, so a parser that widens `45.67.89.10/9` to `45.0.0.0/9` is caught by comparing ints.
"""

from __future__ import annotations

import ipaddress
from typing import NamedTuple


class Span(NamedTuple):
    """The written address's family and the inclusive range from it to the end of its prefix."""

    version: int
    first: int
    last: int
    host_bits: bool  # the written address is not the first of its prefix


def written_span(text: str) -> Span | None:
    """The span `text` writes (IPv4-mapped IPv6 read as the IPv4 it carries), None if it is not an
    address or CIDR at all to ipaddress."""
    s = text.strip()
    try:
        iface = ipaddress.ip_interface(s)
    except ValueError:
        return None
    a, plen = iface.ip, iface.network.prefixlen
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None and plen >= 96:
        a, plen = a.ipv4_mapped, plen - 96
    bits = a.max_prefixlen - plen
    first = int(a)
    return Span(a.version, first, first | ((1 << bits) - 1), first & ((1 << bits) - 1) != 0)


def inside(version: int, first: int, last: int, text: str) -> bool:
    """Whether [first, last] of IP `version` lies inside what `text` writes (never wider, never elsewhere)."""
    span = written_span(text)
    return span is not None and span.version == version and span.first <= first and last <= span.last
