"""feeds.parse: formats, strictness, and any bytes parsing or raising FeedFormatError (hypothesis). That the
entry parser, addr.parse_key, agrees with addr.parse_target is test_addr.py's property."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.addr import key_net, net_key, parse_key, parse_target
from nftblockd.feeds.parse import FeedFormatError, ParseResult, parse_feed

DATA = Path(__file__).parent.parent / "data" / "feeds"


def nets(result: ParseResult) -> list[str]:
    return [str(n) for n in result.networks()]


# -- plain ------------------------------------------------------------------------------------------------


def test_spamhaus_drop_semicolon_comments() -> None:
    r = parse_feed((DATA / "spamhaus_drop.txt").read_bytes())
    assert r.stats.entries == 10 and r.stats.v4 == 10 and r.stats.invalid == 0
    assert r.stats.skipped == 4  # the four `;` header lines
    assert nets(r)[:2] == ["1.10.16.0/20", "1.19.0.0/16"]


def test_firehol_netset_hash_comments() -> None:
    r = parse_feed((DATA / "firehol_level1.netset").read_bytes())
    assert r.stats.entries == 25 and r.stats.invalid == 0
    assert "10.0.0.0/8" in nets(r) and "185.11.61.104/32" in nets(r)


def test_host_bits_are_refused_counted_and_sampled_never_widened() -> None:
    """Issue 33: `45.67.89.10/9` became `45.0.0.0/9` (8.4 M addresses), `2001:db8:f3::1/17` `2001::/17`."""
    body = "45.67.89.10/9\n2001:db8:f3::1/17\n1.2.3.0/24\n" + "8.8.8.8\n" * 5
    r = parse_feed(body)
    assert nets(r) == ["1.2.3.0/24"] + ["8.8.8.8/32"] * 5
    assert (r.stats.host_bits, r.stats.invalid) == (2, 0)
    assert r.stats.invalid_samples == ("line 1: '45.67.89.10/9' (host bits set, not widened)",
                                       "line 2: '2001:db8:f3::1/17' (host bits set, not widened)")
    with pytest.raises(FeedFormatError, match="host bits set"):  # they count towards the garbage share
        parse_feed("10.0.0.5/8\n1.2.3.4/24\n1.2.3.0/24\n")


def test_garbage_is_counted_sampled_and_skipped() -> None:
    body = "1.2.3.4\n5.6.7.8\n9.9.9.9\nfoo\n1.2.3.256\n01.2.3.4\n5.6.7.8/33\n" + "8.8.8.8\n" * 10
    r = parse_feed(body)
    assert r.stats.entries == 13
    assert r.stats.invalid == 4
    assert r.stats.invalid_samples[0] == "line 4: 'foo'"
    assert len(r.stats.invalid_samples) == 4


def test_inline_comments_and_whitespace() -> None:
    r = parse_feed("  1.2.3.4   # a scanner\n\t5.6.7.0/24 ; SBL1\n# only a comment\n\n   \n")
    assert nets(r) == ["1.2.3.4/32", "5.6.7.0/24"]
    assert r.stats.lines == 5 and r.stats.skipped == 3


def test_two_tokens_on_a_line_are_invalid_not_guessed() -> None:
    r = parse_feed("1.2.3.4 5.6.7.8\n" + "9.9.9.9\n" * 3)
    assert r.stats.invalid == 1 and r.stats.entries == 3


@pytest.mark.parametrize("body", [
    "1.2.3.4\n5.6.7.0/24\n",
    "1.2.3.4\r\n5.6.7.0/24\r\n",
    "1.2.3.4\n5.6.7.0/24",  # no trailing newline
    "\ufeff1.2.3.4\n5.6.7.0/24\n",  # BOM
    "1.2.3.4\n\n\n5.6.7.0/24\n\n",
])
def test_line_endings_and_bom_do_not_matter(body: str) -> None:
    assert nets(parse_feed(body)) == ["1.2.3.4/32", "5.6.7.0/24"]
    assert nets(parse_feed(body.encode())) == ["1.2.3.4/32", "5.6.7.0/24"]


def test_ipv6_and_mapped_ipv4() -> None:
    r = parse_feed("2a01:4f8::/32\n::ffff:1.2.3.4\n::ffff:10.0.0.0/104\n2a01:4f8:0:0:0:0:0:1\n")
    assert nets(r) == ["1.2.3.4/32", "10.0.0.0/8", "2a01:4f8::/32", "2a01:4f8::1/128"]
    assert r.stats.v4 == 2 and r.stats.v6 == 2


def test_invalid_utf8_is_garbage_not_a_crash() -> None:
    r = parse_feed(b"1.2.3.4\n\xff\xfe\n5.6.7.8\n9.9.9.9\n")
    assert r.stats.entries == 3 and r.stats.invalid == 1


def test_empty_body_is_an_empty_list() -> None:
    for body in (b"", b"\n\n", b"# nothing listed today\n"):
        r = parse_feed(body)
        assert r.entries == 0 and r.stats.invalid == 0


# -- whole-body rejection -----------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    (DATA / "error.html").read_bytes(),
    b"   \n<html><body>Forbidden</body></html>",
    b"\xef\xbb\xbf<!doctype html>",
    b'<?xml version="1.0"?><Error><Code>AccessDenied</Code></Error>',
    b"# list\n<html>\n1.2.3.4\n",
])
@pytest.mark.parametrize("fmt", ["plain", "csv", "json"])
def test_markup_is_an_error_not_an_empty_list(body: bytes, fmt: str) -> None:
    with pytest.raises(FeedFormatError, match="HTML"):
        parse_feed(body, fmt, "ip" if fmt != "plain" else 0)


@pytest.mark.parametrize(("body", "markup"), [
    (b"1.2.3.4\n<br>\n5.6.7.8\n9.9.9.9\n", 1),  # issue 13: one stray line rejected the whole body
    (b"<pre>\n1.2.3.4\n5.6.7.8\n9.9.9.9\n</pre>\n", 2),  # a list served inside <pre>
    (b"# generated\n1.2.3.4\n5.6.7.8\n9.9.9.9\n<script src=x.js></script>\n", 1),  # a proxy's injection
])
def test_stray_markup_lines_are_counted_and_skipped(body: bytes, markup: int) -> None:
    r = parse_feed(body)
    assert [str(n) for n in r.networks()] == ["1.2.3.4/32", "5.6.7.8/32", "9.9.9.9/32"]
    assert r.stats.markup == markup and r.stats.invalid == 0
    assert r.stats.as_dict()["markup"] == markup


def test_markup_lines_count_towards_the_garbage_share() -> None:
    with pytest.raises(FeedFormatError, match="not a list"):
        parse_feed(b"<p>\n1.2.3.4\n<b>\n<i>\n")


def test_mostly_garbage_is_an_error() -> None:
    with pytest.raises(FeedFormatError, match="3 of 4 entries"):
        parse_feed((DATA / "garbage.txt").read_bytes())


def test_garbage_without_any_entry_is_an_error() -> None:
    with pytest.raises(FeedFormatError):
        parse_feed("Service unavailable\n")


def test_invalid_share_is_tunable() -> None:
    body = "1.2.3.4\nfoo\nbar\n"
    with pytest.raises(FeedFormatError):
        parse_feed(body)
    assert parse_feed(body, max_invalid_share=0.9).stats.invalid == 2


def test_unknown_format_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown feed format"):
        parse_feed("1.2.3.4", "xml")


# -- csv ----------------------------------------------------------------------------------------------------


def test_csv_by_name_with_commented_header_abuse_ch() -> None:
    r = parse_feed((DATA / "feodo.csv").read_bytes(), "csv", "dst_ip")
    assert nets(r) == ["50.16.16.211/32", "162.243.103.246/32", "103.41.204.169/32", "91.92.248.46/32"]
    assert r.stats.invalid == 1 and r.stats.invalid_samples == ("line 12: 'not-an-ip'",)


def test_tsv_by_name_and_by_index_with_header_row() -> None:
    body = (DATA / "blocklist.tsv").read_bytes()
    by_name = parse_feed(body, "csv", "IP")  # header names match case-insensitively
    by_index = parse_feed(body, "csv", 0)
    assert nets(by_name) == nets(by_index) == [
        "80.94.95.81/32", "80.94.95.82/32", "185.224.128.0/24", "2a01:7e00::f03c:91ff:fe00:1/128"]
    assert by_index.stats.skipped == 1 and by_index.stats.invalid == 0


def test_csv_index_without_header_and_semicolons() -> None:
    r = parse_feed("x;1.2.3.4\ny;5.6.7.0/24\nz\n", "csv", 1)
    assert nets(r) == ["1.2.3.4/32", "5.6.7.0/24"]
    assert r.stats.invalid == 1  # a row too short for the column


def test_csv_quoted_cells() -> None:
    r = parse_feed('"1.2.3.4","a, b"\n" 5.6.7.8 ","c"\n', "csv", 0)
    assert nets(r) == ["1.2.3.4/32", "5.6.7.8/32"]


def test_csv_unknown_column_name_is_an_error() -> None:
    with pytest.raises(FeedFormatError, match="no column named 'addr'"):
        parse_feed("ip,count\n1.2.3.4,5\n", "csv", "addr")


def test_csv_negative_index_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_feed("1.2.3.4\n", "csv", -1)


# -- json ---------------------------------------------------------------------------------------------------


def test_json_list_of_strings() -> None:
    r = parse_feed((DATA / "list.json").read_bytes(), "json")
    assert nets(r) == ["80.94.95.81/32", "185.224.128.0/24", "192.168.1.7/32", "2a01:7e00::/32",
                       "2a01:7e00::f03c:91ff:fe00:1/128"]
    assert r.stats.invalid == 1  # the number 17


def test_json_objects_by_key() -> None:
    r = parse_feed((DATA / "objects.json").read_bytes(), "json", "ip")
    assert nets(r) == ["80.94.95.81/32", "185.224.128.0/24", "2a01:7e00::f03c:91ff:fe00:1/128"]
    assert r.stats.skipped == 1 and r.stats.invalid == 0


def test_json_objects_need_a_key() -> None:
    with pytest.raises(FeedFormatError, match="column"):
        parse_feed((DATA / "objects.json").read_bytes(), "json", 0)


def test_ndjson_spamhaus_with_metadata_record() -> None:
    r = parse_feed((DATA / "drop_v4.json").read_bytes(), "json", "cidr")
    assert nets(r) == ["1.10.16.0/20", "1.19.0.0/16", "1.32.128.0/18"]
    assert r.stats.skipped == 1


@pytest.mark.parametrize("body", ['{"cidr": 5}', '[{"cidr": ["1.2.3.4"]}]'])
def test_json_non_string_values_are_invalid(body: str) -> None:
    with pytest.raises(FeedFormatError, match="not a list of addresses"):
        parse_feed(body, "json", "cidr")


@pytest.mark.parametrize("body", ["42", '["1.2.3.4", ', "not json at all\n{"])
def test_json_that_is_not_a_list_is_an_error(body: str) -> None:
    with pytest.raises(FeedFormatError):
        parse_feed(body, "json", "ip")


def test_json_empty_list_and_empty_body() -> None:
    assert parse_feed("[]", "json").entries == 0
    assert parse_feed("", "json").entries == 0


# -- packing ------------------------------------------------------------------------------------------------


def test_pack_unpack_round_trip() -> None:
    for text in ("0.0.0.0/8", "1.2.3.4/32", "255.255.255.255/32", "::/0", "2a01:4f8::/32", "ffff::1/128"):
        net = ipaddress.ip_network(text)
        assert key_net(net_key(net), net.version) == net


# -- properties -------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["plain", "csv", "json"]),
       st.sampled_from([0, 1, "ip", "cidr"]))
def test_any_bytes_parse_or_raise_feed_format_error(body: bytes, fmt: str, column: int | str) -> None:
    try:
        r = parse_feed(body, fmt, column)
    except FeedFormatError:
        return
    s = r.stats
    assert s.entries == len(r.v4) + len(r.v6) == s.v4 + s.v6
    assert s.entries + s.invalid + s.skipped <= max(s.lines, 1) or fmt == "json"


_net = st.one_of(
    st.builds(lambda a, p: ipaddress.IPv4Network((a >> (32 - p) << (32 - p), p)),
              st.integers(0, 2**32 - 1), st.integers(0, 32)),
    st.builds(lambda a, p: ipaddress.IPv6Network((a >> (128 - p) << (128 - p), p)),
              st.integers(0, 2**128 - 1), st.integers(0, 128)),
)


@settings(deadline=None)
@given(st.lists(_net, max_size=50), st.sampled_from(["\n", "\r\n"]), st.booleans())
def test_plain_round_trip(networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network], eol: str,
                          comments: bool) -> None:
    lines = [f"{n} ; SBL{i}" if comments else str(n) for i, n in enumerate(networks)]
    r = parse_feed(eol.join(lines))
    expected = [parse_target(str(n)) for n in networks]  # IPv4-mapped IPv6 becomes IPv4
    assert r.networks() == [n for n in expected if n.version == 4] + [n for n in expected if n.version == 6]
    assert r.stats.invalid == 0 and r.stats.host_bits == 0


@settings(deadline=None)
@given(st.lists(_net, max_size=30))
def test_json_round_trip(networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> None:
    as_objects = json.dumps([{"net": str(n)} for n in networks])
    assert parse_feed(as_objects, "json", "net").networks() == parse_feed(
        "\n".join(str(n) for n in networks)).networks()


def test_stats_as_dict_and_host_bits_in_csv_and_json() -> None:
    r = parse_feed("ip\n1.2.3.4/24\n\n5.6.7.8\n5.6.7.9\n", "csv", "ip")
    assert r.stats.as_dict() == {"lines": 5, "entries": 2, "v4": 2, "v6": 0, "host_bits": 1,
                                 "invalid": 0, "skipped": 2,
                                 "invalid_samples": ["line 2: '1.2.3.4/24' (host bits set, not widened)"],
                                 "markup": 0}
    r = parse_feed('{"ip": "2a01::1/16"}\n\n{"ip": "::ffff:102:304"}\n{"ip": "::1"}\n', "json", "ip")
    assert r.stats.as_dict()["host_bits"] == 1 and nets(r) == ["1.2.3.4/32", "::1/128"]


@pytest.mark.parametrize(("text", "expected"), [
    ("::ffff:102:304", "1.2.3.4/32"),  # IPv4-mapped in hex: the fast path maps it too
    ("::ffff:a00:0/104", "10.0.0.0/8"),
    ("::fffe:0:0/95", "::fffe:0:0/95"),  # shorter than /96: stays IPv6
    ("::ffff:a00:0/95", None),  # host bits set: refused, never widened to ::fffe:0:0/95
    ("1::2::3", None),
    ("1:2:3:4:5:6:7:8:9", None),
    ("12345::", None),
])
def test_parse_entry_edge_cases(text: str, expected: str | None) -> None:
    got = parse_key(text)
    assert (None if got is None else str(key_net(got[1], got[0]))) == expected


@settings(deadline=None)
@given(st.text(alphabet="ab\n\r\x0b\x1c\u2028 ", max_size=60), st.integers(1, 8))
def test_chunked_lines_equal_splitlines(text: str, chunk: int) -> None:
    from nftblockd.feeds.parse import _lines

    assert list(_lines(text, chunk)) == text.splitlines()
