"""Which network devices exist, and word when that changes: rtnetlink link dumps and link notifications.

Ingress chains follow devices (ruleset.chains_for): the writer asks `Links.names()` before installing them,
and the daemon runs a `LinkWatch` whose only job is to say "links changed": the writer then dumps the links
again and attaches or detaches chains. A notification is only a trigger, never trusted for the state itself:
a rename arrives as a new link name only, an overrun receive buffer loses notifications (ENOBUFS), and
both end in the same full comparison.

Why not pyroute2: see ownaddr.py (importing it costs ~0.2 s and logs warnings under the unit's sandbox); a
link dump is one 32-byte request and a small decoder. `request`, `parse` are pure and tested alone; `Links`
and `LinkWatch` are the IO edges. This module reads links only: it never changes them, and never touches
nf_tables.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: waits on the rtnetlink socket from the event loop)
import contextlib
import errno
import os
import socket
import struct
from dataclasses import dataclass

__all__ = ["DumpError", "LinkEvent", "LinkWatch", "Links", "parse", "request"]

NETLINK_ROUTE = 0
RTMGRP_LINK = 1
NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
IFLA_IFNAME = 3

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, portid
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_RTATTR = struct.Struct("=HH")
_ERRNO = struct.Struct("=i")
_RECV = 64 * 1024


class DumpError(Exception):
    """The kernel answered with an error, or a message was malformed."""


@dataclass(frozen=True, slots=True)
class LinkEvent:
    name: str
    index: int
    present: bool  # RTM_NEWLINK (exists, possibly just changed state) or RTM_DELLINK (gone)


def _align(n: int) -> int:
    return (n + 3) & ~3


def request(seq: int) -> bytes:
    """An RTM_GETLINK dump request."""
    body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def parse(data: bytes, seq: int | None = None) -> tuple[list[LinkEvent], bool]:
    """The links in one receive buffer, and whether the dump answering `seq` ended in it.

    With `seq`, messages of other sequence numbers are skipped (a dump's answer); without, every link
    message counts (notifications carry sequence number 0). A malformed message raises DumpError.
    """
    out: list[LinkEvent] = []
    pos = 0
    while pos + _NLMSGHDR.size <= len(data):
        length, kind, _flags, mseq, _portid = _NLMSGHDR.unpack_from(data, pos)
        if length < _NLMSGHDR.size or pos + length > len(data):
            raise DumpError(f"malformed netlink message (length {length} at offset {pos})")
        body, end = pos + _NLMSGHDR.size, pos + length
        pos += _align(length)
        if seq is not None and mseq != seq:
            continue
        if kind == NLMSG_DONE:
            return out, True
        if kind == NLMSG_ERROR:
            if end - body < _ERRNO.size:
                raise DumpError("malformed netlink error message")
            err = -_ERRNO.unpack_from(data, body)[0]
            if err:
                raise DumpError(f"the kernel refused the link dump: {os.strerror(err)}")
            continue
        if kind not in (RTM_NEWLINK, RTM_DELLINK) or end - body < _IFINFOMSG.size:
            continue
        index = _IFINFOMSG.unpack_from(data, body)[2]
        a = body + _IFINFOMSG.size
        while a + _RTATTR.size <= end:
            alen, atype = _RTATTR.unpack_from(data, a)
            if alen < _RTATTR.size or a + alen > end:
                raise DumpError(f"malformed link attribute (length {alen})")
            if atype == IFLA_IFNAME:
                name = data[a + _RTATTR.size:a + alen].split(b"\0", 1)[0].decode(errors="replace")
                out.append(LinkEvent(name, index, kind == RTM_NEWLINK))
                break
            a += _align(alen)
    if pos != len(data):
        raise DumpError("netlink message cut short")
    return out, False


class Links:
    """Device names of the network namespace this object was made in (a netlink socket stays there)."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        self.sock.settimeout(timeout)
        self.sock.bind((0, 0))
        self._seq = int.from_bytes(os.urandom(3), "big") or 1

    def names(self) -> set[str]:
        """Every device that exists now (raises OSError, DumpError)."""
        self._seq += 1
        self.sock.sendto(request(self._seq), (0, 0))
        out: set[str] = set()
        while True:
            part, done = parse(self.sock.recv(_RECV), self._seq)
            out.update(e.name for e in part if e.present)
            if done:
                return out

    def close(self) -> None:
        self.sock.close()


class LinkWatch:
    """Link notifications (RTMGRP_LINK) on the event loop: `changed()` returns when something happened to a
    link since the last call (or when notifications were lost), with the names seen."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        self.sock.setblocking(False)
        self.sock.bind((0, RTMGRP_LINK))
        self._event = asyncio.Event()
        self._names: set[str] = set()
        self._lost = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def _readable(self) -> None:
        while True:
            try:
                data = self.sock.recv(_RECV)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:  # notifications were dropped: whoever waits must look again
                    self._lost = True
                    self._event.set()
                    continue
                raise
            with contextlib.suppress(DumpError):  # a message we cannot read is still news
                self._names.update(e.name for e in parse(data)[0])
            self._event.set()

    async def changed(self) -> tuple[set[str], bool]:
        """(names seen, whether notifications were lost) since the last call; waits for at least one."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self.sock.fileno(), self._readable)
        await self._event.wait()
        self._event.clear()
        names, lost = self._names, self._lost
        self._names, self._lost = set(), False
        return names, lost

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
            self._loop = None
        self.sock.close()
