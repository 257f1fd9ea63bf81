"""The control protocol's codec: bytes in, requests out; values in, bytes out. Pure.

Never opens a socket, never reads the clock, never imports asyncio: `server.py` and `client.py` do the IO and
`docs/control-protocol.md` is the contract this module implements. The rules, in prose:

- A stream is a sequence of lines separated by `\\n` (a trailing `\\r` is dropped; blank lines are ignored).
  Each non-blank line is one JSON object: a request (client → daemon) or a response (daemon → client).
- A line longer than the limit (64 MiB by default for requests) is refused *once* with `bad_request`; the
  decoder then discards bytes up to the next newline and carries on, so its memory stays bounded and the
  connection stays usable.
- A line that is not a valid request (bad JSON, wrong shape, unsupported version) is answered with
  `bad_request`, echoing its `id` when one could be read. The decoder never raises on what a peer sends: it
  turns every line into a `Request` or an `Invalid`. Only the response decoder (the client side, which trusts
  the daemon) raises `ProtocolError`, when the daemon says something that is not a response.
- Responses come back in request order on each connection; `id` lets a client check the pairing.

The per-command argument parsers (`parse_args`) are here too, so that the daemon and any other implementation
read `ban`/`unban`/... arguments by the same rules the document states.
"""

from __future__ import annotations

import binascii
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple, TypeAlias, overload

from nftblockd.addr import format_target
from nftblockd.control.wire import (
    DEFAULT_MAX_REQUEST,
    DEFAULT_MAX_RESPONSE,
    ERROR_CODES,
    OVERSIZE,
    VERSION,
    ControlError,
    FrameSplitter,
    ProtocolError,
    Response,
    ResponseDecoder,
    _Oversize,
    _size,
    decode_response,
    encode_error,
    encode_request,
    encode_result,
    loads,
    one_line,
)
from nftblockd.durations import BanLength, parse_timeout
from nftblockd.events import MAX_REASON, BanInfo, fleet_origin_host

__all__ = [
    "BLOCKLIST_DEFAULT",
    "COMMANDS",
    "DEFAULT_MAX_REQUEST",
    "DEFAULT_MAX_RESPONSE",
    "ERROR_CODES",
    "ORIGINS",
    "OVERSIZE",
    "REPLIES",
    "VERSION",
    "BanArgs",
    "BanItem",
    "CheckArgs",
    "CommandArgs",
    "ControlError",
    "FeedsRefreshArgs",
    "FrameSplitter",
    "Invalid",
    "ListArgs",
    "NoArgs",
    "ProtocolError",
    "Request",
    "RequestDecoder",
    "Response",
    "ResponseDecoder",
    "Timeout",
    "UnbanArgs",
    "UniformItems",
    "ban_entry",
    "decode_request",
    "decode_response",
    "encode_error",
    "encode_request",
    "encode_result",
    "one_line",
    "parse_args",
    "parse_wire_timeout",
    "resolve_timeout",
]

# --- values --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    cmd: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Invalid:
    """A line that is not a valid request; answer `bad_request` with `id` (None when unreadable)."""

    id: int | None
    message: str


# --- requests ------------------------------------------------------------------------------------------


def decode_request(line: bytes) -> Request:
    """Parse one line (without its newline) into a Request; raises ProtocolError.

    The error's `id` attribute carries the request id when one could be read, so the answer can echo it.
    """
    try:
        obj = loads(line)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise _RequestError(None, "not a JSON object on one line") from None
    if not isinstance(obj, dict):
        raise _RequestError(None, "a request must be a JSON object")
    rid = obj.get("id")
    if not isinstance(rid, int) or isinstance(rid, bool):
        raise _RequestError(None, "the request needs an integer \"id\"")
    v = obj.get("v")
    if v != VERSION:
        raise _RequestError(rid, f"unsupported protocol version {v!r} (this daemon speaks {VERSION})")
    cmd = obj.get("cmd")
    if not isinstance(cmd, str) or not cmd:
        raise _RequestError(rid, "the request needs a command name in \"cmd\"")
    args = obj.get("args", {})
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise _RequestError(rid, "\"args\" must be a JSON object")
    return Request(rid, cmd, args)


