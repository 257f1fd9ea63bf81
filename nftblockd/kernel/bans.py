"""What nftblockd believes its kernel sets hold: the active bans, compactly, and the rules for changing them.

Pure: no IO, no clock (`now` is passed in). The batcher turns the `SetOp`s returned here into netlink
transactions; the store persists the same decisions.

Rules
-----
* A ban of a single address goes to the blocklist's hash set for its family; a range (CIDR) goes to the
  interval set. IPv4-mapped IPv6 was already normalised to IPv4 by `addr.parse_target`.
* Re-banning what is already banned never shortens it: the later end wins (an end of `None`, a ban that never
  ends, wins over any other). A re-ban that ends earlier is a no-op (`BanOutcome.UNCHANGED`).
* The kernel refuses overlapping ranges in an interval set and never merges them, so overlaps are resolved
  here, keeping "unbanning one entry never unbans its neighbours" true:
    - a range inside an active range that lasts at least as long is already enforced: `COVERED`, no kernel op;
    - a range inside an active range that ends sooner is refused (`CONFLICT`): extending the outer range would
      block more than was asked for, and splitting it would change what the operator sees. The message says
      which range to unban first;
    - a range that contains active ranges absorbs them in one transaction (delete the inner ones, add the
      outer one with the latest end of all of them), so no address loses protection.
  Adjacent ranges are separate entries and stay separate.
* Unban removes exactly the entry named. Unbanning an address that is only covered by a range reports that
  range instead of doing anything.
* The kernel expires elements itself; `expire(now)` forgets entries whose end has passed without any kernel op.

Memory: one `dict[int, int]` per set (key: addr's host key, or its net key for ranges; value: end in
milliseconds << 22 | index of an interned (origin, reason, jail, comment) tuple). About 110 bytes per ban,
against ~500 for a dataclass holding ipaddress objects. `pack_end` and `unpack_end` are the codec of that
layout (`expire` inlines the second): there an end of 0 ms is a ban that never ends (None everywhere else),
and a real end is at least 1 ms so the two cannot meet.
"""

from __future__ import annotations

import bisect
import enum
import gc
import itertools
import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast, overload

from nftblockd.addr import IPNet, format_target, host_net, key_net, key_range, net_key
from nftblockd.ends import secs_ms
from nftblockd.events import Ban, BanInfo, Unban
from nftblockd.kernel.ruleset import Ruleset, SetSpec, set_name

META_BITS = 22
META_MASK = (1 << META_BITS) - 1
_NEVER = 0  # the packed end of a ban that never ends; see pack_end
# interval index: edited in place below this many changes; above, marked stale and rebuilt by one sort at the
# next look-up (each in-place edit moves the list's tail: ~3 us per edit in a set of 15,000 ranges)
INDEX_EDITS = 64


class BanOutcome(enum.Enum):
    ADDED = "added"
    EXTENDED = "extended"
    UNCHANGED = "unchanged"  # already banned at least as long
    COVERED = "covered"  # inside an active range that lasts at least as long
    ABSORBED = "absorbed"  # replaced narrower active ranges
    CONFLICT = "conflict"
    REMOVED = "removed"
    NOT_FOUND = "not_found"
    UNKNOWN_SET = "unknown_set"
    EXPIRED = "expired"  # the end had already passed when the ban arrived


@dataclass(frozen=True, slots=True)
class SetOp:
    """One element operation for the batcher. `until_ms` None with add=True means permanent."""

    set_name: str
    key: int
    add: bool
    until_ms: int | None = None
    comment: str = ""
    existed: bool = False  # the element may already be in the kernel: an add must refresh its timeout


class OpSpec(NamedTuple):
    """The key-less part of an op; bulk paths share one instance across many elements. A NamedTuple, not a
    frozen dataclass: a catch-up of 100k bans with distinct ends makes one per key, and a dataclass's
    `__init__` (one `object.__setattr__` per field) was a tenth of it (0.09 s vs 0.024 s per 100k)."""

    add: bool
    until_ms: int | None = None
    comment: str = ""
    existed: bool = False


DELETE = OpSpec(False)


