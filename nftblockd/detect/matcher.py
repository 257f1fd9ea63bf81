"""Compiled filters: one log line in, a failure (host, time) or nothing out.

Pure: no IO (filterload.py reads filter files), never the clock (`now` is an argument), no module-level
mutable state. `Filter.match` and `Filter.scan` never raise on input; whatever a log line holds, the worst
outcome is "no match". The regex analysis (lint, required literals) is rxlint.py.

How a line is matched (the general path, `Filter._general`):

1. Lines longer than MAX_LINE characters are cut and embedded newlines become spaces: a pathological line
   cannot stall the loop, a record cannot smuggle a second line, and every line is matched on its own, so
   it cannot hide the lines after it.
2. Gate: the filter's `prefilter` substrings, or else a literal every failregex needs (derived from the
   regex). A line holding none of them is dropped with a few substring searches.
3. The timestamp is found (timestamps.DateParser) and cut out, as fail2ban does, so regexes never see it.
   Journal lines are "stamped" (`scan(..., stamped=True)`): their time travels beside the text, so no date
   is looked for and the regexes see the whole "host ident[pid]: message", as in fail2ban's systemd backend.
4. The filter's prefix (fail2ban `prefregex`, or a YAML `prefix`) must match at the start; the regexes
   then see the message after it.
5. Only the failregexes that can start the way the message starts are tried, in order; the first match
   wins. A match that an ignoreregex also matches is reported as ignored.
6. The host is taken from the `<HOST>` groups and parsed strictly: IPv4-mapped IPv6 becomes IPv4; DNS
   names, leading-zero octets (`192.030.0.6`) and other non-addresses give `Rejected` (skip and count),
   never a guess and never a DNS lookup.

The fast lane (`Filter._fast`, YAML prefixes with the usual syslog / ISO timestamps, i.e. the built-ins on
their hot path) does the same in one regex call: timestamp, prefix (an atomic group, so the very match the
prefix alone gives) and, chosen by the message's first characters, the rules that can start it, joined into
one ordered alternation (the first alternative that matches is the first rule that matches); `scan` then
reads the groups positionally and applies the multi-line rules inline. The tests run both paths over every
sample line and require identical results.

Measured on this project's 2-core VM (bench_matcher, a server under brute force): the regex call is 5-9 us
of the ~15 us a relevant sshd line costs, the rest is the Python around it; noise lines cost 0.3 us.

Regex engine: Python's `re`, with every regex linted for shapes that backtrack super-linearly (nested or
overlapping unbounded repeats, unanchored scans); a flagged regex runs on RE2 (google-re2, linear time)
when RE2 can compile it. Decided by measurement: RE2 through its Python binding costs 5-8x `re` per call
on log lines, and the sshd benchmark with RE2 for every pattern runs at 1.4x fail2ban against 3.8x with
this split. The built-in filters are lint-clean on `re`, except two dovecot rules, which run on RE2. A
flagged regex RE2 cannot compile (lookarounds, back-references, conditionals; or RE2 not installed) stays
on `re`, only ever sees the first RISKY_LINE characters, and `Filter.notes` says so.

Multi-line filters (fail2ban's `<F-MLFID>` connection ids, `<F-NOFAIL>`, `<F-MLFFORGET>`,
`<F-MLFGAINED>`) keep their memory in a caller-owned, bounded `MatchContext`, so the filter itself stays
stateless and shareable. One departure from fail2ban, on purpose: a line naming an address other than the
one its connection id holds starts a new connection (`_other_peer`). The ids are pids, which come round
again while an unclosed connection's memory lingers; fail2ban would merge the two and credit the new peer's
failures to the old one (its host is `ip4 or ip6`, so an IPv6 attacker on a recycled pid goes unbanned).
"""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import tzinfo
from operator import itemgetter
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, TypeAlias

from nftblockd.addr import IPAddr, normalise_address, parse_v4
from nftblockd.detect.multiline import MAX_MAXLINES, BufferedLine, expand_skiplines, joined, split_match
from nftblockd.detect.native import Hooks as NativeHooks
from nftblockd.detect.native import Parts as NativeParts
from nftblockd.detect.native import build as build_native
from nftblockd.detect.rxlint import REGEX_ERRORS, lint_regex, literal_heads, matches_newline, required_literal
from nftblockd.detect.rxopt import cheap_optionals
from nftblockd.detect.sysloghead import syslog_head
from nftblockd.detect.timestamps import DateParser, DatePatternError

__all__ = [
    "MAX_LINE",
    "RISKY_LINE",
    "Filter",
    "FilterDef",
    "FilterError",
    "Match",
    "MatchContext",
    "RegexSource",
    "Rejected",
    "compile_filter",
    "expand_tags",
    "parse_host",
]

MAX_LINE = 8192  # characters of a line the matcher looks at; the rest is cut (journald's LINE_MAX is 48k)
RISKY_LINE = 1024  # characters a lint-flagged regex on `re` may see: bounds its worst case
_HOST_MEMO = 65536  # parsed host texts remembered per filter (attackers repeat); cleared when full

Engine: TypeAlias = Literal["auto", "re", "re2"]
RejectReason: TypeAlias = Literal["dns-name", "bad-address", "no-address"]


