"""Find the timestamp in a log line and turn it into epoch seconds.

Pure: the current time (`now`) and the zone of timestamps that carry none (`tz`) are arguments; this module
never reads the clock. A line without a parseable time gives None and the caller uses the arrival time.

Two ways to say what a timestamp looks like:

- the default set of templates (`DateParser()`): syslog (`Dec  2 09:53:10`, year inferred from `now`),
  RFC 3339 / ISO 8601 (also journal `2026-12-02T09:53:10.123456+0100`), web servers
  (`[02/Dec/2026:09:53:10 +0000]`), epoch seconds (`1796205190.123`, `[1796205190]`, `audit(1796205190.1:2)`)
  and a dozen rarer forms application logs use;
- a fail2ban-style `datepattern` (`DateParser("^%Y-%m-%d %H:%M:%S")`): strftime directives inside a regex,
  with fail2ban's markers `{^LN-BEG}`, `{DATE}`, `{UNB}`, `{NONE}`, `EPOCH`, `LEPOCH`, `TAI64N`, `**`.

The matched time text is reported as a span so that the matcher can cut it out of the line before running
the filter's regexes (fail2ban's convention: regexes never see the date).
"""

from __future__ import annotations

import calendar
import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from typing import Any

from nftblockd.detect.rxlint import REGEX_ERRORS

__all__ = ["DateParser", "DatePatternError", "Stamp", "parse_timestamp"]


class DatePatternError(ValueError):
    """A `datepattern` is not a valid pattern (the filter author's fault)."""


@dataclass(frozen=True, slots=True)
class Stamp:
    """A timestamp found in a line: epoch seconds and the span of the time text within the line."""

    time: float
    start: int
    end: int


_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTH_NUM = {m: i for i, m in enumerate(_MONTHS, 1)}
_MONTH_NUM.update({
    "january": 1, "february": 2, "march": 3, "april": 4, "june": 6, "july": 7, "august": 8,
    "september": 9, "october": 10, "november": 11, "december": 12, "sept": 9,
})
_DAYS = "mon|tue|wed|thu|fri|sat|sun"
_DAYS_FULL = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_MONTHS_FULL = "january|february|march|april|may|june|july|august|september|october|november|december"

# Fixed offsets (minutes) of the zone abbreviations logs commonly print. Abbreviations are ambiguous
# (IST, CST); only the ones with one widespread meaning are listed. Unknown abbreviations make the time
# unparseable rather than silently wrong.
_ZONE_ABBR = {
    "Z": 0, "UT": 0, "UTC": 0, "GMT": 0, "WET": 0, "WEST": 60, "BST": 60, "CET": 60, "CEST": 120, "MET": 60,
    "MEST": 120, "EET": 120, "EEST": 180, "MSK": 180, "EST": -300, "EDT": -240, "CDT": -300, "MST": -420,
    "MDT": -360, "PST": -480, "PDT": -420, "AKST": -540, "AKDT": -480, "HST": -600, "JST": 540, "KST": 540,
    "AEST": 600, "AEDT": 660, "ACST": 570, "AWST": 480, "NZST": 720, "NZDT": 780, "SGT": 480, "HKT": 480,
}
_ZONE_ABBR_RE = "|".join(sorted(_ZONE_ABBR, key=len, reverse=True))