class TimedSpecs(Sequence[OpSpec]):
    """The specs of hash-set adds each with its own end, as one column (a fleet catch-up of jail bans: 100k
    ends, all different): spec i is `OpSpec(True, ends_ms[i], "", i >= new)`, made only when asked for. The
    kernel writer reads `ends_ms` at once (`KernelWriter._mixed_hash_adds`); an `OpSpec` per key was ~0.05 s
    of a 100k catch-up."""

    __slots__ = ("ends_ms", "new")

    def __init__(self, ends_ms: list[int], new: int) -> None:
        self.ends_ms = ends_ms  # absolute, ms since the epoch; none permanent
        self.new = new  # the first `new` are adds of keys the set did not hold (existed False), the rest existed

    def __len__(self) -> int:
        return len(self.ends_ms)

    @overload
    def __getitem__(self, i: int) -> OpSpec: ...
    @overload
    def __getitem__(self, i: slice) -> list[OpSpec]: ...
    def __getitem__(self, i: int | slice) -> OpSpec | list[OpSpec]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self.ends_ms)))]
        j = i + len(self.ends_ms) if i < 0 else i
        return OpSpec(True, self.ends_ms[i], "", j >= self.new)

    def __iter__(self) -> Iterator[OpSpec]:
        rep = itertools.repeat
        return map(OpSpec._make, zip(rep(True), self.ends_ms, rep(""),
                                     itertools.chain(rep(False, self.new), rep(True)), strict=False))

    def count(self, value: Any) -> int:
        if not (isinstance(value, OpSpec) and value.add and value.comment == "" and value.until_ms is not None):
            return 0
        return (self.ends_ms[self.new:] if value.existed else self.ends_ms[:self.new]).count(value.until_ms)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, as a list

    def __repr__(self) -> str:
        return f"TimedSpecs({self.ends_ms!r}, new={self.new})"


@dataclass(frozen=True, slots=True)
class BulkChange:
    """Result of `ban_hosts`: keys that need a kernel add (new, or extended with `existed`) and the rest."""

    set_name: str
    new: list[int]
    extended: list[int]
    unchanged: list[int]
    spec_new: OpSpec
    spec_extended: OpSpec


@dataclass(frozen=True, slots=True)
class HostsEach:
    """Result of `ban_hosts_each`: keys that need a kernel add (new, or extended), each with its end as given
    (None permanent), and the rest."""

    set_name: str
    new: list[int]
    new_untils: list[float | None]
    extended: list[int]
    extended_untils: list[float | None]
    unchanged: list[int]
    new_ms: list[int] | None = None  # the new keys' ends in ms (int(until * 1000)), where they were computed


@dataclass(frozen=True, slots=True)
class Change:
    outcome: BanOutcome
    ops: tuple[SetOp, ...] = ()
    message: str = ""
    related: tuple[IPNet, ...] = ()  # ranges that cover, conflict with or were absorbed


def to_ms(t: float | None) -> int | None:
    return None if t is None else int(t * 1000)


def pack_end(until_ms: int | None, meta: int) -> int:
    """One ban-state value: its end (epoch ms; None never ends) and its interned meta index."""
    # max(1, ...) keeps a real end (even one at the epoch) distinct from _NEVER
    return ((_NEVER if until_ms is None else max(1, until_ms)) << META_BITS) | meta


def unpack_end(packed: int) -> int | None:
    """The end (epoch ms) of a value from `pack_end`; None for a ban that never ends."""
    u = packed >> META_BITS
    return None if u == _NEVER else u


def _reindex(entries: SetEntries, added: list[int], removed: list[int]) -> None:
    """Keep an interval set's sorted index in step with keys added and removed: edited in place for a small
    change, marked stale (rebuilt by one sort at the next look-up) for a large one."""
    if not entries.spec.interval or not (added or removed):
        return
    if len(added) + len(removed) < INDEX_EDITS:
        for k in removed:
            entries.index_remove(k)
        for k in added:
            entries.index_add(k)
    else:
        entries.stale = True


