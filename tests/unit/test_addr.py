"""addr: the codec's round trips, and every fast path held to its plain `ipaddress` version (hypothesis)."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nftblockd.addr import (
    V4_TAG,
    V6_TAG,
    AddressError,
    HostBitsError,
    IPNet,
    addr_int,
    first_octets,
    flagged,
    format_host,
    format_target,
    host_net,
    host_net4,
    host_net4_at,
    host_net6,
    key_net,
    key_range,
    net_key,
    normalise_network,
    pack_hosts,
    pack_target,
    parse_host_int,
    parse_key,
    parse_target,
    parse_v4,
    prefixlen_of,
    split_hosts,
    split_packed6,
    tagged_key,
    tagged_net,
    target_text,
    top_halves,
    unpack_hosts,
    unpack_target,
)
from tests.helpers.spans import inside, written_span

# -- strategies -------------------------------------------------------------------------------------------

_octet = st.one_of(st.integers(0, 255).map(str),
                   st.sampled_from(["256", "01", "00", "000", "-1", "", "1a", "٣", " 1", "1\x00", "0x1"]))


@st.composite
def dotted(draw: st.DrawFn) -> str:
    """Mostly four octets, some of them bad; sometimes three or five."""
    n = draw(st.sampled_from([4, 4, 4, 4, 3, 5]))
    return ".".join(draw(st.lists(_octet, min_size=n, max_size=n)))


@st.composite
def v6_text(draw: st.DrawFn) -> str:
    """IPv6 as people and feeds write it: compressed, expanded, upper case, IPv4-mapped and embedded IPv4."""
    x = draw(st.one_of(st.integers(0, 2**128 - 1), st.integers(0, 2**32 - 1).map(lambda v: 0xFFFF << 32 | v),
                       st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1).map(lambda v: v << 64)))
    a = ipaddress.IPv6Address(x)
    form = draw(st.sampled_from(["short", "exploded", "upper", "v4tail", "mangled"]))
    if form == "short":
        return str(a)
    if form == "exploded":
        return a.exploded
    if form == "upper":
        return str(a).upper()
    if form == "v4tail":
        hi = a.exploded.rsplit(":", 2)[0]
        return f"{hi}:{ipaddress.IPv4Address(x & 0xFFFFFFFF)}"
    groups = a.exploded.split(":")
    i = draw(st.integers(0, 7))
    groups[i] = draw(st.sampled_from(["", "00000", "g", "1%eth0", "٣", groups[i] + ":"]))
    return ":".join(groups)


_hextet = st.one_of(st.integers(0, 0xFFFF).map(lambda i: format(i, "x")),
                    st.sampled_from(["", "00000", "g", "FFFF", "0"]))


@st.composite
def v6_groups(draw: st.DrawFn) -> str:
    """Colon-separated groups, good and bad, too few or too many, sometimes one emptied into '::' (or ':::'
    when its neighbours are empty too)."""
    groups = draw(st.lists(_hextet, min_size=1, max_size=9))
    if len(groups) > 1 and draw(st.booleans()):
        groups[draw(st.integers(0, len(groups) - 1))] = ""
    return ":".join(groups)


_plen = st.one_of(st.none(), st.integers(0, 130).map(str),
                  st.sampled_from(["", "024", "x", "255.255.0.0", "0.0.0.255", " 8"]))


@st.composite
def target_text_like(draw: st.DrawFn) -> str:
    ip = draw(st.one_of(dotted(), v6_text(), v6_groups(), st.text(max_size=20)))
    plen = draw(_plen)
    text = ip if plen is None else f"{ip}/{plen}"
    return draw(st.sampled_from(["", " ", "\t"])) + text + draw(st.sampled_from(["", " ", "%eth0"]))


_nets = st.one_of(
    st.builds(lambda i, p: ipaddress.IPv4Network((i, p), strict=False),
              st.integers(0, 2**32 - 1), st.integers(0, 32)),
    st.builds(lambda i, p: ipaddress.IPv6Network((i, p), strict=False),
              st.integers(0, 2**128 - 1), st.integers(0, 128)),
    st.builds(lambda i, p: ipaddress.IPv6Network(((0xFFFF << 32) | i, p), strict=False),
              st.integers(0, 2**32 - 1), st.integers(96, 128)),
)


def _plain_host(text: str) -> tuple[int, int] | None:
    """The plain version of parse_host_int: parse_target, single addresses only, no blanks allowed."""
    if text != text.strip() or "/" in text:
        return None
    try:
        net = parse_target(text)
    except AddressError:
        return None
    return net.version, int(net.network_address)


# -- the plain parser and printer ------------------------------------------------------------------------


def test_parse_target_rules() -> None:
    assert str(parse_target("1.2.3.4")) == "1.2.3.4/32"
    assert str(parse_target("::ffff:10.0.0.0/104")) == "10.0.0.0/8"
    assert str(parse_target("::fffe:0:0/95")) == "::fffe:0:0/95"  # shorter than /96: stays IPv6
    for bad in ("", "010.0.0.1", "10.1", "fe80::1%eth0", "example.com", "10.0.0.5/8 x", "1" * 65):
        with pytest.raises(AddressError):
            parse_target(bad)

    assert str(parse_target(" 10.0.0.0/8 ")) == "10.0.0.0/8"


@pytest.mark.parametrize("text", ["10.0.0.5/8", "45.67.89.10/9", "2001:db8:f3::1/17", "::ffff:1.2.3.4/120",
                                  "1.2.3.4/255.255.0.0", "1.2.3.4/0", "::1/0"])
def test_host_bits_are_refused_never_widened(text: str) -> None:
    """Issue 33: `45.67.89.10/9` was `45.0.0.0/9` (8.4 M addresses), `2001:db8:f3::1/17` was `2001::/17`."""
    with pytest.raises(HostBitsError, match="host bits set") as info:
        parse_target(text)
    assert text.split("/")[0] in str(info.value)  # the message names what was written
    assert parse_key(text) is None


@given(target_text_like())
@example("45.67.89.10/9")
@example("2001:db8:f3::1/17")
@example("::ffff:10.0.0.5/104")
def test_parse_target_and_parse_key_never_widen(text: str) -> None:
    """Whatever the text, each parser refuses it (AddressError, nothing else) or returns a network inside
    what was written, compared as ints; one with host bits set is always refused."""
    span = written_span(text)
    try:
        net = parse_target(text)
    except AddressError:
        assert parse_key(text) is None
        return
    assert span is not None and not span.host_bits, text
    first = int(net.network_address)
    assert inside(net.version, first, int(net.broadcast_address), text)
    got = parse_key(text)
    assert got is not None and key_range(got[1], got[0]) == (first, int(net.broadcast_address))


@given(_nets)
def test_prefixlen_of_is_prefixlen(net: IPNet) -> None:
    assert prefixlen_of(net) == net.prefixlen
    assert prefixlen_of(host_net4(int(net.network_address) & 0xFFFFFFFF)) == 32


# IPv6 values made of hextets that are often zero: runs of zeros to compress, ties between runs, ::a.b.c.d forms
_zero_runs = st.lists(st.one_of(st.just(0), st.just(0), st.integers(0, 0xFFFF)), min_size=8, max_size=8).map(
    lambda hs: sum(h << (16 * (7 - i)) for i, h in enumerate(hs)))


@given(st.one_of(_nets, st.builds(lambda x, p: ipaddress.IPv6Network((x, p), strict=False), _zero_runs,
                                  st.sampled_from([48, 64, 127, 128]))))
@example(ipaddress.IPv6Network("2001:db8::/64"))
@example(ipaddress.IPv6Network("1:0:0:1::/64"))
@example(ipaddress.IPv6Network("1:0:0:1:0:0:1:0/128"))
@example(ipaddress.IPv6Network("::ffff:0:0/96"))
@example(ipaddress.IPv4Network("192.0.2.7/32"))
@example(ipaddress.IPv4Network("10.0.0.0/8"))
def test_format_target_fast_path_agrees_with_str(net: IPNet) -> None:
    plain = str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)
    assert format_target(net) == plain


# -- fast text parsers ------------------------------------------------------------------------------------


@settings(max_examples=500)
@given(st.one_of(dotted(), v6_text(), st.text(max_size=16)))
@example("1.2.3.4\x00")
@example("0.0.0.0")
@example("255.255.255.255")
def test_parse_v4_agrees_with_ipaddress(text: str) -> None:
    try:
        expected: int | None = int(ipaddress.IPv4Address(text))
    except ValueError:
        expected = None
    assert parse_v4(text) == expected


@settings(max_examples=500)
@given(st.one_of(dotted(), v6_text(), target_text_like()))
@example("::ffff:1.2.3.4")
@example("::FFFF:102:304")
@example("::1.2.3.4")
@example("2001:db8::1\x00")
def test_parse_host_int_agrees_with_parse_target(text: str) -> None:
    assert parse_host_int(text) == _plain_host(text)


_MAPPED = st.integers(0, 0xFFFFFFFF).map(lambda a: 0xFFFF << 32 | a)


@given(st.lists(st.one_of(st.integers(0, (1 << 128) - 1), _MAPPED,  # mapped; and mapped's 12 bytes off 16
                          st.integers(0, 0xFFFFFFFF).map(lambda a: a << 96 | 0xFFFF << 64)), max_size=30))
def test_split_packed6_reads_each_address_as_its_text_is_read(keys: list[int]) -> None:
    blob = b"".join(k.to_bytes(16, "big") for k in keys)
    want: dict[int, list[int]] = {4: [], 6: []}
    for k in keys:
        version, key = parse_host_int(str(ipaddress.IPv6Address(k)))  # type: ignore[misc]
        want[version].append(key)
    assert split_packed6(blob) == (want[4], want[6])


@given(st.lists(st.one_of(dotted(), v6_text(), target_text_like()), max_size=30)
       | st.lists(dotted(), max_size=30))  # nothing but dotted quads: split_hosts's C-level path (_all_v4)
def test_split_hosts_agrees_with_parse_host_int(targets: list[str]) -> None:
    unspelled = split_hosts(targets, spelled=False)
    keys, texts, rest = split_hosts(targets)
    assert (unspelled.keys, unspelled.texts, unspelled.rest) == (keys, {4: {}, 6: {}}, rest)
    want_keys: dict[int, list[int]] = {4: [], 6: []}
    want_texts: dict[int, dict[int, str]] = {4: {}, 6: {}}
    want_rest = []
    for i, t in enumerate(targets):
        got = _plain_host(t)
        if got is None:
            want_rest.append(i)
        else:
            want_keys[got[0]].append(got[1])
            want_texts[got[0]][got[1]] = t
    assert (keys, texts, rest) == (want_keys, want_texts, want_rest)


@settings(max_examples=1000, deadline=None)
@given(st.one_of(target_text_like(), st.text(max_size=40)))
@example("1.2.3.4/024")
@example("1.2.3.4/255.255.0.0")
@example("::ffff:1.2.3.4/120")
@example("::ffff:1.2.3.0/120")
@example("1:2:3:4:5:6:1.2.3.4/127")
@example("1.2.3.4/")
@example("1.2.3.4\x00/8")
@example("1::2:3:4:5:6:7:8")
@example("1:2:3:4:5:6:7::")
@example("::ffff:0.0.0.0/95")
@example("a" * 70 + "::")
def test_parse_key_agrees_with_parse_target(text: str) -> None:
    """The fast parser of ban targets and feed entries against the plain one: same network or both refuse."""
    try:
        expected = parse_target(text)
    except AddressError:
        assert parse_key(text) is None
        return
    got = parse_key(text)
    assert got is not None, text
    version, key = got
    assert (version, key_net(key, version)) == (expected.version, expected)


# -- host keys --------------------------------------------------------------------------------------------


def test_fast_host_networks_equal_the_real_constructor() -> None:
    for x in (0, 1, 0x0A000001, 0xFFFFFFFF):
        a = ipaddress.IPv4Address(x)
        for fast in (host_net4(x), host_net4_at(a)):
            real = ipaddress.IPv4Network((x, 32))
            assert fast == real and hash(fast) == hash(real) and str(fast) == str(real)
            assert list(fast.hosts()) == list(real.hosts()) and fast.broadcast_address == real.broadcast_address
            assert fast.subnet_of(real) and fast.supernet(8) == real.supernet(8)
            assert vars(fast).keys() == vars(real).keys()
    for y in (1, 0x20010DB8 << 96 | 5, (1 << 128) - 1):
        fast6, real6 = host_net6(y), ipaddress.IPv6Network((y, 128))
        assert fast6 == real6 and hash(fast6) == hash(real6) and str(fast6) == str(real6)
        assert list(fast6.hosts()) == list(real6.hosts())


@given(st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)), st.sampled_from(["", "%eth0"]))
def test_addr_int_is_int(a: ipaddress.IPv4Address | ipaddress.IPv6Address, scope: str) -> None:
    """The tracker's `int(address)` fast path, for plain, scoped and IPv4-mapped addresses alike."""
    if scope and a.version == 6:
        a = ipaddress.IPv6Address(f"{a}{scope}")
    assert type(addr_int(a)) is int and addr_int(a) == int(a)
    assert addr_int(ipaddress.IPv6Address(f"::ffff:{ipaddress.IPv4Address(int(a) & 0xFFFFFFFF)}")) == \
        0xFFFF << 32 | int(a) & 0xFFFFFFFF


