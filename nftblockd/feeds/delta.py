"""What a feed refresh changes in a blocklist's sets: the diff against the previous aggregate, and which kernel
timeouts are due for renewal. Pure: no IO, no clock (`now_ms` is passed in), no kernel.

Rules
-----
* The first sync of a blocklist has nothing to diff against: `AppliedSets.plan` answers None and the caller
  makes the sets equal the aggregate the slow way (the enforcer diffs against its ban state, which also
  covers whatever a previous daemon left in the kernel). `record` then remembers what was applied.
* Every later refresh is diffed against the keys last applied, set by set: both are sorted lists (the
  aggregate is sorted by start and its ranges never overlap), so `diff_sorted` walks them in step and only
  does Python work where they differ. A 1 % refresh of a 54,000-entry aggregate costs ~2 ms instead of the
  ~15 ms of set algebra against the ban state; an unchanged refresh costs one list comparison per set and
  sends nothing to the kernel.
* Timeouts (a feed with `ban_timeout`): every element the kernel holds with a timeout belongs to one cohort,
  the elements written with one end (`until_ms`). A refresh renews a cohort only once it is past half of its
  life (less than half of `ban_timeout` left, or already ended): its elements still wanted are re-sent with the
  new end and join the new cohort. A cohort that ended (the feed could not be fetched for longer than
  `ban_timeout`) is renewed as well: its elements expired from the kernel and are written again. So at least
  two refreshes per `ban_timeout` keep every element in the kernel, and each element is re-sent about once per
  half-life instead of on every refresh.
* Elements the kernel refused are forgotten (`forget`): they are no longer "applied", so the next refresh adds
  them again.
* A blocklist whose feeds switch between ending and permanent bans changes every element's end: `plan` then
  answers None too (a full sync), as on the first one.

Memory: per set, the sorted key list last applied (shared with the aggregate, not copied) and its cohorts'
key lists: about 16 bytes per element on top of the ban state, and 8 for the packed IPv4 keys.

The diff runs in C when the optional extension `_sorted` was built (feeds/_sorted.c; `NATIVE` says so,
NFTBLOCK_NATIVE=0 in the environment turns it off as it does the matcher's core): ~0.8 ms for the 1 % refresh
of bench_feeds_kernel.py's 54,000 keys against ~1.5 ms for the Python walk, whose answers it gives exactly
(tests/unit/test_feeds_delta.py). Both are bound by reading every key object of both lists. With the
extension, a set whose keys all fit in 64 bits (IPv4) also keeps the keys last applied packed (`diff_packed`:
8 bytes a key, one contiguous buffer, made in the same walk), so a refresh reads the old keys from there and
not from the previous aggregate's int objects, cold in memory by then.
"""

from __future__ import annotations

import array
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from nftblockd import optional_c

__all__ = ["NATIVE", "AppliedSets", "SetDelta", "diff_packed", "diff_packed_py", "diff_sorted", "diff_sorted_py",
           "pack"]


def diff_sorted_py(old: list[int], new: list[int]) -> tuple[list[int], list[int]]:
    """(added, removed) between two strictly increasing lists: `new` minus `old` and `old` minus `new`, each in
    increasing order. (`diff_sorted` is this, in C when it was built.)

    Walks both lists in step: a run of equal elements is skipped by one C-level scan (`any(map(ne, ...))` over
    the two list iterators stops right after the first unequal pair; the iterators say where they are), so
    Python runs once per difference, not once per element.
    """
    added: list[int] = []
    removed: list[int] = []
    if old == new:
        return added, removed
    n_old, n_new = len(old), len(new)
    i = j = 0
    it_old, it_new = iter(old), iter(new)
    ne = operator.ne
    while i < n_old and j < n_new:
        if not any(map(ne, it_old, it_new)):  # equal up to the end of the shorter one
            step = min(n_old - i, n_new - j)
            i += step
            j += step
            break
        i = n_old - it_old.__length_hint__() - 1  # type: ignore[attr-defined]  # the unequal pair's positions
        j = n_new - it_new.__length_hint__() - 1  # type: ignore[attr-defined]
        a, b = old[i], new[j]
        if a < b:
            removed.append(a)
            i += 1
        else:
            added.append(b)
            j += 1
        it_old.__setstate__(i)  # type: ignore[attr-defined]  # list iterators can be put back
        it_new.__setstate__(j)  # type: ignore[attr-defined]
    removed += old[i:]
    added += new[j:]
    return added, removed


def pack(keys: list[int]) -> bytes | None:
    """`keys` as native-endian int64s (what `diff_packed` takes as `old`); None when one does not fit."""
    try:
        return array.array("q", keys).tobytes()
    except OverflowError:
        return None


def _fits(sorted_keys: list[int]) -> bool:
    return sorted_keys[0] >= -(1 << 63) and sorted_keys[-1] < 1 << 63


def diff_packed_py(old_packed: bytes, old: list[int], new: list[int]) -> tuple[list[int], list[int], bytes] | None:
    """`diff_sorted(old, new)` and `new` packed, `old_packed` being `old` as `pack` or this returned it (the C
    version reads the keys from there, and takes only the removed ones from `old`); None when a key of `new`
    does not fit in 64 bits. (`diff_packed` is this, in C when it was built.)"""
    if len(old_packed) != 8 * len(old):
        raise ValueError("diff_packed: old_packed is not old packed")
    packed = pack(new)
    if packed is None:
        return None
    added, removed = diff_sorted_py(old, new)
    return added, removed, packed