def _later(a: int | None, b: int | None) -> bool:
    """True if end `a` is strictly later than end `b` (None = never)."""
    if a is None:
        return b is not None
    return b is not None and a > b


@dataclass(slots=True)
class SetEntries:
    spec: SetSpec
    # the set's keys -> packed ends; read through `entries`, which first settles what `defer` left pending
    held: dict[int, int] = field(default_factory=dict)
    # interval sets only: sorted starts and the keys at those starts (ranges never overlap)
    starts: list[int] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)
    # the index no longer follows `entries` (a bulk change): rebuilt from them at the next look-up. A feed
    # refresh then costs dict operations per change instead of list insertions into 15,000 ranges per change.
    stale: bool = False
    # (keys, packed end) additions not yet entered into `held` (`defer`): a feed refresh leaves its dict work
    # to the first reader instead of doing it on the way to the kernel
    pending: list[tuple[list[int], int]] = field(default_factory=list)

    @property
    def entries(self) -> dict[int, int]:
        """The set's keys -> packed ends, with any deferred additions entered first: every reader (status,
        reconcile, covering checks, unban, expiry, fleet) sees what an eager update would have left."""
        if self.pending:
            self.settle()
        return self.held

    def defer(self, keys: list[int], packed: int) -> None:
        """Enter `keys`, all ending at `packed`, at the next read of `entries` (the index must be stale: it
        is rebuilt from `entries`). The list is kept, not copied: the caller hands it over."""
        self.pending.append((keys, packed))

    def settle(self) -> None:
        """Enter the deferred additions now, in the order they were deferred."""
        pending, self.pending = self.pending, []
        for keys, packed in pending:
            self.held.update(zip(keys, itertools.repeat(packed)))

    def index_add(self, key: int) -> None:
        if self.stale:
            return
        start = key >> 8
        i = bisect.bisect_left(self.starts, start)
        self.starts.insert(i, start)
        self.keys.insert(i, key)

    def index_remove(self, key: int) -> None:
        if self.stale:
            return
        start = key >> 8
        i = bisect.bisect_left(self.starts, start)
        if i < len(self.starts) and self.keys[i] == key:
            del self.starts[i]
            del self.keys[i]

    def reindex(self) -> None:
        """Rebuild the index from `entries` now (it is marked stale, or a bulk change just happened)."""
        self.keys = sorted(self.entries, key=lambda k: k >> 8)
        self.starts = [k >> 8 for k in self.keys]
        self.stale = False

    def containing(self, first: int, last: int) -> int | None:
        """The key of an active range that contains [first, last], if any."""
        if self.stale:
            self.reindex()
        i = bisect.bisect_right(self.starts, first) - 1
        if i >= 0:
            k = self.keys[i]
            s, e = key_range(k, self.spec.version)
            if s <= first and last <= e:
                return k
        return None

    def inside(self, first: int, last: int) -> list[int]:
        """Keys of active ranges lying within [first, last]."""
        if self.stale:
            self.reindex()
        i = bisect.bisect_left(self.starts, first)
        out = []
        while i < len(self.starts) and self.starts[i] <= last:
            out.append(self.keys[i])
            i += 1
        return out


