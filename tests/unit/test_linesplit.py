"""LineSplitter: whole input, one byte at a time, trailing partial data, and any chunking (hypothesis)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nftblockd.sources.linesplit import Lines, LineSplitter

MAX = 16


def reference(data: bytes, max_line: int = MAX) -> tuple[list[str], int, int, bytes]:
    """The obvious whole-input model: (lines, overlong, invalid, trailing partial bytes)."""
    *complete, rest = data.split(b"\n")
    lines, overlong, invalid = [], 0, 0
    for raw in complete:
        if len(raw) > max_line:
            overlong += 1
            continue
        text = raw.decode("utf-8", "replace")
        invalid += text != raw.decode("utf-8", "ignore")
        lines.append(text)
    return lines, overlong, invalid, rest


def run(chunks: list[bytes], max_line: int = MAX) -> tuple[list[str], int, int, LineSplitter]:
    sp = LineSplitter(max_line)
    lines: list[str] = []
    overlong = invalid = 0
    for chunk in chunks:
        got = sp.feed(chunk)
        lines += got.text
        overlong += got.overlong
        invalid += got.invalid
    return lines, overlong, invalid, sp


SAMPLE = (b"Failed password for root from 1.2.3.4\n"[:MAX] + b"\n"
          b"short\n"
          b"\n"
          b"this line is far longer than sixteen bytes\n"
          b"caf\xc3\xa9 ok\n"
          b"bad \xff\xfe byte\n"
          b"tail")


def test_whole_input() -> None:
    lines, overlong, invalid, sp = run([SAMPLE])
    assert lines == ["Failed password ", "short", "", "café ok", "bad \ufffd\ufffd byte"]
    assert (overlong, invalid) == (1, 1)
    assert sp.pending == len(b"tail")


def test_one_byte_at_a_time() -> None:
    whole = run([SAMPLE])
    bytewise = run([SAMPLE[i:i + 1] for i in range(len(SAMPLE))])
    assert bytewise[:3] == whole[:3]
    assert bytewise[3].pending == whole[3].pending


def test_trailing_partial_is_held_until_its_newline() -> None:
    sp = LineSplitter(MAX)
    assert sp.feed(b"one\ntw").text == ["one"]
    assert sp.pending == 2
    assert sp.feed(b"o").text == []
    got = sp.feed(b"\nthree")
    assert got.text == ["two"]
    assert sp.pending == len(b"three")
    assert sp.flush().text == ["three"]
    assert sp.pending == 0


def test_overlong_partial_is_not_buffered_and_sync_is_kept() -> None:
    sp = LineSplitter(MAX)
    assert sp.feed(b"x" * 100).text == []
    assert sp.pending == 100
    assert sp.feed(b"y" * 1000).text == []
    got = sp.feed(b"zz\nnext\n")
    assert got.text == ["next"]
    assert got.overlong == 1
    assert sp.pending == 0
    assert sp.flush().text == []


def test_line_of_exactly_max_line_is_kept() -> None:
    assert LineSplitter(4).feed(b"abcd\nabcde\n").text == ["abcd"]
    sp = LineSplitter(4)
    sp.feed(b"abcd")
    assert sp.feed(b"\n").text == ["abcd"]


def test_multibyte_lines_near_the_limit_are_measured_in_bytes() -> None:
    sp = LineSplitter(8)
    got = sp.feed("ééé\néééé\nééééé\n".encode() * 3)  # 6, 8 and 10 bytes
    assert got.text == ["ééé", "éééé"] * 3
    assert got.overlong == 3


def test_skip_to_next_line_drops_the_fragment_uncounted() -> None:
    sp = LineSplitter(MAX)
    sp.skip_to_next_line()
    got = sp.feed(b"ment of a line\nwhole\n")
    assert got.text == ["whole"]
    assert got.overlong == 0
    assert sp.pending == 0


def test_reset_forgets_the_partial_line() -> None:
    sp = LineSplitter(MAX)
    sp.feed(b"half")
    sp.reset()
    assert sp.feed(b"new\n").text == ["new"]


def test_empty_feed_and_bad_limit() -> None:
    assert LineSplitter().feed(b"") == Lines([])
    with pytest.raises(ValueError, match="max_line"):
        LineSplitter(0)


@given(st.binary(max_size=400), st.lists(st.integers(min_value=0, max_value=400), max_size=20))
def test_any_chunking_yields_the_same_lines(data: bytes, cuts: list[int]) -> None:
    points = sorted({c for c in cuts if c <= len(data)} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(points)]
    lines, overlong, invalid, sp = run(chunks, max_line=8)
    want_lines, want_overlong, want_invalid, rest = reference(data, max_line=8)
    assert lines == want_lines
    assert (overlong, invalid) == (want_overlong, want_invalid)
    assert sp.pending == len(rest)


@given(st.lists(st.sampled_from([b"a", b"bb", b"\xff", "é".encode(), b"\n", b"x" * 9]), max_size=60))
def test_resuming_at_the_last_boundary_yields_the_rest(parts: list[bytes]) -> None:
    # What the tailer relies on: offset - pending is a line boundary, and starting there loses nothing.
    data = b"".join(parts)
    cut = len(data) // 2
    sp = LineSplitter(8)
    first = sp.feed(data[:cut]).text
    boundary = cut - sp.pending
    assert boundary == 0 or data[boundary - 1:boundary] == b"\n"
    rest = LineSplitter(8).feed(data[boundary:]).text
    assert first + rest == reference(data, max_line=8)[0]


@given(st.binary(max_size=200))
def test_never_raises_and_text_is_str(data: bytes) -> None:
    sp = LineSplitter(8)
    for line in sp.feed(data).text + sp.flush().text:
        assert isinstance(line, str)