_mod = optional_c.load("nftblockd.feeds._sorted")  # not built (no C compiler): the Python walk
NATIVE = _mod is not None
diff_sorted: Callable[[list[int], list[int]], tuple[list[int], list[int]]] = (
    getattr(_mod, "diff_sorted") if _mod is not None else diff_sorted_py)  # noqa: B009
diff_packed: Callable[[bytes, list[int], list[int]], tuple[list[int], list[int], bytes] | None] = (
    getattr(_mod, "diff_packed") if _mod is not None else diff_packed_py)  # noqa: B009


class SetDelta(NamedTuple):
    """One set's part of a refresh: keys to add, to delete, and kept keys whose kernel timeout is renewed."""

    added: list[int]
    removed: list[int]
    renewed: list[int]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.renewed)


@dataclass(slots=True)
class _Applied:
    keys: list[int]  # sorted: what the set holds for the feeds, as last applied
    # (end in ms, keys written with it); only for ending bans. Keys may have been removed since: they are
    # filtered out when their cohort is renewed.
    cohorts: list[tuple[int, list[int]]] = field(default_factory=list)
    packed: bytes | None = None  # `keys` packed (diff_packed), with the extension and while they fit in 64 bits


@dataclass(slots=True)
class AppliedSets:
    """What one feed blocklist's sets hold as far as the feeds are concerned (see the module rules)."""

    sets: dict[str, _Applied] = field(default_factory=dict)
    ttl_ms: int | None = None  # ban_timeout of the last sync (None: permanent)
    # set name -> (the keys planned, them packed): made by `plan`'s walk, kept by `record` for those same keys
    _planned: dict[str, tuple[list[int], bytes]] = field(default_factory=dict, repr=False, compare=False)

    def plan(self, desired: Mapping[str, list[int]], until_ms: int | None, now_ms: int) -> dict[str, SetDelta] | None:
        """The delta from the last applied sets to `desired` (set name -> sorted keys), elements to add or renew
        ending at `until_ms`; None when there is nothing to diff against (see the rules): sync in full."""
        ttl = None if until_ms is None else until_ms - now_ms
        if not self.sets or set(desired) != set(self.sets) or (ttl is None) != (self.ttl_ms is None):
            return None
        out: dict[str, SetDelta] = {}
        self._planned.clear()
        for name, keys in desired.items():
            applied = self.sets[name]
            added, removed = self._diff(name, applied, keys)
            renewed: list[int] = []
            if ttl is not None:
                due = [c for c in applied.cohorts if (c[0] - now_ms) * 2 < ttl]
                if due:
                    want = set(keys).difference(added)  # re-added after a removal: already in `added`
                    renewed = sorted({k for _end, ks in due for k in ks if k in want})
            out[name] = SetDelta(added, removed, renewed)
        return out

    def _diff(self, name: str, applied: _Applied, keys: list[int]) -> tuple[list[int], list[int]]:
        # the packed walk is worth it only in C (the Python one unpacks `old`), and only while both sorted lists
        # fit in 64 bits, which their ends say (IPv6 sets never do: no packing tried and given up each time)
        if NATIVE and applied.keys and _fits(applied.keys) and (not keys or _fits(keys)):
            if applied.packed is None:
                applied.packed = pack(applied.keys)  # once after a full sync or a `forget`
            if applied.packed is not None:
                res = diff_packed(applied.packed, applied.keys, keys)
                if res is not None:
                    self._planned[name] = (keys, res[2])
                    return res[0], res[1]
        return diff_sorted(applied.keys, keys)

    def record(self, desired: Mapping[str, list[int]], until_ms: int | None, now_ms: int,
               deltas: Mapping[str, SetDelta] | None) -> None:
        """`desired` is now applied (with `deltas`, as planned; None: in full, every element ending at
        `until_ms`)."""
        self.ttl_ms = None if until_ms is None else until_ms - now_ms
        if deltas is None:
            self.sets = {name: _Applied(keys, [] if until_ms is None else [(until_ms, keys)])
                         for name, keys in desired.items()}
            return
        for name, keys in desired.items():
            applied = self.sets[name]
            delta = deltas[name]
            applied.keys = keys
            planned = self._planned.get(name)
            applied.packed = planned[1] if planned is not None and planned[0] is keys else None
            if until_ms is None:
                applied.cohorts = []
                continue
            if delta.renewed:
                ttl = until_ms - now_ms
                applied.cohorts = [c for c in applied.cohorts if (c[0] - now_ms) * 2 >= ttl]
            fresh = delta.added + delta.renewed
            if fresh:
                applied.cohorts.append((until_ms, fresh))
        self._planned.clear()

    def forget(self, refused: Iterable[tuple[str, int]]) -> None:
        """The kernel refused these (set name, key): they are not applied, so the next refresh adds them."""
        gone: dict[str, set[int]] = {}
        for name, key in refused:
            gone.setdefault(name, set()).add(key)
        for name, keys in gone.items():
            applied = self.sets.get(name)
            if applied is not None:
                applied.keys = [k for k in applied.keys if k not in keys]
                applied.packed = None