# strftime directive -> regex. Field groups are named after the directive; a pattern may use each at most
# once (Python's re refuses duplicate group names, which is the error the author then sees).
_DIRECTIVES: dict[str, str] = {
    "Y": r"(?P<Y>\d{4})",
    "ExY": r"(?P<Y>(?:19|20)\d\d)",
    "y": r"(?P<y>\d\d)",
    "Exy": r"(?P<y>\d\d)",
    "m": r"(?P<m>1[0-2]|0?[1-9])",
    "Exm": r"(?P<m>1[0-2]|0[1-9])",
    "d": r"(?P<d>3[01]|[12]\d|[0 ]?[1-9])",
    "e": r"(?P<d>3[01]|[12]\d|[0 ]?[1-9])",
    "Exd": r"(?P<d>3[01]|[12]\d|0[1-9])",
    "H": r"(?P<H>2[0-3]|[01]?\d)",
    "ExH": r"(?P<H>2[0-3]|[01]\d)",
    "k": r" ?(?P<H>2[0-3]|[01]?\d)",
    "Exk": r" ?(?P<H>2[0-3]|[01]?\d)",
    "I": r"(?P<I>1[0-2]|0?[1-9])",
    "l": r" ?(?P<I>1[0-2]|0?[1-9])",
    "Exl": r" ?(?P<I>1[0-2]|0?[1-9])",
    "M": r"(?P<M>[0-5]?\d)",
    "ExM": r"(?P<M>[0-5]\d)",
    "S": r"(?P<S>6[01]|[0-5]?\d)",
    "ExS": r"(?P<S>6[01]|[0-5]\d)",
    "f": r"(?P<f>\d{1,9})",
    "p": r"(?P<p>(?i:AM|PM))",
    "b": rf"(?P<b>(?i:{'|'.join(_MONTHS)}))",
    "B": rf"(?P<b>(?i:{_MONTHS_FULL}))",
    "a": rf"(?P<a>(?i:{_DAYS}))",
    "A": rf"(?P<a>(?i:{_DAYS_FULL}))",
    "z": r"(?P<z>Z|UTC|GMT|[+-][01]\d(?::?[0-5]\d)?)",
    "Exz": rf"(?P<z>(?:{_ZONE_ABBR_RE})?[+-][01]\d(?::?[0-5]\d)?|{_ZONE_ABBR_RE})",
    "Z": r"(?P<Z>Z|[A-Z]{2,5})",
    "ExZ": rf"(?P<Z>{_ZONE_ABBR_RE})",
    "j": r"(?P<j>36[0-6]|3[0-5]\d|[12]\d\d|0?[1-9]\d|0{0,2}[1-9])",
    "s": r"(?P<epoch>\d{9,11}(?:\.\d{1,9})?)",
    "%": "%",
}
_DIRECTIVE_RE = re.compile(r"%(Ex[YymdHkMSlzZ]|[YymdeHkIlMSfpbBaAzZjs%])")

_EPOCH = r"(?P<epoch>\d{10,11}(?:\.\d{3,6})?)"
_LEPOCH = r"(?P<lepoch>\d{10,11}(?:\d{3}(?:\.\d{1,6}|\d{3})?)?)"
_TAI64N = r"@(?P<tai>[0-9a-f]{24})"

# The default templates, most common first. Anchored at line start they are tried in this order; when none
# starts the line the leftmost match anywhere wins. Written as datepatterns so one converter serves both.
_DEFAULTS: tuple[str, ...] = (
    r"%ExY(?P<sep>[-/.])%m(?P=sep)%d(?:T|  ?)%H:%M:%S(?:[.,]%f)?(?:\s*%z)?",
    r"(?:%a )?%b %d %k:%M:%S(?:\.%f)?(?: %ExY)?",
    r"(?:%a )?%b %d %ExY %k:%M:%S(?:\.%f)?",
    r"%d(?P<sep>[-/])%m(?P=sep)(?:%ExY|%Exy) %k:%M:%S",
    r"%d(?P<sep>[-/])%b(?P=sep)%ExY[ :]?%H:%M:%S(?:\.%f)?(?: %z)?",
    r"%m/%d/%ExY:%H:%M:%S",
    r"%m-%d-%ExY %k:%M:%S(?:\.%f)?",
    "EPOCH",
    r"{^LN-BEG}%H:%M:%S",
    r"^<%m/%d/%Exy@%H:%M:%S>",
    r"%Exy%Exm%Exd  ?%H:%M:%S",
    r"%b %d, %ExY %I:%M:%S %p",
    r"^%b-%d-%Exy %k:%M:%S",
    r"%ExY%Exm%Exd(?:T|  ?)%ExH%ExM%ExS(?:[.,]%f)?(?:\s*%z)?",
    r"(?:%ExZ )?(?:%a )?%b %d %k:%M:%S(?:\.%f)?(?: %ExY)?",
    r"(?:%Exz )?(?:%a )?%b %d %k:%M:%S(?:\.%f)?(?: %ExY)?",
    "TAI64N",
)

_WORD_BEGIN = r"(?:(?<!\w)|(?=\W))"
_WORD_END = r"(?:(?!\w)|(?<=\W))"
_LINE_BEGIN = r"^(?:\W{0,2})?"
_UNNAMED_GROUP = re.compile(r"(?<!\\)\((?!\?)")
_MEMO_MAX = 4096  # memo entries per parser; the memo only caches results and is cleared when full


