"""Values that cross module boundaries: log lines, hits and ban decisions.

Everything here is a frozen, slotted dataclass or a pure function. Decisions (`Ban`, `Unban`) are plain
serialisable values (`to_dict` / `from_dict`) so that a decision can come from a log jail, the CLI, a feed,
fail2ban or, later, a fleet stream, and be replayed from the store. Nothing here does IO or reads the clock.
Addresses are `ipaddress` values; their text, int and byte forms are `addr`'s business, not this module's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeAlias

from nftblockd.addr import IPAddr, IPNet, format_target, parse_target


class LogLine(NamedTuple):
    """One line from a source. `time` is the source's own timestamp (journal) or None (files).

    A NamedTuple, not a frozen dataclass: sources build one per log line, and a frozen dataclass's
    __init__ made construction 85 % of the tailer's time (bench_tail: 265k -> 614k lines/s).
    """

    source: str
    text: str
    time: float | None = None


class Hit(NamedTuple):
    """A filter matched: `host` failed at `time` (the line's timestamp if it had one, else arrival).

    A NamedTuple like LogLine: one is built per failure on the jails' hot path.
    """

    jail: str
    host: IPAddr
    time: float
    line: str = ""


Origin: TypeAlias = Literal["cli", "jail", "feed", "fail2ban", "store", "remote", "kernel"]


# The longest reason or comment a ban carries. A client's text is refused beyond it (control protocol, CLI);
# the audit log and the database clip to it as the last guard (issue 13: a 5 MB comment became a 5 MB audit
# line and a 5 MB database row). The kernel keeps less still: a comment is at most 253 bytes there.
MAX_REASON = 256


def clip_reason(text: str) -> str:
    """`text`, cut to MAX_REASON characters (an ellipsis marks the cut)."""
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 1] + "\u2026"


@dataclass(frozen=True, slots=True)
class Ban:
    """Block `target` in `blocklist` until the wall-clock time `until` (epoch seconds; None: never, the end of
    a ban of length durations.PERMANENT — made by durations.ban_end, the only meaning None has for an end).

    `until` is absolute so that decisions can be coalesced ("the later end wins"), stored and replayed
    across restarts; the kernel timeout is computed from it at the moment of sending.
    """

    target: IPNet
    blocklist: str
    until: float | None
    origin: Origin = "cli"
    reason: str = ""
    jail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "ban",
            "target": format_target(self.target),
            "blocklist": self.blocklist,
            "until": self.until,
            "origin": self.origin,
            "reason": self.reason,
            "jail": self.jail,
        }


@dataclass(frozen=True, slots=True)
class Unban:
    target: IPNet
    blocklist: str
    origin: Origin = "cli"
    reason: str = ""
    jail: str = ""  # the jail that asked (fail2ban's, through the control socket), for the audit line

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "unban",
            "target": format_target(self.target),
            "blocklist": self.blocklist,
            "origin": self.origin,
            "reason": self.reason,
            "jail": self.jail,
        }


Decision: TypeAlias = Ban | Unban


def decision_from_dict(d: dict[str, Any]) -> Decision:
    """Inverse of `to_dict`; raises ValueError (AddressError) for anything malformed."""
    kind = d.get("type")
    target = parse_target(str(d["target"]))
    blocklist = str(d["blocklist"])
    if kind == "ban":
        until = d.get("until")
        return Ban(
            target=target,
            blocklist=blocklist,
            until=None if until is None else float(until),
            origin=d.get("origin", "remote"),
            reason=str(d.get("reason", "")),
            jail=str(d.get("jail", "")),
        )
    if kind == "unban":
        return Unban(target=target, blocklist=blocklist, origin=d.get("origin", "remote"),
                     reason=str(d.get("reason", "")), jail=str(d.get("jail", "")))
    raise ValueError(f"unknown decision type {kind!r}")


# -- fleet values ---------------------------------------------------------------------------------------
# What the fleet service (fleet/) hands the enforcer (kernel/): they live here because kernel/ sits below
# fleet/ and must not import it.

FLEET_REASON = "fleet:"  # a fleet ban's reason is "fleet:<origin host id>" (the host that decided it)


def fleet_reason(origin_host: str) -> str:
    return FLEET_REASON + (origin_host or "?")


def fleet_origin_host(origin: str, reason: str) -> str | None:
    """The host a ban came from, for a ban applied from the fleet (origin "remote"); None otherwise."""
    if origin == "remote" and reason.startswith(FLEET_REASON):
        return reason[len(FLEET_REASON):]
    return None


@dataclass(frozen=True, slots=True)
class LocalBan:
    """A ban this host decided itself (a jail, the CLI): when it was made and until when."""

    created: float
    until: float  # math.inf for permanent


@dataclass(frozen=True, slots=True)
class FleetBan:
    net: IPNet
    until: float  # absolute; math.inf permanent
    origin: str  # the host that decided it ("" when it comes from a snapshot)


@dataclass(frozen=True, slots=True)
class FleetUnban:
    """Remove the fleet-origin element for `net`; also a local-origin ban made before `at` (None: never).
    `owner`: the host whose unban this is, which lifts only a fleet ban that host made (never a local one);
    None: the operator role's, which lifts any."""

    net: IPNet
    at: float | None
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class FleetHosts:
    """Many `FleetBan`s of single addresses at once, all of one IP version and origin host: the host keys (ints,
    as `addr.net_key` of the /32 or /128), each with its own end. The receive loop's fast form for a catch-up of
    plain bans: no network object per address on the way from the stream to the kernel (fleet/service.py
    `_apply`). One end per key, not per group: a jail's bans each end bantime after their own detection, and
    100k one-address groups cost a catch-up more than its 100k addresses (issue #22)."""

    version: int
    origin: str
    keys: tuple[int, ...]
    ends: tuple[float, ...]  # absolute, one per key; math.inf permanent
    # `ends` in whole ms (`ends.secs_ms`), where the decoder made them already (none permanent): the ban state's
    # unit, not converted again (~7 ms per 100k). Derived from `ends`, so no part of equality.
    ends_ms: tuple[int, ...] | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class FleetChange:
    """What one kernel transaction does for the fleet. An address appears at most once across `bans`, `hosts`
    and `unbans`."""

    bans: tuple[FleetBan, ...] = ()
    unbans: tuple[FleetUnban, ...] = ()
    hosts: tuple[FleetHosts, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.bans or self.unbans or self.hosts)


@dataclass(frozen=True, slots=True)
class BanInfo:
    """What the daemon knows about one active ban (answers `list` and `check`)."""

    target: IPNet
    blocklist: str
    set_name: str
    until: float | None
    origin: str
    reason: str
    jail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