def _host_keys(version: int) -> st.SearchStrategy[tuple[int, int]]:
    return st.tuples(st.just(version), st.integers(0, 2 ** (32 if version == 4 else 128) - 1))


@given(st.sampled_from([4, 6]).flatmap(_host_keys))
def test_host_net_is_the_real_constructor(case: tuple[int, int]) -> None:
    version, x = case
    fast = host_net(x, version)
    real = ipaddress.IPv4Network((x, 32)) if version == 4 else ipaddress.IPv6Network((x, 128))
    assert type(fast) is type(real) and vars(fast).keys() == vars(real).keys()
    assert fast == real and hash(fast) == hash(real) and str(fast) == str(real)
    assert fast.netmask == real.netmask and fast.prefixlen == real.prefixlen
    assert list(fast.hosts()) == list(real.hosts()) and fast.broadcast_address == real.broadcast_address


_v6_keys = st.one_of(st.integers(0, 2**128 - 1), st.integers(0, 2**48),  # low keys: ::a.b.c.d and friends
                    st.integers(0, 2**32 - 1).map(lambda x: 0xFFFF << 32 | x))


@given(st.one_of(st.tuples(st.just(4), st.integers(0, 2**32 - 1)), st.tuples(st.just(6), _v6_keys)))
def test_format_host_agrees_with_ipaddress(case: tuple[int, int]) -> None:
    version, x = case
    plain = str(ipaddress.IPv4Address(x) if version == 4 else ipaddress.IPv6Address(x))
    assert format_host(x, version) == plain == format_target(host_net(x, version))


