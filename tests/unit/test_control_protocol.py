"""The control codec: three ways (whole, byte by byte, with trailing data), hypothesis, argument rules."""

from __future__ import annotations

import ipaddress
import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.addr import parse_target
from nftblockd.control.protocol import (
    BLOCKLIST_DEFAULT,
    DEFAULT_MAX_REQUEST,
    ERROR_CODES,
    BanArgs,
    BanItem,
    CheckArgs,
    ControlError,
    FeedsRefreshArgs,
    FrameSplitter,
    Invalid,
    ListArgs,
    NoArgs,
    ProtocolError,
    Request,
    RequestDecoder,
    Response,
    ResponseDecoder,
    UnbanArgs,
    ban_entry,
    decode_response,
    encode_error,
    encode_request,
    encode_result,
    parse_args,
    resolve_timeout,
)
from nftblockd.durations import PERMANENT
from nftblockd.events import BanInfo

STREAM = (
    encode_request(1, "ping")
    + encode_request(2, "ban", {"targets": ["192.0.2.1", "2001:db8::/64"], "timeout": 3600,
                                "comment": "é\nx"})
    + b"\r\n\n"  # blank lines (netcat, telnet) are ignored
    + b"garbage\n"
    + b'{"v": 1, "id": 7, "args": {}}\n'
    + encode_request(3, "status")
)
EXPECTED: list[Request | Invalid] = [
    Request(1, "ping", {}),
    Request(2, "ban", {"targets": ["192.0.2.1", "2001:db8::/64"], "timeout": 3600, "comment": "é\nx"}),
    Invalid(None, "not a JSON object on one line"),
    Invalid(7, 'the request needs a command name in "cmd"'),
    Request(3, "status", {}),
]


def feed_whole(data: bytes, max_request: int = DEFAULT_MAX_REQUEST) -> list[Request | Invalid]:
    d = RequestDecoder(max_request)
    return d.feed(data) + d.feed_eof()


def feed_bytewise(data: bytes, max_request: int = DEFAULT_MAX_REQUEST) -> list[Request | Invalid]:
    d = RequestDecoder(max_request)
    out: list[Request | Invalid] = []
    for i in range(len(data)):
        out += d.feed(data[i : i + 1])
    return out + d.feed_eof()


@pytest.mark.parametrize("feed", [feed_whole, feed_bytewise])
def test_stream_decodes_the_same_whole_and_byte_by_byte(feed: Any) -> None:
    assert feed(STREAM) == EXPECTED


def test_trailing_partial_request_waits_for_its_newline() -> None:
    line = encode_request(9, "list", {"set": None})
    d = RequestDecoder()
    assert d.feed(STREAM + line[:10]) == EXPECTED
    assert d.buffered == 10
    assert d.feed(line[10:-1]) == []
    assert d.feed(b"\n") == [Request(9, "list", {"set": None})]
    assert d.buffered == 0


def test_final_line_without_newline_counts_at_eof() -> None:
    d = RequestDecoder()
    assert d.feed(b'{"v":1,"id":4,"cmd":"ping"}') == []
    assert d.feed_eof() == [Request(4, "ping", {})]


def test_oversize_request_is_refused_once_and_the_stream_recovers() -> None:
    big = encode_request(1, "ban", {"targets": ["192.0.2.1"] * 200})
    ok = encode_request(2, "ping")
    data = ok + big + ok + big[:-1]  # the last one never ends: refused, then nothing at EOF
    for feed in (feed_whole, feed_bytewise):
        events = feed(data, max_request=len(ok) + 5)
        assert [type(e) for e in events] == [Request, Invalid, Request, Invalid]
        bad = events[1]
        assert isinstance(bad, Invalid) and bad.id is None and "larger than" in bad.message


def test_request_exactly_at_the_limit_is_accepted() -> None:
    line = encode_request(1, "ping")
    assert feed_whole(line, max_request=len(line) - 1) == [Request(1, "ping", {})]
    assert isinstance(feed_whole(line, max_request=len(line) - 2)[0], Invalid)


