"""The address codec: every form an address or a network takes in nftblockd, and every conversion between them.

Pure: no IO, no clock, no state. It must not know about sets, bans, jails or feeds: those modules choose a
form and call this one to convert (`socket` is imported only for inet_pton/inet_ntop/inet_ntoa, the C codecs).

Forms
    text          what operators, logs, feeds and the control socket write: `203.0.113.7`, `10.0.0.0/8`.
    IPNet/IPAddr  `ipaddress` objects: the targets of `Ban`, the hosts of `Hit`, config and the allowlist.
    host key      one address as an int, `int(address)`: hash-set elements and the bulk paths.
    net key       one network as an int, `start << 8 | prefixlen`: interval-set elements, feed entries,
                  tracker offenders. Sorting net keys sorts by start address. The family is NOT in the key:
                  it travels beside it (per-family lists, `SetSpec.version`), so 4 and 6 are never mixed.
    tagged key    a host key or net key made unique across both families, for a dict holding both
                  (`tagged_key`): an IPv4 address is its own value, anything else a net key above `V4_TAG`
                  (IPv4) or `V6_TAG` (IPv6).
    packed bytes  the big-endian bytes of a host key (4 or 16 bytes) or of a net key (5 or 17: the address
                  bytes, then the prefix length): the store's form (`pack_target`) and netlink's.

Rules, the same on every path
    - Strict: no leading zeros (`010.0.0.1` is octal to some parsers), no scope ids (`fe80::1%eth0`), no
      names, no short IPv4 forms (`10.1`). nftblockd never guesses.
    - IPv4-mapped IPv6 (`::ffff:1.2.3.4`) becomes the IPv4 it carries: one host, one key. A mapped network
      does so when it is /96 or longer; a shorter one stays IPv6.
    - A CIDR with host bits set (`10.0.0.5/8`, `2001:db8:f3::1/17`) is refused, on every path and by every
      parser here, with `HostBitsError` (an `AddressError`) naming the text. It is never widened to the
      network it lies in: `45.67.89.10/9` is a typo for one address far more often than a wish to block
      8.4 million. Callers count the refusal under the reason `host_bits` (docs/addresses.md).
    - Canonical text: a single address prints bare (`1.2.3.4`, not `1.2.3.4/32`); IPv6 as ipaddress prints
      it (RFC 5952, lower case, `::` for the longest zero run).

Fast paths. The plain versions are `parse_target` and the `ipaddress` constructors and `str()`. Bulk and hot
paths (a million-line feed, `nftblock ban -` of 100k addresses, a burst of bans) use the versions below
instead; each is held to its plain version by a hypothesis test in tests/unit/test_addr.py and measured
against it by bench/bench_addr.py (ratio to the plain version on this 2-core VM, Python 3.11, busy):
    parse_v4, parse_host_int, split_hosts   inet_pton in C, not ipaddress's per-octet Python     0.03-0.10
    parse_key                               a feed line to (version, net key), no objects             0.09
    host_net4, host_net6                    a single-address network without argument parsing    0.5-0.7
    format_host, target_text                inet_ntoa/inet_ntop, not ipaddress's join of str()s  0.12-0.30
    unpack_hosts                            one C-level byte swap for a blob of IPv4 addresses   0.05-0.10
"""

from __future__ import annotations

import array
import functools
import ipaddress
import operator
import socket
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, TypeAlias

__all__ = [
    "V4_TAG",
    "V6_TAG",
    "AddressError",
    "HostBitsError",
    "HostSplit",
    "IPAddr",
    "IPNet",
    "Range",
    "format_host",
    "format_target",
    "host_net",
    "host_net4",
    "host_net4_at",
    "host_net6",
    "is_single",
    "key_net",
    "key_range",
    "net_key",
    "normalise_address",
    "normalise_network",
    "pack_hosts",
    "pack_target",
    "parse_host_int",
    "parse_key",
    "parse_target",
    "parse_v4",
    "split_hosts",
    "tagged_key",
    "tagged_net",
    "target_text",
    "unpack_hosts",
    "unpack_target",
]

IPNet: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddr: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
Range: TypeAlias = tuple[int, int]  # inclusive (first, last) address as ints

