"""Which network devices exist, and word when that changes: rtnetlink link dumps and link notifications.

Ingress chains follow devices (ruleset.chains_for): the writer asks `Links.names()` before installing them,
and the daemon runs a `LinkWatch` whose only job is to say "links changed": the writer then dumps the links
again and attaches or detaches chains. A notification is only a trigger, never trusted for the state itself:
a rename arrives as a new link name only, an overrun receive buffer loses notifications (ENOBUFS), and
both end in the same full comparison.

Why not pyroute2: see ownaddr.py (importing it costs ~0.2 s and logs warnings under the unit's sandbox); a
link dump is one 32-byte request and a small decoder (the framing is rtnl.py's, shared with ownaddr.py).
`request`, `parse` are pure and tested alone; `Links` and `LinkWatch` are the IO edges. This module reads
links only: it never changes them, and never touches nf_tables.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: waits on the rtnetlink socket from the event loop)
import contextlib
import errno
import os
import socket
import struct
from dataclasses import dataclass

from nftblockd.kernel.rtnl import (
    NETLINK_ROUTE,
    NLMSG_DONE,
    NLMSG_ERROR,
    RECV,
    DumpError,
    attributes,
    dump_request,
    messages,
)

__all__ = ["NLMSG_DONE", "NLMSG_ERROR", "DumpError", "LinkEvent", "LinkWatch", "Links", "parse", "request"]

RTMGRP_LINK = 1
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
IFLA_IFNAME = 3

_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_RECV = RECV


@dataclass(frozen=True, slots=True)
class LinkEvent:
    name: str
    index: int
    present: bool  # RTM_NEWLINK (exists, possibly just changed state) or RTM_DELLINK (gone)


def request(seq: int) -> bytes:
    """An RTM_GETLINK dump request."""
    return dump_request(RTM_GETLINK, _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0), seq)


def parse(data: bytes, seq: int | None = None) -> tuple[list[LinkEvent], bool]:
    """The links in one receive buffer, and whether the dump answering `seq` ended in it.

    With `seq`, messages of other sequence numbers are skipped (a dump's answer); without, every link
    message counts (notifications carry sequence number 0). A malformed message raises DumpError.
    """
    out: list[LinkEvent] = []
    walk = messages(data, seq, "the link dump")
    for kind, body, end in walk:
        if kind not in (RTM_NEWLINK, RTM_DELLINK) or end - body < _IFINFOMSG.size:
            continue
        index = _IFINFOMSG.unpack_from(data, body)[2]
        for atype, a, b in attributes(data, body + _IFINFOMSG.size, end, "link attribute"):
            if atype == IFLA_IFNAME:
                name = data[a:b].split(b"\0", 1)[0].decode(errors="replace")
                out.append(LinkEvent(name, index, kind == RTM_NEWLINK))
                break
    return out, walk.done


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