class _RequestError(ProtocolError):
    def __init__(self, id: int | None, message: str) -> None:
        super().__init__(message)
        self.id = id


class RequestDecoder:
    """Incremental request decoder for the daemon side: never raises on what the peer sends.

        decoder = RequestDecoder()
        for event in decoder.feed(chunk):   # ... and decoder.feed_eof() at end of stream
            Request → call the handler;  Invalid → answer bad_request with event.id
    """

    def __init__(self, max_request: int = DEFAULT_MAX_REQUEST) -> None:
        self.max_request = max_request
        self._lines = FrameSplitter(max_request)

    @property
    def buffered(self) -> int:
        return self._lines.buffered

    def feed(self, data: bytes) -> list[Request | Invalid]:
        return self._decode(self._lines.feed(data))

    def feed_eof(self) -> list[Request | Invalid]:
        return self._decode(self._lines.feed_eof())

    def _decode(self, lines: list[bytes | _Oversize]) -> list[Request | Invalid]:
        out: list[Request | Invalid] = []
        for line in lines:
            if isinstance(line, _Oversize):
                out.append(Invalid(None, f"request larger than {_size(self.max_request)}; it was discarded"))
                continue
            line = line.rstrip(b"\r")
            if not line.strip():
                continue
            try:
                out.append(decode_request(line))
            except _RequestError as exc:
                out.append(Invalid(exc.id, exc.message))
        return out


# --- command arguments ---------------------------------------------------------------------------------


class _BlocklistDefault(enum.Enum):
    TOKEN = "default"

    def __repr__(self) -> str:
        return "BLOCKLIST_DEFAULT"


BLOCKLIST_DEFAULT: Final = _BlocklistDefault.TOKEN
"""A ban timeout not said (`null`, absent or `"default"` on the wire): use the blocklist's configured default."""

Timeout: TypeAlias = BanLength | Literal[_BlocklistDefault.TOKEN]
"""A ban timeout as a client asked for it: seconds, durations.PERMANENT, or BLOCKLIST_DEFAULT. `None` is not
one: on the wire `null` means the default, and `resolve_timeout` is where the default is filled in."""


def resolve_timeout(timeout: Timeout, default: BanLength) -> BanLength:
    """The length a ban gets: what was asked, or the blocklist's `default` when nothing was."""
    return default if timeout is BLOCKLIST_DEFAULT else timeout

ORIGINS: Final = ("cli", "fail2ban")  # what a control client may claim a ban comes from


class BanItem(NamedTuple):
    """One target of a `ban` (a NamedTuple: a bulk request builds a million of them, and a frozen
    dataclass's __init__ costs ~10x more)."""

    target: str  # as sent; the daemon parses it with addr.parse_target and refuses it if invalid
    timeout: Timeout = BLOCKLIST_DEFAULT
    reason: str = ""
    jail: str = ""


class UniformItems(Sequence[BanItem]):
    """The items of a `ban` whose targets were all plain strings: the targets and the one (timeout, reason,
    jail) they share, without a BanItem per target (building 100,000 of them was a fifth of the daemon's
    share of `nftblock ban -`). Reads, compares and hashes as the tuple of BanItems it stands for."""

    __slots__ = ("jail", "reason", "targets", "timeout")

    def __init__(self, targets: Sequence[str], timeout: Timeout, reason: str, jail: str) -> None:
        self.targets = targets
        self.timeout = timeout
        self.reason = reason
        self.jail = jail

    def __len__(self) -> int:
        return len(self.targets)

    @overload
    def __getitem__(self, i: int) -> BanItem: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[BanItem, ...]: ...

    def __getitem__(self, i: int | slice) -> BanItem | tuple[BanItem, ...]:
        if isinstance(i, slice):
            return tuple(BanItem(t, self.timeout, self.reason, self.jail) for t in self.targets[i])
        return BanItem(self.targets[i], self.timeout, self.reason, self.jail)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, UniformItems | tuple):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"UniformItems({len(self)} targets, {self.timeout!r}, {self.reason!r}, {self.jail!r})"