@given(st.lists(st.integers(0, 2**32 - 1), max_size=50), st.lists(st.integers(0, 2**128 - 1), max_size=20))
def test_packed_hosts_round_trip(keys4: list[int], keys6: list[int]) -> None:
    blob4, blob6 = b"".join(pack_hosts(keys4, 4)), b"".join(pack_hosts(keys6, 6))
    assert blob4 == b"".join(struct.pack(">I", k) for k in keys4)  # the plain version: one int at a time
    assert unpack_hosts(blob4, 4) == [int.from_bytes(blob4[i:i + 4], "big") for i in range(0, len(blob4), 4)]
    assert unpack_hosts(blob4, 4) == keys4 and unpack_hosts(blob6, 6) == keys6


@given(st.lists(st.integers(0, 2**32 - 1), max_size=60), st.binary(min_size=256, max_size=256))
def test_flagged_first_octets_are_the_per_key_look_up(keys: list[int], raw: bytes) -> None:
    table = bytes(b & 1 for b in raw)
    assert first_octets(keys) == bytes(k >> 24 for k in keys)  # the plain version: one key at a time
    assert flagged(first_octets(keys), table) == [i for i, k in enumerate(keys) if table[k >> 24]]
    assert list(top_halves(keys)) == [k >> 16 for k in keys]


