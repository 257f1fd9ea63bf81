"""A read as the parser hands it (`rawread.RawEntries`) and its column-at-a-time plain-ban decoding, held to the
entry-by-entry forms they replace: the link's old per-entry dicts and `codec.plain_bans`."""

from __future__ import annotations

import asyncio
import re
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.addr import host_net4
from nftblockd.fleet import rawread
from nftblockd.fleet.catchup import parse_id
from nftblockd.fleet.codec import FleetEvent, encode
from nftblockd.fleet.codec import plain_bans as reference
from tests.unit.test_fleet_batch import ME, NOW, RANGES, UNTILS, observed, service

LAYOUT_ADDRESSES = (b"198.51.100.7", b"198.51.100.8", b"10.1.2.3", b"8.8.8.8", b"127.0.0.1", b"192.0.2.5",
                    b"2001:db8::1", b"::ffff:10.1.2.3", b"fe80::1")


def as_raw(fields: list[Any]) -> list[Any]:
    """A field map as redis sends it: [f, v, f, v, ...] (a dict's order: `encode`'s when built by it)."""
    return [x for kv in fields for x in kv]


ms_ids = st.integers(0, 2**44).flatmap(lambda ms: st.integers(0, 50).map(lambda seq: f"{ms}-{seq}".encode()))


ODD = ("unban", "range", "odd_value", "odd_until", "order", "extra")


@st.composite
def layout_fields(draw: st.DrawFn, odd: str) -> list[tuple[Any, Any]]:
    """An entry laid out as `encode` writes it: a plain ban (`odd` "plain"), or something else in one field."""
    until = draw(st.sampled_from(UNTILS[:5]) | st.integers(-2_000, 4_000_000).map(
        lambda ms: repr(NOW + ms / 1000).encode()))
    origin = draw(st.sampled_from((b"h1", b"h1", b"h2", ME)))
    oseq, ts = str(draw(st.integers(0, 10**6))).encode(), str(draw(st.integers(0, int(NOW * 1000)))).encode()
    f = {b"v": b"2", b"op": b"ban", b"net": draw(st.sampled_from(LAYOUT_ADDRESSES)), b"until": until,
         b"origin": origin, b"oseq": oseq, b"src": draw(st.sampled_from((b"jail:sshd", b"cli"))), b"ts": ts}
    if odd == "unban":
        f[b"op"], f[b"until"] = b"unban", b"0"
    elif odd == "range":
        f[b"net"] = draw(st.sampled_from(RANGES))
    elif odd == "odd_value":
        key = draw(st.sampled_from(list(f)))
        f[key] = draw(st.sampled_from((b"2", b"x", b"-1", b"", "text", bytearray(b"1"), b"a" * 200,
                                       b"12345678901234567890", b"1234567890123456789", b"1.5", b"inf", b"nan",
                                       b" 7")))
    elif odd == "odd_until":
        f[b"until"] = draw(st.sampled_from((*UNTILS[5:], b"inf", b"Infinity", b"1e3", b" 1700000100", b"nan")))
    items = list(f.items())
    if odd == "order":
        items = draw(st.permutations(items))
    elif odd == "extra":
        items.append((b"later", b"field"))
    return items


@st.composite
def raw_reads(draw: st.DrawFn) -> list[Any]:
    """Reads of entries as `encode` lays them out: all plain bans (or own entries), all plain but one, or mixed."""
    n = draw(st.integers(1, 30))
    kind = draw(st.sampled_from(("plain", "one_odd", "mixed")))
    odd_at = draw(st.integers(0, n - 1))
    ms = int(NOW * 1000)
    out = []
    for i in range(n):
        ms += draw(st.sampled_from((0, 1, 300)))
        if kind == "mixed":
            odd = draw(st.sampled_from(("plain",) * 4 + ODD))
        else:
            odd = draw(st.sampled_from(ODD)) if kind == "one_odd" and i == odd_at else "plain"
        out.append([f"{ms}-{i}".encode(), as_raw(draw(layout_fields(odd)))])
    return out


def by_entry(raw: list[Any]) -> list[tuple[tuple[int, int], dict[Any, Any]]]:
    """What `RedisLink.read` made of a reply before (one dict per entry)."""
    return [(parse_id(eid), dict(zip(f[::2], f[1::2], strict=False))) for eid, f in raw]


@settings(max_examples=200, deadline=None)
@given(raw_reads())
def test_column_decoding_agrees_with_the_reference(raw: list[Any]) -> None:
    entries = rawread.RawEntries(raw)
    assert len(entries) == len(raw) and list(entries) == by_entry(raw) and entries[-1] == by_entry(raw)[-1]
    want = reference(by_entry(raw), ME)
    assert rawread.plain_bans(entries, ME) == want
    try:
        columns = rawread._columns(entries, ME)
    except Exception:  # an odd value's type: `plain_bans` then asks the reference
        columns = None
    if columns is not None:  # where the column path answers, it answers what the reference does
        assert columns == want