REPLIES: Final = ("full", "counts")
"""`reply` of `ban`/`unban`: every target echoed (the default, what v1 always did), or counts and the failures."""


@dataclass(frozen=True, slots=True)
class BanArgs:
    items: Sequence[BanItem]  # a tuple, or UniformItems when every target was a plain string
    blocklist: str | None  # None: the default blocklist
    origin: str = "cli"
    # every target was a plain string, so one timeout and reason for all (the bulk path); a hint, not content
    uniform: bool = field(default=False, compare=False)
    reply: str = "full"  # "counts": answer with counts and the refused targets only (docs/control-protocol.md)
    # `hosts4`: IPv4 addresses packed 4 bytes each (network order), banned like `items` (which is then a
    # UniformItems, possibly of no targets, carrying the request's timeout, comment and jail)
    hosts4: bytes = b""
    # `hosts6`: IPv6 addresses packed 16 bytes each, the same way (an IPv4-mapped one is the IPv4 address)
    hosts6: bytes = b""


@dataclass(frozen=True, slots=True)
class UnbanArgs:
    targets: tuple[str, ...]
    blocklist: str | None  # None: every blocklist
    origin: str = "cli"  # who asked, for the audit line (fail2ban's actions say "fail2ban")
    jail: str = ""  # the jail that asked, for the audit line
    reply: str = "full"  # "counts": answer with the count removed and what was not found (no echo)


@dataclass(frozen=True, slots=True)
class ListArgs:
    blocklist: str | None  # None: every blocklist


@dataclass(frozen=True, slots=True)
class CheckArgs:
    target: str


@dataclass(frozen=True, slots=True)
class FeedsRefreshArgs:
    name: str


@dataclass(frozen=True, slots=True)
class NoArgs:
    """`ping`, `status`, `feeds`, `fleet` and `reload` take no arguments."""


CommandArgs: TypeAlias = BanArgs | UnbanArgs | ListArgs | CheckArgs | FeedsRefreshArgs | NoArgs