_ALL32 = 0xFFFFFFFF
_ALL128 = (1 << 128) - 1
_V4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_V4_MAPPED_HI = 0xFFFF  # a host key of ::ffff:0:0/96, shifted right by 32
_V4_MAPPED_BYTES = b"\x00" * 10 + b"\xff\xff"
_PTON, _AF4, _AF6, _NTOA, _NTOP = socket.inet_pton, socket.AF_INET, socket.AF_INET6, socket.inet_ntoa, socket.inet_ntop
_V4 = ipaddress.IPv4Address
_FROM_BYTES = int.from_bytes
_PTON4: Callable[[str], bytes] = functools.partial(_PTON, _AF4)


class AddressError(ValueError):
    """The text is not an address or CIDR nftblockd accepts (the caller's input is at fault)."""


class HostBitsError(AddressError):
    """A CIDR with host bits set (`10.0.0.5/8`): refused, never widened to the network it lies in.

    `network` is that wider network, for the message only: nothing here or in a caller uses it as a target.
    """

    def __init__(self, text: str, network: IPNet) -> None:
        self.text = text
        self.network = network
        super().__init__(
            f"{text!r} has host bits set, so it is not a network: write the address alone for one host, or "
            f"{network} if that whole range ({network.num_addresses} addresses) is meant; never widened")


# -- ipaddress values -------------------------------------------------------------------------------------