@given(st.lists(ms_ids, min_size=1, max_size=40))
def test_stream_id_times_a_column_at_a_time(ids: list[bytes]) -> None:
    assert rawread._ms_of(list(ids)) == [parse_id(i)[0] for i in ids]


@pytest.mark.parametrize("ids", [[b"5", b"6-1"], [b"1-2-3"], [b"7-", b"8-0"], ["9-1", "10-2"], [b"1 2-3"]])
def test_odd_ids_take_parse_id(ids: list[Any]) -> None:
    try:
        want: Any = [parse_id(i)[0] for i in ids]
    except ValueError:
        with pytest.raises(ValueError):
            rawread._ms_of(ids)
        return
    assert rawread._ms_of(ids) == want


def jail_read(n: int, own_every: int = 0) -> list[Any]:
    out = []
    for i in range(n):
        origin = "me" if own_every and i % own_every == 0 else "h1"
        ev = FleetEvent("ban", host_net4(0x0A000000 + i), NOW + 60 + i * 0.001, origin, i + 1, "jail:sshd",
                        int(NOW * 1000))
        fields = as_raw([(k.encode(), v.encode()) for k, v in encode(ev).items()])
        out.append([f"{int(NOW * 1000)}-{i}".encode(), fields])
    return out


def test_a_catch_up_read_is_decoded_by_columns() -> None:
    """Entries as `codec.encode` writes them (the stream keeps the order) take the column path, own entries too."""
    raw = jail_read(50, own_every=7)
    got = rawread._columns(rawread.RawEntries(raw), ME)
    assert got is not None and got == reference(by_entry(raw), ME)
    assert got.own == {"ban": 8} and len(got.keys) == 42


@settings(max_examples=60, deadline=None)
@given(st.lists(raw_reads(), min_size=1, max_size=3), st.booleans())
def test_the_receive_loop_on_raw_reads_does_what_it_does_entry_by_entry(reads: list[list[Any]],
                                                                       permanent: bool) -> None:
    async def run() -> None:
        ref = service(batch=False, allow_permanent=permanent)
        fast = service(batch=True, allow_permanent=permanent)
        for raw in reads:
            await ref._apply(by_entry(raw), "run")
            await fast._apply(rawread.RawEntries(raw), "run")
            assert observed(fast) == observed(ref)

    asyncio.run(run())


ODD_VALUES = (b"2", b"x", b"-1", b"", "text", bytearray(b"1"), b"a" * 200, b"12345678901234567890",
              b"1234567890123456789", b"1.5", b"inf", b"-inf", b"nan", b"Infinity", b"1e400", b" 7", b"4102444800.5",
              b"10.1.2.3/32", b"::1", b"\xff", None)


@pytest.mark.parametrize("field", [1, 3, 5, 7, 9, 11, 13, 15])
def test_one_odd_value_in_a_plain_read_is_what_the_reference_says(field: int) -> None:
    for value in ODD_VALUES:
        raw = jail_read(4)
        raw[2][1][field] = value
        want = reference(by_entry(raw), ME)
        try:
            got = rawread._columns(rawread.RawEntries(raw), ME)
        except Exception:
            got = None
        assert got is None or got == want, value
        assert rawread.plain_bans(rawread.RawEntries(raw), ME) == want, value


# --- the C loop (fleet/_plain.c), where it was built: wherever it answers, it answers what the reference does

native = pytest.mark.skipif(not rawread.NATIVE, reason="nftblockd.fleet._plain not built (no C compiler)")
_DECIMAL = re.compile(rb"[0-9]*\.?[0-9]*")  # (with a digit) the ends the C loop reads: a float's repr, ms


def _native_or_none(raw: list[Any]) -> Any:
    try:
        return rawread._from_native(raw, ME)
    except Exception:  # an origin or src the reference refuses: `plain_bans` then asks it
        return None


@native
@settings(max_examples=300, deadline=None)
@given(raw_reads())
def test_the_c_loop_agrees_with_the_reference(raw: list[Any]) -> None:
    want = reference(by_entry(raw), ME)
    got = _native_or_none(raw)
    assert got is None or got == want
    laid_out = all(f[0::2] == list(rawread.LAYOUT) and all(type(v) is bytes for v in f) for _i, f in raw)
    if want is not None and laid_out and all(b":" not in f[5] and _DECIMAL.fullmatch(f[7]) for _i, f in raw
                                             if f[9] != ME):
        assert got == want  # an IPv4 read with decimal ends: the C loop answers it, not the Python columns


