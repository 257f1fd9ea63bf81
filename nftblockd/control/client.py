"""A small blocking client for the control socket (the CLI is synchronous).

It raises typed errors and never prints or exits: turning them into messages and exit codes is `cli/main.py`'s job.
One connection is reused for successive calls; requests are sent one at a time.
"""

from __future__ import annotations

# _socket, not socket: the wrapper module imports enum and selectors, 2-3 ms of a `nftblock ban` process's
# ~20 ms (bench/bench_cli.py); the C module's socket has everything used here. See wire.py on start-up cost.
import _socket
import errno
import posix  # not os, for the same reason

from nftblockd.control.wire import DEFAULT_MAX_RESPONSE, ProtocolError, Response, ResponseDecoder, encode_request

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import os
    from types import TracebackType
    from typing import Any

__all__ = ["ClientError", "ControlClient", "DaemonNotRunning", "PermissionDenied", "RemoteError"]

_READ_CHUNK = 256 * 1024


class ClientError(Exception):
    """Talking to the daemon failed; the message is one line for an operator."""


class DaemonNotRunning(ClientError):
    pass


class PermissionDenied(ClientError):
    pass


class RemoteError(ClientError):
    """The daemon answered with an error; `code` is one of protocol.ERROR_CODES (or a newer one)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ControlClient:
    """`call(cmd, args) -> result`; `timeout` bounds each wait for the daemon (connect, send, each read)."""

    def __init__(self, path: str | os.PathLike[str], timeout: float | None = 60.0, *,
                 max_response: int = DEFAULT_MAX_RESPONSE) -> None:
        self.path = posix.fspath(path)
        self.timeout = timeout
        self._max_response = max_response
        self._sock: _socket.socket | None = None
        self._next_id = 1

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def call(self, cmd: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one request and wait for its response; returns the result object."""
        sock = self._connect()
        rid = self._next_id
        self._next_id += 1
        try:
            response = self._exchange(sock, encode_request(rid, cmd, args))
        except BaseException:
            self.close()  # the stream's state is unknown: never reuse it
            raise
        if response.id is not None and response.id != rid:
            self.close()
            raise ClientError(f"nftblockd answered request {response.id}, expected {rid}")
        if not response.ok:
            if response.code == "forbidden":
                self.close()
                raise PermissionDenied(f"permission denied on {self.path}: {response.message}")
            raise RemoteError(response.code or "internal", response.message or "")
        return response.result if response.result is not None else {}

    def _connect(self) -> _socket.socket:
        if self._sock is not None:
            return self._sock
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            raise self._connect_error(exc) from None
        self._sock = sock
        return sock

    def _connect_error(self, exc: OSError) -> ClientError:
        if exc.errno == errno.ENOENT:
            return DaemonNotRunning(f"nftblockd is not running (no socket at {self.path})")
        if exc.errno == errno.ECONNREFUSED:
            return DaemonNotRunning(f"nftblockd is not running (nothing listens on {self.path})")
        if exc.errno in (errno.EACCES, errno.EPERM):
            return PermissionDenied(f"permission denied on {self.path}: run as root")
        if isinstance(exc, TimeoutError):
            return ClientError(f"nftblockd did not accept a connection on {self.path} in {self.timeout}s")
        return ClientError(f"cannot connect to {self.path}: {exc.strerror or exc}")

    def _exchange(self, sock: _socket.socket, request: bytes) -> Response:
        send_error: OSError | None = None
        try:
            sock.sendall(request)
        except TimeoutError:
            raise ClientError(f"nftblockd stopped reading the request on {self.path}") from None
        except (BrokenPipeError, ConnectionResetError) as exc:
            # The daemon may have answered and hung up before reading (forbidden, shutting down): read that.
            send_error = exc
        decoder = ResponseDecoder(self._max_response)
        while True:
            try:
                data = sock.recv(_READ_CHUNK)
            except TimeoutError:
                raise ClientError(f"no answer from nftblockd within {self.timeout}s") from None
            except ConnectionResetError:
                data = b""
            try:
                responses = decoder.feed(data) if data else decoder.feed_eof()
            except ProtocolError as exc:
                raise ClientError(f"unexpected reply from nftblockd: {exc}") from None
            if responses:
                return responses[0]  # one request in flight: the first complete line is its answer
            if not data:
                why = f" ({send_error.strerror})" if send_error is not None and send_error.strerror else ""
                raise ClientError(f"nftblockd closed the connection without answering{why}")
