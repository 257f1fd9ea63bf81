"""Bounds of the control socket under a root client (issue 33): a `ban` of a million invalid targets stalled the
event loop for about 5 s at a 650 MB peak, answered with a million refusals. Now a request over MAX_TARGETS is
refused whole before a target is parsed, and one with more than MAX_INVALID_TARGETS invalid targets as soon as
the scan finds that many; nothing reaches the kernel. Through the real ControlServer on a UNIX socket."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nftblockd.control.api import MAX_INVALID_TARGETS
from nftblockd.control.protocol import MAX_TARGETS
from nftblockd.control.wire import encode_request
from tests.helpers.apirig import ApiRig, api_rig, serve

CONFIG = "blocklists:\n  default: {timeout: 1h}\nallowlist_self: false\n"


@pytest.fixture
async def sock() -> AsyncIterator[tuple[ApiRig, Path]]:
    d = Path(tempfile.mkdtemp(prefix="nblim-", dir="/tmp"))  # short: UNIX socket paths stop at 108 bytes
    try:
        async with api_rig(CONFIG) as rig, serve(rig, d / "control.sock") as path:
            yield rig, path
    finally:
        shutil.rmtree(d, ignore_errors=True)


async def request(path: Path, cmd: str, args: dict[str, Any]) -> dict[str, Any]:
    reader, writer = await asyncio.open_unix_connection(str(path), limit=1 << 26)
    try:
        writer.write(encode_request(1, cmd, args))
        await writer.drain()
        reply: dict[str, Any] = json.loads(await reader.readline())
        return reply
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.mark.parametrize("cmd", ["ban", "unban"])
async def test_many_invalid_targets_are_refused_whole_with_a_count(sock: tuple[ApiRig, Path], cmd: str) -> None:
    rig, path = sock
    targets = ["203.0.113.7", *(f"bogus{i}" for i in range(50_000))]
    tracemalloc.start()
    try:
        reply = await request(path, cmd, {"targets": targets})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert reply["ok"] is False and reply["error"]["code"] == "bad_request"
    assert reply["error"]["message"] == (f"{cmd}: more than {MAX_INVALID_TARGETS} of the 50001 targets are not "
                                         "addresses or CIDR ranges (the first: 'bogus0'); nothing was applied")
    assert rig.fake.transactions == []
    # The request's own strings, not a refusal object per target (those were ~600 bytes each).
    assert peak < 50_000 * 300


async def test_a_few_invalid_targets_are_still_refused_one_by_one(sock: tuple[ApiRig, Path]) -> None:
    _rig, path = sock
    reply = await request(path, "ban", {"targets": ["203.0.113.7", *(f"bogus{i}" for i in range(100))]})
    assert reply["ok"] is True
    assert len(reply["result"]["refused"]) == 100 and reply["result"]["applied"] == ["203.0.113.7"]


async def test_more_targets_than_one_request_may_carry_are_refused_before_parsing(
        sock: tuple[ApiRig, Path]) -> None:
    rig, path = sock
    reply = await request(path, "ban", {"targets": ["1"] * (MAX_TARGETS + 1)})
    assert reply["error"] == {"code": "bad_request", "message": f"ban: {MAX_TARGETS + 1} targets; at most "
                              f"{MAX_TARGETS} per request (send them in several)"}
    assert rig.fake.transactions == []


async def test_unfinished_requests_of_all_connections_share_one_bound() -> None:
    # Eight peers sending 60 MiB without a newline held 481 MiB; each stayed under the 64 MiB request limit.
    from nftblockd.control.server import ControlServer, Peer
    from tests.helpers.sources import wait_for_condition

    async def handler(cmd: str, args: dict[str, Any], peer: Peer) -> dict[str, Any]:
        return {"pad": len(args["pad"])}

    d = Path(tempfile.mkdtemp(prefix="nblim-", dir="/tmp"))
    srv = ControlServer(d / "c.sock", handler, max_request=1 << 20, max_buffered=1 << 20)
    await srv.start()
    try:
        head = b'{"v": 1, "id": 1, "cmd": "ping", "args": {"pad": "' + b"x" * 600_000
        r1, w1 = await asyncio.open_unix_connection(str(srv.path))
        w1.write(head)
        await w1.drain()
        await wait_for_condition(lambda: srv.buffered == len(head), what="the first partial request held")
        r2, w2 = await asyncio.open_unix_connection(str(srv.path))
        w2.write(head)
        await w2.drain()
        refused = json.loads(await r2.readline())
        assert refused["error"]["code"] == "bad_request"
        assert refused["error"]["message"].startswith(f"unfinished requests on the control socket hold over "
                                                      f"{1 << 20} bytes; this one")
        assert await r2.read() == b""  # closed
        assert srv.over_budget == 1
        await wait_for_condition(lambda: srv.buffered == len(head), what="the refused one's bytes released")
        w1.write(b'"}}\n')  # the first one, within the bound, is answered
        assert json.loads(await r1.readline())["result"] == {"pad": 600_000}
        assert srv.buffered == 0
        w1.close()
        w2.close()
    finally:
        await srv.close()
        shutil.rmtree(d, ignore_errors=True)
