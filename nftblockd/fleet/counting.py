"""Fleet counting, the pure part: every host counts every host's failures itself, by the same rules.

A jail with `fleet_maxretry` hands each failure it counts (after its own allowlist, never-ban and time checks)
to the fleet counter (fleet/counter.py), which appends it to this host's own failure stream on the server,
`nftblock:{F}:h:<host>:fail`. The server's ACL lets a host write only keys under its own prefix
`nftblock:{F}:h:<host>:` and read all of the fleet's keys: so the stream a failure sits in says, with the
server's authority, which host reported it. Every host reads every member's `fail` stream and runs the same
`Tally` over what it reads. No host decides for another; there is no shared counting key, no decision key and no
quota that another host could drain, forge or delete.

Rules of the `Tally` (the state machine; time is the server's, in ms, taken from the stream entry IDs):

1. An entry of host H at server time `T` carries (jail, offender, k, age) items: k failures of one offender,
   seen `age` ms before the entry was written (a failure queued during a partition keeps the time it was seen;
   age is capped at the jail's `fleet_findtime`, so no failure is made to look older than the window).
2. Rate cap per authenticated host: H's failures are taken from a token bucket of `count.rate` per second and
   `count.burst` plus `SLACK` seconds of rate, refilled by the entries' server times. An honest sender paces
   itself to `count.rate`/`count.burst` (it queues, it never drops what the cap delays); failures beyond the
   bucket can only come from a host that does not, and are refused and counted (`limited`). The bucket is H's
   alone: nothing another host writes takes from it.
3. Share cap per host and offender: of one host's failures of one offender, only its latest `share` count
   (`share = fleet_maxretry - 1`, at least 1): a ban always needs failures reported by at least two hosts
   (with `fleet_maxretry` 1, one is enough). A single host's own failures are its local `maxretry`'s job.
4. A ban: as soon as some window of `fleet_findtime` holds `fleet_maxretry` failures (after 2 and 3), the
   offender is banned until the crossing failure's time plus `bantime`. The crossing failure is the last one in
   the earliest such window (ordered by time, then host); its host is `by`. Every host reads the same entries,
   so every host decides the same ban with the same end; failures of a banned offender are skipped until the
   ban ends. The count of the offender starts again from nothing after a ban.
5. Memory: at most `MAX_OFFENDERS` offenders are tracked (counting or banned), least recently touched dropped
   first (counted `evicted`); each holds at most `share` failures per host, older than the window dropped.

This module holds the keys, the entry format (`encode_items`, `parse_entry`: outside input, bounded) and the
`Tally`. No IO, no clock, no redis.
"""

from __future__ import annotations

import ipaddress
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from nftblockd.addr import IPAddr, IPNet, format_target, normalise_address

# host ids that can own a key prefix and name an ACL user (safe in key names and ACL glob patterns)
HOST_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
SLACK = 2.0  # seconds of `count.rate` a receiver allows beyond `count.burst` (send vs server time jitter)
MAX_ITEMS = 2000  # offenders in one stream entry
MAX_FIELD = 256 * 1024  # bytes of one entry's failure list
MAX_OFFENDERS = 1_000_000
FAIL_MAXLEN = 100_000  # entries a host's fail stream keeps at most (trimmed by age too)


@dataclass(frozen=True, slots=True)
class CountPolicy:
    """A jail's fleet counting: `maxretry` failures fleet-wide within `findtime` ban for `bantime` seconds."""

    maxretry: int
    findtime: float
    bantime: float
    ipv6_prefix: int = 64

    @property
    def share(self) -> int:
        """How many of one host's failures of one offender count (rule 3)."""
        return max(1, self.maxretry - 1)


class Item(NamedTuple):
    """`k` failures of one offender of a jail, seen `age_ms` before they were written."""

    jail: str
    offender: str
    k: int
    age_ms: int = 0


class Decided(NamedTuple):
    """A fleet-counted ban: `hosts` reported the `failures` that crossed the line, `by` the crossing one."""

    jail: str
    net: IPNet
    until: float
    hosts: tuple[str, ...]
    failures: int
    by: str

    def reason(self) -> str:
        shown = ", ".join(self.hosts[:10]) + (", ..." if len(self.hosts) > 10 else "")
        return f"fleet count: {self.failures} failures seen by {shown}"


def published_and_held(decided: Iterable[Decided], host: str
                       ) -> tuple[list[tuple[IPNet, float, str]], list[tuple[IPNet, float, str]]]:
    """How host `host` shares the fleet-counted bans it applied, as (target, end, src "count:<jail>") rows:
    those its own failure crossed it publishes (so a host that joins after the failures are trimmed gets them);
    the others it holds as its own published bans. Every holder re-asserts them when the server loses them."""
    pub: list[tuple[IPNet, float, str]] = []
    held: list[tuple[IPNet, float, str]] = []
    for d in decided:
        (pub if d.by == host else held).append((d.net, d.until, f"count:{d.jail}"))
    return pub, held