@pytest.mark.parametrize(
    ("line", "rid", "fragment"),
    [
        (b"[1,2]", None, "JSON object"),
        (b'{"v":1,"cmd":"ping"}', None, "integer"),
        (b'{"v":1,"id":true,"cmd":"ping"}', None, "integer"),
        (b'{"v":2,"id":5,"cmd":"ping"}', 5, "version"),
        (b'{"id":5,"cmd":"ping"}', 5, "version"),
        (b'{"v":1,"id":5,"cmd":""}', 5, "command"),
        (b'{"v":1,"id":5,"cmd":"ping","args":[]}', 5, "args"),
        (b"\xff\xfe\x00", None, "JSON"),
        (b"[" * 100000, None, "JSON"),
    ],
)
def test_invalid_requests_echo_the_id_when_readable(line: bytes, rid: int | None, fragment: str) -> None:
    (event,) = feed_whole(line + b"\n")
    assert isinstance(event, Invalid)
    assert event.id == rid
    assert fragment in event.message


def test_null_args_mean_none() -> None:
    assert feed_whole(b'{"v":1,"id":1,"cmd":"status","args":null}\n') == [Request(1, "status", {})]


def test_a_million_ipv6_addresses_fit_in_the_default_limit() -> None:
    # the longest canonical form: eight groups of four digits, 39 characters each
    targets = [f"2001:fdb8:ffff:ffff:ffff:ffff:{0x1000 + (i >> 12):x}:{0x1000 + (i & 0xFFF):x}"
               for i in range(1_000_000)]
    assert len(targets[-1]) == 39 and str(ipaddress.IPv6Address(targets[-1])) == targets[-1]
    line = encode_request(1, "ban", {"targets": targets, "timeout": "permanent", "set": None, "comment": ""})
    assert len(line) < DEFAULT_MAX_REQUEST
    d = RequestDecoder()
    events = []
    for i in range(0, len(line), 1 << 18):  # the server reads 256 KiB at a time
        events += d.feed(line[i : i + (1 << 18)])
    assert len(events) == 1
    assert isinstance(events[0], Request) and len(events[0].args["targets"]) == 1_000_000


# --- hypothesis ----------------------------------------------------------------------------------------


@st.composite
def chunked(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
    edges = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
requests = st.builds(
    Request,
    id=st.integers(min_value=-(2**63), max_value=2**63),
    cmd=st.text(min_size=1, max_size=20),
    args=st.dictionaries(st.text(max_size=10), json_values, max_size=4),
)


@given(st.data(), st.binary(max_size=400), st.integers(1, 64))
def test_request_decoder_never_raises_on_arbitrary_bytes(data: st.DataObject, raw: bytes, limit: int) -> None:
    d = RequestDecoder(limit)
    events = []
    for chunk in data.draw(chunked(raw)):
        events += d.feed(chunk)
    events += d.feed_eof()
    assert all(isinstance(e, Request | Invalid) for e in events)
    assert d.buffered <= limit


@given(st.data(), st.lists(requests, max_size=5))
def test_encoded_requests_decode_to_themselves_however_chunked(
    data: st.DataObject, reqs: list[Request],
) -> None:
    raw = b"".join(encode_request(r.id, r.cmd, r.args) for r in reqs)
    d = RequestDecoder()
    events = []
    for chunk in data.draw(chunked(raw)):
        events += d.feed(chunk)
    assert events + d.feed_eof() == reqs


@given(st.data(), st.binary(max_size=300))
def test_response_decoder_raises_only_protocol_error(data: st.DataObject, raw: bytes) -> None:
    d = ResponseDecoder(64)
    try:
        for chunk in data.draw(chunked(raw)):
            d.feed(chunk)
        d.feed_eof()
    except ProtocolError:
        pass


@given(st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=6),
       st.integers(1, 40), st.data())
