"""The machine's own addresses, read with one rtnetlink dump (RTM_GETADDR), for `allowlist_self`.

Why not pyroute2: importing any part of it imports the whole package, tc layer included (163 modules,
~0.2 s here), and under the unit's `ProcSubset=pid` that layer logs two warnings at every start because
/proc/net/psched is hidden. Neither /proc nor anything beyond the standard library is needed to ask the kernel
for addresses: a request of 24 bytes and a small decoder (the framing is rtnl.py's, shared with links.py).

`parse_dump` is pure (bytes in, addresses out) and tested alone; `own_addresses` is the IO edge. This module
reads addresses (and, with `AddressChanges`, hears that they changed): it never changes links, routes or
addresses, and never touches nf_tables.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Iterable

from nftblockd.addr import IPAddr
from nftblockd.kernel.rtnl import (
    NETLINK_ROUTE,
    NLMSG_DONE,
    NLMSG_ERROR,
    NLMSGHDR,
    RECV,
    DumpError,
    align,
    attributes,
    dump_request,
    messages,
)

__all__ = ["NLMSG_DONE", "NLMSG_ERROR", "AddressChanges", "DumpError", "own_addresses", "parse_dump", "request"]

RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
IFA_ADDRESS, IFA_LOCAL = 1, 2

_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, ifindex
_RECV = RECV


def request(seq: int) -> bytes:
    """An RTM_GETADDR dump request for every family."""
    return dump_request(RTM_GETADDR, _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0), seq)


def parse_dump(data: bytes, seq: int) -> tuple[list[IPAddr], bool]:
    """The addresses in one receive buffer of the dump answering `seq`, and whether it was the last part.

    An address is IFA_LOCAL when present (on a point-to-point link IFA_ADDRESS is the peer's), else
    IFA_ADDRESS. Messages of other sequence numbers are skipped; a malformed message raises DumpError.
    """
    out: list[IPAddr] = []
    walk = messages(data, seq, "the address dump")
    for kind, body, end in walk:
        if kind != RTM_NEWADDR or end - body < _IFADDRMSG.size:
            continue
        family = _IFADDRMSG.unpack_from(data, body)[0]
        size = {socket.AF_INET: 4, socket.AF_INET6: 16}.get(family)
        if size is None:
            continue
        found: dict[int, bytes] = {}
        for atype, a, b in attributes(data, body + _IFADDRMSG.size, end, "address attribute"):
            if atype in (IFA_ADDRESS, IFA_LOCAL) and b - a == size:
                found[atype] = data[a:b]
        raw = found.get(IFA_LOCAL) or found.get(IFA_ADDRESS)
        if raw is not None:
            out.append(ipaddress.IPv4Address(raw) if size == 4 else ipaddress.IPv6Address(raw))
    return out, walk.done


def own_addresses(timeout: float = 5.0) -> list[IPAddr]:
    """Every address configured on this network namespace's interfaces (raises OSError, DumpError)."""
    seq = int.from_bytes(os.urandom(4), "big") or 1
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as s:
        s.settimeout(timeout)
        s.bind((0, 0))
        s.sendto(request(seq), (0, 0))
        out: list[IPAddr] = []
        while True:
            part, done = parse_dump(s.recv(_RECV), seq)
            out += part
            if done:
                return _unique(out)


def _unique(addrs: Iterable[IPAddr]) -> list[IPAddr]:
    return list(dict.fromkeys(addrs))


RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR = 0x10, 0x100


class AddressChanges:
    """Notifications that an address was added to or removed from an interface (rtnetlink multicast groups
    of IPv4 and IPv6 addresses), so a daemon's view of its own addresses follows them instead of being read
    once. Only that something changed is reported; the caller re-reads the list (`own_addresses`).

    A receive-buffer overflow (ENOBUFS: a burst of changes) also counts as a change: the re-read is the truth.
    """

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, NETLINK_ROUTE)
        self._sock.bind((0, RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR))

    def fileno(self) -> int:
        return self._sock.fileno()

    def drain(self) -> bool:
        """Read what is queued; True if any of it was an address change."""
        changed = False
        while True:
            try:
                data = self._sock.recv(_RECV)
            except BlockingIOError:
                return changed
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    changed = True
                    continue
                raise
            pos = 0
            while pos + NLMSGHDR.size <= len(data):  # leniently: any readable header is news enough
                length, kind = NLMSGHDR.unpack_from(data, pos)[:2]
                if length < NLMSGHDR.size:
                    break
                changed |= kind in (RTM_NEWADDR, RTM_DELADDR)
                pos += align(length)

    def close(self) -> None:
        self._sock.close()
