"""Fleet events: one ban or unban as it travels through the stream, and its field encoding.

An entry of the `events` stream is a flat map of short ASCII fields:

    v       schema version, "2" (per-host keys; all hosts of a fleet upgrade together, docs/fleet.md)
    op      "ban" | "unban"
    net     canonical address or prefix, host bits zero ("203.0.113.7", "2001:db8::/48")
    until   absolute end in unix seconds ("1767225600.5"), "inf" for permanent; for an unban: "0"
    origin  the publishing host's stable id: it must be the host whose stream holds the entry (else refused,
            "origin"); the operator role's entries say "operator"
    oseq    the origin's persisted counter: (origin, oseq) names one event for tracing and dedupe
    src     what decided it on the origin: "jail:sshd", "cli", "escalation"
    ts      publish time in unix milliseconds (for the propagation-lag metric only)

`decode` is the receive loop's per-entry cost (a 100k catch-up decodes 100k entries): it reads the bytes redis
hands over without copying them into str first, and single addresses skip `ipaddress` parsing.
`decode` never raises: whatever a hostile or broken peer wrote comes back as a `Rejection` with a reason from
`REASONS`, so the receive loop counts it and moves on. Fields this version does not know are ignored (a later
minor change may add some); a different `v` is refused as a whole.

This module is pure: no IO, no clock, no redis import.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeAlias

from nftblockd.addr import (
    AddressError,
    HostBitsError,
    IPNet,
    format_target,
    host_net4,
    host_net6,
    parse_host_int,
    parse_target,
    split_hosts,
)
from nftblockd.ends import secs_ms

SCHEMA = "2"
_SCHEMA_B = SCHEMA.encode()
MAX_UNTIL = 4102444800.0  # 2100-01-01: an end beyond this is not a clock, it is garbage
MAX_FIELD = 128  # bytes of any one field value we are willing to look at

Op: TypeAlias = Literal["ban", "unban"]
Reason: TypeAlias = Literal[
    "version", "malformed", "bad_net", "host_bits", "bad_until",  # codec
    "too_wide", "never_ban", "allowlisted", "expired", "rate",  # gate
    "origin",  # the receive loop: an origin field that is not the stream's host
]
REASONS: tuple[Reason, ...] = ("version", "malformed", "bad_net", "host_bits", "bad_until", "too_wide",
                               "never_ban", "allowlisted", "expired", "rate", "origin")

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


def _as_bytes(fields: Mapping[Any, Any]) -> Mapping[Any, Any]:
    """redis-py hands bytes keys and values; tests and tools may use str. Normalise once, to bytes."""
    for k in fields:
        if isinstance(k, bytes):
            return fields
        break
    else:
        return fields
    return {(k.encode() if isinstance(k, str) else k): (v.encode() if isinstance(v, str) else v)
            for k, v in fields.items()}


@functools.lru_cache(maxsize=4096)
def _name(raw: bytes, pattern: re.Pattern[str]) -> str | None:
    """An origin or src field as text when it is well formed (memoised: a fleet has few of each)."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    return text if pattern.fullmatch(text) else None


def _uint(raw: Any) -> int | None:
    if not isinstance(raw, bytes) or not raw.isdigit() or len(raw) > 19:
        return None
    return int(raw)


