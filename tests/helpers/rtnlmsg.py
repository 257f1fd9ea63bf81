"""rtnetlink messages built by hand for the decoder tests (kernel/rtnl.py, links.py, ownaddr.py): written from
the wire format, not with the code under test, so an encoding mistake there cannot hide itself."""

from __future__ import annotations

import struct


def msg(kind: int, seq: int, body: bytes) -> bytes:
    """One netlink message (flags NLM_F_MULTI), padded to 4 bytes."""
    raw = struct.pack("=IHHII", 16 + len(body), kind, 2, seq, 0) + body
    return raw + b"\0" * (-len(raw) % 4)


def attr(kind: int, value: bytes) -> bytes:
    """One route attribute, padded to 4 bytes."""
    raw = struct.pack("=HH", 4 + len(value), kind) + value
    return raw + b"\0" * (-len(raw) % 4)
