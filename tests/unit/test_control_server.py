"""ControlServer over a real UNIX socket with a fake handler; ControlClient against it.

Peer-credential tests run a small client in a child process under uid 65534 (they need root to set it up).
"""

from __future__ import annotations

import asyncio
import grp
import json
import logging
import os
import shutil
import socket
import stat
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nftblockd.control.client import (
    ClientError,
    ControlClient,
    DaemonNotRunning,
    RemoteError,
)
from nftblockd.control.protocol import encode_request
from nftblockd.control.server import ControlError, ControlServer, ControlServerError, Peer

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client under another uid")


class FakeHandler:
    """Answers a few made-up commands; `wait` blocks on a named gate so tests control timing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], Peer]] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.entered: dict[str, asyncio.Event] = {}
        self.waiting = 0
        self.all_waiting = asyncio.Event()
        self.expect_waiting = 0
        self.cancelled = 0

    def gate(self, name: str) -> asyncio.Event:
        self.entered.setdefault(name, asyncio.Event())
        return self.gates.setdefault(name, asyncio.Event())

    async def __call__(self, cmd: str, args: dict[str, Any], peer: Peer) -> dict[str, Any]:
        self.calls.append((cmd, args, peer))
        if cmd == "ping":
            return {"pong": True}
        if cmd == "echo":
            return {"args": args, "uid": peer.uid, "pid": peer.pid}
        if cmd == "fail":
            raise ControlError(args["code"], args["message"])
        if cmd == "crash":
            raise RuntimeError("boom\nwith a second line")
        if cmd == "not_json":
            return {"x": object()}
        if cmd == "wait":
            gate = self.gate(args["gate"])
            self.entered[args["gate"]].set()
            self.waiting += 1
            if self.waiting == self.expect_waiting:
                self.all_waiting.set()
            try:
                await gate.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            finally:
                self.waiting -= 1
            return {"gate": args["gate"]}
        raise ControlError("bad_request", f"unknown command {cmd!r}")


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # Not tmp_path: a UNIX socket path must stay under 108 bytes, and uid 65534 must be able to reach it.
    d = Path(tempfile.mkdtemp(prefix="nbc-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def handler() -> FakeHandler:
    return FakeHandler()


MakeServer = Callable[..., Awaitable[ControlServer]]


@pytest.fixture
async def make_server(sock_dir: Path, handler: FakeHandler) -> AsyncIterator[MakeServer]:
    """Start a server (closed at teardown even when the test fails); keywords go to ControlServer."""
    started: list[ControlServer] = []

    async def make(path: Path | None = None, **kwargs: Any) -> ControlServer:
        srv = ControlServer(path or sock_dir / "c.sock", handler, **kwargs)
        await srv.start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        await srv.close()


@pytest.fixture
async def server(make_server: MakeServer, sock_dir: Path) -> ControlServer:
    return await make_server(sock_dir / "control.sock")


class Conn:
    """A raw test client: write lines, read response objects."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, path: Path) -> Conn:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=1 << 26)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def recv(self) -> dict[str, Any]:
        line = await self.reader.readline()
        assert line.endswith(b"\n"), f"connection closed: {line!r}"
        obj: dict[str, Any] = json.loads(line)
        return obj

    async def call(self, rid: int, cmd: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        await self.send(encode_request(rid, cmd, args))
        return await self.recv()

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


# --- basics --------------------------------------------------------------------------------------------


async def test_request_response_and_peer_credentials(server: ControlServer, handler: FakeHandler) -> None:
    c = await Conn.open(server.path)
    try:
        assert await c.call(1, "ping") == {"v": 1, "id": 1, "ok": True, "result": {"pong": True}}
        # the peer is whoever runs the tests (root in CI's integration run, nobody in `make coverage`)
        assert await c.call(2, "echo", {"a": [1, "é"]}) == {
            "v": 1, "id": 2, "ok": True, "result": {"args": {"a": [1, "é"]}, "uid": os.getuid(), "pid": os.getpid()}}
        assert handler.calls[0][2] == Peer(pid=os.getpid(), uid=os.getuid(), gid=os.getgid())
    finally:
        await c.close()  # also when an assertion failed: a leaked socket would fail a later test instead


async def test_socket_file_mode_group_and_parent_directory(sock_dir: Path, make_server: MakeServer) -> None:
    path = sock_dir / "run" / "nftblockd" / "control.sock"
    # root may give the socket to any group (the daemon's case: adm); anyone else only to a group of their own
    group = "adm" if os.geteuid() == 0 else grp.getgrgid(os.getegid()).gr_name
    srv = await make_server(path, mode=0o660, group=group)
    st = os.stat(path)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660
    assert st.st_gid == grp.getgrnam(group).gr_gid
    parent = os.stat(path.parent)
    assert stat.S_IMODE(parent.st_mode) == 0o755 and parent.st_uid == os.geteuid()
    await srv.close()
    assert not path.exists()


async def test_unknown_group_is_refused_at_start(sock_dir: Path, handler: FakeHandler) -> None:
    srv = ControlServer(sock_dir / "c.sock", handler, group="no-such-group-here")
    with pytest.raises(ControlServerError, match="does not exist"):
        await srv.start()


async def test_stale_socket_is_replaced(sock_dir: Path, make_server: MakeServer) -> None:
    path = sock_dir / "control.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))  # what a crashed daemon leaves behind: a socket file nobody listens on
    dead.close()
    srv = await make_server(path)
    c = await Conn.open(path)
    assert (await c.call(1, "ping"))["ok"] is True
    await c.close()
    await srv.close()


async def test_refuses_to_start_when_another_daemon_listens(
    server: ControlServer, handler: FakeHandler,
) -> None:
    twin = ControlServer(server.path, handler)
    with pytest.raises(ControlServerError, match="another nftblockd is already listening on"):
        await twin.start()
    c = await Conn.open(server.path)  # the first one is untouched
    assert (await c.call(1, "ping"))["ok"] is True
    await c.close()


async def test_refuses_to_replace_a_file_that_is_not_a_socket(sock_dir: Path, handler: FakeHandler) -> None:
    path = sock_dir / "control.sock"
    path.write_text("precious")
    with pytest.raises(ControlServerError, match="not a socket"):
        await ControlServer(path, handler).start()
    assert path.read_text() == "precious"


async def test_close_leaves_a_successors_socket_alone(sock_dir: Path, make_server: MakeServer) -> None:
    path = sock_dir / "control.sock"
    srv = await make_server(path)
    path.unlink()
    successor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    successor.bind(str(path))
    await srv.close()
    assert path.exists()
    successor.close()


# --- bad input -----------------------------------------------------------------------------------------


async def test_garbage_is_answered_and_the_connection_survives(server: ControlServer) -> None:
    c = await Conn.open(server.path)
    await c.send(b"this is not json\n")
    reply = await c.recv()
    assert reply["ok"] is False and reply["id"] is None
    assert reply["error"]["code"] == "bad_request"
    await c.send(b'{"v": 1, "id": 8, "args": {}}\n')
    reply = await c.recv()
    assert reply["id"] == 8
    assert reply["error"] == {"code": "bad_request", "message": 'the request needs a command name in "cmd"'}
    assert (await c.call(9, "ping"))["result"] == {"pong": True}
    await c.close()


async def test_oversize_request_is_refused_and_the_connection_survives(
    sock_dir: Path, handler: FakeHandler, make_server: MakeServer,
) -> None:
    srv = await make_server(sock_dir / "c.sock", max_request=1024)
    c = await Conn.open(srv.path)
    await c.send(encode_request(1, "echo", {"blob": "x" * 600_000}))  # the server discards as it reads
    reply = await c.recv()
    assert reply["id"] is None and reply["error"]["code"] == "bad_request"
    assert "larger than 1 KiB" in reply["error"]["message"]
    assert (await c.call(2, "ping"))["ok"] is True
    assert [call[0] for call in handler.calls] == ["ping"]
    await c.close()
    await srv.close()


async def test_handler_errors_never_crash_the_server(
    server: ControlServer, caplog: pytest.LogCaptureFixture,
) -> None:
    c = await Conn.open(server.path)
    reply = await c.call(1, "fail", {"code": "unknown_set", "message": "no blocklist named 'x'"})
    assert reply == {"v": 1, "id": 1, "ok": False,
                     "error": {"code": "unknown_set", "message": "no blocklist named 'x'"}}
    with caplog.at_level(logging.ERROR, logger="nftblockd.control"):
        reply = await c.call(2, "crash")
    assert reply["error"]["code"] == "internal"
    message = reply["error"]["message"]
    assert "RuntimeError: boom with a second line" in message and "\n" not in message
    assert any(r.exc_info and "boom" in str(r.exc_info[1]) for r in caplog.records)
    reply = await c.call(3, "not_json")
    assert reply["error"]["code"] == "internal" and "TypeError" in reply["error"]["message"]
    assert (await c.call(4, "ping"))["ok"] is True
    await c.close()


async def test_client_hanging_up_mid_request_does_not_disturb_others(
    server: ControlServer, handler: FakeHandler,
) -> None:
    gate = handler.gate("g")
    a = await Conn.open(server.path)
    await a.send(encode_request(1, "wait", {"gate": "g"}))
    await handler.entered["g"].wait()
    await a.close()
    gate.set()  # the reply now goes to a closed connection
    b = await Conn.open(server.path)
    assert (await b.call(1, "ping"))["ok"] is True
    await b.close()


# --- ordering and concurrency --------------------------------------------------------------------------


async def test_pipelined_requests_are_handled_in_order(server: ControlServer, handler: FakeHandler) -> None:
    gate = handler.gate("first")
    a = await Conn.open(server.path)
    await a.send(encode_request(1, "wait", {"gate": "first"}) + encode_request(2, "echo", {"n": 2})
                 + encode_request(3, "ping"))
    await handler.entered["first"].wait()
    b = await Conn.open(server.path)  # a full round trip elsewhere: the loop has had every chance to run #2
    assert (await b.call(1, "ping"))["ok"] is True
    assert [call[0] for call in handler.calls] == ["wait", "ping"]
    gate.set()
    assert [(await a.recv())["id"] for _ in range(3)] == [1, 2, 3]
    await a.close()
    await b.close()


async def test_many_clients_are_served_concurrently(server: ControlServer, handler: FakeHandler) -> None:
    n = 40
    handler.expect_waiting = n
    gate = handler.gate("all")
    conns = [await Conn.open(server.path) for _ in range(n)]
    for i, c in enumerate(conns):
        await c.send(encode_request(i, "wait", {"gate": "all"}))
    await handler.all_waiting.wait()  # all n are inside the handler at once
    gate.set()
    replies = await asyncio.gather(*(c.recv() for c in conns))
    assert [r["id"] for r in replies] == list(range(n))
    for c in conns:
        await c.close()


async def test_connection_limit_turns_away_only_when_every_slot_runs_a_request(
    sock_dir: Path, make_server: MakeServer, handler: FakeHandler,
) -> None:
    srv = await make_server(sock_dir / "c.sock", max_connections=1)
    a = await Conn.open(srv.path)
    await a.send(encode_request(1, "wait", {"gate": "g"}))
    handler.gate("g")
    await handler.entered["g"].wait()  # a's request is running
    b = await Conn.open(srv.path)
    reply = await b.recv()
    assert reply["error"]["code"] == "unavailable" and "too many" in reply["error"]["message"]
    assert await b.reader.read() == b""
    handler.gate("g").set()
    assert (await a.recv())["ok"] is True
    await a.close()
    await b.close()
    await srv.close()


async def test_idle_connections_cannot_lock_out_status(sock_dir: Path, make_server: MakeServer) -> None:
    # Issue 13, item 5: 64 idle connections locked `nftblock status` out for as long as they were held.
    srv = await make_server(sock_dir / "c.sock")  # the defaults: 64 connections, 60 s idle timeout
    idle = [await Conn.open(srv.path) for _ in range(64)]
    for i, c in enumerate(idle):  # each has been used once and idles now, idle[0] the longest
        assert (await c.call(i, "ping"))["ok"] is True
    assert srv.connections == 64
    ops = []
    for i in range(3):  # three operators, each keeping the connection open
        ops.append(await Conn.open(srv.path))
        reply = await ops[-1].call(i, "echo", {"status": True})
        assert reply["ok"] is True, reply
    assert srv.evicted == 3
    for c in idle[:3]:  # the three idle the longest were closed to make room
        assert await asyncio.wait_for(c.reader.read(), 10) == b""
    assert (await idle[3].call(99, "ping"))["ok"] is True
    for c in idle + ops:
        await c.close()


async def test_a_connection_idle_past_the_timeout_is_closed(sock_dir: Path, make_server: MakeServer) -> None:
    srv = await make_server(sock_dir / "c.sock", idle_timeout=0.2)
    c = await Conn.open(srv.path)
    assert (await c.call(1, "ping"))["ok"] is True
    assert await asyncio.wait_for(c.reader.read(), 10) == b""  # closed by the server, not by this bound
    assert srv.idle_closed == 1
    half = await Conn.open(srv.path)
    await half.send(b'{"v":1,"id":1,"cmd":"pi')  # a request begun and never finished (slowloris)
    assert await asyncio.wait_for(half.reader.read(), 10) == b""
    assert srv.idle_closed == 2
    await c.close()
    await half.close()


# --- shutdown ------------------------------------------------------------------------------------------


async def test_close_lets_in_flight_requests_finish_and_drops_idle_ones(
    sock_dir: Path, handler: FakeHandler, make_server: MakeServer,
) -> None:
    srv = await make_server(sock_dir / "c.sock")
    gate = handler.gate("slow")
    busy = await Conn.open(srv.path)
    idle = await Conn.open(srv.path)
    assert (await idle.call(1, "ping"))["ok"] is True
    await busy.send(encode_request(7, "wait", {"gate": "slow"}) + encode_request(8, "ping"))
    await handler.entered["slow"].wait()
    closing = asyncio.create_task(srv.close())
    assert await idle.reader.read() == b""  # the idle connection is closed at once
    assert not closing.done()
    assert not srv.path.exists()  # no new clients meanwhile
    gate.set()
    assert (await busy.recv()) == {"v": 1, "id": 7, "ok": True, "result": {"gate": "slow"}}
    assert await busy.reader.read() == b""  # the pipelined ping is not started during shutdown
    await closing
    assert srv.connections == 0
    await busy.close()
    await idle.close()


async def test_close_is_bounded_when_a_handler_never_finishes(
    sock_dir: Path, handler: FakeHandler, make_server: MakeServer,
) -> None:
    srv = await make_server(sock_dir / "c.sock", close_timeout=0.01)
    handler.gate("never")
    c = await Conn.open(srv.path)
    await c.send(encode_request(1, "wait", {"gate": "never"}))
    await handler.entered["never"].wait()
    await srv.close()
    assert handler.cancelled == 1
    assert await c.reader.read() == b""
    await c.close()


# --- the client ----------------------------------------------------------------------------------------


async def test_client_calls_reuse_one_connection(server: ControlServer, handler: FakeHandler) -> None:
    def run() -> list[dict[str, Any]]:
        with ControlClient(server.path, timeout=30) as client:
            return [client.call("ping"), client.call("echo", {"n": 1}), client.call("ping")]

    results = await asyncio.to_thread(run)
    assert results[0] == {"pong": True} and results[1]["args"] == {"n": 1}
    assert len({call[2].pid for call in handler.calls}) == 1


async def test_client_raises_remote_errors_with_their_code(server: ControlServer) -> None:
    def run() -> RemoteError:
        with ControlClient(server.path, timeout=30) as client:
            try:
                client.call("fail", {"code": "allowlisted", "message": "10.0.0.1 is allowlisted"})
            except RemoteError as exc:
                assert client.call("ping") == {"pong": True}  # still usable after an error reply
                return exc
        raise AssertionError("no error")

    exc = await asyncio.to_thread(run)
    assert (exc.code, str(exc)) == ("allowlisted", "10.0.0.1 is allowlisted")


async def test_client_carries_a_bulk_request_both_ways(server: ControlServer) -> None:
    targets = [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(200_000)]

    def run() -> dict[str, Any]:
        with ControlClient(server.path, timeout=60) as client:
            return client.call("echo", {"targets": targets})

    result = await asyncio.to_thread(run)
    assert result["args"]["targets"] == targets


def test_client_reports_a_missing_daemon(sock_dir: Path) -> None:
    path = sock_dir / "nope.sock"
    with pytest.raises(DaemonNotRunning) as info:
        ControlClient(path).call("ping")
    assert str(info.value) == f"nftblockd is not running (no socket at {path})"


def test_client_reports_a_stale_socket_as_not_running(sock_dir: Path) -> None:
    path = sock_dir / "stale.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()
    with pytest.raises(DaemonNotRunning, match="nftblockd is not running"):
        ControlClient(path).call("ping")


async def test_client_reports_a_daemon_that_hangs_up(sock_dir: Path) -> None:
    path = sock_dir / "rude.sock"

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.close()

    srv = await asyncio.start_unix_server(hang_up, str(path))
    with pytest.raises(ClientError, match="closed the connection without answering"):
        await asyncio.to_thread(ControlClient(path, timeout=30).call, "ping")
    srv.close()
    await srv.wait_closed()


async def test_client_reports_a_daemon_that_talks_nonsense(sock_dir: Path) -> None:
    path = sock_dir / "odd.sock"

    async def nonsense(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"HTTP/1.1 400 Bad Request\r\n")
        await writer.drain()
        writer.close()

    srv = await asyncio.start_unix_server(nonsense, str(path))
    with pytest.raises(ClientError, match="unexpected reply from nftblockd"):
        await asyncio.to_thread(ControlClient(path, timeout=30).call, "ping")
    srv.close()
    await srv.wait_closed()


# --- peer credentials (a child process under uid 65534) ------------------------------------------------

# The interpreter lives under /root, which uid 65534 cannot read: the child starts as root, imports what it
# needs, then drops to 65534 (and the groups in argv[2]) before connecting.
DROP = r"""
import os, sys
os.setgroups([int(g) for g in sys.argv[2].split(",") if g])
os.setgid(65534)
os.setuid(65534)
"""

RAW_CHILD = r"""
import socket
""" + DROP + r"""
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(b'{"v": 1, "id": 1, "cmd": "ping"}\n')
buf = b""
while not buf.endswith(b"\n"):
    chunk = s.recv(65536)
    if not chunk:
        break
    buf += chunk
print(buf.decode().strip())
"""

CLIENT_CHILD = r"""
from nftblockd.control.client import ControlClient, ClientError
""" + DROP + r"""
try:
    print("ok", ControlClient(sys.argv[1], timeout=30).call("ping"))
except ClientError as exc:
    print(type(exc).__name__, exc)
"""


async def run_as_nobody(code: str, path: Path, extra_groups: list[int] | None = None) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-c", code, str(path), ",".join(str(g) for g in extra_groups or []),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd="/",
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode().strip()


async def start_open_server(make_server: MakeServer, group: str | None) -> ControlServer:
    return await make_server(mode=0o666, group=group)  # the file lets anyone in; credentials decide


@pytest.mark.root
@needs_root
async def test_other_users_are_forbidden(
    handler: FakeHandler, make_server: MakeServer, caplog: pytest.LogCaptureFixture,
) -> None:
    srv = await start_open_server(make_server, group=None)
    with caplog.at_level(logging.WARNING, logger="nftblockd.control"):
        reply = json.loads(await run_as_nobody(RAW_CHILD, srv.path))
    assert reply == {"v": 1, "id": None, "ok": False,
                     "error": {"code": "forbidden", "message": "run as root"}}
    assert handler.calls == []
    assert any("refused connection from uid 65534" in r.getMessage() for r in caplog.records)
    out = await run_as_nobody(CLIENT_CHILD, srv.path)
    assert out == f"PermissionDenied permission denied on {srv.path}: run as root"
    await srv.close()


@pytest.mark.root
@needs_root
async def test_group_members_are_allowed_by_primary_group(
    handler: FakeHandler, make_server: MakeServer,
) -> None:
    srv = await start_open_server(make_server, group=grp.getgrgid(NOBODY).gr_name)
    reply = json.loads(await run_as_nobody(RAW_CHILD, srv.path))
    assert reply["ok"] is True
    assert handler.calls[0][2].uid == NOBODY
    await srv.close()


@pytest.mark.root
@needs_root
async def test_group_members_are_allowed_by_supplementary_group(make_server: MakeServer) -> None:
    adm = grp.getgrnam("adm").gr_gid
    srv = await start_open_server(make_server, group="adm")
    assert json.loads(await run_as_nobody(RAW_CHILD, srv.path, extra_groups=[adm]))["ok"] is True
    reply = json.loads(await run_as_nobody(RAW_CHILD, srv.path))  # not a member
    assert reply["error"] == {"code": "forbidden", "message": "run as root or as a member of group 'adm'"}
    await srv.close()


@pytest.mark.root
@needs_root
async def test_client_reports_a_socket_it_may_not_open(server: ControlServer) -> None:
    out = await run_as_nobody(CLIENT_CHILD, server.path)  # mode 0600, owned by root: EACCES
    assert out == f"PermissionDenied permission denied on {server.path}: run as root"