class BanState:
    def __init__(self, ruleset: Ruleset) -> None:
        self.sets: dict[str, SetEntries] = {
            s.name: SetEntries(s) for s in ruleset.sets if s.blocklist is not None
        }
        # earliest end among entries (ms): `expire` does nothing before it instead of scanning every entry
        self.next_due: float = float("inf")
        self._meta: list[tuple[str, str, str, str]] = [("", "", "", "")]
        self._meta_ids: dict[tuple[str, str, str, str], int] = {("", "", "", ""): 0}

    # -- helpers --------------------------------------------------------------------------------------

    def _due(self, until_ms: int | None) -> None:
        if until_ms is not None and until_ms < self.next_due:
            self.next_due = until_ms

    def _intern(self, meta: tuple[str, str, str, str]) -> int:
        i = self._meta_ids.get(meta)
        if i is None:
            i = len(self._meta)
            if i > META_MASK:  # absurdly many distinct reasons: share the generic slot rather than overflow
                return 0
            self._meta.append(meta)
            self._meta_ids[meta] = i
        return i

    def set_for(self, blocklist: str, net: IPNet) -> SetEntries | None:
        single = net.prefixlen == net.max_prefixlen
        return self.sets.get(set_name(blocklist, net.version, not single))

    def key_for(self, entries: SetEntries, net: IPNet) -> int:
        return net_key(net) if entries.spec.interval else int(net.network_address)

    def net_of(self, entries: SetEntries, key: int) -> IPNet:
        if entries.spec.interval:
            return key_net(key, entries.spec.version)
        return host_net(key, entries.spec.version)

    # -- changes ---------------------------------------------------------------------------------------

    def ban(self, ban: Ban, now: float, comment: str = "") -> Change:
        entries = self.set_for(ban.blocklist, ban.target)
        if entries is None:
            return Change(BanOutcome.UNKNOWN_SET, message=f"unknown blocklist {ban.blocklist!r}")
        until_ms = to_ms(ban.until)
        if until_ms is not None and until_ms <= int(now * 1000):
            return Change(BanOutcome.EXPIRED, message="the ban had already ended")
        meta = self._intern((ban.origin, ban.reason, ban.jail, comment))
        self._due(until_ms)
        key = self.key_for(entries, ban.target)
        d = entries.entries  # once: a property (it settles a feed refresh's deferred additions)
        old = d.get(key)
        if old is not None:
            if not _later(until_ms, unpack_end(old)):
                return Change(BanOutcome.UNCHANGED)
            d[key] = pack_end(until_ms, meta)
            return Change(BanOutcome.EXTENDED, (SetOp(entries.spec.name, key, True, until_ms, comment, True),))
        if not entries.spec.interval:
            d[key] = pack_end(until_ms, meta)
            return Change(BanOutcome.ADDED, (SetOp(entries.spec.name, key, True, until_ms, comment),))
        return self._ban_range(entries, key, until_ms, meta, comment)

    def _ban_range(self, entries: SetEntries, key: int, until_ms: int | None, meta: int, comment: str) -> Change:
        v = entries.spec.version
        first, last = key_range(key, v)
        outer = entries.containing(first, last)
        if outer is not None:
            outer_net = key_net(outer, v)
            if _later(until_ms, unpack_end(entries.entries[outer])):
                return Change(BanOutcome.CONFLICT, related=(outer_net,), message=(
                    f"{format_target(key_net(key, v))} lies inside the active ban {format_target(outer_net)}, "
                    "which ends sooner; unban that range first or ban it for longer"))
            return Change(BanOutcome.COVERED, related=(outer_net,))
        inner = entries.inside(first, last)
        ops: list[SetOp] = []
        end = until_ms
        for k in inner:
            u = unpack_end(entries.entries.pop(k))
            entries.index_remove(k)
            if _later(u, end):
                end = u
            ops.append(SetOp(entries.spec.name, k, False))
        entries.entries[key] = pack_end(end, meta)
        entries.index_add(key)
        ops.append(SetOp(entries.spec.name, key, True, end, comment))
        if inner:
            return Change(BanOutcome.ABSORBED, tuple(ops),
                          related=tuple(key_net(k, v) for k in inner))
        return Change(BanOutcome.ADDED, tuple(ops))

    def ban_hosts(self, blocklist: str, version: int, keys: list[int], until: float | None, now: float, *,
                  origin: str = "cli", reason: str = "", jail: str = "", comment: str = "") -> BulkChange | None:
        """Ban many single addresses of one family with one end: the bulk path (CLI stdin, restores).

        Same rules as `ban`, done with set operations instead of a Python loop per address, because per-element
        Python work is what bounds bulk throughput. Returns None for an unknown blocklist.
        """
        entries = self.sets.get(set_name(blocklist, version, False))
        if entries is None:
            return None
        until_ms = to_ms(until)
        name = entries.spec.name
        spec_new = OpSpec(True, until_ms, comment)
        spec_ext = OpSpec(True, until_ms, comment, True)
        if until_ms is not None and until_ms <= int(now * 1000):
            return BulkChange(name, [], [], list(keys), spec_new, spec_ext)
        packed = pack_end(until_ms, self._intern((origin, reason, jail, comment)))  # one int shared by all
        self._due(until_ms)
        d = entries.entries
        clash = d.keys() & keys if d else set()
        if not clash:  # one dict of the keys, merged in (cloned when the set is empty), not two
            fresh = dict.fromkeys(keys, packed)
            d.update(fresh)
            return BulkChange(name, list(fresh), [], [], spec_new, spec_ext)
        new, extended, unchanged = [], [], []
        for k in dict.fromkeys(keys):
            old = d.get(k)
            if old is None:
                new.append(k)
            elif _later(until_ms, unpack_end(old)):
                extended.append(k)
            else:
                unchanged.append(k)
                continue
            d[k] = packed
        return BulkChange(name, new, extended, unchanged, spec_new, spec_ext)

    def ban_hosts_each(self, blocklist: str, version: int, keys: Sequence[int], untils: Sequence[float | None],
                       now: float, *, origin: str, reason: str, jail: str = "", comment: str = "",
                       ends_ms: Sequence[int] | None = None) -> HostsEach | None:
        """`ban_hosts` with an end per key (`untils[i]` for `keys[i]`; None permanent): the same rules, key by
        key, in one pass with one interned meta (a fleet catch-up of jail bans, every ban its own end, made one
        `ban_hosts` call per address before). Returns None for an unknown blocklist. `ends_ms`, where the
        caller has them: `ends.secs_ms(untils)` (none permanent), made already (a fleet catch-up's decoder)."""
        entries = self.sets.get(set_name(blocklist, version, False))
        if entries is None:
            return None
        meta = self._intern((origin, reason, jail, comment))
        never = _NEVER << META_BITS | meta  # pack_end, inlined: once per key
        now_ms = int(now * 1000)
        d = entries.entries
        due = self.next_due
        if keys and (ends_ms is not None or None not in untils) and d.keys().isdisjoint(keys):
            # all new, none permanent (a catch-up into an empty set): the loop below a column at a time
            ends = secs_ms(cast("Sequence[float]", untils)) if ends_ms is None else list(ends_ms)
            first = min(ends)
            if first > now_ms:
                rep = itertools.repeat
                held = len(d)
                d.update(zip(keys, map(operator.or_, map(operator.lshift, ends, rep(META_BITS)), rep(meta)),
                             strict=False))  # (`max(1, ms)` of the loop: every ms is above now_ms here)
                if len(d) == held + len(keys):  # the keys were distinct (a set of them cost ~2 ms per 100k)
                    self.next_due = min(due, first)
                    return HostsEach(entries.spec.name, list(keys), list(untils), [], [], [], ends)
                for k in keys:  # a key twice: undone (none was held before), the loop decides each in turn
                    d.pop(k, None)
        out = HostsEach(entries.spec.name, [], [], [], [], [])
        for k, until in zip(keys, untils, strict=True):
            ms = None if until is None else int(until * 1000)
            if ms is not None and ms <= now_ms:
                out.unchanged.append(k)
                continue
            old = d.get(k)
            if old is None:
                out.new.append(k)
                out.new_untils.append(until)
            elif _later(ms, unpack_end(old)):
                out.extended.append(k)
                out.extended_untils.append(until)
            else:
                out.unchanged.append(k)
                continue
            if ms is None:
                d[k] = never
            else:
                d[k] = max(1, ms) << META_BITS | meta
                if ms < due:
                    due = ms
        self.next_due = due
        return out

    def restore_hosts(self, blocklist: str, version: int, keys: list[int], ends_ms: list[int | None], now: float,
                      *, origin: str, reason: str, jail: str) -> tuple[str, list[int], list[int | None]] | None:
        """Saved single-address bans back into the state, each with its own end (ms since the epoch, None =
        permanent): (set, keys to add, their ends). `restore_plan` then `restore_commit`."""
        plan = self.restore_plan(blocklist, version, keys, ends_ms, now)
        if plan is not None:
            self.restore_commit(*plan, origin=origin, reason=reason, jail=jail)
        return plan

    def restore_plan(self, blocklist: str, version: int, keys: list[int], ends_ms: list[int | None], now: float
                     ) -> tuple[str, list[int], list[int | None]] | None:
        """Which of these saved bans go back (the state is not changed): (set, keys, their ends in ms), or None
        for an unknown blocklist. Ended bans and keys already held are skipped.

        Split from `restore_commit` so that a restart can send the kernel its transactions first and fill the
        state while the kernel works (the state's dict of a million entries is ~0.5 s of the GIL). Between the
        two nothing may change the set: the caller holds the enforcer's lock. A few list passes in C-level
        comprehensions, no object per ban (a million restored jail bans have nearly a million different ends).
        """
        entries = self.sets.get(set_name(blocklist, version, False))
        if entries is None:
            return None
        d = entries.entries
        now_ms = int(now * 1000)
        # the usual restore: every end ahead (the store filtered them) and nothing held yet: C-level checks
        if None in ends_ms:
            ended = any(x is not None and x <= now_ms for x in ends_ms)
        else:
            ended = min(cast("list[int]", ends_ms), default=now_ms + 1) <= now_ms
        if ended or (d and not d.keys().isdisjoint(keys)):
            keep = [x is None or x > now_ms for x in ends_ms]
            if d:
                keep = [ok and k not in d for k, ok in zip(keys, keep, strict=True)]
            if not all(keep):
                keys = list(itertools.compress(keys, keep))
                ends_ms = list(itertools.compress(ends_ms, keep))
        return entries.spec.name, keys, ends_ms

    def restore_commit(self, set_name_: str, keys: list[int], ends_ms: list[int | None], *, origin: str,
                       reason: str, jail: str) -> None:
        """Enter what `restore_plan` returned into the state."""
        d = self.sets[set_name_].entries
        meta = self._intern((origin, reason, jail, ""))
        gc_was = gc.isenabled()
        gc.disable()  # a million small allocations would trigger the collector hundreds of times
        try:
            if None in ends_ms:
                low = _NEVER << META_BITS | meta  # pack_end, inlined: once per restored ban
                packed = [low if x is None else max(1, x) << META_BITS | meta for x in ends_ms]
                timed = [x for x in ends_ms if x is not None]
            else:  # every end is ahead of now (restore_plan), so positive: no max(1, ...) needed
                timed = cast("list[int]", ends_ms)
                packed = list(map(meta.__or__, map(META_BITS.__rlshift__, timed)))
            if timed:
                self._due(min(timed))
            d.update(zip(keys, packed, strict=True))
        finally:
            if gc_was:
                gc.enable()

    def replace_set(self, set_name_: str, keys: list[int], until: float | None, *, origin: str = "feed",
                    reason: str = "", refresh: bool = False) -> tuple[list[int], list[int], list[int]]:
        """Make a set hold exactly `keys` (a feed-owned set): returns (added, removed, kept).

        Ranges in `keys` must not overlap (the aggregate guarantees it). The interval index is rebuilt in one
        sort instead of per insertion: feeds change tens of thousands of ranges at once. With `refresh`,
        kept entries take the new end too (their kernel timeouts must be re-sent).
        """
        entries = self.sets[set_name_]
        d = entries.entries
        want = set(keys)
        current = d.keys()
        added = list(want - current)  # set algebra in C: a 1 % refresh of 50k ranges costs ~1 ms, not 25
        removed = list(current - want)
        kept = list(want & current) if refresh else []
        packed = pack_end(to_ms(until), self._intern((origin, reason, "", "")))
        self._due(to_ms(until))
        for k in removed:
            del d[k]
        d.update(dict.fromkeys(added, packed))
        if refresh:
            d.update(dict.fromkeys(kept, packed))
        _reindex(entries, added, removed)
        return added, removed, kept

    def apply_delta(self, set_name_: str, added: list[int], removed: list[int], renewed: list[int],
                    until: float | None, *, origin: str = "feed", reason: str = "") -> list[int]:
        """A feed-owned set's change as its caller diffed it (`feeds.delta`): `replace_set` without the
        diff, so work is proportional to the change, not to the set. Removing a key not held and adding one
        already held are harmless. `added` and `renewed` take the new end. Returns the removed keys that were
        held (one that ended meanwhile is gone from the kernel too: nothing to delete)."""
        entries = self.sets[set_name_]
        d = entries.entries
        packed = pack_end(to_ms(until), self._intern((origin, reason, "", "")))
        if added or renewed:
            self._due(to_ms(until))
        pop = d.pop
        gone = [k for k in removed if pop(k, None) is not None]
        if len(added) + len(removed) >= INDEX_EDITS:
            # A refresh's additions and renewals wait for the first reader of `entries` (usually the next
            # status or reconcile, long after the commit): ~0.4 ms of cold dict work off the way to the
            # kernel for a 1 % refresh of the 70k feed (docs/datapath.md, round seven). The index is stale
            # from here, so nothing reads the state without settling them first.
            entries.stale = entries.spec.interval
            entries.defer(added, packed)
            if renewed:
                entries.defer(renewed, packed)
            return gone
        if entries.spec.interval:  # which keys are new matters to a small edit of the index only
            _reindex(entries, [k for k in added if k not in d], gone)
        d.update(zip(added, itertools.repeat(packed)))
        if renewed:
            d.update(zip(renewed, itertools.repeat(packed)))
        return gone

    def unban_hosts(self, blocklist: str, version: int, keys: list[int]) -> tuple[str, list[int], list[int]] | None:
        """Bulk unban of single addresses: (set name, removed keys, keys that were not banned)."""
        entries = self.sets.get(set_name(blocklist, version, False))
        if entries is None:
            return None
        d = entries.entries
        removed, missing = [], []
        for k in dict.fromkeys(keys):
            if d.pop(k, None) is None:
                missing.append(k)
            else:
                removed.append(k)
        return entries.spec.name, removed, missing

    def unban(self, unban: Unban) -> Change:
        entries = self.set_for(unban.blocklist, unban.target)
        if entries is None:
            return Change(BanOutcome.UNKNOWN_SET, message=f"unknown blocklist {unban.blocklist!r}")
        key = self.key_for(entries, unban.target)
        if entries.entries.pop(key, None) is not None:
            if entries.spec.interval:
                entries.index_remove(key)
            return Change(BanOutcome.REMOVED, (SetOp(entries.spec.name, key, False),))
        covering = tuple(b.target for b in self.covering(unban.target, unban.blocklist))
        if covering:
            return Change(BanOutcome.NOT_FOUND, related=covering, message=(
                f"{format_target(unban.target)} is not banned itself; it lies inside "
                f"{', '.join(map(format_target, covering))}"))
        return Change(BanOutcome.NOT_FOUND, message=f"{format_target(unban.target)} is not banned")

    def adopt(self, set_name_: str, remaining_ms: dict[int, int | None], now: float) -> list[int]:
        """Take in elements the kernel holds that the state does not know, each ending when the kernel's own
        timeout says (remaining ms from `now`; None: permanent). Returns the keys adopted.

        The kernel is a witness: after a lost or damaged state database, or a forward jump of the wall
        clock that made the state forget bans the kernel still enforces, these are real bans. A range that
        overlaps one the state holds is left alone (the kernel cannot hold both; the dump raced a change).
        """
        entries = self.sets[set_name_]
        meta = self._intern(("kernel", "adopted from the kernel", "", ""))
        now_ms = int(now * 1000)
        adopted = []
        for key, remaining in remaining_ms.items():
            if key in entries.entries:
                continue
            if entries.spec.interval:
                first, last = key_range(key, entries.spec.version)
                if entries.containing(first, last) is not None or entries.inside(first, last):
                    continue
                entries.index_add(key)
            until_ms = None if remaining is None else now_ms + max(remaining, 1)
            self._due(until_ms)
            entries.entries[key] = pack_end(until_ms, meta)
            adopted.append(key)
        return adopted

    def forget(self, set_name_: str, key: int) -> None:
        """Drop an entry the kernel refused (the ban did not happen)."""
        entries = self.sets[set_name_]
        if entries.entries.pop(key, None) is not None and entries.spec.interval:
            entries.index_remove(key)

    def expire(self, now: float) -> int:
        """Forget entries whose end has passed; the kernel removed them on its own."""
        limit = int(now * 1000)
        if limit < self.next_due:
            return 0
        dropped = 0
        due = float("inf")
        for entries in self.sets.values():
            dead = []
            d = entries.entries  # once: a property (settles deferred feed additions), not a plain attribute
            for k, v in d.items():
                u = v >> META_BITS  # unpack_end inlined: 1M bans sweep in 90 ms instead of 135 ms
                if u == _NEVER:
                    continue
                if u <= limit:
                    dead.append(k)
                elif u < due:
                    due = u
            for k in dead:
                del d[k]
                if entries.spec.interval:
                    entries.index_remove(k)
            dropped += len(dead)
        self.next_due = due
        return dropped

    # -- queries ---------------------------------------------------------------------------------------

    def info(self, entries: SetEntries, key: int) -> BanInfo:
        packed = entries.entries[key]
        origin, reason, jail, comment = self._meta[packed & META_MASK]
        u = unpack_end(packed)
        extra = {"comment": comment} if comment else {}
        return BanInfo(self.net_of(entries, key), entries.spec.blocklist or "", entries.spec.name,
                       None if u is None else u / 1000, origin, reason, jail, extra)

    def origin_of(self, entries: SetEntries, key: int) -> str | None:
        """The origin of the entry at `key` (None when there is none): cheaper than `info`."""
        packed = entries.entries.get(key)
        return None if packed is None else self._meta[packed & META_MASK][0]

    def iter_origins(self, blocklist: str) -> Iterator[tuple[str, int, IPNet, float | None, str]]:
        """(set name, key, target, end in seconds or None, origin) of every entry of `blocklist` (the fleet's
        snapshot reconcile reads a whole blocklist; BanInfo per entry would cost twice as much)."""
        for entries in self.sets.values():
            if entries.spec.blocklist != blocklist:
                continue
            name = entries.spec.name
            for k, packed in entries.entries.items():
                u = unpack_end(packed)
                yield (name, k, self.net_of(entries, k), None if u is None else u / 1000,
                       self._meta[packed & META_MASK][0])

    def covering(self, net: IPNet, blocklist: str | None = None) -> list[BanInfo]:
        """Active bans that cover `net`: the exact entry and any range containing it."""
        out = []
        for entries in self.sets.values():
            if entries.spec.version != net.version:
                continue
            if blocklist is not None and entries.spec.blocklist != blocklist:
                continue
            if entries.spec.interval:
                k = entries.containing(int(net.network_address), int(net.broadcast_address))
                if k is not None:
                    out.append(self.info(entries, k))
            elif net.prefixlen == net.max_prefixlen and int(net.network_address) in entries.entries:
                out.append(self.info(entries, int(net.network_address)))
        return out

    def iter_bans(self, blocklist: str | None = None) -> Iterator[BanInfo]:
        for entries in self.sets.values():
            if blocklist is None or entries.spec.blocklist == blocklist:
                for k in entries.entries:
                    yield self.info(entries, k)

    def counts(self) -> dict[str, int]:
        return {name: len(e.entries) for name, e in self.sets.items()}

    def all_groups(self, set_names: Iterable[str] | None = None,
                   only: set[int] | None = None) -> Iterator[tuple[str, list[int], OpSpec]]:
        """(set, keys, shared add spec) for every active entry, grouped by end and comment (bulk re-adds)."""
        names = list(self.sets) if set_names is None else list(set_names)
        for name in names:
            by_value: dict[int, list[int]] = {}
            for k, packed in self.sets[name].entries.items():
                if only is None or k in only:
                    by_value.setdefault(packed, []).append(k)
            for packed, keys in by_value.items():
                yield name, keys, OpSpec(True, unpack_end(packed), self._meta[packed & META_MASK][3], True)

    def __len__(self) -> int:
        return sum(len(e.entries) for e in self.sets.values())