# -- net keys and tagged keys -----------------------------------------------------------------------------


@given(_nets)
def test_net_keys_round_trip_and_sort_by_start(net: IPNet) -> None:
    key = net_key(net)
    assert key_net(key, net.version) == net
    assert key_range(key, net.version) == (int(net.network_address), int(net.broadcast_address))


@given(st.lists(_nets, max_size=20))
def test_net_keys_sort_as_networks_do(nets: list[IPNet]) -> None:
    for version in (4, 6):
        mine = [n for n in nets if n.version == version]
        assert [key_net(k, version) for k in sorted(net_key(n) for n in mine)] == sorted(mine)


@given(_nets, _nets)
def test_tagged_keys_round_trip_and_never_collide(a: IPNet, b: IPNet) -> None:
    ka = tagged_key(a.version, int(a.network_address), a.prefixlen)
    kb = tagged_key(b.version, int(b.network_address), b.prefixlen)
    assert tagged_net(ka) == a and tagged_net(kb) == b
    assert (ka == kb) == (a == b)
    assert (ka < V4_TAG) == (a.version == 4 and a.prefixlen == 32)
    assert (ka >= V6_TAG) == (a.version == 6)


@given(_nets)
def test_tagged_net_equals_the_plain_construction(net: IPNet) -> None:
    # the tracker's bans take tagged_net for every key (its IPv4-host fast path is tagged_net's first test)
    got = tagged_net(tagged_key(net.version, int(net.network_address), net.prefixlen))
    plain = ipaddress.ip_network((int(net.network_address) if net.version == 4 else net.network_address,
                                  net.prefixlen))
    assert type(got) is type(plain) and got == plain and str(got) == str(plain)
    assert got.num_addresses == plain.num_addresses and hash(got) == hash(plain)


