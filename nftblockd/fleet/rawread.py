"""A stream read as the RESP parser hands it, and its plain bans decoded a column at a time.

`RawEntries` keeps an `XREAD` reply's entries as they came (`[id, [field, value, ...]]` each) and is the
sequence of (stream id, fields) the receive loop iterates; the fields of an entry become a dict only when
something asks for that entry. `plain_bans` is `codec.plain_bans` for such a read: where the read is what a
catch-up reads (every entry laid out as `codec.encode` writes it, every one not this host's own a plain
single-address ban), it checks and converts whole columns with C-level passes (`map`, `zip`, `set`, one
`float` per end) instead of a dict, a dozen lookups and a few calls per entry: a 100k catch-up spent ~0.4 s
building the dicts and ~0.3 s in the per-entry checks, against ~0.2 s for the read itself. Anything else
(another layout, an unban, a range, a field `decode` would refuse) goes to `codec.plain_bans`, the reference,
which answers None where the read is not plain: the receive loop then decodes it entry by entry. Where this
module answers, it agrees with `codec.plain_bans` field for field (tests/unit/test_fleet_rawread.py).

Pure: no IO, no clock, no redis import. It never raises on a peer's bytes (only on a stream id the server
could not have sent, where that id is read: the receive loop then counts and skips it, `good_ids`).
"""

from __future__ import annotations

import collections
import itertools
import math
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

from nftblockd import optional_c
from nftblockd.fleet.catchup import StreamId, parse_id
from nftblockd.fleet.codec import (
    _ORIGIN_RE,
    _SCHEMA_B,
    _SRC_RE,
    MAX_FIELD,
    MAX_UNTIL,
    PlainBans,
    _checked_name,
    _checked_until,
    _hosts,
    plain_ends_ms,
)
from nftblockd.fleet.codec import plain_bans as plain_entries

Entry = tuple[StreamId, dict[Any, Any]]  # as fleet.link.Entry

# the field names at the even places of an entry as `codec.encode` lays it out (redis keeps the order)
LAYOUT = (b"v", b"op", b"net", b"until", b"origin", b"oseq", b"src", b"ts")
_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)


def _fields(f: Any) -> dict[Any, Any]:
    return dict(zip(f[::2], f[1::2], strict=False)) if isinstance(f, list) else dict(f or {})


class RawEntries(Sequence[Entry]):
    """The entries of one read, `raw` as the parser gave them: the ids' times when first asked for (a column at
    a time where they are all "<ms>-<seq>"; the C loop reads them itself), each entry's id and fields when it
    is asked for. An id the server could not have sent raises ValueError where it is read."""

    __slots__ = ("_ms", "raw")

    def __init__(self, raw: list[Any]) -> None:
        self.raw = raw
        self._ms: list[int] | None = None

    def __len__(self) -> int:
        return len(self.raw)

    @overload
    def __getitem__(self, i: int) -> Entry: ...
    @overload
    def __getitem__(self, i: slice) -> list[Entry]: ...
    def __getitem__(self, i: int | slice) -> Entry | list[Entry]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self.raw)))]
        eid, f = self.raw[i]
        return parse_id(eid), _fields(f)

    def __iter__(self) -> Iterator[Entry]:
        for eid, f in self.raw:
            yield parse_id(eid), _fields(f)

    def ms(self) -> list[int]:
        """The entries' id times (milliseconds), in order."""
        if self._ms is None:
            self._ms = _ms_of(list(map(_FIRST, self.raw)))
        return self._ms


def good_ids(entries: Sequence[Entry]) -> tuple[list[Entry], int]:
    """The entries of `entries` whose stream ids parse, as (id, fields) each, and how many do not (a
    `RawEntries` read parses its ids only when they are read: the receive loop asks this once one failed)."""
    if not isinstance(entries, RawEntries):
        return list(entries), 0  # (ids parsed already)
    good: list[Entry] = []
    for eid, f in entries.raw:
        try:
            sid = parse_id(eid)
        except ValueError:
            continue
        good.append((sid, _fields(f)))
    return good, len(entries.raw) - len(good)


def _ms_of(ids: list[Any]) -> list[int]:
    """The millisecond parts of the stream ids `ids`: one join and split for the whole read when every id is
    bytes "<digits>-<digits>"; else `parse_id` each (which raises ValueError on garbage, as reading did)."""
    n = len(ids)
    try:
        joined = b" ".join(ids)
        if joined.count(b"-") == n and joined.count(b" ") == n - 1:
            parts = joined.replace(b"-", b" ").split(b" ")
            if len(parts) == 2 * n and min(map(len, parts), default=1) and b"".join(parts).isdigit():
                return list(map(int, parts[0::2]))
    except TypeError:
        pass
    return [parse_id(i)[0] for i in ids]


_plain_mod = optional_c.load("nftblockd.fleet._plain")  # not built (no C compiler): the columns in Python
_plain_c: Callable[[list[Any], bytes], tuple[Any, ...] | None] | None = (
    None if _plain_mod is None else _plain_mod.columns)
