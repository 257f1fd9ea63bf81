"""Link dumps and notifications over rtnetlink: the decoder alone (whole buffers, other sequences, malformed
input), and the real dump against `ip -j link`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import struct
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nftblockd.kernel.links import (
    IFLA_IFNAME,
    NLMSG_DONE,
    NLMSG_ERROR,
    RTM_DELLINK,
    RTM_NEWLINK,
    DumpError,
    LinkEvent,
    Links,
    LinkWatch,
    parse,
    request,
)
from tests.helpers.rtnlmsg import attr, msg


def link(kind: int, seq: int, index: int, name: str | None, *extra: bytes) -> bytes:
    attrs = b"".join(extra) + (attr(IFLA_IFNAME, name.encode() + b"\0") if name is not None else b"")
    return msg(kind, seq, struct.pack("=BxHiII", 0, 1, index, 0, 0) + attrs)


def test_request_is_a_link_dump() -> None:
    r = request(7)
    assert struct.unpack_from("=IHHII", r) == (32, 18, 0x301, 7, 0)


def test_dump_parts_names_and_end() -> None:
    data = (link(RTM_NEWLINK, 5, 1, "lo") + link(RTM_NEWLINK, 9, 2, "other-seq")
            + link(RTM_NEWLINK, 5, 3, "veth1", attr(4, b"\x00\x00\x05\xdc")) + msg(NLMSG_DONE, 5, b"\0" * 4))
    assert parse(data, 5) == ([LinkEvent("lo", 1, True), LinkEvent("veth1", 3, True)], True)
    assert parse(data[:-20], 5) == ([LinkEvent("lo", 1, True), LinkEvent("veth1", 3, True)], False)


def test_notifications_new_and_gone_any_sequence() -> None:
    data = link(RTM_NEWLINK, 0, 4, "wg0") + link(RTM_DELLINK, 0, 3, "veth1") + link(RTM_NEWLINK, 0, 5, None)
    assert parse(data) == ([LinkEvent("wg0", 4, True), LinkEvent("veth1", 3, False)], False)


def test_errors_and_malformed_input() -> None:
    with pytest.raises(DumpError, match="refused"):
        parse(msg(NLMSG_ERROR, 3, struct.pack("=i", -1) + b"\0" * 16), 3)
    assert parse(msg(NLMSG_ERROR, 3, struct.pack("=i", 0) + b"\0" * 16), 3) == ([], False)  # an ACK
    with pytest.raises(DumpError):
        parse(struct.pack("=IHHII", 200, RTM_NEWLINK, 0, 1, 0) + b"\0" * 20, 1)
    with pytest.raises(DumpError):
        parse(link(RTM_NEWLINK, 1, 2, "x")[:-3], 1)
    bad_attr = msg(RTM_NEWLINK, 1, struct.pack("=BxHiII", 0, 1, 2, 0, 0) + struct.pack("=HH", 64, IFLA_IFNAME))
    with pytest.raises(DumpError):
        parse(bad_attr, 1)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise_anything_but_dump_error(data: bytes) -> None:
    with contextlib.suppress(DumpError):
        parse(data)


@pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2")
def test_the_real_dump_lists_what_ip_link_lists() -> None:
    want = {x["ifname"] for x in json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True,
                                                            text=True, check=True).stdout)}
    lk = Links()
    try:
        assert lk.names() == want
        assert lk.names() == want  # the socket is reused
    finally:
        lk.close()


async def test_the_watch_returns_what_arrived_and_reports_lost_notifications() -> None:
    w = LinkWatch()
    try:
        waiter = asyncio.ensure_future(w.changed())
        await asyncio.sleep(0)
        assert not waiter.done()
        # feed the decoder through the watch's own path, as the socket would
        w._names.add("veth1")
        w._event.set()
        assert await asyncio.wait_for(waiter, 5) == ({"veth1"}, False)
        w._lost = True
        w._event.set()
        assert await asyncio.wait_for(w.changed(), 5) == (set(), True)
    finally:
        w.close()