def normalise_address(addr: IPAddr) -> IPAddr:
    """IPv4-mapped IPv6 (`::ffff:1.2.3.4`) becomes the IPv4 address it carries; everything else is unchanged."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def normalise_network(net: IPNet) -> IPNet:
    """`::ffff:10.0.0.0/104` becomes `10.0.0.0/8`; prefixes shorter than /96 keep their IPv6 form."""
    if isinstance(net, ipaddress.IPv6Network) and net.prefixlen >= 96 and net.subnet_of(_V4_MAPPED):
        v4 = ipaddress.IPv4Address(int(net.network_address) & _ALL32)
        return ipaddress.IPv4Network((v4, net.prefixlen - 96))
    return net


def is_single(net: IPNet) -> bool:
    return net.prefixlen == net.max_prefixlen


def parse_target(text: str) -> IPNet:
    """Parse an address or CIDR into a network (`1.2.3.4` → `1.2.3.4/32`): the plain, authoritative parser.

    A CIDR with host bits set (`10.0.0.5/8`) raises `HostBitsError`; scoped addresses (`fe80::1%eth0`),
    names and leading-zero octets raise `AddressError`. Nothing is ever widened.
    """
    s = text.strip()
    if not s or "%" in s or len(s) > 64:
        raise AddressError(f"not an IP address or CIDR: {text!r}")
    try:
        if "/" in s:
            net: IPNet = ipaddress.ip_network(s)
        else:
            net = ipaddress.ip_network(ipaddress.ip_address(s))
    except ValueError as exc:
        wide = _host_bits_network(s)
        if wide is not None:
            raise HostBitsError(s, wide) from None
        raise AddressError(f"not an IP address or CIDR: {text!r} ({exc})") from None
    return normalise_network(net)


def _host_bits_network(s: str) -> IPNet | None:
    """The network a CIDR with host bits set lies in (for `HostBitsError`'s message), None if `s` is not
    such a CIDR (it is garbage for another reason)."""
    if "/" not in s:
        return None
    try:
        return normalise_network(ipaddress.ip_network(s, strict=False))
    except ValueError:
        return None


def format_target(net: IPNet) -> str:
    """`1.2.3.4/32` prints as `1.2.3.4`; ranges keep their prefix."""
    # The address through format_host (in C), not ipaddress's join of four str() (0.5 us) or its hextet
    # compression (4 us): every saved ban's history row comes here.
    # An IPv4 address is inet_ntoa'd right here, not through format_host's call and version test: a burst's
    # 10,000 history rows are nearly all IPv4 hosts (6.7 -> 4.9 ms for 10,000).
    plen = prefixlen_of(net)
    a = net.network_address
    if type(a) is _V4 or isinstance(a, _V4):  # the exact type first: isinstance is the slower test
        text = _NTOA(addr_int(a).to_bytes(4, "big"))
        return text if plen == 32 else f"{text}/{plen}"
    text = format_host(addr_int(a), 6) if a.scope_id is None else str(a)
    return text if plen == 128 else f"{text}/{plen}"


# -- fast text parsers ------------------------------------------------------------------------------------
# inet_pton is as strict as ipaddress (no leading zeros, no scope ids, no short forms) and runs in C: it is
# ~10x cheaper per address. It raises OSError for anything else, ValueError for text with a NUL in it.


def parse_v4(text: str) -> int | None:
    """The host key of a dotted quad (`'10.0.0.1'` → 167772161), None for anything else (no stripping)."""
    try:
        return _FROM_BYTES(_PTON(_AF4, text), "big")
    except (OSError, ValueError):
        return None


def parse_host_int(text: str) -> tuple[int, int] | None:
    """(version, host key) for a plain address, IPv4-mapped IPv6 folded to IPv4; None for anything else
    (CIDRs, garbage, surrounding blanks), which the caller hands to `parse_target` for the full rules and
    error message."""
    try:
        if ":" not in text:
            return 4, _FROM_BYTES(_PTON(_AF4, text), "big")
        v6 = _FROM_BYTES(_PTON(_AF6, text), "big")
    except (OSError, ValueError):
        return None
    if v6 >> 32 == _V4_MAPPED_HI:
        return 4, v6 & _ALL32
    return 6, v6


class HostSplit(NamedTuple):
    """`split_hosts`'s answer: host keys per family, each key's spelling as given, and what is not a host."""

    keys: dict[int, list[int]]  # version -> host keys in the caller's order (duplicates kept)
    texts: dict[int, dict[int, str]]  # version -> host key -> the caller's spelling (the last one given)
    rest: list[int]  # indexes of the targets that are not plain addresses (CIDRs, garbage)


def split_hosts(targets: Sequence[str], *, spelled: bool = True) -> HostSplit:
    """`parse_host_int` over a bulk request: its plain addresses as host keys per family, with the caller's
    spelling of each (answers echo it), and the indexes of everything else for the one-by-one path.

    IPv4 is parsed inline (no function call per address): this runs once per address of `nftblock ban -`.
    A list of nothing but dotted quads (what `nftblock ban -` sends) takes `_all_v4`, a few C-level passes.
    Without `spelled`, `texts` stays empty (a caller that echoes nothing back).
    """
    whole = _all_v4(targets)
    if whole is not None:
        return HostSplit({4: whole, 6: []}, {4: dict(zip(whole, targets, strict=True)) if spelled else {}, 6: {}}, [])
    keys: dict[int, list[int]] = {4: [], 6: []}
    texts: dict[int, dict[int, str]] = {4: {}, 6: {}}
    rest: list[int] = []
    keys4, texts4 = keys[4], texts[4]
    pton, af4, from_bytes = _PTON, _AF4, _FROM_BYTES
    for i, target in enumerate(targets):
        if ":" not in target:
            try:
                k = from_bytes(pton(af4, target), "big")
            except (OSError, ValueError):
                rest.append(i)
                continue
            keys4.append(k)
            if spelled:
                texts4[k] = target
            continue
        parsed = parse_host_int(target)
        if parsed is None:
            rest.append(i)
        else:
            keys[parsed[0]].append(parsed[1])
            if spelled:
                texts[parsed[0]][parsed[1]] = target
    return HostSplit(keys, texts, rest)


def _all_v4(targets: Sequence[str]) -> list[int] | None:
    """The host keys of `targets` when every one is a dotted quad, else None: inet_pton mapped over the list
    and one byte swap of the joined result, no Python bytecode per address (~4x cheaper than the loop in
    `split_hosts`; bench/bench_addr.py). The first target that is anything else stops it (OSError, or
    ValueError for a NUL), and `split_hosts` takes its loop instead."""
    try:
        blob = b"".join(map(_PTON4, targets))
    except (OSError, ValueError, TypeError):
        return None
    return unpack_hosts(blob, 4)


_PLEN4 = {str(i): i for i in range(33)}  # canonical prefix lengths only; `/024` goes the plain way
_PLEN6 = {str(i): i for i in range(129)}
_MASK4 = [(_ALL32 << (32 - p)) & _ALL32 for p in range(33)]
_MASK6 = [_ALL128 ^ ((1 << (128 - p)) - 1) for p in range(129)]


def parse_key(text: str) -> tuple[int, int] | None:
    """(version, net key) for one address or CIDR, None if `parse_target` refuses it (host bits set
    included: call `parse_target` on a refused text for the reason).

    Accepts exactly what `parse_target` accepts. The common spellings are parsed with inet_pton; anything
    unusual (`/024`, netmask notation, garbage) goes through `parse_target` itself.
    """
    s = text.strip()
    ip, slash, plen_text = s.partition("/")
    if ":" not in ip:
        try:
            value = _FROM_BYTES(_PTON(_AF4, ip), "big")
            plen = _PLEN4[plen_text] if slash else 32
        except (OSError, ValueError, KeyError):
            return _slow_key(s)
        if value & ~_MASK4[plen]:
            return None  # host bits set
        return 4, value << 8 | plen
    try:
        v6 = _FROM_BYTES(_PTON(_AF6, ip), "big")
        plen = _PLEN6[plen_text] if slash else 128
    except (OSError, ValueError, KeyError):
        return _slow_key(s)
    if v6 & ~_MASK6[plen]:
        return None
    if plen >= 96 and v6 >> 32 == _V4_MAPPED_HI:
        return 4, (v6 & _ALL32) << 8 | (plen - 96)
    return 6, v6 << 8 | plen


def _slow_key(s: str) -> tuple[int, int] | None:
    try:
        net = parse_target(s)
    except AddressError:
        return None
    return net.version, net_key(net)


# -- host keys --------------------------------------------------------------------------------------------


def _fast_host_net(cls: type[Any], bits: int) -> tuple[Callable[[int], Any], Callable[[Any], Any]]:
    """Constructors of single-address networks that skip ipaddress's argument parsing: from a host key, and
    from an address object already at hand (which becomes the network's `network_address`).

    `IPv4Network((x, 32))` costs ~1.6 us (tuple splitting, netmask lookup, host-bit check); the tracker
    builds one per ban and the daemon one per restored jail ban. This builds the instance ipaddress's own
    __init__ builds: the same four instance attributes (network_address, the class's shared netmask,
    _prefixlen, and `hosts`, which __init__ sets per instance for a single address) in ~0.7 us, ~0.5 us
    from an address (a burst's matcher already built one per attacker: addresses are immutable, so sharing
    it is safe). They are used only if that still holds on this Python, checked here at import; otherwise
    the real constructor is.
    """
    addr_cls = cls._address_class
    mask = cls((0, bits)).netmask
    new = object.__new__

    def make_at(a: Any) -> Any:
        net = new(cls)
        net.network_address = a
        net.netmask = mask
        net._prefixlen = bits
        net.hosts = lambda: [a]
        return net

    def make(x: int) -> Any:
        return make_at(addr_cls(x))

    def real(x: int) -> Any:
        return cls((x, bits))

    def real_at(a: Any) -> Any:
        return cls((int(a), bits))

    probe = 0x0A000001 if bits == 32 else 0x20010DB8 << 96 | 1
    fast, slow = make(probe), real(probe)
    same = (set(vars(fast)) == set(vars(slow)) and fast == slow and hash(fast) == hash(slow)
            and str(fast) == str(slow) and fast.hosts() == slow.hosts() and fast.netmask == slow.netmask
            and fast.broadcast_address == slow.broadcast_address and fast.num_addresses == 1)
    return (make, make_at) if same else (real, real_at)


def _fast_addr_int() -> Callable[[IPAddr], int]:
    """`int(address)` without the Python-level `__int__` call (~0.1 us of the tracker's per-failure work): an
    ipaddress address keeps its value in its `_ip` slot, which the native matcher core also builds them
    through. Used only if that still holds on this Python, checked here at import; otherwise `int` is."""
    get = operator.attrgetter("_ip")
    probes = (ipaddress.IPv4Address("192.0.2.1"), ipaddress.IPv6Address("2001:db8::1"),
              ipaddress.IPv6Address("fe80::2%eth0"), ipaddress.IPv6Address("::ffff:192.0.2.1"))
    try:
        same = all(type(get(a)) is int and get(a) == int(a) for a in probes)
    except AttributeError:
        same = False
    return get if same else int


addr_int: Callable[[IPAddr], int] = _fast_addr_int()
"""`int(a)` for an IPv4Address or IPv6Address, fast."""


def _fast_prefixlen() -> Callable[[IPNet], int]:
    """`net.prefixlen` without the property's Python-level call: the value is the `_prefixlen` attribute the
    fast host networks above set too. Used only if that still holds on this Python, checked at import."""
    get = operator.attrgetter("_prefixlen")
    probes = (ipaddress.IPv4Network("192.0.2.0/24"), ipaddress.IPv6Network("2001:db8::/64"),
              ipaddress.IPv4Network("192.0.2.1/32"), ipaddress.IPv6Network("::/0"))
    try:
        same = all(type(get(n)) is int and get(n) == n.prefixlen for n in probes)
    except AttributeError:
        same = False
    return get if same else operator.attrgetter("prefixlen")


prefixlen_of: Callable[[IPNet], int] = _fast_prefixlen()
"""`net.prefixlen`, fast."""

_NET4 = _fast_host_net(ipaddress.IPv4Network, 32)
host_net4: Callable[[int], ipaddress.IPv4Network] = _NET4[0]
"""`IPv4Network((x, 32))`, fast."""
host_net4_at: Callable[[ipaddress.IPv4Address], ipaddress.IPv4Network] = _NET4[1]
"""`IPv4Network(a)` for an IPv4Address `a` (which the network keeps as its address), fast."""
host_net6: Callable[[int], ipaddress.IPv6Network] = _fast_host_net(ipaddress.IPv6Network, 128)[0]
"""`IPv6Network((x, 128))`, fast."""


def host_net(key: int, version: int) -> IPNet:
    """The single-address network of a host key."""
    return host_net4(key) if version == 4 else host_net6(key)


def format_host(key: int, version: int) -> str:
    """`format_target(host_net(key, version))`, in C: inet_ntoa, or inet_ntop where it spells IPv6 as
    ipaddress does (it writes the low 32 bits of `::a.b.c.d` and `::ffff:a.b.c.d` dotted; ipaddress does not)."""
    if version == 4:
        return _NTOA(key.to_bytes(4, "big"))
    if key >> 48:
        return _NTOP(_AF6, key.to_bytes(16, "big"))
    return str(ipaddress.IPv6Address(key))


def pack_hosts(keys: Iterable[int], version: int) -> list[bytes]:
    """Host keys as packed bytes (4 or 16 each)."""
    size = 4 if version == 4 else 16
    return [k.to_bytes(size, "big") for k in keys]


def unpack_hosts(blob: bytes, version: int) -> list[int]:
    """Concatenated packed addresses -> host keys. IPv4: one C-level byte swap instead of int.from_bytes each."""
    if version == 4:
        arr = array.array("I")
        arr.frombytes(blob)
        if sys.byteorder == "little":
            arr.byteswap()
        return arr.tolist()
    # IPv6: the 64-bit halves in one array byte swap, then one shift-or per address (~30 % under
    # int.from_bytes of each 16-byte slice)
    halves = array.array("Q")
    halves.frombytes(blob)
    if sys.byteorder == "little":
        halves.byteswap()
    return [hi << 64 | lo for hi, lo in zip(halves[0::2], halves[1::2], strict=True)]


_MAPPED_PREFIX = bytes(10) + b"\xff\xff"  # the first 12 bytes of a packed ::ffff:a.b.c.d


def split_packed6(blob: bytes) -> tuple[list[int], list[int]]:
    """Concatenated packed IPv6 addresses (16 bytes each) -> (IPv4 host keys, IPv6 host keys), each in
    order: an IPv4-mapped address (`::ffff:a.b.c.d`) is the IPv4 address, as `parse_host_int` reads its text.
    The mapped ones are found with bytes.find (no Python per address when there are none)."""
    mapped: list[int] = []
    i = blob.find(_MAPPED_PREFIX)
    while i >= 0:
        if i % 16 == 0:
            mapped.append(i)
            i = blob.find(_MAPPED_PREFIX, i + 16)
        else:
            i = blob.find(_MAPPED_PREFIX, i + 1)
    if not mapped:
        return [], unpack_hosts(blob, 6)
    keys4 = [_FROM_BYTES(blob[i + 12:i + 16], "big") for i in mapped]
    at = set(mapped)
    return keys4, [_FROM_BYTES(blob[i:i + 16], "big") for i in range(0, len(blob), 16) if i not in at]


_TOP = 3 if sys.byteorder == "little" else 0  # where an IPv4 key's first octet lies in its 4 array bytes


def first_octets(keys: Sequence[int]) -> bytes:
    """The first octet of every IPv4 host key, in order, as one bytes object: the keys into an array and one
    strided slice, no Python per key (bulk tests where the first octet decides for nearly every address)."""
    return array.array("I", keys).tobytes()[_TOP::4]


def top_halves(keys: Sequence[int]) -> array.array[int]:
    """The top 16 bits (`k >> 16`) of every IPv4 host key, in order: the keys into an array, read back as
    16-bit halves, every other one (no Python per key)."""
    halves = array.array("H")
    halves.frombytes(array.array("I", keys).tobytes())
    return halves[1::2] if sys.byteorder == "little" else halves[0::2]


def flagged(octets: bytes, table: bytes) -> list[int]:
    """The indexes i, in order, where `table[octets[i]]` is 1 (`table`: 256 bytes, each 0 or 1). One C-level
    translate over all of them, then one find per flagged index: for 100,000 keys of which few are flagged,
    a fraction of a comprehension that looks each one up (bench/bench_addr.py)."""
    return ones(octets.translate(table))


def ones(marks: bytes) -> list[int]:
    """The indexes i, in order, where `marks[i]` is 1 (one find per index found)."""
    out: list[int] = []
    i = marks.find(1)
    while i >= 0:
        out.append(i)
        i = marks.find(1, i + 1)
    return out


# -- net keys ---------------------------------------------------------------------------------------------


def net_key(net: IPNet) -> int:
    """`10.0.0.0/8` → `(10 << 24) << 8 | 8`: start address and prefix length in one int."""
    return int(net.network_address) << 8 | net.prefixlen


def key_net(key: int, version: int) -> IPNet:
    """Inverse of `net_key` for the given IP version (4 or 6)."""
    plen = key & 0xFF
    if version == 4:
        return host_net4(key >> 8) if plen == 32 else ipaddress.IPv4Network((key >> 8, plen))
    return host_net6(key >> 8) if plen == 128 else ipaddress.IPv6Network((key >> 8, plen))


def key_range(key: int, version: int) -> Range:
    """Inclusive (first, last) address of a net key."""
    start = key >> 8
    return start, start + (1 << ((32 if version == 4 else 128) - (key & 0xFF))) - 1


# -- tagged keys (both families in one dict) --------------------------------------------------------------

V4_TAG = 1 << 40  # above every IPv4 net key (< 2**40)
V6_TAG = 1 << 136  # above every IPv6 net key (< 2**136), and so above every tagged IPv4 key


def tagged_key(version: int, start: int, prefixlen: int) -> int:
    """A key unique across families: an IPv4 address is its own host key (< 2**32, the cheapest to hash and
    keep); anything else is its net key with its family's tag, so a /64 and the /128 of its first address
    never collide, and neither collides with an IPv4 key."""
    if version == 4:
        return start if prefixlen == 32 else V4_TAG | start << 8 | prefixlen
    return V6_TAG | start << 8 | prefixlen


def tagged_net(key: int) -> IPNet:
    """Inverse of `tagged_key`."""
    if key < V4_TAG:
        return host_net4(key)
    if key < V6_TAG:
        return ipaddress.IPv4Network(((key >> 8) & _ALL32, key & 0xFF))
    if key & 0xFF == 128:
        return host_net6((key >> 8) & _ALL128)
    return ipaddress.IPv6Network(((key >> 8) & _ALL128, key & 0xFF))


# -- packed bytes -----------------------------------------------------------------------------------------


def pack_target(net: IPNet) -> bytes:
    """Network address bytes (4 or 16), plus one prefix-length byte unless it is a single address.

    IPv4-mapped IPv6 (`::ffff:1.2.3.4`) is packed as the IPv4 address it carries, so one host has one key.
    """
    packed = net.network_address.packed
    plen = net.prefixlen
    if len(packed) == 16 and plen >= 96 and packed[:12] == _V4_MAPPED_BYTES:
        packed, plen = packed[12:], plen - 96
    if plen == len(packed) * 8:
        return packed
    return packed + bytes((plen,))


def unpack_target(key: bytes) -> IPNet:
    """Inverse of `pack_target`; raises ValueError for bytes that are not a packed target."""
    n = len(key)
    if n == 4:
        return host_net4(_FROM_BYTES(key, "big"))
    if n == 16:
        return host_net6(_FROM_BYTES(key, "big"))
    if n == 5:
        return ipaddress.IPv4Network((key[:4], key[4]))
    if n == 17:
        return ipaddress.IPv6Network((key[:16], key[16]))
    raise ValueError(f"not a packed target: {key!r}")


def _v6_text(packed: bytes) -> str:
    if packed[:10] == _V4_MAPPED_BYTES[:10]:
        return str(ipaddress.IPv6Address(packed))  # inet_ntop prints ::1.2.3.4, ipaddress ::102:304
    return _NTOP(_AF6, packed)


def target_text(key: bytes) -> str:
    """`format_target(unpack_target(key))`, without building ipaddress objects."""
    n = len(key)
    if n == 4:
        return _NTOA(key)
    if n == 16:
        return _v6_text(key)
    if n == 5:
        return f"{_NTOA(key[:4])}/{key[4]}"
    if n == 17:
        return f"{_v6_text(key[:16])}/{key[16]}"
    raise ValueError(f"not a packed target: {key!r}")