def offender(host: IPAddr, ipv6_prefix: int) -> str:
    """What a failure counts against: an IPv4 address, or the IPv6 /`ipv6_prefix` (the jail's setting)."""
    a = normalise_address(host)
    if a.version == 4 or ipv6_prefix >= 128:
        return str(a)
    return format_target(ipaddress.IPv6Network((int(a) >> (128 - ipv6_prefix) << (128 - ipv6_prefix),
                                                ipv6_prefix)))


def fail_key(fleet: str, host: str) -> str:
    """Host `host`'s failure stream: only that host's ACL user may write it."""
    return f"nftblock:{{{fleet}}}:h:{host}:fail"


def fail_pattern(fleet: str) -> str:
    """The SCAN pattern of every member's failure stream."""
    return f"nftblock:{{{fleet}}}:h:*:fail"


def host_of_key(fleet: str, key: str) -> str | None:
    """The host whose failure stream `key` is, or None for a key that is not one (never counted)."""
    head, tail = f"nftblock:{{{fleet}}}:h:", ":fail"
    if not (key.startswith(head) and key.endswith(tail)):
        return None
    host = key[len(head):len(key) - len(tail)]
    return host if HOST_RE.fullmatch(host) else None


def encode_items(jail: str, items: Iterable[tuple[str, int, int]]) -> list[str]:
    """The fields of one stream entry: (offender, k, age_ms) items of `jail` (at most MAX_ITEMS)."""
    parts = []
    for off, k, age in items:
        s = off if k == 1 else f"{off}*{k}"
        parts.append(s if age <= 0 else f"{s}@{age}")
    return ["v", "1", "j", jail, "f", ",".join(parts)]


def _text(v: Any) -> str:
    return v.decode("ascii") if isinstance(v, bytes) else str(v)


def _canonical(text: str, p: CountPolicy) -> bool:
    """Whether `text` is an offender as `offender()` writes it for policy `p` (no wider, no other spelling)."""
    try:
        if "/" not in text:
            a = ipaddress.ip_address(text)
            return str(a) == text and (a.version == 4 or p.ipv6_prefix >= 128)
        n = ipaddress.ip_network(text, strict=True)
    except ValueError:
        return False
    return n.version == 6 and n.prefixlen == p.ipv6_prefix < 128 and format_target(n) == text


def parse_entry(fields: Mapping[Any, Any], policies: Mapping[str, CountPolicy]) -> tuple[list[Item], int] | None:
    """The items of one entry another host wrote (outside input) and how many of its items were malformed;
    None if the entry is not one at all, or is of a jail this host does not count (nothing to do). Never
    raises; bounded by MAX_FIELD and MAX_ITEMS."""
    try:
        f = {_text(k): v for k, v in fields.items()}
        if _text(f.get("v", b"")) != "1":
            return None
        jail = _text(f.get("j", b""))
        p = policies.get(jail)
        raw = f.get("f", b"")
        if p is None or not isinstance(raw, bytes | str) or len(raw) > MAX_FIELD:
            return None if p is None else ([], 1)
        text = _text(raw)
    except (UnicodeDecodeError, AttributeError, TypeError):
        return [], 1
    out: list[Item] = []
    bad = 0
    cap_ms = int(p.findtime * 1000)
    parts = text.split(",") if text else []
    if len(parts) > MAX_ITEMS:
        return [], 1
    for part in parts:
        off, _, age_s = part.partition("@")
        off, star, k_s = off.partition("*")
        try:
            k = int(k_s) if star else 1
            age = int(age_s) if age_s else 0
        except ValueError:
            bad += 1
            continue
        if not (0 < k <= 1_000_000 and 0 <= age < 10**12 and (not star or k_s.isdigit())
                and (not age_s or age_s.isdigit()) and _canonical(off, p)):
            bad += 1
            continue
        out.append(Item(jail, off, k, min(age, cap_ms)))
    return out, bad


@dataclass(slots=True)
class TallyStats:
    accepted: int = 0  # failures counted
    limited: int = 0  # ... refused: over their host's rate cap (rule 2)
    skipped: int = 0  # ... of offenders banned already
    evicted: int = 0  # offenders dropped for memory (rule 5)


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at_ms: int