def parse_wire_timeout(value: object, where: str = "timeout") -> Timeout:
    """`null` or `"default"` → BLOCKLIST_DEFAULT; positive seconds; a duration string ("1h", "permanent").

    `"default"` is the explicit spelling of `null` (docs/control-protocol.md); clients keep sending `null`
    or nothing, which every daemon understands."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "default"):
        return BLOCKLIST_DEFAULT
    if isinstance(value, float) and not math.isfinite(value):
        raise ProtocolError(f"{where}: not a finite number")
    try:
        return parse_timeout(value)
    except ValueError as exc:
        raise ProtocolError(f"{where}: {exc}") from None


def _check_keys(cmd: str, args: dict[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(k for k in args if k not in known)
    if unknown:
        allowed = ", ".join(known) if known else "none"
        raise ProtocolError(f"{cmd}: unknown argument {unknown[0]!r} (allowed: {allowed})")


def _opt_str(cmd: str, args: dict[str, Any], key: str) -> str | None:
    v = args.get(key)
    if v is not None and not isinstance(v, str):
        raise ProtocolError(f"{cmd}: {key!r} must be a string or null")
    return v


def _req_str(cmd: str, args: dict[str, Any], key: str) -> str:
    v = args.get(key)
    if not isinstance(v, str) or not v:
        raise ProtocolError(f"{cmd}: {key!r} must be a non-empty string")
    return v


# Targets one ban or unban may carry, strings and packed hosts together: as many as one `nftblock ban -` sends
# (a million addresses is what the request-size limit was sized for). More is refused whole, with the count.
MAX_TARGETS: Final = 1_000_000


def _count_targets(cmd: str, n: int) -> None:
    if n > MAX_TARGETS:
        raise ProtocolError(f"{cmd}: {n} targets; at most {MAX_TARGETS} per request (send them in several)")


def _targets(cmd: str, args: dict[str, Any], packed: bool = False) -> list[Any]:
    """`targets`; with `packed` addresses (`hosts4`) it may be absent or empty."""
    t = args.get("targets")
    if packed and t is None:
        return []
    if not isinstance(t, list) or (not t and not packed):
        raise ProtocolError(f"{cmd}: 'targets' must be a non-empty list")
    return t


def _packed(cmd: str, args: dict[str, Any], version: int) -> bytes:
    """`hosts4`/`hosts6`: base64 of IP addresses packed 4/16 bytes each, or b"" when absent."""
    v = args.get(f"hosts{version}")
    if v is None:
        return b""
    try:
        blob = binascii.a2b_base64(v, strict_mode=True) if isinstance(v, str) and v.isascii() else None
    except binascii.Error:
        blob = None
    size = 4 if version == 4 else 16
    if blob is None or len(blob) % size:
        raise ProtocolError(f"{cmd}: 'hosts{version}' must be base64 of IPv{version} addresses, {size} bytes each")
    return blob


def _bounded(where: str, text: str) -> str:
    if len(text) > MAX_REASON:
        raise ProtocolError(f"{where}: at most {MAX_REASON} characters, got {len(text)}")
    return text


def _reply(cmd: str, args: dict[str, Any]) -> str:
    reply = args.get("reply") or "full"
    if reply not in REPLIES:
        raise ProtocolError(f"{cmd}: 'reply' must be one of {', '.join(REPLIES)}")
    return str(reply)


def _parse_ban(args: dict[str, Any]) -> BanArgs:
    _check_keys("ban", args, ("targets", "hosts4", "hosts6", "timeout", "set", "comment", "origin", "jail",
                              "reply"))
    timeout = parse_wire_timeout(args.get("timeout"))
    comment = args.get("comment") or ""
    if not isinstance(comment, str):
        raise ProtocolError("ban: 'comment' must be a string")
    _bounded("ban: 'comment'", comment)
    origin = _origin("ban", args)
    jail = _bounded("ban: 'jail'", _opt_str("ban", args, "jail") or "")
    hosts4, hosts6 = _packed("ban", args, 4), _packed("ban", args, 6)
    targets = _targets("ban", args, bool(hosts4 or hosts6))
    _count_targets("ban", len(targets) + len(hosts4) // 4 + len(hosts6) // 16)
    reply = _reply("ban", args)
    if all(type(t) is str for t in targets):  # the bulk case: no per-target objects to check
        return BanArgs(UniformItems(targets, timeout, comment, jail), _opt_str("ban", args, "set"), origin, True,
                       reply, hosts4, hosts6)
    if hosts4 or hosts6:
        raise ProtocolError(f"ban: '{'hosts4' if hosts4 else 'hosts6'}' takes the request's timeout, comment and "
                            "jail: its 'targets' must be strings")
    items: list[BanItem] = []
    for i, t in enumerate(targets):
        if isinstance(t, str):
            items.append(BanItem(t, timeout, comment, jail))
        elif isinstance(t, dict):
            _check_keys(f"ban: targets[{i}]", t, ("target", "timeout", "reason", "jail"))
            target = t.get("target")
            reason, item_jail = t.get("reason", comment), t.get("jail", jail)
            if not isinstance(target, str) or not isinstance(reason, str) or not isinstance(item_jail, str):
                raise ProtocolError(f"ban: targets[{i}]: 'target', 'reason' and 'jail' must be strings")
            _bounded(f"ban: targets[{i}].reason", reason)
            _bounded(f"ban: targets[{i}].jail", item_jail)
            item_timeout = timeout
            if "timeout" in t:
                item_timeout = parse_wire_timeout(t["timeout"], f"targets[{i}].timeout")
            items.append(BanItem(target, item_timeout, reason, item_jail))
        else:
            raise ProtocolError(f"ban: targets[{i}] must be a string or an object")
    return BanArgs(tuple(items), _opt_str("ban", args, "set"), origin, reply=reply)


def _parse_unban(args: dict[str, Any]) -> UnbanArgs:
    _check_keys("unban", args, ("targets", "set", "origin", "jail", "reply"))
    targets = _targets("unban", args)
    _count_targets("unban", len(targets))
    if not all(isinstance(t, str) for t in targets):
        raise ProtocolError("unban: 'targets' must be a list of strings")
    return UnbanArgs(tuple(targets), _opt_str("unban", args, "set"), _origin("unban", args),
                     _opt_str("unban", args, "jail") or "", _reply("unban", args))


def _origin(cmd: str, args: dict[str, Any]) -> str:
    origin = args.get("origin") or "cli"
    if origin not in ORIGINS:
        raise ProtocolError(f"{cmd}: 'origin' must be one of {', '.join(ORIGINS)}")
    return str(origin)


def _parse_list(args: dict[str, Any]) -> ListArgs:
    _check_keys("list", args, ("set",))
    return ListArgs(_opt_str("list", args, "set"))


def _parse_check(args: dict[str, Any]) -> CheckArgs:
    _check_keys("check", args, ("target",))
    return CheckArgs(_req_str("check", args, "target"))


def _parse_feeds_accept(args: dict[str, Any]) -> FeedsRefreshArgs:
    _check_keys("feeds_accept", args, ("name",))
    return FeedsRefreshArgs(_req_str("feeds_accept", args, "name"))


def _parse_feeds_refresh(args: dict[str, Any]) -> FeedsRefreshArgs:
    _check_keys("feeds_refresh", args, ("name",))
    return FeedsRefreshArgs(_req_str("feeds_refresh", args, "name"))


def _no_args(cmd: str) -> Any:
    def parse(args: dict[str, Any]) -> NoArgs:
        _check_keys(cmd, args, ())
        return NoArgs()

    return parse


_PARSERS: Final = {
    "ping": _no_args("ping"),
    "ban": _parse_ban,
    "unban": _parse_unban,
    "list": _parse_list,
    "status": _no_args("status"),
    "check": _parse_check,
    "feeds": _no_args("feeds"),
    "fleet": _no_args("fleet"),
    "feeds_refresh": _parse_feeds_refresh,
    "feeds_accept": _parse_feeds_accept,
    "reload": _no_args("reload"),
}
COMMANDS: Final = frozenset(_PARSERS)


def parse_args(cmd: str, args: dict[str, Any]) -> CommandArgs:
    """Validate a command's arguments by the documented rules; raises ProtocolError (`bad_request`)."""
    parser = _PARSERS.get(cmd)
    if parser is None:
        raise ProtocolError(f"unknown command {cmd!r} (known: {', '.join(sorted(COMMANDS))})")
    result: CommandArgs = parser(args)
    return result


# --- result helpers ------------------------------------------------------------------------------------


def ban_entry(info: BanInfo, now: float) -> dict[str, Any]:
    """One element of `list`'s and `check`'s `bans`; `expires_in` is computed from `until` and `now`."""
    entry = {
        "target": format_target(info.target),
        "blocklist": info.blocklist,
        "set": info.set_name,
        "until": info.until,
        "expires_in": None if info.until is None else max(0.0, round(info.until - now, 3)),
        "origin": info.origin,
        "reason": info.reason,
        "jail": info.jail,
    }
    host = fleet_origin_host(info.origin, info.reason)
    if host is not None:  # a ban applied from the fleet: the host that decided it
        entry["origin_host"] = host
    return entry