@dataclass(frozen=True, slots=True)
class _Template:
    """One compiled timestamp form. `group` names the span to cut out (0 = whole match, or 1 / "date")."""

    rx: re.Pattern[str]
    group: int | str
    anchored: bool  # matches at line start only: tried with `match`, never with `search`


def _strftime_to_regex(pattern: str) -> str:
    def repl(m: re.Match[str]) -> str:
        return _DIRECTIVES[m.group(1)]

    return _DIRECTIVE_RE.sub(repl, pattern)


def _bounded(body: str, begin: bool, end: bool) -> str:
    if begin and not re.match(r"^\(*(?:\(\?\w+\))?(?:\^|\(\?:\^)", body):
        body = _WORD_BEGIN + body
    if end and not re.search(r"(?<!\\)(?:\$\)?|\\b|\\s)$", body):
        body += _WORD_END
    return body


def _compile_pattern(pattern: str) -> list[_Template]:
    """Turn one fail2ban-style datepattern line into templates (several when it embeds {DATE})."""
    p = pattern.strip()
    if not p:
        return []
    key = p.upper()
    if key in ("{^LN-BEG}", "{DEFAULT}", "{DATE}"):
        return _default_templates(line_begin_only=key == "{^LN-BEG}")
    if key == "{NONE}":
        return []
    if key in ("EPOCH", "{^LN-BEG}EPOCH", "^EPOCH", "LEPOCH", "{^LN-BEG}LEPOCH", "^LEPOCH"):
        ep = _LEPOCH if "LEPOCH" in key else _EPOCH
        if key.startswith(("{^LN-BEG}", "^")):
            body = rf"(?P<date>\[?{ep})(?!\w)"
            return [_Template(re.compile(_LINE_BEGIN + body), "date", True)]
        body = rf"(?:^\[?|(?<=\baudit\())(?P<date>{ep})(?![\w.])"
        return [_Template(re.compile(body), "date", False)]
    if key in ("TAI64N", "{^LN-BEG}TAI64N", "^TAI64N"):
        if key != "TAI64N":
            return [_Template(re.compile(_LINE_BEGIN + f"(?P<date>{_TAI64N})"), "date", True)]
        return [_Template(re.compile(_WORD_BEGIN + f"(?P<date>{_TAI64N})"), "date", False)]
    unbounded = p.startswith("{UNB}")
    if unbounded:
        p = p[len("{UNB}"):]
    line_begin = p.startswith("{^LN-BEG}")
    if line_begin:
        p = p[len("{^LN-BEG}"):]
    if re.search(r"\{DATE\}", p, re.IGNORECASE):
        out = []
        for d in _DEFAULTS:
            if d in ("EPOCH", "TAI64N") or d.startswith(("{^LN-BEG}", "^")):
                continue
            inner = _bounded(_strftime_to_regex(d), False, True)
            body = re.sub(r"\{DATE\}", lambda _m, s=inner: s, p, flags=re.IGNORECASE)  # type: ignore[misc]
            out.append(_finish(body, line_begin, unbounded))
        return out
    body = re.sub(r"\{L?EPOCH\}", lambda m: _LEPOCH if m.group(0).upper().startswith("{L") else _EPOCH, p,
                  flags=re.IGNORECASE)
    # fail2ban's `**` at either end switches off the word boundary on that side
    begin = end = not unbounded
    if body.startswith("**"):
        body, begin = body[2:], False
    if body.endswith("**"):
        body, end = body[:-2], False
    return [_finish(_strftime_to_regex(body), line_begin, unbounded, begin, end)]


def _finish(body: str, line_begin: bool, unbounded: bool, begin: bool = True, end: bool = True) -> _Template:
    if unbounded:
        begin = end = False
    # fail2ban cuts out the first unnamed group when the pattern has one, else the whole match
    grouped = bool(_UNNAMED_GROUP.search(body))
    anchored = line_begin or body.startswith("^")
    if not grouped:
        lead = ""
        if body.startswith("^"):
            lead, body = "^", body[1:]
        body = f"{lead}(?P<date>{_bounded(body, begin and not line_begin, end)})"
        group: int | str = "date"
    else:
        body = _bounded(body, begin and not line_begin, end)
        group = 1
    if line_begin:
        body = _LINE_BEGIN + body
    try:
        return _Template(re.compile(body), group, anchored)
    except REGEX_ERRORS as exc:
        raise DatePatternError(f"invalid datepattern {body!r}: {exc}") from None