@native
@settings(max_examples=300, deadline=None)
@given(st.one_of(st.floats(0, 4102444800.0).map(lambda x: repr(x).encode()),
                 st.from_regex(rb"\A[0-9]{0,25}\.?[0-9]{0,25}\Z"),
                 st.integers(0, 2**32 - 1).map(lambda k: f"{k >> 24}.{k >> 16 & 255}.{k >> 8 & 255}.{k & 255}"
                                               .encode())),
       st.sampled_from((5, 3)))
def test_the_c_loop_reads_ends_as_float_does_and_addresses_as_inet_pton(value: bytes, field: int) -> None:
    """Ends: glibc's strtod against Python's float() on reprs and on any digits-and-dot string; addresses:
    canonical dotted quads (and the same strings as ends, as odd addresses: leading zeros, too many digits)."""
    raw = jail_read(3)
    raw[1][1][2 * (2 if field == 5 else 3) + 1] = value
    want = reference(by_entry(raw), ME)
    got = _native_or_none(raw)
    assert got is None or got == want
    canonical = not any(p.startswith(b"0") and p != b"0" for p in value.split(b"."))
    if want is not None and (_DECIMAL.fullmatch(value) if field == 3 else canonical):
        assert got == want


@native
@pytest.mark.parametrize("field", [1, 3, 5, 7, 9, 11, 13, 15])
def test_one_odd_value_in_the_c_loop_is_what_the_reference_says(field: int) -> None:
    for value in (*ODD_VALUES, b"010.1.2.3", b"1.2.3.256", b"1.2.3", b"1.2.3.4.5", b"1..2.3", b"1.2.3.4 ", b"1.5.",
                  b".5", b"5.", b".", b"1.2.3", b"0.0.0.0", b"00", b"1" * 19, b"1" * 20):
        raw = jail_read(4)
        raw[2][1][field] = value
        got = _native_or_none(raw)
        assert got is None or got == reference(by_entry(raw), ME), value
    for eid in (b"5", b"1-2-3", b"7-", b"-1", b"1" * 19 + b"-0", b"12-" + b"9" * 21, "9-1"):
        raw = jail_read(4)
        raw[1][0] = eid
        try:
            want = reference(by_entry(raw), ME)
        except ValueError:
            want = None
        got = _native_or_none(raw)
        assert got is None or got == want, eid


@native
def test_a_catch_up_read_takes_the_c_loop_own_entries_too() -> None:
    raw = jail_read(50, own_every=7)
    got = rawread._from_native(raw, ME)
    assert got is not None and got == reference(by_entry(raw), ME) and got.own == {"ban": 8}
    assert rawread._from_native(jail_read(5, own_every=1), ME) == reference(by_entry(jail_read(5, own_every=1)), ME)


@native
def test_the_c_loop_gives_the_ids_times_in_seconds_below_2_53_ms_only() -> None:
    # the loop divides the ms as a double: exact (Python's `ms / 1000`) below 2**53, where a double holds the ms
    raw = jail_read(3)
    raw[1][0] = f"{2**53 - 1}-0".encode()
    got = rawread._from_native(raw, ME)
    assert got is not None and got == reference(by_entry(raw), ME) and got.ats[1] == (2**53 - 1) / 1000
    raw[1][0] = f"{2**53}-0".encode()
    assert sys.modules["nftblockd.fleet._plain"].columns(raw, ME) is None  # the Python columns decide then
    assert rawread.plain_bans(rawread.RawEntries(raw), ME) == reference(by_entry(raw), ME)


def test_good_ids_keeps_the_entries_whose_ids_parse_and_counts_the_others() -> None:
    raw: list[Any] = [[b"5-0", [b"k", b"v"]], [b"x-1", []], [7, []], [None, []], [b"\xff-1", []], [b"6-2", None]]
    read = rawread.RawEntries(raw)
    for bad in raw[1:5]:
        with pytest.raises(ValueError):
            parse_id(bad[0])
    assert rawread.good_ids(read) == ([((5, 0), {b"k": b"v"}), ((6, 2), {})], 4)
    assert rawread.good_ids([((1, 0), {})]) == ([((1, 0), {})], 0)


# hostile bytes in any one place of an entry (a field's name or value, the id): digits, dots, dashes, NULs,
# blanks, high bytes, at any length up to past the loop's bounds; the C loop answers the reference or None
_hostile = st.one_of(st.binary(max_size=24),
                     st.lists(st.sampled_from([b"0", b"1", b"9", b".", b"-", b"\x00", b" ", b"\xff", b":", b"e",
                                               b"255", b"256", b"4102444800"]), max_size=40).map(b"".join))


