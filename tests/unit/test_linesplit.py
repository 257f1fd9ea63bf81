"""LineSplitter: whole input, one byte at a time, trailing partial data, and any chunking (hypothesis)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nftblockd.detect.filterload import load_filter
from nftblockd.sources.linesplit import Lines, LineSplitter

MAX = 16


def reference(data: bytes, max_line: int = MAX) -> tuple[list[str], int, int, bytes]:
    """The obvious whole-input model: (lines, overlong, invalid, trailing partial bytes); NUL bytes removed."""
    *complete, rest = data.split(b"\n")
    lines, overlong, invalid = [], 0, 0
    for raw in complete:
        if len(raw) > max_line:
            overlong += 1
            continue
        text = raw.decode("utf-8", "replace")
        invalid += text != raw.decode("utf-8", "ignore")
        lines.append(text.replace("\0", ""))
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


# -- NUL bytes (rule 5, issue 33) -------------------------------------------------------------------------

_FAILURE = ("Dec  7 10:00:0{i} host sshd[10{i}]: Failed password for invalid user admin from 203.0.113.{i} "
            "port 4000{i} ssh2")
_text = st.text(st.characters(codec="utf-8", exclude_characters="\n\0"), max_size=12)


@pytest.mark.parametrize("where", [0, 15, 20, 26, 40, 80, -4, None])
@pytest.mark.parametrize("run_length", [1, 7, 600])
def test_a_nul_run_in_one_of_three_failures_loses_none(where: int | None, run_length: int) -> None:
    """Issue 33: a NUL run inside a log line dropped one of three failures: the line did not match."""
    lines = [_FAILURE.format(i=i) for i in range(3)]
    at = len(lines[1]) if where is None else where
    lines[1] = lines[1][:at] + "\0" * run_length + lines[1][at:]
    sp = LineSplitter()
    got = sp.feed("\n".join(lines).encode() + b"\n")
    assert got.text == [_FAILURE.format(i=i) for i in range(3)] and got.nul == 1
    sshd = load_filter("sshd")
    hosts = [getattr(sshd.match(t, 0.0), "host", None) for t in got.text]
    assert [str(h) for h in hosts] == ["203.0.113.0", "203.0.113.1", "203.0.113.2"]


@given(st.lists(st.tuples(_text, st.integers(0, 40), _text), min_size=1, max_size=12),
       st.lists(st.integers(min_value=0, max_value=2000), max_size=10))
def test_nul_runs_are_removed_from_their_lines_however_chunked(parts: list[tuple[str, int, str]],
                                                               cuts: list[int]) -> None:
    """A NUL run anywhere in a line: the line comes out as written without it, never split in two, and each
    line that had one is counted once."""
    data = b"".join(a.encode() + b"\0" * n + b.encode() + b"\n" for a, n, b in parts)
    points = sorted({c for c in cuts if c <= len(data)} | {0, len(data)})
    sp = LineSplitter(4096)
    lines: list[str] = []
    nul = 0
    for x, y in itertools.pairwise(points):
        got = sp.feed(data[x:y])
        lines += got.text
        nul += got.nul
    assert lines == [a + b for a, _, b in parts]
    assert nul == sum(1 for _, n, _ in parts if n)
    assert sp.pending == 0


def test_a_nul_in_the_held_last_line_is_removed_at_flush() -> None:
    sp = LineSplitter()
    assert sp.feed(b"one\n\0\0two").text == ["one"]
    assert sp.flush() == Lines(["two"], nul=1)