def _default_templates(line_begin_only: bool = False) -> list[_Template]:
    out: list[_Template] = []
    for d in _DEFAULTS:
        if d in ("EPOCH", "TAI64N"):
            ts = _compile_pattern(("{^LN-BEG}" if line_begin_only else "") + d)
        elif d.startswith(("{^LN-BEG}", "^")):
            ts = _compile_pattern(d)
        else:
            ts = _compile_pattern(("{^LN-BEG}" if line_begin_only else "") + d)
        out.extend(ts)
    return out


def _anchored_variant(t: _Template) -> _Template:
    """A search template tried first at line start (fail2ban does the same, with a heavier weight)."""
    return _Template(re.compile(_LINE_BEGIN + t.rx.pattern), t.group, True)


# Exact shortcuts for the two commonest line starts. Each matches only text the default template set would
# match in the same way (the templates before them cannot match such a line; the lookaheads exclude a year,
# a fraction or a zone that the template would have taken too). Tests compare them with the templates.
_MONTH_CAP = {m.capitalize(): i for i, m in enumerate(_MONTHS, 1)}
FAST_SYSLOG = (r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) (?:[ 0][1-9]|[12]\d|3[01]) "
               r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?=$| [^\d\s.])")
FAST_ISO = (r"(?:19|20)\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d"
            r"(?:[.,]\d{1,9})?(?:Z|[+-][01]\d(?::?[0-5]\d)?)?(?=$| (?!UTC|GMT|Z\b)[^+\-\s\d])")
_FAST_SYSLOG_RX = re.compile(FAST_SYSLOG)
_FAST_ISO_RX = re.compile(FAST_ISO)
_ISO_FIELDS = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:[.,](\d+))?(.*)")

_ASCII = [chr(c) for c in range(128)]
_CATEGORY_TEST: dict[str, Callable[[str], bool]] = {
    "CATEGORY_DIGIT": str.isdigit, "CATEGORY_SPACE": str.isspace,
    "CATEGORY_WORD": lambda c: c.isalnum() or c == "_",
}
_sre: Any = importlib.import_module("re._parser")


def _in_ascii(items: Any) -> set[str]:
    """The ASCII characters a character class matches (first-character sets are only used for ASCII)."""
    out: set[str] = set()
    negate = False
    for iop, iav in items:
        iname = str(iop)
        if iname == "NEGATE":
            negate = True
        elif iname == "LITERAL":
            out.add(chr(iav))
        elif iname == "RANGE":
            out.update(c for c in _ASCII if iav[0] <= ord(c) <= iav[1])
        elif iname == "CATEGORY":
            cat = str(iav)
            test = _CATEGORY_TEST.get(cat.replace("_NOT", ""))
            if test is None:
                raise LookupError
            hit = {c for c in _ASCII if test(c)}
            out.update(set(_ASCII) - hit if "_NOT_" in cat else hit)
        else:
            raise LookupError
    return set(_ASCII) - out if negate else out


def _first_chars(pattern: str) -> frozenset[str] | None:
    """The ASCII characters a match of an anchored pattern can begin with; None when that is unknown."""
    try:
        items = list(_sre.parse(pattern))
    except REGEX_ERRORS:
        return None
    chars: set[str] = set()
    try:
        if _seq_first_chars(items, chars):
            return None
    except LookupError:
        return None
    return frozenset(chars)


def _seq_first_chars(seq: list[Any], chars: set[str]) -> bool:
    """Add the first chars of a parsed sequence to `chars`; True if it can match the empty string."""
    return all(_item_first_chars(str(op), av, chars) for op, av in seq)


def _item_first_chars(name: str, av: Any, chars: set[str]) -> bool:
    """Add the first chars of one parsed item to `chars`; True if it can match the empty string.

    LookupError: an item this analysis does not follow (the caller then knows nothing)."""
    if name in ("AT", "ASSERT", "ASSERT_NOT"):
        return True
    if name == "LITERAL":
        chars.add(chr(av))
        return False
    if name == "IN":
        chars.update(_in_ascii(av))
        return False
    if name == "NOT_LITERAL":
        chars.update(c for c in _ASCII if ord(c) != av)
        return False
    if name == "SUBPATTERN":
        if av[1] & re.IGNORECASE:
            raise LookupError
        return _seq_first_chars(list(av[3]), chars)
    if name == "BRANCH":
        empty = False
        for alt in av[1]:  # every alternative, even after an empty one: each adds its first chars
            empty = _seq_first_chars(list(alt), chars) or empty
        return empty
    if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
        empty = _seq_first_chars(list(av[2]), chars)
        return av[0] == 0 or empty
    raise LookupError