def test_line_splitter_yields_each_short_line_and_one_marker_per_long_one(
    lines: list[bytes], limit: int, data: st.DataObject,
) -> None:
    raw = b"".join(line + b"\n" for line in lines)
    s = FrameSplitter(limit)
    out: list[Any] = []
    for chunk in data.draw(chunked(raw)):
        out += s.feed(chunk)
    out += s.feed_eof()
    assert [o if isinstance(o, bytes) else None for o in out] == [
        line if len(line) <= limit else None for line in lines
    ]


# --- responses -----------------------------------------------------------------------------------------


def test_responses_round_trip() -> None:
    d = ResponseDecoder()
    raw = encode_result(1, {"applied": ["192.0.2.1"], "refused": []})
    raw += encode_error(None, "forbidden", "run\nas root")
    assert d.feed(raw) == [
        Response(1, True, result={"applied": ["192.0.2.1"], "refused": []}),
        Response(None, False, code="forbidden", message="run as root"),  # messages are one line
    ]


@pytest.mark.parametrize(
    "line",
    [b"nope", b"[]", b'{"v":1,"id":1}', b'{"v":2,"id":1,"ok":true,"result":{}}', b'{"v":1,"id":1,"ok":true}',
     b'{"v":1,"id":"x","ok":true,"result":{}}', b'{"v":1,"id":1,"ok":false,"error":"x"}'],
)
def test_malformed_responses_raise_protocol_error(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_response(line)


def test_oversize_response_raises() -> None:
    with pytest.raises(ProtocolError, match="larger than 10 bytes"):
        ResponseDecoder(10).feed(encode_result(1, {"x": "y" * 20}))


def test_encoding_refuses_what_json_cannot_carry() -> None:
    with pytest.raises(ValueError):
        encode_result(1, {"x": float("nan")})
    with pytest.raises(TypeError):
        encode_result(1, {"x": object()})
    with pytest.raises(ValueError):
        encode_error(1, "oops", "x")  # type: ignore[arg-type]


def test_encoded_lines_are_single_lines() -> None:
    line = encode_result(1, {"reason": "a\nb\rc\u2028"})
    assert line.count(b"\n") == 1 and line.endswith(b"\n")
    assert json.loads(line)["result"]["reason"] == "a\nb\rc\u2028"


def test_control_error_codes() -> None:
    assert {"invalid_address", "allowlisted", "never_ban", "unknown_set", "bad_request", "not_found", "internal",
            "unavailable", "forbidden", "refused"} == ERROR_CODES
    e = ControlError("unknown_set", "no blocklist named 'x'\n(configured: a)")
    assert (e.code, e.message, str(e)) == ("unknown_set", "no blocklist named 'x' (configured: a)",
                                           "no blocklist named 'x' (configured: a)")
    with pytest.raises(ValueError):
        ControlError("nope", "x")  # type: ignore[arg-type]
    assert ProtocolError("bad").code == "bad_request"


# --- arguments -----------------------------------------------------------------------------------------


def test_ban_args_with_defaults_and_shared_timeout() -> None:
    assert parse_args("ban", {"targets": ["192.0.2.1"]}) == BanArgs(
        (BanItem("192.0.2.1", BLOCKLIST_DEFAULT, ""),), None, "cli")
    a = parse_args("ban", {"targets": ["192.0.2.1", "10.0.0.0/8"], "timeout": "permanent", "set": "web",
                           "comment": "scan"})
    assert a == BanArgs((BanItem("192.0.2.1", PERMANENT, "scan"), BanItem("10.0.0.0/8", PERMANENT, "scan")), "web")
    assert parse_args("ban", {"targets": ["x"], "timeout": 90}) == BanArgs((BanItem("x", 90.0),), None)
    assert parse_args("ban", {"targets": ["x"], "timeout": "1h"}) == BanArgs((BanItem("x", 3600.0),), None)


def test_timeout_wire_forms_default_and_permanent_are_distinct() -> None:
    # issue 12: `null`, absent and "default" are the blocklist's default; "permanent" is PERMANENT; never None
    for args in ({}, {"timeout": None}, {"timeout": "default"}, {"timeout": " Default "}):
        [item] = parse_args("ban", {"targets": ["x"], **args}).items  # type: ignore[union-attr]
        assert item.timeout is BLOCKLIST_DEFAULT
    [item] = parse_args("ban", {"targets": ["x"], "timeout": "never"}).items  # type: ignore[union-attr]
    assert item.timeout is PERMANENT
    [item] = parse_args("ban", {"targets": [{"target": "x", "timeout": "default"}],  # type: ignore[union-attr]
                                "timeout": 60}).items
    assert item.timeout is BLOCKLIST_DEFAULT  # an object may ask for the default explicitly
    assert resolve_timeout(BLOCKLIST_DEFAULT, PERMANENT) is PERMANENT
    assert resolve_timeout(BLOCKLIST_DEFAULT, 60.0) == 60.0 and resolve_timeout(PERMANENT, 60.0) is PERMANENT
    assert resolve_timeout(30.0, PERMANENT) == 30.0


def test_ban_args_with_per_target_timeouts() -> None:
    a = parse_args("ban", {"origin": "fail2ban", "timeout": 60, "targets": [
        {"target": "192.0.2.1", "timeout": 120.5, "jail": "sshd", "reason": "imported"},
        {"target": "192.0.2.2", "timeout": "permanent"},
        {"target": "192.0.2.3"},
        "192.0.2.4",
    ]})
    assert a == BanArgs((
        BanItem("192.0.2.1", 120.5, "imported", "sshd"),
        BanItem("192.0.2.2", PERMANENT, "", ""),
        BanItem("192.0.2.3", 60.0, "", ""),
        BanItem("192.0.2.4", 60.0, "", ""),
    ), None, "fail2ban")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({}, "'targets'"),
        ({"targets": []}, "'targets'"),
        ({"targets": "192.0.2.1"}, "'targets'"),
        ({"targets": [1]}, "targets[0]"),
        ({"targets": ["x"], "timeout": 0}, "positive"),
        ({"targets": ["x"], "timeout": -5}, "negative"),
        ({"targets": ["x"], "timeout": "soon"}, "duration"),
        ({"targets": ["x"], "timeout": True}, "duration"),
        ({"targets": ["x"], "timeout": float("inf")}, "finite"),
        ({"targets": ["x"], "set": 3}, "'set'"),
        ({"targets": ["x"], "comment": 3}, "'comment'"),
        ({"targets": ["x"], "origin": "jail"}, "'origin'"),
        ({"targets": ["x"], "timout": 5}, "unknown argument 'timout'"),
        ({"targets": [{"target": "x", "until": 5}]}, "unknown argument 'until'"),
        ({"targets": [{"target": 5}]}, "must be strings"),
        ({"targets": [{"target": "x", "timeout": 0}]}, "targets[0].timeout"),
    ],
)
def test_bad_ban_args(args: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_args("ban", args)
    assert fragment in info.value.message
    assert info.value.code == "bad_request"


def test_other_commands_args() -> None:
    assert parse_args("unban", {"targets": ["192.0.2.1"]}) == UnbanArgs(("192.0.2.1",), None)
    assert parse_args("unban", {"targets": ["192.0.2.1"], "set": "web"}) == UnbanArgs(("192.0.2.1",), "web")
    assert parse_args("list", {}) == ListArgs(None)
    assert parse_args("list", {"set": "web"}) == ListArgs("web")
    assert parse_args("check", {"target": "192.0.2.1"}) == CheckArgs("192.0.2.1")
    assert parse_args("feeds_refresh", {"name": "spamhaus"}) == FeedsRefreshArgs("spamhaus")
    for cmd in ("ping", "status", "feeds"):
        assert parse_args(cmd, {}) == NoArgs()
        with pytest.raises(ProtocolError, match="allowed: none"):
            parse_args(cmd, {"x": 1})
    bad: list[tuple[str, dict[str, Any]]] = [
        ("unban", {"targets": [{"target": "x"}]}), ("check", {}), ("check", {"target": ""}),
        ("feeds_refresh", {"name": 1}), ("nope", {}),
    ]
    for cmd, args in bad:
        with pytest.raises(ProtocolError):
            parse_args(cmd, args)


def test_jail_and_origin_of_fail2ban_requests() -> None:
    # Optional since nftblockd 0.1 (v1 stays v1): a v1 client that never sends them gets the old defaults.
    a = parse_args("ban", {"targets": ["192.0.2.1", {"target": "192.0.2.2", "jail": "recidive"}],
                           "origin": "fail2ban", "jail": "sshd", "comment": "f2b"})
    assert isinstance(a, BanArgs) and a.origin == "fail2ban"
    assert [(i.target, i.jail) for i in a.items] == [("192.0.2.1", "sshd"), ("192.0.2.2", "recidive")]
    bulk = parse_args("ban", {"targets": ["192.0.2.1", "192.0.2.3"], "jail": "sshd"})
    assert isinstance(bulk, BanArgs) and bulk.uniform and {i.jail for i in bulk.items} == {"sshd"}
    assert parse_args("unban", {"targets": ["192.0.2.1"], "origin": "fail2ban", "jail": "sshd"}) == \
        UnbanArgs(("192.0.2.1",), None, "fail2ban", "sshd")
    assert parse_args("unban", {"targets": ["192.0.2.1"]}) == UnbanArgs(("192.0.2.1",), None, "cli", "")
    for cmd, args in (("unban", {"targets": ["x"], "origin": "jail"}), ("unban", {"targets": ["x"], "jail": 1}),
                      ("ban", {"targets": ["x"], "jail": ["sshd"]})):
        with pytest.raises(ProtocolError):
            parse_args(cmd, args)


def test_ban_entry_computes_remaining_time_from_now() -> None:
    info = BanInfo(parse_target("192.0.2.1"), "default", "nftblock_default_v4", 1000.0, "jail", "5 failures",
                   "sshd")
    assert ban_entry(info, now=400.0) == {
        "target": "192.0.2.1", "blocklist": "default", "set": "nftblock_default_v4", "until": 1000.0,
        "expires_in": 600.0, "origin": "jail", "reason": "5 failures", "jail": "sshd",
    }
    assert ban_entry(info, now=2000.0)["expires_in"] == 0.0
    forever = BanInfo(parse_target("10.0.0.0/8"), "feeds", "s", None, "feed", "")
    assert ban_entry(forever, now=0.0)["expires_in"] is None
    assert ban_entry(forever, now=0.0)["target"] == "10.0.0.0/8"


@settings(max_examples=50)
@given(st.integers(0, 2**32 - 1))
def test_any_ipv4_target_survives_the_wire(n: int) -> None:
    text = str(ipaddress.IPv4Address(n))
    (event,) = feed_whole(encode_request(1, "ban", {"targets": [text]}))
    assert isinstance(event, Request)
    assert parse_args(event.cmd, event.args) == BanArgs((BanItem(text),), None)


@pytest.mark.parametrize("timeout", [1e308, 10**400, "99999d", "9" * 400])
def test_a_huge_timeout_is_the_clients_mistake(timeout: object) -> None:
    # Issue 13, item 5: `timeout: 1e308` was answered `internal` (an OverflowError in the daemon).
    with pytest.raises(ProtocolError, match=r"timeout: .*(at most 3650d|too large)"):
        parse_args("ban", {"targets": ["203.0.113.9"], "timeout": timeout})


def test_a_huge_comment_reason_or_jail_is_refused() -> None:
    # Issue 13, item 5: a 5 MB comment became one 5 MB audit line and a 5 MB database row.
    big = "x" * 5_000_000
    with pytest.raises(ProtocolError, match="'comment': at most 256 characters"):
        parse_args("ban", {"targets": ["203.0.113.9"], "comment": big})
    with pytest.raises(ProtocolError, match=r"targets\[0\].reason: at most 256"):
        parse_args("ban", {"targets": [{"target": "203.0.113.9", "reason": big}]})
    with pytest.raises(ProtocolError, match=r"targets\[0\].jail: at most 256"):
        parse_args("ban", {"targets": [{"target": "203.0.113.9", "jail": big}]})
    assert parse_args("ban", {"targets": ["203.0.113.9"], "comment": "x" * 256})