def parse_net(text: str | bytes) -> IPNet | Rejection:
    """A canonical network from the text form; host bits set is its own reason (a sloppy or hostile peer)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            return Rejection("bad_net", repr(text))
    if "/" not in text:
        # the common case, a single address: inet_pton and the fast host constructors (~20x ipaddress)
        parsed = parse_host_int(text)
        if parsed is None:
            return Rejection("bad_net", text)
        return host_net4(parsed[1]) if parsed[0] == 4 else host_net6(parsed[1])
    if not text or "%" in text or text != text.strip():
        return Rejection("bad_net", text)
    try:
        return parse_target(text)  # addr's one rule: host bits set is refused, never widened
    except HostBitsError:
        return Rejection("host_bits", text)
    except AddressError:
        return Rejection("bad_net", text)


def _until(raw: bytes, op: str) -> float | Rejection:
    if raw == b"inf":
        return math.inf if op == "ban" else Rejection("bad_until", "inf")
    try:
        v = float(raw)
    except ValueError:
        return Rejection("bad_until", repr(raw))
    if not math.isfinite(v) or v < 0 or v > MAX_UNTIL:
        return Rejection("bad_until", repr(raw))
    return v


def decode(fields: Mapping[Any, Any]) -> FleetEvent | Rejection:
    """The event in a stream entry's fields, or why it is refused. Never raises."""
    try:
        get = _as_bytes(fields).get
        v = get(b"v")
        if v != _SCHEMA_B:
            return Rejection("version", repr(v.decode("ascii", "replace") if isinstance(v, bytes) else v))
        raw_op = get(b"op")
        if raw_op == b"ban":
            op: Op = "ban"
        elif raw_op == b"unban":
            op = "unban"
        else:
            return Rejection("malformed", f"op={raw_op!r}")
        raw = get(b"origin")
        origin = _name(raw, _ORIGIN_RE) if isinstance(raw, bytes) and len(raw) <= MAX_FIELD else None
        if origin is None:
            return Rejection("malformed", f"origin={raw!r}")
        oseq = _uint(get(b"oseq"))
        if oseq is None:
            return Rejection("malformed", "oseq")
        raw = get(b"src", b"cli")
        src = _name(raw, _SRC_RE) if isinstance(raw, bytes) and len(raw) <= MAX_FIELD else None
        if src is None:
            return Rejection("malformed", f"src={raw!r}")
        ts = _uint(get(b"ts", b"0"))
        if ts is None:
            return Rejection("malformed", "ts")
        raw = get(b"net")
        if not isinstance(raw, bytes) or len(raw) > MAX_FIELD:
            return Rejection("bad_net", "missing or too long")
        net = parse_net(raw)
        if isinstance(net, Rejection):
            return net
        raw = get(b"until")
        if not isinstance(raw, bytes) or len(raw) > MAX_FIELD:
            return Rejection("bad_until", "missing or too long")
        until = _until(raw, op)
        if isinstance(until, Rejection):
            return until
        return FleetEvent(op, net, until, origin, oseq, src, ts)
    except Exception as exc:  # a peer's bytes must never take the receive loop down
        return Rejection("malformed", f"{type(exc).__name__}: {exc}")


class PlainBans(NamedTuple):
    """`plain_bans`' answer: entry i of the read that is not this host's own is (versions[i], keys[i]) banned
    until untils[i] by origins[i], published at ts[i] (milliseconds), received at ats[i] (the
    server's entry id time, seconds). `ends_ms` is `untils` in whole ms (`ends.secs_ms`), the ban state's
    unit, made where the ends are read (the C loop makes them beside the floats); None when one is permanent."""

    own: dict[str, int]  # entries of this host's own, by op ("ban", "unban", "?")
    versions: list[int]
    keys: list[int]
    untils: list[float]
    origins: list[str]
    ats: list[float]
    ts: list[int]
    ends_ms: list[int] | None = None


def plain_ends_ms(untils: list[float]) -> list[int] | None:
    """`PlainBans.ends_ms` of `untils`: each in whole ms (truncated), None when one is permanent (inf)."""
    return None if math.inf in untils else secs_ms(untils)


class _NotPlain(Exception):
    """An entry `plain_bans` does not take (the read goes entry by entry, through `decode`)."""


def _checked_name(raw: Any, pattern: re.Pattern[str]) -> str:
    """An origin or src field's text, as `decode` accepts it; raises _NotPlain otherwise. (type() is, not
    isinstance: a bytes subclass or a bytearray goes the long way, through `decode`.)"""
    name = _name(raw, pattern) if type(raw) is bytes and len(raw) <= MAX_FIELD else None
    if name is None:
        raise _NotPlain
    return name