class DateParser:
    """Compiled timestamp templates. `find(line, now)` returns a Stamp or None; never raises on input.

    `pattern` is a fail2ban datepattern (several alternatives separated by newlines) or None for the
    default set. `tz` is the zone of timestamps that carry no offset; None means the host's local zone.
    The parser remembers conversions (bounded); a result never depends on what it remembers.
    """

    __slots__ = ("_anchored", "_by_first", "_fast", "_iso", "_memo", "_search", "_syslog", "_year_cache",
                 "tz")

    def __init__(self, pattern: str | Sequence[str] | None = None, *, tz: tzinfo | None = None) -> None:
        self.tz = tz
        templates: list[_Template] = []
        if pattern is None:
            templates = _default_templates()
        else:
            lines = pattern.splitlines() if isinstance(pattern, str) else list(pattern)
            for p in lines:
                templates.extend(_compile_pattern(p))
        anchored = [t for t in templates if t.anchored]
        search = [t for t in templates if not t.anchored]
        # every free-standing template is first tried at line start, where nearly all timestamps are
        self._anchored = tuple(anchored + [_anchored_variant(t) for t in search])
        self._search = tuple(search)
        # Templates that can match a line starting with a given ASCII character, in order: a line then
        # tries the one or two templates it can match instead of all of them.
        firsts = [_first_chars(t.rx.pattern) for t in self._anchored]
        self._by_first: dict[str, tuple[tuple[int, _Template], ...]] = {
            ch: tuple((i, t) for i, (t, f) in enumerate(zip(self._anchored, firsts, strict=True))
                      if f is None or ch in f)
            for ch in _ASCII
        }
        # the shortcuts are exact only where the syslog / ISO template is the first that can match
        self._fast = pattern is None or (isinstance(pattern, str)
                                         and pattern.strip().upper() == "{^LN-BEG}")
        self._memo: dict[tuple[Any, ...], Any] = {}  # template results and hour bases
        # syslog text -> (year, time in that year, time a year earlier)
        self._syslog: dict[str, tuple[int, float | None, float | None]] = {}
        self._iso: dict[str, float | None] = {}
        self._year_cache: tuple[float, int] = (-1.0, 0)

    @property
    def disabled(self) -> bool:
        """True for `{NONE}`: lines are never searched for a time."""
        return not self._anchored and not self._search

    @property
    def fast_shapes(self) -> tuple[str, str] | None:
        """Regex texts (without groups) of the syslog and ISO shortcuts, when this parser may use them."""
        return (FAST_SYSLOG, FAST_ISO) if self._fast else None

    def find(self, line: str, now: float) -> Stamp | None:
        found = self.find_span(line, now)
        return Stamp(*found) if found is not None else None

    def find_span(self, line: str, now: float) -> tuple[float, int, int] | None:
        """(time, start, end) of the line's timestamp, or None: `find` without the object, for hot loops."""
        if self._fast and line:
            for rx, kind in ((_FAST_SYSLOG_RX, 0), (_FAST_ISO_RX, 1)):
                m = rx.match(line)
                if m is not None:
                    when = self.stamp(m.group(), None, now) if kind == 0 else self.stamp(None, m.group(), now)
                    if when is not None:
                        return when, 0, m.end()
        m = None
        group: int | str = 0
        idx = 0
        cands = self._by_first.get(line[:1]) if line[:1] < "\x80" else None
        for i, t in cands if cands is not None else enumerate(self._anchored):
            m = t.rx.match(line)
            if m is not None:
                idx, group = i, t.group
                break
        else:
            best: tuple[int, int, re.Match[str], int | str] | None = None
            for i, t in enumerate(self._search):
                mm = t.rx.search(line)
                if mm is not None and (best is None or mm.start() < best[0]):
                    best = (mm.start(), -1 - i, mm, t.group)
            if best is None:
                return None
            _, idx, m, group = best
        if m is None:
            return None
        when = self._template_time(idx, m, now)
        if when is None:
            return None
        return when, m.start(group), m.end(group)

    def stamp(self, syslog: str | None, iso: str | None, now: float) -> float | None:
        """The time of a text the `fast_shapes` regexes matched (give one of the two). Remembers
        (year, time, time a year earlier) per text: the usual line costs two lookups and a comparison."""
        if syslog is None:
            if iso in self._iso:
                return self._iso[iso]
            f = _ISO_FIELDS.match(iso or "")
            when = None
            if f is not None:
                fields = {"Y": f.group(1), "m": f.group(2), "d": f.group(3), "H": f.group(4), "M": f.group(5),
                          "S": f.group(6), "f": f.group(7), "z": f.group(8) or None}
                try:
                    when = self._at(fields, int(f.group(1)))
                except (ValueError, OverflowError, KeyError):
                    when = None
            _remember(self._iso, iso or "", when)
            return when
        bucket, year = self._year_cache
        if bucket != now // 900:
            year = self._year(now)
        hit = self._syslog.get(syslog)
        if hit is None or hit[0] != year:
            # fixed layout "Mmm dd HH:MM:SS": slices, no regex
            month, day = _MONTH_CAP[syslog[:3]], int(syslog[4:6])
            hour, minute, second = int(syslog[7:9]), int(syslog[10:12]), int(syslog[13:15])
            hit = (year, self._local_epoch(year, month, day, hour, minute, second, 0),
                   self._local_epoch(year - 1, month, day, hour, minute, second, 0))
            _remember(self._syslog, syslog, hit)
        this = hit[1]
        # A log without a year is from the last twelve months: a date more than a day ahead of `now`
        # belongs to the previous year (the day absorbs zone and clock differences).
        return hit[2] if this is None or this > now + 86400.0 else this

    # -- conversion ------------------------------------------------------------------------------------

    def _template_time(self, idx: int, m: re.Match[str], now: float) -> float | None:
        key = ("t", idx, m.group(0))
        hit = self._memo.get(key)
        if hit is None or (hit[0] and hit[1] != self._year(now)):
            try:
                hit = self._convert(m.groupdict(), now)
            except (ValueError, OverflowError, KeyError, IndexError):
                hit = (False, 0, None, None)
            if hit[0] is not None:  # a time of day alone depends on the day of `now`: not remembered
                _remember(self._memo, key, hit)
        yearless, _year, this, prev = hit
        if yearless and (this is None or this > now + 86400.0):
            return prev
        return this

    def _convert(self, g: dict[str, str | None],
                 now: float) -> tuple[bool | None, int, float | None, float | None]:
        """(yearless, year used, time, time a year earlier); yearless None: not to be remembered."""
        if g.get("epoch") is not None:
            return False, 0, float(g["epoch"] or 0), None
        if g.get("lepoch") is not None:
            v = g["lepoch"] or ""
            if len(v) >= 16 and "." not in v:
                return False, 0, float(v) / 1_000_000, None
            return False, 0, (float(v) / 1000 if len(v.split(".")[0]) >= 13 else float(v)), None
        if g.get("tai") is not None:
            tai = g["tai"] or ""
            # TAI64N label: 2^62 + seconds; TAI is ahead of UTC by 10 s at the epoch (leap seconds ignored)
            return False, 0, float(int(tai[:16], 16) - (1 << 62) - 10) + int(tai[16:], 16) / 1e9, None
        if not (g.get("m") or g.get("b") or g.get("j")):
            local_now = _local(now, self.tz)
            g = {**g, "Y": str(local_now.year), "m": str(local_now.month), "d": str(local_now.day)}
            when = self._at(g, local_now.year)
            return None, 0, (when - 86400.0 if when is not None and when > now else when), None
        if g.get("Y") or g.get("y"):
            year = int(g["Y"] or 0) if g.get("Y") else 2000 + int(g.get("y") or 0)
            return False, year, self._at(g, year), None
        year = self._year(now)
        return True, year, self._at(g, year), self._at(g, year - 1)

    def _at(self, g: dict[str, str | None], year: int) -> float | None:
        """Epoch of the fields in `g` in `year` (None for a date that does not exist)."""
        if g.get("m"):
            month = int(g["m"] or 0)
            day = int((g.get("d") or "1").strip())
        elif g.get("b"):
            month = _MONTH_NUM[(g["b"] or "").lower()]
            day = int((g.get("d") or "1").strip())
        else:
            d0 = datetime(year, 1, 1) + timedelta(days=int(g.get("j") or 1) - 1)
            month, day = d0.month, d0.day
        hour = int(g["H"] or 0) if g.get("H") else 0
        if g.get("I"):
            hour = int(g["I"] or 0) % 12 + (12 if (g.get("p") or "").upper() == "PM" else 0)
        minute = int(g["M"] or 0) if g.get("M") else 0
        second = min(int(g["S"] or 0) if g.get("S") else 0, 59)  # a leap second counts as the one before
        frac = g.get("f")
        micro = int((frac + "000000")[:6]) if frac else 0
        offset = _zone_offset(g)
        if offset is None:
            return self._local_epoch(year, month, day, hour, minute, second, micro)
        try:
            datetime(year, month, day, hour, minute, second)
        except ValueError:
            return None
        return calendar.timegm((year, month, day, hour, minute, second)) - offset * 60 + micro / 1e6

    def _local_epoch(self, year: int, month: int, day: int, hour: int, minute: int, second: int,
                     micro: int) -> float | None:
        """Epoch of a wall-clock time in the parser's zone; None if there is no such date. The epoch of
        each hour's start is remembered; an hour in which the zone's offset changes (DST) is converted
        on its own instead."""
        base = self.hour_base(year, month, day, hour)
        if base is False:
            return None
        if base is True:
            return _epoch(datetime(year, month, day, hour, minute, second, micro), self.tz)
        return float(base) + minute * 60 + second + micro / 1e6

    def hour_base(self, year: int, month: int, day: int, hour: int) -> float | bool:
        """Epoch of the start of a wall-clock hour in the parser's zone (remembered); True when the zone's
        offset changes within that hour (convert each time on its own), False when there is no such date.
        The native scanning core converts timestamps with it: base + minutes * 60 + seconds."""
        key = ("h", year, month, day, hour)
        base = self._memo.get(key)
        if base is None:
            try:
                start = _epoch(datetime(year, month, day, hour), self.tz)
                end = _epoch(datetime(year, month, day, hour, 59, 59), self.tz)
                base = start if end - start == 3599.0 else True
            except (ValueError, OverflowError):
                base = False  # 30 February: remembered as impossible
            _remember(self._memo, key, base)
        return base

    def year_of(self, now: float) -> int:
        """The local year at `now`: a syslog timestamp without a year is taken in it (or the one before)."""
        return self._year(now)

    def _year(self, now: float) -> int:
        # zone offsets are whole quarter hours, so the local year is constant within a quarter hour
        bucket = now // 900
        if self._year_cache[0] != bucket:
            self._year_cache = (bucket, _local(now, self.tz).year)
        return self._year_cache[1]