@native
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 3), st.integers(-1, 15), _hostile)
def test_the_c_loop_on_hostile_bytes_is_the_reference_or_none(at: int, field: int, value: bytes) -> None:
    raw = jail_read(4, own_every=3)
    if field < 0:
        raw[at][0] = value
    else:
        raw[at][1][field] = value
    try:
        want = reference(by_entry(raw), ME)
    except ValueError:  # an id the server could not have sent: reading raises, the C loop must not answer
        want = None
    got = _native_or_none(raw)
    assert got is None or got == want, (at, field, value)


def _refcounts(raw: list[Any]) -> list[int]:
    """The reference counts of a read's every object (the lists, the ids, the fields' names and values)."""
    objs = [raw, *raw, *(y for entry in raw for x in entry for y in (x, *(x if isinstance(x, list) else ())))]
    return [sys.getrefcount(o) for o in objs]


@native
def test_the_c_loop_leaves_its_inputs_references_as_they_were() -> None:
    # each answer (a result, None at each kind of refusal) run many times: a reference taken and not given
    # back (or given back twice) on any path shows in the inputs' counts; the answer's origins are
    # the read's own bytes objects (borrowed from it, each appended once per entry)
    reads = [jail_read(8, own_every=3), jail_read(3)]
    for field, value in ((5, b"::1"), (7, b"inf"), (3, b"unban"), (0, b"x"), (15, "text"), (11, b"1" * 20)):
        odd = jail_read(4)
        odd[2][1][field] = value
        reads.append(odd)
    odd_id = jail_read(3)
    odd_id[1][0] = b"1-2-3"
    reads += [odd_id, [[b"1-1"]], [[b"1-1", [b"v"] * 16]], []]
    plain = sys.modules["nftblockd.fleet._plain"]
    for raw in reads:
        before = _refcounts(raw)
        for _ in range(50):
            got = plain.columns(raw, ME)
            if got is not None:
                origins = got[6]
                assert all(o is e[1][9] for o, e in zip(origins, (e for e in raw if e[1][9] != ME), strict=True))
                del origins
            del got
        assert _refcounts(raw) == before, raw[:1]


@native
def test_the_c_loop_under_failing_allocations_raises_memoryerror_and_leaks_nothing() -> None:
    # every allocation of one call made to fail in turn (CPython's _testcapi hooks): each of the loop's error
    # paths runs; it answers or raises MemoryError, and the read's references are as they were
    testcapi = pytest.importorskip("_testcapi")
    plain = sys.modules["nftblockd.fleet._plain"]
    raw = jail_read(6, own_every=4)
    want = plain.columns(raw, ME)
    before = _refcounts(raw)
    failed = 0
    for k in range(1, 60):
        got = None
        testcapi.set_nomemory(k, k + 1)
        try:
            got = plain.columns(raw, ME)
        except MemoryError:
            failed += 1
        else:
            assert got == want
        finally:
            testcapi.remove_mem_hooks()
    del got
    assert failed > 10  # the sweep reached the loop's allocations, not only the call's
    assert _refcounts(raw) == before


# an until as digits with at most one dot anywhere (leading zeros, a dot first or last), up to 18 digits: the C
# loop's exact quotient for at most 15 digits, strtod beyond, each held to Python's float() bit for bit
until_texts = st.builds(lambda digits, dot: digits[:dot] + "." + digits[dot:] if dot is not None else digits,
                        st.text("0123456789", min_size=1, max_size=18),
                        st.none() | st.integers(0, 18)).filter(lambda t: t != ".")


@native
@settings(max_examples=400, deadline=None)
@given(st.lists(until_texts, min_size=1, max_size=20))
def test_the_c_loop_reads_each_until_as_float_does(texts: list[str]) -> None:
    raw = jail_read(len(texts))
    for entry, text in zip(raw, texts, strict=True):
        entry[1][7] = text.encode()  # the until's value (the fourth field)
    got = sys.modules["nftblockd.fleet._plain"].columns(raw, ME)
    want = [float(t) for t in texts]
    if max(want) > 4102444800.0:  # beyond MAX_UNTIL: the Python columns decide (and refuse)
        assert got is None
        return
    assert got is not None
    ends, ends_ms = got[5], got[9]
    assert [e.hex() for e in ends] == [w.hex() for w in want]
    assert ends_ms == [int(w * 1000.0) for w in want]


@native
def test_the_c_loop_shares_a_runs_time_objects_and_cuts_its_lists_after_own_entries() -> None:
    raw = jail_read(30, own_every=4)  # ids: one ms for all; ts: one value for all
    got = sys.modules["nftblockd.fleet._plain"].columns(raw, ME)
    assert got is not None and got[:3] == (8, 0, 0)
    ats, keys, ts = got[3], got[4], got[8]
    assert len(ats) == len(keys) == len(ts) == 22 and None not in ats
    assert len({id(a) for a in ats}) == 1 and len({id(t) for t in ts}) == 1  # one object each for the run
    assert rawread._from_native(raw, ME) == reference(by_entry(raw), ME)