NATIVE = _plain_c is not None


def plain_bans(entries: Sequence[Entry], own: bytes) -> PlainBans | None:
    """`codec.plain_bans` of `entries`: for a `RawEntries` read of IPv4 bans laid out as `LAYOUT`, in one C loop
    (`_plain.c`, where it was built); other `RawEntries` reads a column at a time; the rest the reference."""
    if isinstance(entries, RawEntries):
        try:
            done = _from_native(entries.raw, own) if _plain_c is not None else None
            if done is None:
                done = _columns(entries, own)
        except Exception:  # an odd value somewhere (a bytearray, a str, an unhashable ...): the reference says
            done = None
        if done is not None:
            return done
    return plain_entries(entries, own)


def _from_native(raw: list[Any], own: bytes) -> PlainBans | None:
    """`_columns` of `raw` by `_plain.columns`; None where that loop does not answer (IPv6, "inf", anything it
    does not know: `_columns` then decides). Raises where `_columns` would (an origin or src `decode` refuses)."""
    assert _plain_c is not None
    got = _plain_c(raw, own)
    if got is None:
        return None
    ban, unban, other, ats, keys, ends, origins, srcs, tss, ends_ms = got
    owned = {op: k for op, k in (("ban", ban), ("unban", unban), ("?", other)) if k}
    n = len(keys)
    if not n:
        return PlainBans(owned, [], [], [], [], [], [], [])
    text = {o: _checked_name(o, _ORIGIN_RE) for o in set(origins)}
    for s in srcs:
        _checked_name(s, _SRC_RE)
    return PlainBans(owned, [4] * n, keys, ends, list(map(text.__getitem__, origins)), ats, tss, ends_ms)


def _columns(read: RawEntries, own: bytes) -> PlainBans | None:
    """None: not this path's read (the reference then decides); raises on values of an unexpected type."""
    fl = list(map(_SECOND, read.raw))
    width = 2 * len(LAYOUT)
    if set(map(type, fl)) != {list} or set(map(len, fl)) != {width}:
        return None
    # every field list has the layout's length (checked above): the columns are strided slices of the entries
    # end to end (`zip(*fl)` over 10,000 entries cost 4x as much: one iterator per entry, advanced per column)
    flat = list(itertools.chain.from_iterable(fl))
    n_all = len(fl)
    if any(flat[i::width].count(name) != n_all for i, name in zip(range(0, width, 2), LAYOUT, strict=True)):
        return None
    vs, ops, nets, untils, origins, oseqs, srcs, tss = (flat[i::width] for i in range(1, width, 2))
    ms: Sequence[int] = read.ms()
    owned: dict[str, int] = {}
    names = set(origins)
    if own in names:  # this host's own entries only move the cursor: counted by op, nothing else looked at
        keep = list(map(own.__ne__, origins))
        for op, k in collections.Counter(itertools.compress(ops, map(operator.not_, keep))).items():
            label = "ban" if op == b"ban" else "unban" if op == b"unban" else "?"
            owned[label] = owned.get(label, 0) + k
        vs, ops, nets, untils, origins, oseqs, srcs, tss = (
            list(itertools.compress(c, keep)) for c in (vs, ops, nets, untils, origins, oseqs, srcs, tss))
        ms = list(itertools.compress(ms, keep))
        names.discard(own)
    n = len(nets)
    if not n:
        return PlainBans(owned, [], [], [], [], [], [], [])
    if vs.count(_SCHEMA_B) != n or ops.count(b"ban") != n:
        return None
    text = {o: _checked_name(o, _ORIGIN_RE) for o in names}
    for s in set(srcs):
        _checked_name(s, _SRC_RE)
    for col in (oseqs, tss):  # `codec._uint`: ASCII digits, at most 19 of them (bytes.isdigit refuses non-bytes)
        if not all(map(bytes.isdigit, col)) or max(map(len, col)) > 19:
            return None
    if max(map(len, nets)) > MAX_FIELD or max(map(len, untils)) > MAX_FIELD or set(map(type, untils)) != {bytes}:
        return None
    if b"/" in b" ".join(nets):
        return None
    ends = list(map(float, untils))  # `codec._until`: float() of the bytes, finite, within [0, MAX_UNTIL]
    if not (math.isfinite(sum(ends)) and min(ends) >= 0 and max(ends) <= MAX_UNTIL):
        memo: dict[bytes, float] = {}  # "inf" (permanent) among them, or a refusal: each distinct end checked
        ends = [memo[u] if u in memo else memo.setdefault(u, _checked_until(u)) for u in untils]
    parsed = _hosts(list(nets))
    if parsed is None:
        return None
    ats = list(map(operator.truediv, ms, itertools.repeat(1000)))
    return PlainBans(owned, parsed[0], parsed[1], ends, list(map(text.__getitem__, origins)), ats,
                      list(map(int, tss)), plain_ends_ms(ends))


__all__ = ["LAYOUT", "NATIVE", "RawEntries", "good_ids", "plain_bans"]
