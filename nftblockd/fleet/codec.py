"""Fleet events: one ban or unban as it travels through the stream, and its field encoding.

An entry of the `events` stream is a flat map of short ASCII fields:

    v       schema version, "1"
    op      "ban" | "unban"
    net     canonical address or prefix, host bits zero ("203.0.113.7", "2001:db8::/48")
    until   absolute end in unix seconds ("1767225600.5"), "inf" for permanent; for an unban: "0"
    origin  the publishing host's stable id
    oseq    the origin's persisted counter: (origin, oseq) names one event for tracing and dedupe
    src     what decided it on the origin: "jail:sshd", "cli", "escalation"
    ts      publish time in unix milliseconds (for the propagation-lag metric only)

`decode` never raises: whatever a hostile or broken peer wrote comes back as a `Rejection` with a reason from
`REASONS`, so the receive loop counts it and moves on. Fields this version does not know are ignored (a later
minor change may add some); a different `v` is refused as a whole.

This module is pure: no IO, no clock, no redis import.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from ..events import IPNet, format_target, normalise_network

SCHEMA = "1"
MAX_UNTIL = 4102444800.0  # 2100-01-01: an end beyond this is not a clock, it is garbage
MAX_FIELD = 128  # bytes of any one field value we are willing to look at

Op: TypeAlias = Literal["ban", "unban"]
Reason: TypeAlias = Literal[
    "version", "malformed", "bad_net", "host_bits", "bad_until",  # codec
    "too_wide", "never_ban", "allowlisted", "expired", "rate",  # gate
]
REASONS: tuple[Reason, ...] = ("version", "malformed", "bad_net", "host_bits", "bad_until", "too_wide",
                               "never_ban", "allowlisted", "expired", "rate")

_ORIGIN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
_SRC_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}")


@dataclass(frozen=True, slots=True)
class FleetEvent:
    op: Op
    net: IPNet
    until: float  # absolute unix seconds; math.inf = permanent; 0.0 for an unban
    origin: str
    oseq: int
    src: str = "cli"
    ts: int = 0  # unix milliseconds at publish


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why an event was refused; `detail` is for a debug log line, never for a metric label."""

    reason: Reason
    detail: str = ""


def encode(ev: FleetEvent) -> dict[str, str]:
    """The stream fields of `ev`. The caller passes canonical values (the codec does not re-check them)."""
    return {
        "v": SCHEMA,
        "op": ev.op,
        "net": format_target(ev.net),
        "until": "inf" if ev.until == math.inf else repr(float(ev.until)),
        "origin": ev.origin,
        "oseq": str(ev.oseq),
        "src": ev.src,
        "ts": str(ev.ts),
    }


def _text(fields: Mapping[Any, Any], key: str) -> str | None:
    v = fields.get(key)
    if v is None:
        v = fields.get(key.encode())
    if v is None:
        return None
    if isinstance(v, bytes):
        if len(v) > MAX_FIELD:
            return None
        try:
            return v.decode("ascii")
        except UnicodeDecodeError:
            return None
    return v if isinstance(v, str) and len(v) <= MAX_FIELD else None


def parse_net(text: str) -> IPNet | Rejection:
    """A canonical network from the text form; host bits set is its own reason (a sloppy or hostile peer)."""
    if not text or "%" in text or text != text.strip():
        return Rejection("bad_net", text)
    try:
        net: IPNet = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return Rejection("bad_net", text)
    if "/" in text:
        try:
            ipaddress.ip_network(text, strict=True)
        except ValueError:
            return Rejection("host_bits", text)
    return normalise_network(net)


def _until(text: str, op: str) -> float | Rejection:
    if text == "inf":
        return math.inf if op == "ban" else Rejection("bad_until", text)
    try:
        v = float(text)
    except ValueError:
        return Rejection("bad_until", text)
    if not math.isfinite(v) or v < 0 or v > MAX_UNTIL:
        return Rejection("bad_until", text)
    return v


def _int(text: str | None) -> int | None:
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 19:
        return None
    return int(text)


def decode(fields: Mapping[Any, Any]) -> FleetEvent | Rejection:
    """The event in a stream entry's fields, or why it is refused. Never raises."""
    try:
        v = _text(fields, "v")
        if v != SCHEMA:
            return Rejection("version", repr(v))
        op = _text(fields, "op")
        if op not in ("ban", "unban"):
            return Rejection("malformed", f"op={op!r}")
        origin = _text(fields, "origin")
        if origin is None or not _ORIGIN_RE.fullmatch(origin):
            return Rejection("malformed", f"origin={origin!r}")
        oseq = _int(_text(fields, "oseq"))
        if oseq is None:
            return Rejection("malformed", "oseq")
        src = _text(fields, "src") or "cli"
        if not _SRC_RE.fullmatch(src):
            return Rejection("malformed", f"src={src!r}")
        ts = _int(_text(fields, "ts") or "0")
        if ts is None:
            return Rejection("malformed", "ts")
        net_text = _text(fields, "net")
        if net_text is None:
            return Rejection("bad_net", "missing")
        net = parse_net(net_text)
        if isinstance(net, Rejection):
            return net
        until_text = _text(fields, "until")
        if until_text is None:
            return Rejection("bad_until", "missing")
        until = _until(until_text, op)
        if isinstance(until, Rejection):
            return until
        return FleetEvent("ban" if op == "ban" else "unban", net, until, origin, oseq, src, ts)
    except Exception as exc:  # a peer's bytes must never take the receive loop down
        return Rejection("malformed", f"{type(exc).__name__}: {exc}")


__all__ = ["REASONS", "SCHEMA", "FleetEvent", "Op", "Reason", "Rejection", "decode", "encode", "parse_net"]
