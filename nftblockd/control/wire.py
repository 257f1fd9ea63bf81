"""The control protocol's framing and envelope: what both ends share and all a client needs. Pure.

Constants, the error types, the line splitter, request and response encoding and the response decoder live here;
`protocol.py` re-exports them and adds the daemon's side (request decoding, per-command argument rules). The
rules of the stream are written in `protocol.py`'s docstring and in docs/control-protocol.md.

This module must stay cheap to import, because `nftblock ban` runs once per ban from fail2ban's shell action:
it imports the C module `_json` and nothing else (no dataclasses, typing or enum; not even the `json` package,
which imports `re`: together they were half of that process's start-up, see bench/bench_cli.py). `dumps` and
`loads` below are `json.dumps(..., ensure_ascii=False, allow_nan=False, separators=(",", ":"))` and
`json.loads` built from the same C encoder and scanner the json package uses (tests/unit/test_control_wire.py
holds them to the json package's results). It never opens a socket and never reads the clock.
"""

from __future__ import annotations

import _json

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy treats the name the same way
if TYPE_CHECKING:
    from typing import Any, Final, Literal, TypeAlias

    # The error codes as a type, for the type checker only: at run time ERROR_CODES below is the set (whose
    # annotation makes mypy hold every member to this list). Here, not in protocol.py, so that the dependency
    # between the two modules goes one way (protocol.py builds on this module).
    ErrorCode: TypeAlias = Literal[
        "invalid_address", "allowlisted", "never_ban", "unknown_set", "bad_request", "not_found", "internal",
        "unavailable", "forbidden", "refused",
    ]

VERSION: Final = 1
DEFAULT_MAX_REQUEST: Final = 64 * 1024 * 1024  # a bulk `ban -` of 1,000,000 IPv6 addresses is ~42 MB
DEFAULT_MAX_RESPONSE: Final = 1024 * 1024 * 1024  # the client trusts the daemon; `list` can be large

ERROR_CODES: Final[frozenset[ErrorCode]] = frozenset({
    "invalid_address",  # a target is not an IP address or CIDR
    "allowlisted",  # a target overlaps the allowlist; never banned
    "never_ban",  # a target is (or overlaps) never-ban space: unspecified, multicast, link-local... (neverban.py)
    "unknown_set",  # no blocklist by that name
    "bad_request",  # the request is malformed: JSON, shape, unknown command or argument
    "not_found",  # the named thing (feed, ban) does not exist
    "internal",  # a bug in the daemon; details are in its log
    "unavailable",  # the daemon cannot serve this now (starting, stopping, kernel unreachable, busy)
    "forbidden",  # the peer's credentials do not allow using the socket
    "refused",  # the daemon refused what was asked as it stands (a reload of an invalid config)
})

