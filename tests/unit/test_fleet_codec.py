"""Fleet event codec: round trips, and every hostile input comes back as a typed rejection."""

from __future__ import annotations

import ipaddress
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nftblockd.fleet.codec import REASONS, FleetEvent, Rejection, decode, encode

N = ipaddress.ip_network


def _ev(**kw: object) -> FleetEvent:
    base: dict[str, object] = dict(op="ban", net=N("203.0.113.7/32"), until=1_800_000_000.5, origin="web-01",
                                   oseq=7, src="jail:sshd", ts=1_700_000_000_123)
    base.update(kw)
    return FleetEvent(**base)  # type: ignore[arg-type]


def _bytes(fields: dict[str, str]) -> dict[bytes, bytes]:
    return {k.encode(): v.encode() for k, v in fields.items()}


def test_round_trip_as_redis_returns_it() -> None:
    ev = _ev()
    fields = encode(ev)
    assert fields["net"] == "203.0.113.7" and fields["v"] == "2"
    assert decode(_bytes(fields)) == ev
    assert decode(fields) == ev


def test_permanent_ranges_and_unbans() -> None:
    ev = _ev(net=N("2001:db8:bad::/48"), until=math.inf)
    assert encode(ev)["until"] == "inf" and decode(_bytes(encode(ev))) == ev
    un = _ev(op="unban", until=0.0)
    assert decode(_bytes(encode(un))) == un


def test_unknown_fields_are_ignored_but_unknown_version_is_refused() -> None:
    fields = encode(_ev()) | {"future": "x"}
    assert isinstance(decode(fields), FleetEvent)
    assert decode(fields | {"v": "1"}) == Rejection("version", "'1'")  # schema 1: one shared stream, refused
    no_v = dict(fields)
    del no_v["v"]
    assert isinstance(r := decode(no_v), Rejection) and r.reason == "version"


@pytest.mark.parametrize(("change", "reason"), [
    ({"op": "nuke"}, "malformed"),
    ({"origin": ""}, "malformed"),
    ({"origin": "a b"}, "malformed"),
    ({"oseq": "-1"}, "malformed"),
    ({"oseq": "1e3"}, "malformed"),
    ({"ts": "soon"}, "malformed"),
    ({"src": "jail sshd"}, "malformed"),
    ({"net": "10.0.0.5/8"}, "host_bits"),
    ({"net": "example.com"}, "bad_net"),
    ({"net": "fe80::1%eth0"}, "bad_net"),
    ({"net": " 1.2.3.4"}, "bad_net"),
    ({"until": "nan"}, "bad_until"),
    ({"until": "-5"}, "bad_until"),
    ({"until": "1e300"}, "bad_until"),
    ({"until": "tomorrow"}, "bad_until"),
])
def test_bad_fields_have_their_reason(change: dict[str, str], reason: str) -> None:
    r = decode(encode(_ev()) | change)
    assert isinstance(r, Rejection) and r.reason == reason


def test_missing_and_oversized_fields() -> None:
    for key in ("net", "until", "origin", "oseq", "op"):
        f = encode(_ev())
        del f[key]
        assert isinstance(decode(f), Rejection)
    assert isinstance(decode(_bytes(encode(_ev())) | {b"net": b"1" * 10_000}), Rejection)
    assert isinstance(decode(_bytes(encode(_ev())) | {b"origin": b"\xff\xfe"}), Rejection)


def test_mapped_ipv6_is_read_as_ipv4() -> None:
    ev = decode(encode(_ev()) | {"net": "::ffff:203.0.113.7"})
    assert isinstance(ev, FleetEvent) and ev.net == N("203.0.113.7/32")


def test_an_unban_cannot_be_permanent() -> None:
    r = decode(encode(_ev(op="unban", until=0.0)) | {"until": "inf"})
    assert isinstance(r, Rejection) and r.reason == "bad_until"


_keys = st.sampled_from(["v", "op", "net", "until", "origin", "oseq", "src", "ts", "x"])
_vals = st.one_of(st.binary(max_size=20),
                  st.sampled_from([b"1", b"ban", b"unban", b"inf", b"10.0.0.0/8", b"::/0", b"0", b"1.2.3.4"]))


@given(st.dictionaries(st.one_of(_keys, _keys.map(str.encode)), _vals, max_size=9))
def test_decode_never_raises(fields: dict[bytes | str, bytes]) -> None:
    r = decode(fields)
    assert isinstance(r, FleetEvent) or r.reason in REASONS


@given(st.integers(0, 2**32 - 1), st.integers(16, 32), st.floats(0, 4_000_000_000), st.integers(0, 2**62),
       st.sampled_from(["ban", "unban"]))
def test_round_trip_property(addr: int, plen: int, until: float, oseq: int, op: str) -> None:
    net = ipaddress.IPv4Network((addr, plen), strict=False)
    ev = _ev(op=op, net=net, until=until if op == "ban" else 0.0, oseq=oseq)
    assert decode(_bytes(encode(ev))) == ev


@given(st.integers(0, 2**128 - 1), st.integers(16, 128))
def test_round_trip_ipv6(addr: int, plen: int) -> None:
    net = ipaddress.IPv6Network((addr, plen), strict=False)
    out = decode(_bytes(encode(_ev(net=net))))
    assert isinstance(out, FleetEvent)
    # IPv4-mapped space folds to IPv4: the one address has one form on the wire
    assert out.net == net or (out.net.version == 4 and net.prefixlen >= 96)


@given(st.one_of(st.integers(0, 2**32 - 1).map(lambda x: str(ipaddress.IPv4Address(x))),
                 st.integers(0, 2**128 - 1).map(lambda x: str(ipaddress.IPv6Address(x))),
                 st.text(alphabet="0123456789abcdef:./%", max_size=24)))
def test_fast_parse_equals_the_ipaddress_path(text: str) -> None:
    from nftblockd.addr import AddressError, parse_target
    from nftblockd.fleet.codec import parse_net
    fast = parse_net(text)
    try:
        slow = parse_target(text)
    except AddressError:
        assert isinstance(fast, Rejection)
        return
    assert fast == slow or (isinstance(fast, Rejection) and fast.reason == "bad_net" and "/" not in text)