@dataclass(slots=True)
class _Offender:
    by_host: dict[str, list[int]] = field(default_factory=dict)  # host -> its latest `share` failure times
    banned_until_ms: int = -1
    decided: Decided | None = None


class Tally:
    """The per-host counting state machine of the module rules. `add` is called with each entry read."""

    def __init__(self, policies: Mapping[str, CountPolicy], rate: float, burst: int,
                 max_offenders: int = MAX_OFFENDERS) -> None:
        self.policies = dict(policies)
        self.rate = rate
        self.capacity = burst + rate * SLACK
        self.max_offenders = max_offenders
        self.stats = TallyStats()
        self._buckets: dict[str, _Bucket] = {}
        self._off: OrderedDict[tuple[str, str], _Offender] = OrderedDict()

    def add(self, host: str, at_ms: int, items: Sequence[Item]) -> list[Decided]:
        """One entry of `host`'s stream, written at server time `at_ms`: the bans it completes."""
        b = self._buckets.get(host)
        if b is None:
            b = self._buckets[host] = _Bucket(self.capacity, at_ms)
        elif at_ms > b.at_ms:
            b.tokens = min(self.capacity, b.tokens + (at_ms - b.at_ms) * self.rate / 1000)
            b.at_ms = at_ms
        out: list[Decided] = []
        st = self.stats
        for it in items:
            p = self.policies.get(it.jail)
            if p is None:
                continue
            key = (it.jail, it.offender)
            o = self._off.get(key)
            if o is not None:
                self._off.move_to_end(key)
                if o.banned_until_ms > at_ms:
                    st.skipped += it.k
                    continue
                if o.banned_until_ms >= 0:  # the ban ended: count from nothing
                    o = self._off[key] = _Offender()
            take = min(it.k, int(b.tokens))
            b.tokens -= take
            st.limited += it.k - take
            if take <= 0:
                continue
            st.accepted += take
            if o is None:
                o = self._new(key)
            t = at_ms - it.age_ms
            times = o.by_host.setdefault(host, [])
            times.extend([t] * min(take, p.share))
            times.sort()
            del times[:-p.share]
            d = self._check(it.jail, it.offender, o, p)
            if d is not None:
                out.append(d)
        return out

    def _new(self, key: tuple[str, str]) -> _Offender:
        while len(self._off) >= self.max_offenders:
            self._off.popitem(last=False)
            self.stats.evicted += 1
        o = self._off[key] = _Offender()
        return o

    def _check(self, jail: str, target: str, o: _Offender, p: CountPolicy) -> Decided | None:
        win = int(p.findtime * 1000)
        all_t = sorted((t, h) for h, ts in o.by_host.items() for t in ts)
        start = 0
        for end in range(len(all_t)):
            t_end = all_t[end][0]
            while all_t[start][0] <= t_end - win:
                start += 1
            if end - start + 1 >= p.maxretry:
                hosts: list[str] = []
                for _t, h in all_t[start:end + 1]:
                    if h not in hosts:
                        hosts.append(h)
                until_ms = t_end + max(1000, int(p.bantime * 1000))
                d = Decided(jail, ipaddress.ip_network(target), until_ms / 1000, tuple(hosts), end - start + 1,
                            all_t[end][1])
                o.by_host.clear()
                o.banned_until_ms = until_ms
                o.decided = d
                return d
        newest = all_t[-1][0]
        for h in list(o.by_host):  # rule 5: older than the window of the newest failure
            ts = [t for t in o.by_host[h] if t > newest - win]
            if ts:
                o.by_host[h] = ts
            else:
                del o.by_host[h]
        return None

    def forget(self, jail: str, target: str) -> None:
        """A fleet-counted ban was lifted (an unban): new failures count again from nothing."""
        self._off.pop((jail, target), None)

    def seen(self, jail: str, target: str) -> dict[str, Any]:
        """What `nftblock check` shows of one offender: failures in the window, the hosts, the decision."""
        o = self._off.get((jail, target))
        if o is None:
            return {}
        out: dict[str, Any] = {"counting": sum(len(ts) for ts in o.by_host.values()),
                               "seen_by": sorted(o.by_host, key=lambda h: min(o.by_host[h]))}
        if o.decided is not None and o.banned_until_ms >= 0:
            out["decided"] = {"by": o.decided.by, "seen_by": list(o.decided.hosts), "count": o.decided.failures}
        return out

    def __len__(self) -> int:
        return len(self._off)


__all__ = ["FAIL_MAXLEN", "HOST_RE", "MAX_ITEMS", "CountPolicy", "Decided", "Item", "Tally", "TallyStats",
           "encode_items", "fail_key", "fail_pattern", "host_of_key", "offender", "parse_entry", "published_and_held"]
