"""The control socket: a UNIX stream server that checks each peer's credentials and calls one handler.

This module owns the socket file, the peer-credential check and the request/response loop; it knows nothing
about bans. What a command does is the handler's business (`daemon/root.py` supplies it); the wire format is
`protocol.py`'s. It never lets a handler's exception end the server: `ControlError` becomes the error the
client sees, anything else becomes `internal` with the traceback in the log.

Per connection, requests are handled strictly in order (a client may pipeline); across connections they run
concurrently. While a request is being handled the connection is not read, which is the back-pressure.

Bounds, so that idle or slow peers cannot lock an operator out of `nftblock status` (issue 13: 64 idle
connections did): a connection that sends nothing for `idle_timeout` seconds while no request of its own is
running is closed; and when `max_connections` are open, a newcomer takes the place of the connection idle
the longest (not busy with a request), so only `max_connections` requests *running at once* can turn one
away. Clients that keep a connection open (the fail2ban action) reconnect when they find it closed.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: the control socket server runs on the event loop)
import contextlib
import errno
import grp
import logging
import os
import pwd
import socket
import stat
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from nftblockd.control.protocol import (
    DEFAULT_MAX_REQUEST,
    ControlError,
    Invalid,
    Request,
    RequestDecoder,
    encode_error,
    encode_result,
    one_line,
)

if TYPE_CHECKING:
    from nftblockd.control.wire import ErrorCode

__all__ = ["ControlError", "ControlServer", "ControlServerError", "Handler", "Peer"]

log = logging.getLogger("nftblockd.control")

_UCRED: Final = struct.Struct("iII")  # struct ucred { pid_t pid; uid_t uid; gid_t gid; }
_SO_PEERGROUPS: Final = getattr(socket, "SO_PEERGROUPS", 59)  # Linux ≥ 4.13; Python has no constant
_PEERGROUPS_BUF: Final = 1024  # Python caps getsockopt buffers at 1024 bytes: 256 groups, then ERANGE
_READ_CHUNK: Final = 256 * 1024
_REFUSE_LINGER: Final = 1.0  # seconds a refused peer gets to finish sending before we hang up
_REFUSE_DRAIN: Final = 1024 * 1024  # ... and bytes
# Unfinished requests held across all connections: each may hold up to max_request (64 MiB), so eight peers
# sending 60 MiB without a newline held 481 MiB. Two whole maximal requests fit; the connection whose bytes
# go past it is answered bad_request and closed (`over_budget` counts them).
MAX_BUFFERED: Final = 2 * DEFAULT_MAX_REQUEST


class ControlServerError(Exception):
    """The control socket cannot be set up: the operator's environment is at fault (path, group, a twin)."""


@dataclass(frozen=True, slots=True)
class Peer:
    """Who is on the other end, from SO_PEERCRED at connect time."""

    pid: int
    uid: int
    gid: int


class Handler(Protocol):
    """Runs one command. Raise ControlError(code, message) for errors the client should see."""

    async def __call__(self, cmd: str, args: dict[str, Any], peer: Peer) -> dict[str, Any]: ...


@dataclass(eq=False, slots=True)
class _Connection:
    task: asyncio.Task[Any] | None
    busy: bool = False  # handling a request: let it finish on close
    active: float = 0.0  # monotonic time of the last bytes read or the last answer sent
    evicted_for_room: bool = False
    buffered: int = 0  # bytes of an unfinished request held by its decoder