class FilterError(ValueError):
    """A filter cannot be loaded: the operator's or the filter author's fault. Says file:line and why."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}" if where else reason)
        self.where = where
        self.reason = reason


_NO_FIELDS: Mapping[str, str] = MappingProxyType({})


class Match(NamedTuple):
    """A failregex matched and named a usable address.

    `time` is the line's own timestamp (None if it had none: use the arrival time). `ignored` means an
    ignoreregex matched too: count it, do not ban. `fields` holds the `<F-...>` captures (user, ...).
    A NamedTuple, not a frozen dataclass: one is built per matched line, and a frozen dataclass's __init__
    costs five times as much.
    """

    host: IPAddr
    time: float | None
    ignored: bool = False
    fields: Mapping[str, str] = _NO_FIELDS
    regex: int = -1


class Rejected(NamedTuple):
    """A failregex matched but the host is unusable (a DNS name, `192.030.0.6`, no address): skip, count."""

    text: str
    reason: RejectReason
    time: float | None
    ignored: bool = False
    regex: int = -1


MatchResult: TypeAlias = Match | Rejected | None
# tuple.__new__(Match, values) builds a Match in half the time of the generated __new__ (the hot path)
_new_match: Callable[[type[Match], tuple[Any, ...]], Match] = tuple.__new__


@dataclass(frozen=True, slots=True)
class RegexSource:
    """One regex as written, with where it was written (for errors)."""

    text: str
    where: str = ""


@dataclass(frozen=True, slots=True)
class FilterDef:
    """A filter before compilation, whichever format it came from (our YAML, a fail2ban .conf).

    `prefix` is matched at the start of the line (after the timestamp is cut out) and the regexes see the
    rest. `prefregex` is fail2ban's: searched in the line, its `<F-CONTENT>` is what the regexes see.
    """

    name: str
    source: str
    failregex: tuple[RegexSource, ...]
    ignoreregex: tuple[RegexSource, ...] = ()
    prefix: RegexSource | None = None
    prefregex: RegexSource | None = None
    datepattern: str | None = None
    prefilter: tuple[str, ...] | None = None  # None: derived from the regexes
    ignore_whole_line: bool = False  # fail2ban also tries ignoreregex on the whole line
    notes: tuple[str, ...] = ()
    maxlines: int = 1  # fail2ban's: > 1 searches the last N lines joined (multiline.py)
    options: Mapping[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------------
# Tags: <HOST> and friends, fail2ban's <F-NAME>...</F-NAME> captures


_H16 = "[0-9a-fA-F]{1,4}"
# written out: `(?:\.[0-9]{1,3}){3}` is a REPEAT, measurably slower on `re` than three copies
IP4_RE = r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}"
# Ends in a hex group or in "::", never in a lone ":" (so "from 2001:db8::1: 11: Bye" stops before ": 11")
IP6_RE = rf"(?:(?:{_H16}::?|::){{1,7}}{_H16}|(?:{_H16}:){{1,7}}:|::)"
# A name has a letter (TLDs do): "46038" after a greedy user name is a port, not a host to reject.
DNS_RE = r"[0-9\-.]*[A-Za-z_][\w\-.]*"
_IP4_GROUP = rf"(?:::f{{4,6}}:)?(?P<ip4>{IP4_RE})"
_IP6_GROUP = rf"(?P<ip6>{IP6_RE})"
_ADDR = rf"\[?(?:{_IP4_GROUP}|{_IP6_GROUP})\]?"
# <HOST> matches names too, only so that such lines are counted as rejected instead of silently missed
_HOST = rf"(?:{_ADDR}|(?P<dns>{DNS_RE}))"
_CIDR = r"(?P<cidr>[0-9]{1,3})"
_STATIC_TAGS = {
    "HOST": _HOST,
    "ADDR": _ADDR,
    "F-ADDR/": _ADDR,
    "IP4": _IP4_GROUP,
    "F-IP4/": _IP4_GROUP,
    "IP6": _IP6_GROUP,
    "F-IP6/": _IP6_GROUP,
    "DNS": rf"(?P<dns>{DNS_RE})",
    "F-DNS/": rf"(?P<dns>{DNS_RE})",
    "CIDR": _CIDR,
    "F-CIDR/": _CIDR,
    "SUBNET": rf"\[?(?:{_IP4_GROUP}|{_IP6_GROUP})(?:/{_CIDR})?\]?",
    "F-SUBNET/": rf"\[?(?:{_IP4_GROUP}|{_IP6_GROUP})(?:/{_CIDR})?\]?",
    "F-ID/": r"(?P<fid>\S+)",
    "F-PORT/": r"(?P<fport>\w+)",
}
_GROUP_ALIAS = {"id": "fid", "port": "fport"}
_TAG_RE = re.compile(r"</?[\w\-]+/?>")
_CUSTOM_TAG = re.compile(r"^(/?)F-([A-Z0-9_\-]+)$")
_GLOBAL_FLAGS = re.compile(r"(?<!\\)\((?:\?:)?(\(\?[aiLmsux]+)\)")


class UnsupportedRegex(ValueError):
    """The regex uses a construct nftblockd does not implement (fail2ban's <SKIPLINES>, multi-line)."""


# A regex that cannot be used: a tag outside what is supported, or an error compiling it.
_UNUSABLE: tuple[type[Exception], ...] = (UnsupportedRegex, *REGEX_ERRORS)


def expand_tags(regex: str) -> str:
    """Replace `<HOST>`, `<ADDR>`, `<IP4>`, `<IP6>`, `<F-ID/>`, `<F-NAME>...</F-NAME>` with regex groups.

    Unknown `<tags>` stay as they are (they are literal text to the regex). `<SKIPLINES>` raises
    UnsupportedRegex: only a filter with maxlines > 1 has it, expanded first (multiline.expand_skiplines).
    """
    opened: set[str] = set()

    def subst(m: re.Match[str]) -> str:
        tag = m.group(0)
        name = tag[1:-1]
        if name == "SKIPLINES":
            raise UnsupportedRegex("<SKIPLINES> (multi-line buffering) is not supported")
        static = _STATIC_TAGS.get(name)
        if static is not None:
            return static
        cm = _CUSTOM_TAG.match(name)
        if cm is None:
            return tag
        closing, gname = cm.group(1), cm.group(2)
        if closing:
            return ")" if gname in opened else tag
        opened.add(gname)
        g = gname.lower().replace("-", "_")
        return f"(?P<{_GROUP_ALIAS.get(g, g)}>"

    out = _TAG_RE.sub(subst, regex)
    # Python 3.11 refuses global flags in mid-pattern; fail2ban filters write `((?i)a|b)` meaning `(?i:a|b)`
    return _GLOBAL_FLAGS.sub(lambda m: m.group(1) + ":", out)


# --------------------------------------------------------------------------------------------------------
# Engines: every compiled regex is a function text -> groupdict | None


Finder: TypeAlias = Callable[[str], "dict[str, Any] | None"]


def _re_finder(rx: re.Pattern[str], limit: int | None) -> Finder:
    search = rx.search
    if limit is None:
        def find(text: str) -> dict[str, Any] | None:
            m = search(text)
            return m.groupdict() if m is not None else None
    else:
        def find(text: str) -> dict[str, Any] | None:
            m = search(text[:limit])
            return m.groupdict() if m is not None else None
    return find


def _re2_finder(pattern: str) -> Finder | None:
    """An RE2 finder, or None when RE2 is missing or cannot compile the pattern."""
    try:
        re2: Any = importlib.import_module("re2")
    except ImportError:
        return None
    options = re2.Options()
    options.log_errors = False
    try:
        rx = re2.compile(pattern.encode("utf-8", "surrogateescape"), options)
    except Exception:  # re2.error and pybind errors have no common base
        return None
    search = rx.search

    # Bytes in, bytes out: the binding is markedly faster on bytes, and surrogate-escaped undecodable
    # input cannot make it raise.
    def find(text: str) -> dict[str, Any] | None:
        m = search(text.encode("utf-8", "surrogateescape"))
        if m is None:
            return None
        return {k.decode() if isinstance(k, bytes) else k:
                (v.decode("utf-8", "surrogateescape") if v is not None else None)
                for k, v in m.groupdict().items()}

    return find


@dataclass(frozen=True, slots=True)
class _Compiled:
    find: Finder
    engine: str
    note: str = ""
    rx: re.Pattern[str] | None = None  # the `re` pattern behind `find` (the native core compiles its text)
    limit: int | None = None  # characters `find` looks at


def _compile_one(pattern: str, where: str, engine: Engine) -> _Compiled:
    try:
        rx = re.compile(cheap_optionals(pattern))
    except REGEX_ERRORS as exc:
        rx2 = _re2_finder(pattern) if engine != "re" else None
        if rx2 is None:
            raise FilterError(where, f"invalid regex: {exc}") from None
        return _Compiled(rx2, "re2")
    risk = lint_regex(pattern) if engine == "auto" else None
    if engine == "re2" or risk:
        rx2 = _re2_finder(pattern) if engine != "re" else None
        if rx2 is not None:
            return _Compiled(rx2, "re2")
        if risk:
            return _Compiled(_re_finder(rx, RISKY_LINE), "re",
                             f"{where}: {risk}; RE2 cannot run it, so it sees only {RISKY_LINE} characters",
                             rx, RISKY_LINE)
    return _Compiled(_re_finder(rx, None), "re", rx=rx)


# --------------------------------------------------------------------------------------------------------
# Hosts

_IPv4 = ipaddress.IPv4Address

def parse_host(text: str) -> IPAddr | RejectReason:
    """Strictly parse an address a regex captured; a reason string when it is not one nftblockd bans."""
    s = text
    if s.startswith("[") and s.endswith("]"):
        s = s[1:-1]
    if ":" not in s:
        v4 = parse_v4(s)  # addr's strict fast parser: the common case, in C
        if v4 is not None:
            return _IPv4(v4)
        # Not an address (030 is octal to some parsers, decimal to others: never guessed): say why.
        return "dns-name" if any(c.isalpha() for c in s) else "bad-address"
    if "%" in s or not s.isascii():
        return "bad-address"
    try:
        return normalise_address(ipaddress.IPv6Address(s))
    except ValueError:
        return "bad-address"


# --------------------------------------------------------------------------------------------------------
# Multi-line memory


@dataclass(slots=True)
class _Conn:
    """What the lines of one connection said so far (fail2ban keeps the same in a dict of groups)."""

    ip4: str | None
    ip6: str | None
    dns: str | None
    fid: str | None
    nofail: Any  # the last line was a helper (or a successful login): no failure by itself
    gained: Any  # the last line was a successful login
    pending: bool  # a failure without an address waits for a line that names one
    fields: dict[str, str]  # user and other captures, merged
    user: str  # the first user name the connection tried ("": none yet, or a line standing alone)
    multi: bool  # it tried more than one user name
    seen: float


class MatchContext:
    """Memory of multi-line filters for one stream of lines (one per jail source): connection id -> what
    earlier lines of that connection said (its address, whether it failed, which users it tried).

    Bounded: at most `max_entries` connections (the one first seen longest ago is forgotten first), each
    forgotten `max_age` seconds after its last line (measured with the `now` given to `match`). Not
    thread-safe; one per task.
    """

    __slots__ = ("_conns", "lines", "max_age", "max_entries")

    def __init__(self, max_entries: int = 1000, max_age: float = 300.0) -> None:
        self._conns: dict[str, _Conn] = {}
        self.lines: list[BufferedLine] = []  # the maxlines buffer of a multi-line filter (at most MAX_MAXLINES)
        self.max_entries = max_entries
        self.max_age = max_age

    def __len__(self) -> int:
        return len(self._conns)


def _evict(ctx: MatchContext) -> None:
    """Forget the connections first seen longest ago, an eighth of the cap at a time: deleting one key at a
    time from a dict's front makes every next `iter()` step over the growing run of deleted slots."""
    conns = ctx._conns
    for k in list(itertools.islice(conns, len(conns) - ctx.max_entries + ctx.max_entries // 8)):
        del conns[k]


def _merged_fields(held: dict[str, str], new: Mapping[str, str]) -> dict[str, str]:
    """A connection's fields after a line's: `held` itself when the line says nothing new, else a new dict.
    A connection's fields dict is never changed in place, on either path (the native core's fold_fields
    keeps the same rule): the results of the connection's lines hold the very dict their connection held
    at the time, without a copy each."""
    for name, value in new.items():
        if held.get(name) != value:
            return {**held, **new}
    return held


def _fold_line(conn: _Conn, line: _Conn, user: str | None, now: float) -> None:
    """A known connection learns from its newest line: a second user name marks it `multi`, and whatever the
    line names (address, host name, failure id, fields) replaces what the connection knew."""
    if user and user != conn.user:
        if conn.user:
            conn.multi = True
        else:
            conn.user = user
    conn.nofail = line.nofail
    conn.gained = line.gained
    if line.gained:
        conn.pending = False
    if line.ip4 is not None:
        conn.ip4 = line.ip4
    if line.ip6 is not None:
        conn.ip6 = line.ip6
    if line.dns is not None:
        conn.dns = line.dns
    if line.fid is not None:
        conn.fid = line.fid
    if line.fields:
        conn.fields = _merged_fields(conn.fields, line.fields)
    conn.seen = now


def _other_peer(conn: _Conn, ip4: str | None, ip6: str | None) -> bool:
    """The line names an address and its connection holds another: the id was reused by a new connection.

    sshd's ids are pids, which wrap, and a connection whose closing line never came (a killed process, a
    lost line, a log that names no close) is remembered up to `max_age`. Folding the new connection into
    that memory would credit its failures to the old peer: an IPv6 attacker's lines to the IPv4 address
    that used the pid before (`raw` takes ip4 first), or the old connection's pending failure to the new
    address. So the memory is dropped, as if it had aged out; a host name alone (`dns`) never conflicts.
    """
    if conn.ip4 is None and conn.ip6 is None:
        return False
    return (ip4 is not None and ip4 != conn.ip4) or (ip6 is not None and ip6 != conn.ip6)


def _merge_connection(ctx: MatchContext | None, mlfid: str | None, line: _Conn, now: float) -> _Conn:
    """Fold one line into what is known about its connection (fail2ban's multi-line semantics); returns
    the state that decides this line.

    A `nofail` line only teaches (e.g. "Connection from <HOST>" gives the address for later lines); a line
    without an address stays pending until a later line of the connection names one; `forget`
    (disconnect) ends the connection; `gained` (accepted login) clears pending failures unless the
    connection already tried more than one user name.
    """
    if line.gained and not line.nofail:
        line.nofail = line.gained
    if mlfid is None or ctx is None:
        return line
    forget = line.pending  # the caller passes `mlfforget` in `pending` (a line is never pending itself)
    line.pending = False
    user = line.fields.get("user")
    conns = ctx._conns
    conn = conns.get(mlfid)
    if conn is not None and (conn.seen < now - ctx.max_age or _other_peer(conn, line.ip4, line.ip6)):
        del conns[mlfid]
        conn = None
    if conn is not None:
        _fold_line(conn, line, user, now)
        if forget:
            del conns[mlfid]
        state = conn
    elif not forget:
        line.user = user or ""
        line.seen = now
        conns[mlfid] = line
        if len(conns) > ctx.max_entries:
            _evict(ctx)
        state = line
    else:
        state = line
    if state.pending or state.multi:
        state.pending = False
        state.nofail = state.gained = None
    return state


# --------------------------------------------------------------------------------------------------------
# Filters

_INTERNAL = frozenset({"ip4", "ip6", "dns", "cidr", "content", "mlfid", "nofail", "mlfforget", "mlfgained",
                       "mlfpending"})
_ALT_NAME = re.compile(r"^alt_(.*?)(?:_\d+)?$")


@dataclass(frozen=True, slots=True)
class _Rule:
    find: Finder
    key: str | None  # a literal the line must contain for this rule to match (prefilter)
    index: int
    pattern: str  # after tag expansion
    engine: str
    alts: tuple[tuple[str, str], ...]  # (alt_user, user): fail2ban's alternative names
    fields: tuple[str, ...]  # capture names reported in Match.fields
    heads: frozenset[str] | None  # literal starts of the message this rule can match (None: any)
    names: tuple[str, ...] = ()  # all group names of the regex
    rx: re.Pattern[str] | None = None  # on `re`: the compiled pattern (what the native core translates)
    limit: int | None = None  # characters of the message `find` looks at (None: all)

    @property
    def starts(self) -> tuple[str, ...] | None:
        return tuple(self.heads) if self.heads else None


_FLAGS = ("ip4", "ip6", "dns", "fid", "nofail", "mlfgained", "mlfforget")


def _state_from_groups(rule: _Rule, groups: dict[str, Any], now: float) -> _Conn:
    """One line's groups as connection state (mlfforget travels in `pending`, see _merge_connection)."""
    get = groups.get
    fields = {k: v for k, v in groups.items()
              if isinstance(v, str) and k not in _INTERNAL and not k.startswith(("cond_", "alt_", "_"))}
    for k, base in rule.alts:
        v = get(k)
        if v and not get(base):
            fields[base] = v
    return _Conn(get("ip4"), get("ip6"), get("dns"), get("fid"), get("nofail"), get("mlfgained"),
                 bool(get("mlfforget")), fields, "", False, now)


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where a fast-lane rule's groups sit in the combined regex. `Match.group(*idx)` gives the rule's own
    groups, the prefix's groups, `_pre`, the two timestamp groups and `_none` (always None here); two
    itemgetters (one C call each) read the flags and the fields from that tuple."""

    rule: _Rule
    idx: tuple[int, ...]
    core: Callable[[tuple[Any, ...]], tuple[Any, ...]]  # ip4, ip6, dns, fid, nofail, mlfgained, mlfforget, mlfid
    field_names: tuple[str, ...]
    field_values: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None
    alts: tuple[tuple[str, int], ...]
    field1: tuple[str, int] | None  # the only field (a user name, as a rule usually has): built directly


def _plan(rule: _Rule, local: dict[str, int], pre: dict[str, int], tail: tuple[int, int, int, int]) -> _Plan:
    """Plan for a rule whose own groups sit at `local` group indices of the combined regex and whose
    prefix groups (e.g. mlfid) sit at `pre`; `tail` is (_pre, _ds, _di, _none), the last a group that is
    None whenever a rule matched (it is the other branch), read for names the rule does not have. A
    rule's own group wins over the prefix's, even when it did not take part (fail2ban: the prefix's
    groups updated by the rule's)."""
    names = list(local)
    idx = [local[n] for n in names]
    where = {n: i for i, n in enumerate(names)}
    for n, j in pre.items():
        if n not in where:
            where[n] = len(idx)
            idx.append(j)
    idx += tail  # >= 4 indices: Match.group returns a tuple
    none = len(idx) - 1
    core = itemgetter(*(where.get(k, none) for k in (*_FLAGS, "mlfid")))
    field_names = tuple(dict.fromkeys(n for n in (*rule.fields, *pre)
                                      if n in where and n not in _INTERNAL and not n.startswith(("cond_", "alt_"))))
    values = itemgetter(*(where[n] for n in field_names), none) if len(field_names) > 1 else None
    field1 = (field_names[0], where[field_names[0]]) if len(field_names) == 1 else None
    alts = tuple((base, where[k]) for k, base in rule.alts if k in where)
    return _Plan(rule, tuple(idx), core, field_names, values, alts, field1)


def _lane(pattern: str, marks: dict[str, tuple[_Rule, str]], pre_only: Mapping[str, int]
          ) -> tuple[re.Pattern[str], dict[str | None, _Plan | None]] | None:
    """The fast lane's regex for `pattern` and the plan of each rule marker in it (None: `re` refuses it)."""
    try:
        rx = re.compile(cheap_optionals(pattern))
    except REGEX_ERRORS:
        return None
    gi = rx.groupindex
    pre = {n: gi[n] for n in pre_only}
    tail = (gi["_pre"], gi["_ds"], gi["_di"], gi["_none"])
    plans: dict[str | None, _Plan | None] = {}
    for mark, (r, own) in marks.items():
        local = {n[len(own):]: j for n, j in gi.items() if n.startswith(own)}
        plans[mark] = _plan(r, local, pre, tail)
    return rx, plans


def _joinable(rule: _Rule) -> bool:
    """Can the rule be one alternative of the combined regex (on `re`, anchored at the message start)?"""
    p = rule.pattern
    return rule.engine == "re" and p.startswith("^") and not re.match(r"\^(?:\\[bB]|\(\?<)", p)


class Filter:
    """A compiled filter. Immutable after construction apart from a bounded memo of parsed host texts
    (which only saves work and never changes a result), so one Filter may serve many jails.
    """

    __slots__ = ("_dates", "_fast", "_fast_plans", "_fast_plans_stamped", "_fast_stamped", "_gate", "_heads",
                 "_heads_len", "_hosts", "_ignore", "_ignore_rx", "_ignore_whole", "_ml", "_native", "_pref",
                 "_pref_head", "_pref_rx", "_rules", "_unheaded", "definition", "engines", "name", "native_notes",
                 "notes", "scanner", "uses_context")


    # complexity exempt (C901): building a filter's engines: each optional part is one branch
    def __init__(self, definition: FilterDef, *, tz: tzinfo | None = None, engine: Engine = "auto",  # noqa: C901
                 fast: bool = True, native: bool = True) -> None:
        self.definition = definition
        self.name = definition.name
        notes = list(definition.notes)
        engines: list[str] = []
        rules: list[_Rule] = []
        self._ml = _multiline(definition, notes)
        if self._ml is not None:
            fast = native = False  # the buffer is searched on `re` (multiline.py); the lanes are per line
        for i, src in enumerate(definition.failregex):
            try:
                pattern = expand_tags(src.text)
            except UnsupportedRegex as exc:
                notes.append(f"{src.where}: regex skipped: {exc}")
                continue
            if matches_newline(pattern):
                notes.append(f"{src.where}: regex skipped: it spans lines (multi-line buffering)")
                continue
            c = _compile_one(pattern, src.where, engine)
            names = _check_groups(pattern, src.where, definition)
            if c.note:
                notes.append(c.note)
            engines.append(c.engine)
            alts = tuple((n, _ALT_NAME.sub(r"\1", n)) for n in names if n.startswith("alt_"))
            fields = tuple(n for n in names if n not in _INTERNAL and not n.startswith(("cond_", "alt_")))
            rules.append(_Rule(c.find, required_literal(pattern), i, pattern, c.engine, alts, fields,
                               literal_heads(pattern), names, c.rx, c.limit))
        if not rules and self._ml is None:
            raise FilterError(definition.source, "the filter has no usable failregex")
        self._rules = tuple(rules)
        ignores = [self._compile_aux(src, engine, notes, engines) for src in definition.ignoreregex]
        self._ignore = tuple(c.find for c in ignores)
        # what the native core needs to run them (None where a regex is not on `re`)
        self._ignore_rx = tuple((c.rx, c.limit) if c.rx is not None else None for c in ignores)
        self._ignore_whole = definition.ignore_whole_line
        self._pref: Finder | None = None
        # ("prefregex" | "prefix", the `re` pattern or None when on RE2, its character limit)
        self._pref_rx: tuple[str, re.Pattern[str] | None, int | None] | None = None
        # The built-in syslog header at the prefix's start, which the native core reads by hand: its
        # daemon names, and the texts the rest of the prefix matches (sysloghead.syslog_head).
        self._pref_head: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        if definition.prefregex is not None:
            c = self._compile_aux(definition.prefregex, engine, notes, engines)
            self._pref = c.find
            self._pref_rx = ("prefregex", c.rx, c.limit)
        elif definition.prefix is not None:
            self._pref, prx = self._compile_prefix(definition.prefix, engine, notes, engines)
            self._pref_rx = ("prefix", prx, None)
            self._pref_head = syslog_head(definition.prefix.text) if prx is not None else None
        try:
            self._dates = DateParser(definition.datepattern, tz=tz)
        except DatePatternError as exc:
            raise FilterError(definition.source, str(exc)) from None
        # Gate: a line must hold one of the filter's prefilter strings, or else one of the literals its
        # rules cannot match without. Nearly every line of a busy log ends here.
        keys = [r.key for r in rules]
        if definition.prefilter:
            self._gate: tuple[str, ...] | None = tuple(definition.prefilter)
        elif all(k is not None for k in keys):
            self._gate = tuple(dict.fromkeys(k for k in keys if k is not None))
        else:
            self._gate = None
        # Dispatch on the message's first characters: only rules that can start that way are tried.
        heads = [h for r in rules if r.heads for h in r.heads]
        self._heads_len = max(1, min(4, min((len(h) for h in heads), default=1)))
        table: dict[str, list[_Rule]] = {}
        unheaded: list[_Rule] = []
        for r in rules:
            if r.heads is None or any(len(h) < self._heads_len for h in r.heads):
                unheaded.append(r)
                continue
            for h in r.heads:
                table.setdefault(h[:self._heads_len], []).append(r)
        self._unheaded = tuple(unheaded)
        self._heads = {k: tuple(sorted({*v, *unheaded}, key=lambda r: r.index)) for k, v in table.items()}
        self._hosts: dict[str, IPAddr | RejectReason] = {}
        self.notes = tuple(notes)
        self.engines = tuple(engines)
        self.uses_context = self._ml is not None or any(
            "<F-MLFID>" in src.text
            for src in (definition.prefregex, definition.prefix, *definition.failregex) if src is not None)
        self._fast: re.Pattern[str] | None = None
        self._fast_plans: dict[str | None, _Plan | None] = {}
        self._fast_stamped: re.Pattern[str] | None = None  # the same without the date (journal lines)
        self._fast_plans_stamped: dict[str | None, _Plan | None] = {}
        if fast:
            self._build_fast_lane()
        # The native scanning core (native.py), when the extension is built and the filter suits it;
        # `scanner` says which engine runs the filter, `native_notes` what stays on the Python path.
        self._native: Any = None
        self.scanner = "python (re)"
        self.native_notes: tuple[str, ...] = ()
        if native:
            parts = NativeParts(self._dates, self._pref_rx, self._pref_head, self._ignore_rx, self._ignore_whole,
                                self._rules, self._heads, self._heads_len, self._unheaded, self._gate, self._hosts)
            hooks = NativeHooks(Match, Rejected, _evict, parse_host, _HOST_MEMO, MAX_LINE)
            built = build_native(parts, hooks)
            self._native, self.scanner, self.native_notes = built.scanner, built.engine, built.notes

    def disable_native(self) -> None:
        """Run the pure-Python path from now on (the reference; the benchmarks compare the two)."""
        self._native = None
        self.scanner = "python (re): native core disabled"

    @property
    def native_stats(self) -> dict[str, int] | None:
        """Lines the native core saw, handed to the Python path, skipped at a match limit, and the syslog
        headers it read by hand instead of the prefix regex (None: not native)."""
        return dict(self._native.stats) if self._native is not None else None

    @staticmethod
    def _compile_aux(src: RegexSource, engine: Engine, notes: list[str], engines: list[str]) -> _Compiled:
        try:
            pattern = expand_tags(src.text)
        except UnsupportedRegex as exc:
            raise FilterError(src.where, str(exc)) from None
        c = _compile_one(pattern, src.where, engine)
        if c.note:
            notes.append(c.note)
        engines.append(c.engine)
        return c

    @staticmethod
    def _compile_prefix(src: RegexSource, engine: Engine, notes: list[str], engines: list[str]
                        ) -> tuple[Finder, re.Pattern[str] | None]:
        # A YAML prefix is matched at the start; the message is the rest of the line (no `.*` tail, so
        # the prefix stays lintable and cheap).
        try:
            pattern = expand_tags(src.text)
            rx = re.compile(cheap_optionals(pattern))
        except _UNUSABLE as exc:
            raise FilterError(src.where, f"invalid prefix: {exc}") from None
        risk = lint_regex("^" + pattern) if engine == "auto" else None
        if risk or engine == "re2":
            rx2 = _re2_finder(f"^(?:{pattern})(?P<content>.*)")
            if rx2 is not None:
                engines.append("re2")
                return rx2, None
            if risk:
                notes.append(f"{src.where}: {risk}")
        engines.append("re")
        match = rx.match

        def find(text: str) -> dict[str, Any] | None:
            m = match(text)
            if m is None:
                return None
            d = m.groupdict()
            d["content"] = text[m.end():]
            return d

        return find, rx

    def _build_fast_lane(self) -> None:
        """One regex for timestamp, prefix and rules: the line's whole decision in one call to `re`.

        `TS (?: (?>PREFIX) (?: (?=HEAD1) RULES1 | (?=HEAD2) RULES2 | ... ) | (?P<_none>) )`: the message's
        first characters choose the rules that can start that way (as the general path's dispatch does),
        and within them the engine tries alternatives in order, so the first alternative that matches is
        the first rule that matches. The prefix is an atomic group, so it is the very match the prefix
        regex alone gives. A head whose rules cannot all join (RE2, unanchored) is a `(?P<_slowN>)` branch
        that sends its lines to the general path. No match at all means the line does not start with a
        timestamp of the usual forms: the general path reads it. Only for YAML prefixes with the default
        timestamp forms; the tests run both paths over every sample line and require identical results.
        """
        d = self.definition
        if d.prefix is None:
            return
        try:
            prefix = expand_tags(d.prefix.text)
            if lint_regex("^" + prefix):
                return
            re.compile(prefix)
        except _UNUSABLE:
            return
        branches: list[str] = []
        marks: dict[str, tuple[_Rule, str]] = {}  # marker group -> rule, prefix of its renamed groups

        def alternation(rules: tuple[_Rule, ...], tag: str) -> str:
            alts = []
            for r in rules:
                own = f"_{r.index}_{tag}_"
                marks[f"_r{r.index}_{tag}"] = (r, own)
                alts.append(f"(?:{_rename_groups(r.pattern[1:], own)})(?P<_r{r.index}_{tag}>)")
            return "(?:" + "|".join(alts) + ")"

        keys = sorted(self._heads)
        for n, k in enumerate(keys):
            rules = self._heads[k]
            body = alternation(rules, str(n)) if all(_joinable(r) for r in rules) else f"(?P<_slow{n}>)"
            branches.append(f"(?={re.escape(k)}){body}")
        if self._unheaded:
            body = (alternation(self._unheaded, "o") if all(_joinable(r) for r in self._unheaded)
                    else "(?P<_slowo>)")
            guard = f"(?!{'|'.join(re.escape(k) for k in keys)})" if keys else ""
            branches.append(guard + body)
        body = f"(?:(?P<_pre>(?>{prefix}))(?:{'|'.join(branches)})|(?P<_none>))"
        pre_only = re.compile(prefix).groupindex
        if self._dates.fast_shapes is not None:
            syslog, iso = self._dates.fast_shapes
            lane = _lane(f"(?:(?P<_ds>{syslog})|(?P<_di>{iso})){body}", marks, pre_only)
            if lane is not None:
                self._fast, self._fast_plans = lane
        # Stamped lines (the journal's) have no date to read whatever the datepattern: two empty groups
        # stand where the date groups were, so the plans read the same tuple shape and `_ds` is always "".
        lane = _lane(f"(?P<_ds>)(?P<_di>){body}", marks, pre_only)
        if lane is not None:
            self._fast_stamped, self._fast_plans_stamped = lane

    # -- matching ----------------------------------------------------------------------------------------

    def match(self, line: str, now: float, ctx: MatchContext | None = None, *, stamped: bool = False
              ) -> MatchResult:
        """Match one line. `now` is the caller's clock (used for year inference and context expiry).

        Returns Match (a failure by an address, possibly `ignored`), Rejected (a failure whose host is not
        a usable address) or None. Pass a MatchContext to get multi-line (connection id) semantics; without
        one every line stands alone. Never raises on input. `stamped`: see `scan`.
        """
        found = self.scan((line,), now, ctx, stamped=stamped)
        return found[0][1] if found else None

    # C901: one function on purpose. It runs for every line of every jail and inlines the general path's
    # steps (state, connection merge, decision, result) with every lookup hoisted out of the loop; a call per
    # step per line is what the inlining removed (bench_matcher times it in lines/s). `match` and the general
    # path are the readable version, and tests check the two agree line by line.
    def scan(self, lines: Sequence[str], now: float, ctx: MatchContext | None = None, *, stamped: bool = False
             ) -> list[tuple[int, Match | Rejected]]:
        """Match many lines in order (what `match` does for each): the (index, result) of every line that
        gave a result. The daemon's hot path: on the native core when there is one (it hands the lines it
        cannot take exactly to `_scan_one`), else `_scan_py`.

        `stamped`: the lines carry their time outside their text (journal entries, "host ident[pid]: msg"),
        as fail2ban's systemd backend hands them to `processLine` with the journal's date: no date is looked
        for, whatever the filter's datepattern, and the regexes see the whole text, a date-like text in the
        message included. Such a result's `time` is None: the line's own time (LogLine.time) is its time.
        An embedded newline becomes the two characters "\\n", as fail2ban's formatJournalEntry writes it.
        """
        native = self._native
        if native is not None:
            if stamped:
                return native.scan(lines, now, ctx, self._scan_one_stamped, True)  # type: ignore[no-any-return]
            return native.scan(lines, now, ctx, self._scan_one)  # type: ignore[no-any-return]
        if self._ml is not None:
            return self._scan_multi(lines, now, ctx, stamped)
        return self._scan_py(lines, now, ctx, stamped)

    def _scan_multi(self, lines: Sequence[str], now: float, ctx: MatchContext | None, stamped: bool = False
                    ) -> list[tuple[int, Match | Rejected]]:
        """fail2ban's maxlines buffer (multiline.py): each line joins the buffer, which the regexes search;
        without a context each line stands alone. Stamped lines are buffered whole, their time None (each
        match takes the time of the line that completes it, as fail2ban's findFailure does)."""
        ml = self._ml
        assert ml is not None
        buf: list[BufferedLine] = ctx.lines if ctx is not None else []
        out: list[tuple[int, Match | Rejected]] = []
        for i, line in enumerate(lines):
            if len(line) > MAX_LINE:
                line = line[:MAX_LINE]
            if stamped:
                found = None
                line = line.replace("\n", "\\n")
            else:
                found = self._dates.find_span(line, now)
            if found is not None and found[1] < found[2]:
                when: float | None = found[0]
                text = line[:found[1]] + line[found[2]:]
            elif stamped:
                when, text = None, line
            else:  # no date, or an empty one (`^WARNING:()**`): fail2ban's last known date, the message's
                when, text = (buf[-1].time if buf else None), line
            if "\n" in text:  # a journal message may hold one: it must not pass for a line of its own (`^`)
                text = text.replace("\n", " ")
            buf.append(BufferedLine(text, when))
            del buf[:-ml.maxlines]
            window = joined(buf)
            for index, rx in ml.rules:
                m = rx.search(window)
                if m is None:
                    continue
                used, rest = split_match(m, buf)
                ignored = any(ig.search(joined(used)) is not None for ig in ml.ignores)
                buf[:] = rest
                groups = m.groupdict()
                if not groups.get("nofail"):
                    out.append((i, self._multi_result(index, groups, when, ignored)))
                break
        return out

    def _multi_result(self, index: int, groups: dict[str, Any], when: float | None, ignored: bool
                      ) -> Match | Rejected:
        raw = groups.get("ip4") or groups.get("ip6") or groups.get("dns") or groups.get("fid")
        if not raw:
            return Rejected("", "no-address", when, ignored, index)
        host = self._host(raw)
        if isinstance(host, str):
            return Rejected(raw, host, when, ignored, index)
        fields = {k: v for k, v in groups.items() if isinstance(v, str) and k not in _INTERNAL
                  and not k.startswith(("cond_", "alt_", "_", "skiplines"))}
        return Match(host, when, ignored, fields, index)

    def _scan_one(self, line: str, now: float, ctx: MatchContext | None) -> MatchResult:
        """The Python path for one line (the native core's fallback)."""
        found = self._scan_py((line,), now, ctx)
        return found[0][1] if found else None

    def _scan_one_stamped(self, line: str, now: float, ctx: MatchContext | None) -> MatchResult:
        """`_scan_one` for a stamped line (the native core's fallback in a stamped batch)."""
        found = self._scan_py((line,), now, ctx, True)
        return found[0][1] if found else None


    # complexity exempt (C901): the per-line hot path of the Python engine, inlined on purpose (bench_matcher)
    def _scan_py(self, lines: Sequence[str], now: float, ctx: MatchContext | None = None,  # noqa: C901
                 stamped: bool = False) -> list[tuple[int, Match | Rejected]]:
        """The pure-Python path of `scan`: the reference, and the fallback without the native core.
        Everything a line needs is looked up once per batch.
        """
        out: list[tuple[int, Match | Rejected]] = []
        gate = self._gate
        gate1 = gate[0] if gate is not None and len(gate) == 1 else None
        fast = self._fast_stamped if stamped else self._fast
        fmatch = fast.match if fast is not None else None
        plans = self._fast_plans_stamped if stamped else self._fast_plans
        stamp = self._dates.stamp
        general = self._general_stamped if stamped else self._general
        ignore = self._ignore
        hosts = self._hosts
        conns = ctx._conns if ctx is not None else None
        # The stamped lane's date groups are always "" (see _build_fast_lane): starting from "" the time is
        # never read from the text and stays None, the line's own time.
        last_ds: str | None = "" if stamped else None
        last_di: str | None = "" if stamped else None
        last_when: float | None = None  # `now` is fixed for the call, so a timestamp text has one time
        for i, line in enumerate(lines):
            if len(line) > MAX_LINE:
                line = line[:MAX_LINE]
            if stamped:
                if "\n" in line:  # fail2ban's formatJournalEntry: one entry, one line, "\\n" for a newline
                    line = line.replace("\n", "\\n")
            elif "\n" in line or "\r" in line:
                # One record, one line: an embedded newline must not let a forged line start mid-record.
                line = line.replace("\r", " ").replace("\n", " ")
            if gate1 is not None:
                if gate1 not in line:
                    continue
            elif gate is not None:
                for g in gate:
                    if g in line:
                        break
                else:
                    continue
            if fmatch is None or (m := fmatch(line)) is None:
                r = general(line, now, ctx)
                if r is not None:
                    out.append((i, r))
                continue
            plan = plans.get(m.lastgroup)
            if plan is None:
                if m.lastgroup != "_none":  # a head whose rules run on their own
                    r = general(line, now, ctx)
                    if r is not None:
                        out.append((i, r))
                continue  # the timestamp was read; the prefix or every rule failed: nothing can match
            # The general path's steps (_state_from_groups, _merge_connection, _decide, _result), inlined
            # on positional groups: this runs for nearly every line a busy jail matches.
            rule = plan.rule
            allv = m.group(*plan.idx)
            ds, di = allv[-3], allv[-2]
            if ds != last_ds or di != last_di:  # a busy log has many lines a second: same text, same time
                last_ds, last_di, last_when = ds, di, stamp(ds, di, now)
            when = last_when
            ip4, ip6, dns, fid, nofail, gained, forget, mlfid = plan.core(allv)
            fields: dict[str, str]
            one = plan.field1
            if one is not None:  # dict(zip(...)) costs eight times a literal
                v = allv[one[1]]
                fields = {} if v is None else {one[0]: v}
            elif plan.field_values is None:
                fields = {}
            else:
                fields = dict(zip(plan.field_names, plan.field_values(allv), strict=False))
                if None in fields.values():
                    fields = {n: v for n, v in fields.items() if v is not None}
            if plan.alts:
                for base, j in plan.alts:
                    x = allv[j]
                    if x and not fields.get(base):
                        fields[base] = x
            if ignore:
                content = line[m.end("_pre"):]
                date_end = m.end("_ds") if allv[-3] is not None else m.end("_di")
                if self._ignored(content, line[date_end:]):
                    r = self._result(rule, _Conn(ip4, ip6, dns, fid, nofail, gained, False, fields, "", False,
                                                 now), when, True)
                    if r is not None:
                        out.append((i, r))
                    continue
            if gained and not nofail:
                nofail = gained
            if mlfid is not None and conns is not None:
                assert ctx is not None
                # _merge_connection, inlined
                user = fields.get("user")
                conn = conns.get(mlfid)
                if conn is not None and (conn.seen < now - ctx.max_age or (
                        (ip4 is not None or ip6 is not None) and _other_peer(conn, ip4, ip6))):
                    del conns[mlfid]
                    conn = None
                if conn is not None:
                    if user and user != conn.user:
                        if conn.user:
                            conn.multi = True
                        else:
                            conn.user = user
                    conn.nofail = nofail
                    conn.gained = gained
                    if gained:
                        conn.pending = False
                    if ip4 is not None:
                        conn.ip4 = ip4
                    if ip6 is not None:
                        conn.ip6 = ip6
                    if dns is not None:
                        conn.dns = dns
                    if fid is not None:
                        conn.fid = fid
                    if fields:
                        conn.fields = _merged_fields(conn.fields, fields)
                    conn.seen = now
                    if forget:
                        del conns[mlfid]
                    state = conn
                else:
                    # A connection's first line (the same steps, short-cut: a fresh state is neither
                    # pending nor multi-user). Helper lines usually end here, most without allocating.
                    missing = ip4 is None and ip6 is None and dns is None and fid is None
                    if not forget:
                        conns[mlfid] = _Conn(ip4, ip6, dns, fid, nofail, gained,
                                             missing and not (nofail or gained), fields,
                                             user or "", False, now)
                        if len(conns) > ctx.max_entries:
                            _evict(ctx)
                    if nofail or gained or missing:
                        continue
                    raw = ip4 or ip6 or dns or fid
                    host = hosts.get(raw) if raw else None
                    if host is None:
                        if not raw:
                            out.append((i, Rejected("", "no-address", when, False, rule.index)))
                            continue
                        host = self._host(raw)
                    if isinstance(host, str):
                        out.append((i, Rejected(raw, host, when, False, rule.index)))
                    else:
                        out.append((i, _new_match(Match, (host, when, False, fields, rule.index))))
                    continue
                if state.pending or state.multi:
                    state.pending = False
                    state.nofail = state.gained = None
                if state.nofail or state.gained:
                    continue
                ip4, ip6, dns, fid = state.ip4, state.ip6, state.dns, state.fid
                if ip4 is None and ip6 is None and dns is None and fid is None:
                    state.pending = True  # remembered: a later line of this connection decides
                    continue
                fields = state.fields  # the connection's, shared: it is never changed in place
            elif nofail or gained or (ip4 is None and ip6 is None and dns is None and fid is None):
                continue
            raw = ip4 or ip6 or dns or fid
            if not raw:
                out.append((i, Rejected("", "no-address", when, False, rule.index)))
                continue
            host = hosts.get(raw)
            if host is None:
                host = self._host(raw)
            if isinstance(host, str):
                out.append((i, Rejected(raw, host, when, False, rule.index)))
            else:
                out.append((i, _new_match(Match, (host, when, False, fields, rule.index))))
        return out

    def _general_stamped(self, line: str, now: float, ctx: MatchContext | None) -> MatchResult:
        """`_general` for a stamped line: no date is looked for, the regexes see the whole text."""
        return self._general(line, now, ctx, True)

    def _general(self, line: str, now: float, ctx: MatchContext | None, stamped: bool = False) -> MatchResult:
        found = None if stamped else self._dates.find_span(line, now)
        if found is not None:
            when: float | None = found[0]
            text = line[:found[1]] + line[found[2]:] if found[1] or found[2] else line
        else:
            text, when = line, None
        pre: dict[str, Any] | None = None
        content = text
        if self._pref is not None:
            d = self._pref(text)
            if d is None:
                return None
            c = d.pop("content", None)
            if c:
                content = c
            pre = d
        for rule in self._heads.get(content[:self._heads_len], self._unheaded):
            groups = rule.find(content)
            if groups is not None:
                break
        else:
            return None
        if pre:
            merged = dict(pre)
            merged.update(groups)
            groups = merged
        return self._general_tail(rule, groups, when, now, ctx, content, text)

    def _general_tail(self, rule: _Rule, groups: dict[str, Any], when: float | None, now: float,
                      ctx: MatchContext | None, content: str, text: str) -> MatchResult:
        state = _state_from_groups(rule, groups, now)
        if self._ignore and self._ignored(content, text):
            return self._result(rule, state, when, True)
        return self._decide(rule, groups.get("mlfid"), state, when, now, ctx)

    def _decide(self, rule: _Rule, mlfid: str | None, state: _Conn, when: float | None, now: float,
                ctx: MatchContext | None) -> MatchResult:
        state = _merge_connection(ctx, mlfid, state, now)
        if state.nofail or state.gained:
            return None
        if state.ip4 is None and state.ip6 is None and state.dns is None and state.fid is None:
            state.pending = True  # remembered in the context: a later line of this connection decides
            return None
        return self._result(rule, state, when, False)

    def _ignored(self, content: str, text: str) -> bool:
        for ig in self._ignore:
            if ig(content) is not None:
                return True
            if self._ignore_whole and content is not text and ig(text) is not None:
                return True
        return False

    def _host(self, raw: str) -> IPAddr | RejectReason:
        """`parse_host` through a bounded memo (scanners repeat their address line after line)."""
        host = self._hosts.get(raw)
        if host is None:
            host = parse_host(raw)
            if len(self._hosts) >= _HOST_MEMO:
                self._hosts.clear()
            self._hosts[raw] = host
        return host

    def _result(self, rule: _Rule, state: _Conn, when: float | None, ignored: bool) -> MatchResult:
        raw = state.ip4 or state.ip6 or state.dns or state.fid
        if not raw:
            return Rejected("", "no-address", when, ignored, rule.index)
        host = self._host(raw)
        if isinstance(host, str):
            return Rejected(raw, host, when, ignored, rule.index)
        return Match(host, when, ignored, state.fields, rule.index)

    def __repr__(self) -> str:
        return f"Filter({self.name!r}, {len(self._rules)} regexes)"


@dataclass(frozen=True, slots=True)
class _MultiLine:
    maxlines: int
    rules: tuple[tuple[int, re.Pattern[str]], ...]  # (failregex index, pattern), searched in order
    ignores: tuple[re.Pattern[str], ...]


def _multiline(definition: FilterDef, notes: list[str]) -> _MultiLine | None:
    """The multi-line form of a filter whose maxlines > 1 (None: it matches line by line)."""
    if definition.maxlines <= 1:
        return None
    if definition.prefregex is not None or definition.prefix is not None:
        notes.append(f"{definition.source}: maxlines = {definition.maxlines} with a prefregex is not "
                     "implemented; lines are matched one at a time and regexes that span lines are skipped")
        return None

    def compile_ml(src: RegexSource) -> re.Pattern[str]:
        try:
            return re.compile(expand_tags(expand_skiplines(src.text)), re.MULTILINE)
        except _UNUSABLE as exc:
            raise FilterError(src.where, f"invalid regex: {exc}") from None

    rules = tuple((i, compile_ml(src)) for i, src in enumerate(definition.failregex))
    if not rules:
        raise FilterError(definition.source, "the filter has no usable failregex")
    return _MultiLine(min(definition.maxlines, MAX_MAXLINES), rules,
                      tuple(compile_ml(src) for src in definition.ignoreregex))


def _check_groups(pattern: str, where: str, definition: FilterDef) -> tuple[str, ...]:
    """A failregex must be able to name a host: <HOST>/<ADDR>/<F-ID> here or in the prefix. Returns the
    regex's group names."""
    try:
        own = tuple(re.compile(pattern).groupindex)
    except REGEX_ERRORS:
        own = tuple(_re2_group_names(pattern))
    names = set(own)
    for extra in (definition.prefregex, definition.prefix):
        if extra is not None:
            with contextlib.suppress(*_UNUSABLE):
                names |= set(re.compile(expand_tags(extra.text)).groupindex)
    if not names & {"ip4", "ip6", "dns", "fid", "mlfid"}:
        raise FilterError(where, "failregex has no <HOST> (or <ADDR>, <F-ID>) to take the address from")
    return own


def _rename_groups(pattern: str, prefix: str) -> str:
    """Prefix every named group (and back-reference) so that several rules can share one regex."""
    pattern = re.sub(r"\(\?P<(\w+)>", lambda m: f"(?P<{prefix}{m.group(1)}>", pattern)
    return re.sub(r"\(\?P=(\w+)\)", lambda m: f"(?P={prefix}{m.group(1)})", pattern)


def _re2_group_names(pattern: str) -> list[str]:
    return re.findall(r"\(\?P<(\w+)>", pattern)


def compile_filter(definition: FilterDef, *, tz: tzinfo | None = None, engine: Engine = "auto",
                   fast: bool = True, native: bool = True) -> Filter:
    return Filter(definition, tz=tz, engine=engine, fast=fast, native=native)
