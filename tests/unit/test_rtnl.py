"""The rtnetlink framing links.py and ownaddr.py share (kernel/rtnl.py): one walk, one DumpError."""

from __future__ import annotations

import struct

import pytest

from nftblockd.kernel import links, ownaddr
from nftblockd.kernel.rtnl import NLMSG_DONE, NLMSG_ERROR, DumpError, attributes, dump_request, messages
from tests.helpers.rtnlmsg import msg


def test_both_decoders_share_the_framing_and_its_error() -> None:
    assert links.DumpError is ownaddr.DumpError is DumpError
    assert links.request(7)[4:6] == struct.pack("=H", 18) and ownaddr.request(7)[4:6] == struct.pack("=H", 22)
    assert dump_request(18, b"\0" * 16, 7) == links.request(7)


def test_the_walk_skips_other_sequences_and_acks_and_stops_at_done() -> None:
    data = (msg(16, 9, b"x" * 4) + msg(16, 1, b"a" * 4) + msg(NLMSG_ERROR, 1, struct.pack("=i", 0) + b"\0" * 16)
            + msg(NLMSG_DONE, 1, b"\0" * 4) + msg(16, 1, b"late"))
    walk = messages(data, 1, "the dump")
    assert [(kind, data[b:e]) for kind, b, e in walk] == [(16, b"aaaa")] and walk.done
    everything = messages(data[:40], None, "notifications")
    assert [kind for kind, _b, _e in everything] == [16, 16] and not everything.done
    with pytest.raises(DumpError, match="the kernel refused the dump: Operation not permitted"):
        list(messages(msg(NLMSG_ERROR, 1, struct.pack("=i", -1) + b"\0" * 16), 1, "the dump"))
    with pytest.raises(DumpError, match="cut short"):
        list(messages(msg(16, 1, b"abcd") + b"\x08\0", 1, "the dump"))


def test_attributes_are_walked_with_their_padding_and_a_bad_length_is_refused() -> None:
    body = struct.pack("=HH", 5, 3) + b"x\0\0\0" + struct.pack("=HH", 8, 1) + b"\1\2\3\4"
    assert [(t, body[a:b]) for t, a, b in attributes(body, 0, len(body), "attr")] == [(3, b"x"), (1, b"\1\2\3\4")]
    with pytest.raises(DumpError, match="malformed link attribute"):
        list(attributes(struct.pack("=HH", 40, 3), 0, 4, "link attribute"))