class ControlServer:
    """`await start()`, serve until `await close()`.

    `group`: members of this group (primary or supplementary) may use the socket besides root; the socket file
    is chgrp'ed to it. `mode` is applied to the socket file; the credential check is what actually decides.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        handler: Handler,
        *,
        mode: int = 0o600,
        group: str | None = None,
        max_request: int = DEFAULT_MAX_REQUEST,
        max_connections: int = 64,
        close_timeout: float = 5.0,
        idle_timeout: float = 60.0,
        max_buffered: int = MAX_BUFFERED,
    ) -> None:
        self.path = Path(path)
        self._handler = handler
        self._mode = mode
        self._group = group
        self._gid: int | None = None
        self._max_request = max_request
        self._max_connections = max_connections
        self._close_timeout = close_timeout
        self._idle_timeout = idle_timeout
        self.idle_closed = 0  # connections closed for idling past idle_timeout
        self.evicted = 0  # idle connections closed to make room for a newcomer
        self.over_budget = 0  # connections closed for holding unfinished requests past max_buffered in all
        self._max_buffered = max_buffered
        self._buffered = 0  # sum of the connections' `buffered`
        self._server: asyncio.AbstractServer | None = None
        self._inode: tuple[int, int] | None = None
        self._connections: set[_Connection] = set()
        self._closing = False

    # --- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("ControlServer.start() called twice")
        self._gid = _resolve_group(self._group) if self._group is not None else None
        self._make_parent()
        self._remove_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(self.path))
            st = os.stat(self.path)
            self._inode = (st.st_dev, st.st_ino)
            # Permissions are set between bind() and listen(): no connection can arrive before they hold.
            os.chmod(self.path, self._mode)
            if self._gid is not None:
                os.chown(self.path, -1, self._gid)
            sock.setblocking(False)
            self._server = await asyncio.start_unix_server(self._serve, sock=sock, backlog=128,
                                                           limit=_READ_CHUNK)
        except BaseException as exc:
            sock.close()
            self._unlink_own()
            if isinstance(exc, OSError):
                raise ControlServerError(f"cannot listen on {self.path}: {exc.strerror or exc}") from exc
            raise
        who = f"root and group {self._group!r}" if self._group else "root only"
        log.info("control socket listening on %s (mode %04o, %s)", self.path, self._mode, who)

    async def close(self) -> None:
        """Stop accepting, let in-flight requests finish (at most `close_timeout`), then cut the rest."""
        if self._server is None or self._closing:
            return
        self._closing = True
        self._server.close()
        self._unlink_own()
        for conn in self._connections:
            if not conn.busy and conn.task is not None:
                conn.task.cancel()  # idle: waiting for a request that will not be served
        tasks = [c.task for c in self._connections if c.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self._close_timeout)
            if pending:
                log.warning("control: %d request(s) still running after %.1fs; cancelling them",
                            len(pending), self._close_timeout)
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        await self._server.wait_closed()

    @property
    def connections(self) -> int:
        return len(self._connections)

    @property
    def buffered(self) -> int:
        """Bytes of unfinished requests held across all connections (at most max_buffered + one read)."""
        return self._buffered

    # --- socket file -----------------------------------------------------------------------------------

    def _make_parent(self) -> None:
        parent = self.path.parent
        if parent.is_dir():
            return  # an existing directory is the operator's (or systemd's RuntimeDirectory=): leave it
        try:
            parent.mkdir(mode=0o755, parents=True)
            os.chmod(parent, 0o755)  # mkdir's mode is filtered by the umask
            if os.geteuid() == 0:
                os.chown(parent, 0, 0)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ControlServerError(f"cannot create {parent}: {exc.strerror or exc}") from exc

    def _remove_stale(self) -> None:
        """A socket file left by a crashed daemon is removed; one somebody listens on is not."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ControlServerError(f"cannot inspect {self.path}: {exc.strerror or exc}") from exc
        if not stat.S_ISSOCK(st.st_mode):
            raise ControlServerError(f"{self.path} exists and is not a socket; refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.setblocking(False)
        try:
            probe.connect(str(self.path))
        except (ConnectionRefusedError, FileNotFoundError):
            pass  # nothing listens: stale
        except BlockingIOError:
            # EAGAIN on a UNIX socket means a full backlog: somebody is listening.
            raise ControlServerError(f"another nftblockd is already listening on {self.path}") from None
        except OSError as exc:
            raise ControlServerError(f"cannot probe {self.path}: {exc.strerror or exc}") from exc
        else:
            raise ControlServerError(f"another nftblockd is already listening on {self.path}")
        finally:
            probe.close()
        log.info("removing stale control socket %s", self.path)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _unlink_own(self) -> None:
        """Remove the socket file only if it is still the one we bound (a successor may have replaced it)."""
        if self._inode is None:
            return
        try:
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self._inode:
                self.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove control socket %s: %s", self.path, exc.strerror or exc)
        self._inode = None

    # --- connections -----------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(asyncio.current_task(), active=time.monotonic())
        self._connections.add(conn)
        try:
            await self._serve_connection(conn, reader, writer)
        except ConnectionError:
            pass  # the client went away; what it asked for has been done or was never read
        except asyncio.CancelledError:
            if not conn.evicted_for_room:
                raise
            # closed to make room for a newcomer: that is this connection's end, not the server's
        finally:
            self._connections.discard(conn)
            self._buffered -= conn.buffered
            conn.buffered = 0
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve_connection(
        self, conn: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
    ) -> None:
        if self._closing:
            await self._refuse(reader, writer, "unavailable", "nftblockd is shutting down")
            return
        if len(self._connections) > self._max_connections and not self._make_room(conn):
            log.warning("control: refusing a connection: %d requests already running", self._max_connections)
            await self._refuse(reader, writer, "unavailable",
                               f"too many control connections ({self._max_connections}); try again")
            return
        try:
            peer = _peer_credentials(writer.get_extra_info("socket"))
        except OSError as exc:
            log.warning("control: cannot read peer credentials: %s", exc)
            return
        refusal = self._refusal(peer, writer.get_extra_info("socket"))
        if refusal is not None:
            log.warning("control: refused connection from uid %d (pid %d): %s", peer.uid, peer.pid, refusal)
            await self._refuse(reader, writer, "forbidden", refusal)
            return
        log.debug("control: connection from uid %d pid %d", peer.uid, peer.pid)
        decoder = RequestDecoder(self._max_request)
        while not self._closing:
            try:
                async with asyncio.timeout(self._idle_timeout):
                    data = await reader.read(_READ_CHUNK)
            except TimeoutError:
                self.idle_closed += 1
                log.debug("control: closing the connection of pid %d: idle for %gs", peer.pid,
                          self._idle_timeout)
                return
            conn.active = time.monotonic()
            events = decoder.feed(data) if data else decoder.feed_eof()
            for event in events:
                conn.busy = True
                response = await self._respond(event, peer)
                await self._send(writer, response)
                conn.busy = False
                conn.active = time.monotonic()
                if self._closing:
                    return  # pipelined requests after this one are not started during shutdown
            self._buffered += decoder.buffered - conn.buffered
            conn.buffered = decoder.buffered
            if self._buffered > self._max_buffered:
                self.over_budget += 1
                log.warning("control: closing the connection of pid %d: unfinished requests of all connections "
                            "hold %d bytes, over %d (this one %d)", peer.pid, self._buffered, self._max_buffered,
                            conn.buffered)
                await self._send(writer, encode_error(None, "bad_request", f"unfinished requests on the control "
                                                      f"socket hold over {self._max_buffered} bytes; this one "
                                                      f"({conn.buffered} bytes so far) was discarded"))
                return
            if not data:
                return

    def _make_room(self, newcomer: _Connection) -> bool:
        """Close the connection idle the longest to let `newcomer` in; False when every other one is busy."""
        idle = [c for c in self._connections if c is not newcomer and not c.busy and c.task is not None
                and not c.evicted_for_room]
        if not idle:
            return False
        victim = min(idle, key=lambda c: c.active)
        victim.evicted_for_room = True
        assert victim.task is not None
        victim.task.cancel()
        self._connections.discard(victim)  # its slot is the newcomer's now, whenever its task ends
        self.evicted += 1
        log.info("control: %d connections open; closing the one idle the longest to make room",
                 self._max_connections)
        return True

    async def _respond(self, event: Request | Invalid, peer: Peer) -> bytes:
        if isinstance(event, Invalid):
            return encode_error(event.id, "bad_request", event.message)
        try:
            result = await self._handler(event.cmd, event.args, peer)
            if not isinstance(result, dict):
                raise TypeError(f"handler returned {type(result).__name__}, not a dict")
            return encode_result(event.id, result)
        except ControlError as exc:
            return encode_error(event.id, exc.code, exc.message)
        except Exception as exc:
            log.exception("control: command %r from uid %d failed", event.cmd, peer.uid)
            return encode_error(event.id, "internal",
                                f"internal error in {event.cmd!r}: {type(exc).__name__}: {one_line(exc, 300)}"
                                " (details in the nftblockd log)")

    @staticmethod
    async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, code: ErrorCode,
                      message: str) -> None:
        """Answer with an error (id null) and hang up without making the peer's pending send fail.

        Closing at once would make a client that is still sending its request see EPIPE instead of our answer,
        so: shut our side down, then read and drop what it sends, until it hangs up, for a bounded time and
        amount (an unauthorised peer must not be able to hold a connection slot).
        """
        await ControlServer._send(writer, encode_error(None, code, message))
        if writer.can_write_eof():
            writer.write_eof()
        dropped = 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_REFUSE_LINGER):
                while dropped < _REFUSE_DRAIN and (chunk := await reader.read(_READ_CHUNK)):
                    dropped += len(chunk)

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    def _refusal(self, peer: Peer, sock: Any) -> str | None:
        """None if `peer` may use the socket, else the reason (one line, shown to the client).

        The daemon's own user is admitted: under the unit that is a dedicated system user, and the process
        asking is the unit's ExecReload (`nftblock reload`), which runs as that user."""
        if peer.uid == 0 or peer.uid == os.geteuid():
            return None
        if self._gid is None:
            return "run as root"
        if peer.gid == self._gid:
            return None
        try:
            groups = _peer_groups(sock)
        except OSError as exc:
            log.warning("control: cannot read the peer's groups: %s", exc)
            groups = None
        if groups is None:
            groups = _groups_from_database(peer.uid)
        if self._gid in groups:
            return None
        return f"run as root or as a member of group {self._group!r}"


def _peer_credentials(sock: Any) -> Peer:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return Peer(pid=pid, uid=uid, gid=gid)


def _peer_groups(sock: Any) -> tuple[int, ...] | None:
    """The peer's supplementary groups from SO_PEERGROUPS, or None when the kernel cannot tell us."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, _PEERGROUPS_BUF)
    except OSError as exc:
        if exc.errno in (errno.ERANGE, errno.ENOPROTOOPT, errno.EINVAL):
            return None
        raise
    return struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4])


def _resolve_group(group: str) -> int:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        pass
    if group.isdigit():
        return int(group)
    raise ControlServerError(f"control socket group {group!r} does not exist")


def _groups_from_database(uid: int) -> tuple[int, ...]:
    """Fallback when SO_PEERGROUPS cannot answer: the group database (misses groups granted at login only)."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return ()
    return tuple(g.gr_gid for g in grp.getgrall() if name in g.gr_mem)