def _remember(memo: dict[Any, Any], key: Any, value: Any) -> None:
    """Bounded memo: cleared when full (the entries are cheap to recompute)."""
    if len(memo) >= _MEMO_MAX:
        memo.clear()
    memo[key] = value


def _zone_offset(g: dict[str, str | None]) -> int | None:
    """Offset in minutes east of UTC from the %z / %Z fields, or None when the text names no zone."""
    z = g.get("z")
    if z:
        if z in ("Z", "UTC", "GMT"):
            return 0
        m = re.fullmatch(r"([A-Z]{1,5})?([+-])([01]\d)(?::?([0-5]\d))?", z)
        if m is None:
            return _ZONE_ABBR[z]
        base = _ZONE_ABBR[m.group(1)] if m.group(1) else 0
        minutes = int(m.group(3)) * 60 + int(m.group(4) or 0)
        return base + (minutes if m.group(2) == "+" else -minutes)
    zn = g.get("Z")
    if zn:
        return _ZONE_ABBR[zn.upper()]
    return None


def _local(now: float, tz: tzinfo | None) -> datetime:
    return datetime.fromtimestamp(now, tz) if tz is not None else datetime.fromtimestamp(now)


def _epoch(dt: datetime, tz: tzinfo | None) -> float:
    if tz is not None:
        return dt.replace(tzinfo=tz).timestamp()
    return dt.timestamp()  # naive: the host's local zone, as syslog writes it


def parse_timestamp(text: str, now: float, *, tz: tzinfo | None = None) -> float | None:
    """Epoch seconds of the first timestamp in `text` (default templates), or None.

    Convenience for one-off use; the matcher keeps a DateParser, which is faster for many lines.
    """
    try:
        stamp = DateParser(tz=tz).find(text, now)
    except (ValueError, OverflowError):
        return None
    return stamp.time if stamp else None