# -- packed bytes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, size", [("1.2.3.4", 4), ("10.0.0.0/8", 5), ("2001:db8::1", 16),
                                        ("2001:db8::/64", 17), ("0.0.0.0/0", 5), ("::/0", 17)])
def test_pack_round_trip(text: str, size: int) -> None:
    net = parse_target(text)
    key = pack_target(net)
    assert len(key) == size
    assert unpack_target(key) == net
    assert target_text(key) == format_target(net) == text


def test_pack_folds_v4_mapped_addresses() -> None:
    mapped = ipaddress.IPv6Network("::ffff:1.2.3.4/128")
    assert pack_target(mapped) == pack_target(ipaddress.IPv4Network("1.2.3.4/32"))
    mapped_range = ipaddress.IPv6Network("::ffff:10.0.0.0/104")
    assert pack_target(mapped_range) == pack_target(parse_target("10.0.0.0/8"))


def test_unpack_refuses_other_lengths() -> None:
    for bad in (b"", b"abc", b"x" * 6, b"x" * 18):
        with pytest.raises(ValueError):
            unpack_target(bad)
        with pytest.raises(ValueError):
            target_text(bad)


@given(_nets)
def test_pack_is_a_canonical_key(net: IPNet) -> None:
    key = pack_target(net)
    assert unpack_target(key) == normalise_network(net)
    assert target_text(key) == format_target(normalise_network(net))
    assert pack_target(unpack_target(key)) == key
    # the packed bytes are the big-endian bytes of the host key or the net key
    n = normalise_network(net)
    single = n.prefixlen == n.max_prefixlen
    as_int = int(n.network_address) if single else net_key(n)
    assert key == as_int.to_bytes(len(key), "big")
