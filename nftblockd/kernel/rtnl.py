"""rtnetlink framing shared by links.py and ownaddr.py: a dump request, the walk over the messages of one
receive buffer, and the walk over one message's attributes. Pure: bytes in, offsets out.

What each caller reads from a message (a link's name, an address) stays with the caller; what they share is
how the kernel frames it, and how a malformed or cut-short buffer is refused (DumpError, never anything
else: tests/unit/test_links.py and test_ownaddr.py feed both decoders arbitrary bodies). Never opens a
socket; never touches nf_tables.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

__all__ = ["NETLINK_ROUTE", "NLMSG_DONE", "NLMSG_ERROR", "RECV", "DumpError", "attributes", "dump_request",
           "messages"]

NETLINK_ROUTE = 0
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
RECV = 64 * 1024  # a dump part is at most a page or two; 64 KiB never truncates one

NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, portid
_RTATTR = struct.Struct("=HH")  # len, type
_ERRNO = struct.Struct("=i")


class DumpError(Exception):
    """The kernel answered with an error, or a message was cut short or malformed."""


def align(n: int) -> int:
    return (n + 3) & ~3


def dump_request(kind: int, body: bytes, seq: int) -> bytes:
    """A dump request (`kind`: RTM_GETLINK, RTM_GETADDR...) with its family header `body`."""
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), kind, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


class Walk:
    """The messages of one receive buffer: iterate for (type, body start, end) of each message that is
    neither NLMSG_DONE nor an ACK; `done` says whether the dump ended in this buffer.

    With `seq`, messages of other sequence numbers are skipped (a dump's answer); with None, every message
    counts (notifications carry sequence number 0). An NLMSG_ERROR with an errno raises DumpError naming
    `what` ("the link dump"); so do a malformed header and a buffer that ends inside a message.
    """

    def __init__(self, data: bytes, seq: int | None, what: str) -> None:
        self.data = data
        self.seq = seq
        self.what = what
        self.done = False

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        data = self.data
        pos = 0
        while pos + NLMSGHDR.size <= len(data):
            length, kind, _flags, mseq, _portid = NLMSGHDR.unpack_from(data, pos)
            if length < NLMSGHDR.size or pos + length > len(data):
                raise DumpError(f"malformed netlink message (length {length} at offset {pos})")
            body, end = pos + NLMSGHDR.size, pos + length
            pos += align(length)
            if self.seq is not None and mseq != self.seq:
                continue
            if kind == NLMSG_DONE:
                self.done = True
                return
            if kind == NLMSG_ERROR:
                if end - body < _ERRNO.size:
                    raise DumpError("malformed netlink error message")
                err = -_ERRNO.unpack_from(data, body)[0]
                if err:
                    raise DumpError(f"the kernel refused {self.what}: {os.strerror(err)}")
                continue  # an ACK
            yield kind, body, end
        if pos != len(data):
            raise DumpError("netlink message cut short")


def messages(data: bytes, seq: int | None, what: str) -> Walk:
    return Walk(data, seq, what)


def attributes(data: bytes, start: int, end: int, what: str) -> Iterator[tuple[int, int, int]]:
    """(type, payload start, payload end) of each attribute in data[start:end]; a malformed one raises
    DumpError naming `what` ("link attribute")."""
    a = start
    while a + _RTATTR.size <= end:
        alen, atype = _RTATTR.unpack_from(data, a)
        if alen < _RTATTR.size or a + alen > end:
            raise DumpError(f"malformed {what} (length {alen})")
        yield atype, a + _RTATTR.size, a + alen
        a += align(alen)
