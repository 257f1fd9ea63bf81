"""fleet/counting.py: offenders, the call's arguments, and the parsing of what the server replies (hostile
replies included). The script itself runs against a real server in tests/integration/test_fleet_count_redis.py."""

from __future__ import annotations

import ipaddress
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.fleet.counting import (
    CountPolicy,
    Decided,
    build_call,
    count_key,
    decision_key,
    offender,
    parse_reply,
    parse_seen,
)

POL = {"sshd": CountPolicy(3, 600.0, 3600.0), "web": CountPolicy(10, 60.0, 60.0, ipv6_prefix=56)}
SRC = {"count:sshd": "sshd", "count:web": "web"}


def test_offender_is_the_address_or_the_jails_ipv6_prefix() -> None:
    assert offender(ipaddress.ip_address("198.51.100.7"), 64) == "198.51.100.7"
    assert offender(ipaddress.ip_address("::ffff:198.51.100.7"), 64) == "198.51.100.7"
    assert offender(ipaddress.ip_address("2001:db8:1:2:3::4"), 64) == "2001:db8:1:2::/64"
    assert offender(ipaddress.ip_address("2001:db8:1:2:3::4"), 48) == "2001:db8:1::/48"
    assert offender(ipaddress.ip_address("2001:db8::4"), 128) == "2001:db8::4"


def test_keys_share_the_fleets_hash_tag() -> None:
    assert count_key("prod", "sshd", "1.2.3.4") == "nftblock:{prod}:fc:sshd:1.2.3.4"
    assert decision_key("prod", "sshd", "1.2.3.4") == "nftblock:{prod}:fd:sshd:1.2.3.4"


def test_build_call_layout_and_caps() -> None:
    keys, argv = build_call("prod", "web-01", 100.0, 1000, 86400.0,
                            {("sshd", "1.2.3.4"): 7, ("web", "2001:db8::/56"): 2}, POL)
    assert keys[:4] == ["nftblock:{prod}:fcrate", "nftblock:{prod}:events", "nftblock:{prod}:active",
                        "nftblock:{prod}:unbanned"]
    assert keys[4:] == [count_key("prod", "sshd", "1.2.3.4"), decision_key("prod", "sshd", "1.2.3.4"),
                        count_key("prod", "web", "2001:db8::/56"), decision_key("prod", "web", "2001:db8::/56")]
    assert argv[:4] == ["web-01", "100.0", "1000", "86400000"]
    # k is capped at maxretry: more failures in one batch cannot count for more than a crossing
    assert argv[4:10] == ["1.2.3.4", "3", "3", "600000", "3600000", "count:sshd"]
    assert argv[10:] == ["2001:db8::/56", "2", "10", "60000", "60000", "count:web"]
    assert (len(argv) - 4) % 6 == 0 and len(keys) == 4 + 2 * ((len(argv) - 4) // 6)


def test_parse_reply_good_and_bad_decisions() -> None:
    reply = [[[b"198.51.100.7", b"1767225600.000", b"a,b,c", 3, b"count:sshd"],
              [b"2001:db8::/64", b"1767225600.5", b"a,b;evil,c", 3, b"count:sshd"],  # a bad host name is left out
              [b"198.51.100.8/24", b"1767225600", b"a", 3, b"count:sshd"],  # host bits: refused
              [b"198.51.100.9", b"inf", b"a", 3, b"count:sshd"],  # not an end
              [b"198.51.100.10", b"1767225600", b"a", 3, b"count:nope"],  # not our jail
              [b"198.51.100.11", b"1"]],  # short
             5, 1, 2, 0]
    r = parse_reply(reply, SRC)
    assert r.decided == [
        Decided("sshd", ipaddress.ip_network("198.51.100.7/32"), 1767225600.0, ("a", "b", "c"), 3),
        Decided("sshd", ipaddress.ip_network("2001:db8::/64"), 1767225600.5, ("a", "c"), 3)]
    assert (r.accepted, r.limited, r.skipped, r.malformed, r.bad_reply) == (5, 1, 2, 0, 4)
    assert "seen by a, b, c" in r.decided[0].reason()


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.none() | st.integers() | st.binary(max_size=12) | st.sampled_from([b"count:sshd", b"1.2.3.4"]),
                    lambda c: st.lists(c, max_size=5), max_leaves=12))
def test_parse_reply_never_raises(reply: Any) -> None:
    r = parse_reply(reply, SRC)
    assert r.accepted >= 0 and r.bad_reply >= 0
    for d in r.decided:
        assert d.jail in ("sshd", "web")


def test_parse_seen() -> None:
    assert parse_seen(None, [b"a|1", b"b|7", b"a|9", b"junk"]) == {"counting": 4, "seen_by": ["a", "b"]}
    out = parse_seen(b"a,b,c;b;3", [])
    assert out["decided"] == {"by": "b", "seen_by": ["a", "b", "c"], "count": 3}