def _checked_until(raw: Any) -> float:
    """A ban's until field, as `decode` accepts it; raises _NotPlain otherwise."""
    value = _until(raw, "ban") if type(raw) is bytes and len(raw) <= MAX_FIELD else None
    if value is None or isinstance(value, Rejection):
        raise _NotPlain
    return value


def plain_bans(entries: Iterable[tuple[tuple[int, int], Mapping[Any, Any]]], own: bytes) -> PlainBans | None:
    """The read's entries decoded to ints when every one that is not this host's own (origin `own`) is a plain
    ban: schema `SCHEMA`, op "ban", one address (no "/"), every field well formed. None as soon as one is not
    (a range, an unban, anything `decode` would refuse): the caller then decodes the read entry by entry.

    The fast form of `decode` for the common read (a catch-up is all single-address bans): no network object,
    `FleetEvent` or `Rejection` per entry, and each distinct origin, src and until checked once per read.
    Where it answers, it agrees with `decode` field for field (tests/unit/test_fleet_batch.py). Never raises."""
    owned: dict[str, int] = {}
    nets: list[bytes] = []
    untils: list[float] = []
    origins: list[str] = []
    ats: list[float] = []
    tss: list[int] = []
    names: dict[Any, str] = {}  # origin field -> text, once checked
    srcs: set[Any] = set()
    ends: dict[Any, float] = {}
    schema = _SCHEMA_B
    try:
        for sid, fields in entries:
            get = fields.get
            o = get(b"origin")
            if o == own:
                op = get(b"op")
                label = "ban" if op == b"ban" else "unban" if op == b"unban" else "?"
                owned[label] = owned.get(label, 0) + 1
                continue
            if get(b"v") != schema or get(b"op") != b"ban":
                return None
            origin = names.get(o)
            if origin is None:
                origin = names[o] = _checked_name(o, _ORIGIN_RE)
            src = get(b"src", b"cli")
            if src not in srcs:
                _checked_name(src, _SRC_RE)
                srcs.add(src)
            q = get(b"oseq")
            if type(q) is not bytes or not q.isdigit() or len(q) > 19:
                return None
            t = get(b"ts", b"0")
            if type(t) is not bytes or not t.isdigit() or len(t) > 19:
                return None
            n = get(b"net")
            if type(n) is not bytes or len(n) > MAX_FIELD or b"/" in n:
                return None
            u = get(b"until")
            end = ends.get(u)
            if end is None:
                end = ends[u] = _checked_until(u)
            nets.append(n)
            untils.append(end)
            origins.append(origin)
            ats.append(sid[0] / 1000)
            tss.append(int(t))
        parsed = _hosts(nets)
    except Exception:  # not plain, or odd (unhashable values, non-ASCII bytes, ...): `decode` says what it is
        return None
    if parsed is None:
        return None
    return PlainBans(owned, parsed[0], parsed[1], untils, origins, ats, tss, plain_ends_ms(untils))


def _hosts(nets: list[bytes]) -> tuple[list[int], list[int]] | None:
    """(versions, host keys) of the address fields `nets`, in order, or None if one is not an address as
    `parse_net` reads it. All IPv4 (a catch-up's usual read): inet_pton mapped over them (`addr.split_hosts`),
    no function call of ours per address."""
    if not b"".join(nets).isascii():
        return None
    texts = list(map(bytes.decode, nets))
    split = split_hosts(texts, spelled=False)
    if not split.rest and not split.keys[6]:
        return [4] * len(texts), split.keys[4]
    parsed = list(map(parse_host_int, texts))  # IPv6 or IPv4-mapped among them, or not addresses: in order
    if None in parsed:
        return None
    return [p[0] for p in parsed if p is not None], [p[1] for p in parsed if p is not None]


__all__ = ["REASONS", "SCHEMA", "FleetEvent", "Op", "PlainBans", "Reason", "Rejection", "decode", "encode",
           "parse_net", "plain_bans"]
