"""Values that cross module boundaries: addresses, log lines, hits and ban decisions.

Everything here is a frozen, slotted dataclass or a pure function. Decisions (`Ban`, `Unban`) are plain
serialisable values (`to_dict` / `from_dict`) so that a decision can come from a log jail, the CLI, a feed,
fail2ban or, later, a fleet stream, and be replayed from the store. Nothing here does IO or reads the clock.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeAlias

IPNet: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddr: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address

_V4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


class AddressError(ValueError):
    """The text is not an address or CIDR nftblockd accepts (the caller's input is at fault)."""


def normalise_address(addr: IPAddr) -> IPAddr:
    """IPv4-mapped IPv6 (`::ffff:1.2.3.4`) becomes the IPv4 address it carries; everything else is unchanged."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def normalise_network(net: IPNet) -> IPNet:
    """`::ffff:10.0.0.0/104` becomes `10.0.0.0/8`; prefixes shorter than /96 keep their IPv6 form."""
    if isinstance(net, ipaddress.IPv6Network) and net.prefixlen >= 96 and net.subnet_of(_V4_MAPPED):
        v4 = ipaddress.IPv4Address(int(net.network_address) & 0xFFFFFFFF)
        return ipaddress.IPv4Network((v4, net.prefixlen - 96))
    return net


def _host_network_fast(cls: type[Any], addr_cls: type[Any], bits: int) -> Callable[[int], Any]:
    """A constructor of single-address networks that skips ipaddress's parsing: the tracker builds one per
    ban and `IPv4Network((x, 32))` costs ~6 us of splitting, mask lookup and checks. It sets the same
    attributes the real __init__ does, and is used only if that holds on this Python (checked below)."""
    mask = cls((0, bits)).netmask  # the real constructor's shared netmask object

    def make(x: int) -> Any:
        net = object.__new__(cls)
        a = addr_cls(x)
        net.network_address = a
        net.netmask = mask
        net._prefixlen = bits
        net.hosts = lambda: [a]
        return net

    def real(x: int) -> Any:
        return cls((x, bits))

    probe = 0x0A000001 if bits == 32 else 0x20010DB8 << 96 | 1
    fast, slow = make(probe), real(probe)
    same = (set(vars(fast)) == set(vars(slow)) and fast == slow and hash(fast) == hash(slow)
            and str(fast) == str(slow) and fast.hosts() == slow.hosts() and fast.netmask == slow.netmask
            and fast.broadcast_address == slow.broadcast_address and fast.num_addresses == 1)
    return make if same else real


host_network4: Callable[[int], ipaddress.IPv4Network] = _host_network_fast(ipaddress.IPv4Network,
                                                                          ipaddress.IPv4Address, 32)
"""`IPv4Network((x, 32))`, fast."""
host_network6: Callable[[int], ipaddress.IPv6Network] = _host_network_fast(ipaddress.IPv6Network,
                                                                          ipaddress.IPv6Address, 128)
"""`IPv6Network((x, 128))`, fast."""


def parse_target(text: str, *, strict: bool = False) -> IPNet:
    """Parse an address or CIDR into a network (`1.2.3.4` → `1.2.3.4/32`).

    With `strict`, a CIDR with host bits set (`10.0.0.5/8`) is refused; otherwise it is widened to its
    network. Scoped addresses (`fe80::1%eth0`), names and leading-zero octets are always refused: nftblockd
    never guesses.
    """
    s = text.strip()
    if not s or "%" in s or len(s) > 64:
        raise AddressError(f"not an IP address or CIDR: {text!r}")
    try:
        if "/" in s:
            net: IPNet = ipaddress.ip_network(s, strict=strict)
        else:
            addr = ipaddress.ip_address(s)
            net = ipaddress.ip_network(addr)
    except ValueError as exc:
        raise AddressError(f"not an IP address or CIDR: {text!r} ({exc})") from None
    return normalise_network(net)


def parse_host_int(text: str) -> tuple[int, int] | None:
    """(version, address as int) for a plain address, IPv4-mapped IPv6 folded to IPv4; None for anything else
    (CIDRs, garbage), which the caller hands to `parse_target` for the full rules and error message.

    The bulk paths parse hundreds of thousands of addresses; inet_pton is ~20x faster than ipaddress here and
    just as strict (no leading zeros, no scope ids, no short forms).
    """
    try:
        if ":" not in text:
            return 4, int.from_bytes(socket.inet_pton(socket.AF_INET, text), "big")
        v6 = int.from_bytes(socket.inet_pton(socket.AF_INET6, text), "big")
    except OSError:
        return None
    if v6 >> 32 == 0xFFFF:
        return 4, v6 & 0xFFFFFFFF
    return 6, v6


def is_single(net: IPNet) -> bool:
    return net.prefixlen == net.max_prefixlen


def format_target(net: IPNet) -> str:
    """`1.2.3.4/32` prints as `1.2.3.4`; ranges keep their prefix."""
    if type(net) is ipaddress.IPv4Network and net.prefixlen == 32:
        # inet_ntoa in C, not ipaddress's join of four str(): every saved ban's history row comes here
        return socket.inet_ntoa(int(net.network_address).to_bytes(4, "big"))
    return str(net.network_address) if is_single(net) else str(net)


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


@dataclass(frozen=True, slots=True)
class Ban:
    """Block `target` in `blocklist` until the wall-clock time `until` (epoch seconds; None = no expiry).

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
    target = parse_target(str(d["target"]), strict=True)
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