class ControlError(Exception):
    """An error the client should see: `code` is one of ERROR_CODES, `message` one line for an operator.

    The daemon's handler raises it; the server turns it into an error response. Any other exception from a
    handler is a bug and becomes `internal`.
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown control error code {code!r}")
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = one_line(message)

    def __str__(self) -> str:
        return self.message


class ProtocolError(ControlError):
    """What a peer sent does not follow the protocol (always `bad_request` when it is the client's fault)."""

    def __init__(self, message: str) -> None:
        super().__init__("bad_request", message)


def one_line(text: object, limit: int = 500) -> str:
    """Collapse whitespace (newlines included) so a message fits one log or terminal line."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


# --- responses: the value --------------------------------------------------------------------------------


class Response:
    """One answer from the daemon (a plain class: a frozen dataclass would cost the CLI `import dataclasses`)."""

    __slots__ = ("code", "id", "message", "ok", "result")

    def __init__(self, id: int | None, ok: bool, result: dict[str, Any] | None = None, code: str | None = None,
                 message: str | None = None) -> None:
        self.id = id
        self.ok = ok
        self.result = result
        self.code = code  # set when not ok; may be a code newer than ERROR_CODES
        self.message = message

    def _key(self) -> tuple[Any, ...]:
        return self.id, self.ok, self.result, self.code, self.message

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Response) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash((self.id, self.ok, self.code, self.message))

    def __repr__(self) -> str:
        return (f"Response(id={self.id!r}, ok={self.ok!r}, result={self.result!r}, code={self.code!r}, "
                f"message={self.message!r})")


# --- JSON, from the json package's C parts ------------------------------------------------------------


def _not_serializable(o: object) -> Any:
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def dumps(obj: object) -> str:
    """json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")); TypeError/ValueError for
    what JSON cannot say. (json.encoder.JSONEncoder.iterencode, one-shot path, without its Python fallback.)"""
    encode = _json.make_encoder({}, _not_serializable, _json.encode_basestring, None, ":", ",", False, False,
                                False)
    return "".join(encode(obj, 0))


class _ScanContext:
    """The attributes _json.make_scanner reads, as json.JSONDecoder() has them by default."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


_scan = _json.make_scanner(_ScanContext())  # type: ignore[arg-type]  # (typeshed wants a JSONDecoder)
_WS = " \t\n\r"


def loads(data: bytes | str) -> Any:
    """json.loads for one document; ValueError (UnicodeDecodeError, JSONDecodeError) if it is not one."""
    # The protocol is UTF-8 (json.loads would also sniff UTF-16/32); surrogatepass as json.loads decodes.
    text = data.decode("utf-8-sig" if data[:3] == b"\xef\xbb\xbf" else "utf-8", "surrogatepass") \
        if isinstance(data, bytes) else data
    start = len(text) - len(text.lstrip(_WS))
    try:
        obj, end = _scan(text, start)
    except StopIteration as exc:
        raise ValueError(f"Expecting value at {exc.value}") from None
    if text[end:].strip(_WS):
        raise ValueError(f"Extra data at {end}")
    return obj


# --- encoding ------------------------------------------------------------------------------------------


def _dumps(obj: dict[str, Any]) -> bytes:
    # JSON escapes control characters inside strings, so the encoded object never contains a raw newline.
    # allow_nan=False: NaN and Infinity are not JSON; a handler returning them is a bug (→ `internal`).
    return dumps(obj).encode() + b"\n"


def encode_request(id: int, cmd: str, args: dict[str, Any] | None = None) -> bytes:
    return _dumps({"v": VERSION, "id": id, "cmd": cmd, "args": args or {}})


def encode_result(id: int | None, result: dict[str, Any]) -> bytes:
    """Raises TypeError/ValueError if `result` is not JSON-encodable (the server answers `internal`)."""
    return _dumps({"v": VERSION, "id": id, "ok": True, "result": result})


def encode_error(id: int | None, code: ErrorCode, message: str) -> bytes:
    if code not in ERROR_CODES:
        raise ValueError(f"unknown control error code {code!r}")
    error = {"code": code, "message": one_line(message)}
    return _dumps({"v": VERSION, "id": id, "ok": False, "error": error})


# --- line splitting ------------------------------------------------------------------------------------


class _Oversize:
    """Marker from FrameSplitter: a line exceeded the limit and is being discarded."""


OVERSIZE: Final = _Oversize()


class FrameSplitter:
    """Splits a byte stream into lines of at most `max_line` bytes (newline excluded), memory bounded.

    A longer line yields OVERSIZE once, and its bytes are discarded up to the next newline.
    """

    def __init__(self, max_line: int) -> None:
        if max_line < 1:
            raise ValueError("max_line must be positive")
        self._max = max_line
        self._buf = bytearray()
        self._discarding = False
        self._eof = False

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes | _Oversize]:
        if self._eof:
            raise RuntimeError("feed() after feed_eof()")
        out: list[bytes | _Oversize] = []
        start = 0
        n = len(data)
        while start < n:
            nl = data.find(b"\n", start)
            end = n if nl < 0 else nl
            if self._discarding:
                if nl >= 0:
                    self._discarding = False
            elif len(self._buf) + (end - start) > self._max:
                out.append(OVERSIZE)
                self._buf.clear()
                self._discarding = nl < 0
            elif nl < 0:
                self._buf += data[start:end]
            elif self._buf:
                self._buf += data[start:end]
                out.append(bytes(self._buf))
                self._buf.clear()
            else:
                out.append(data[start:end])
            if nl < 0:
                break
            start = nl + 1
        return out

    def feed_eof(self) -> list[bytes | _Oversize]:
        """End of stream: a final line without a newline still counts (netcat users forget it)."""
        self._eof = True
        if self._discarding or not self._buf:
            return []
        line = bytes(self._buf)
        self._buf.clear()
        return [line]


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# --- responses -----------------------------------------------------------------------------------------


def decode_response(line: bytes) -> Response:
    """Parse one response line; raises ProtocolError if the daemon said something that is not a response."""
    try:
        obj = loads(line)
    except (ValueError, RecursionError):
        raise ProtocolError("the daemon's reply is not JSON") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("ok"), bool):
        raise ProtocolError("the daemon's reply is not a response object")
    if obj.get("v") != VERSION:
        raise ProtocolError(f"the daemon speaks protocol version {obj.get('v')!r}, not {VERSION}")
    rid = obj.get("id")
    if rid is not None and not _is_int(rid):
        raise ProtocolError("the daemon's reply has a non-integer id")
    if obj["ok"]:
        result = obj.get("result")
        if not isinstance(result, dict):
            raise ProtocolError("the daemon's reply has no result object")
        return Response(rid, True, result=result)
    err = obj.get("error")
    if not isinstance(err, dict) or not isinstance(err.get("code"), str):
        raise ProtocolError("the daemon's error reply has no error code")
    return Response(rid, False, code=err["code"], message=one_line(err.get("message") or err["code"]))


class ResponseDecoder:
    """Incremental response decoder for the client side; raises ProtocolError (and only that)."""

    def __init__(self, max_response: int = DEFAULT_MAX_RESPONSE) -> None:
        self.max_response = max_response
        self._lines = FrameSplitter(max_response)

    def feed(self, data: bytes) -> list[Response]:
        return self._decode(self._lines.feed(data))

    def feed_eof(self) -> list[Response]:
        return self._decode(self._lines.feed_eof())

    def _decode(self, lines: list[bytes | _Oversize]) -> list[Response]:
        out: list[Response] = []
        for line in lines:
            if isinstance(line, _Oversize):
                raise ProtocolError(f"the daemon's reply is larger than {_size(self.max_response)}")
            line = line.rstrip(b"\r")
            if line.strip():
                out.append(decode_response(line))
        return out


def _size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"
