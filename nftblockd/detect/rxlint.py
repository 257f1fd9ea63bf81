"""Static analysis of a regex (Python's `re` syntax), for filters written by others:

- `lint_regex`: shapes that backtrack super-linearly (nested or overlapping unbounded repeats, unanchored
  scans), which a hostile log line could use to stall the daemon; the matcher runs such a regex on RE2.
- `required_literal`: a literal every match must contain (the matcher's prefilter gate).
- `matches_newline`: whether a regex can span lines (fail2ban's multi-line regexes, unsupported).
- `literal_heads`: the literal texts a match can start with (the matcher's dispatch on a message's start).

Works on `re`'s own parse tree; pure, no IO.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["REGEX_ERRORS", "exponential_risk", "lint_regex", "literal_heads", "matches_newline", "required_literal"]

# What compiling or parsing a regex can raise besides re.error: a repeat count over re's limit (OverflowError),
# groups nested too deep for the parser (RecursionError). Each is the regex's fault, reported with its line.
REGEX_ERRORS: tuple[type[Exception], ...] = (re.error, OverflowError, RecursionError)

_sre: Any = importlib.import_module("re._parser")
_C: Any = importlib.import_module("re._constants")
# Character sets as bit masks: bits 0-127 are ASCII; non-ASCII characters fall in four buckets (digits,
# spaces, other word characters, the rest), enough to tell \d, \s, \w and their negations apart.
_NA_DIGIT, _NA_SPACE, _NA_WORD, _NA_OTHER = 1 << 128, 1 << 129, 1 << 130, 1 << 131
_NONASCII = _NA_DIGIT | _NA_SPACE | _NA_WORD | _NA_OTHER
_ALL = (1 << 132) - 1
_BIG_REPEAT = 64  # a bounded repeat this long counts as unbounded for the lint


def _bit(c: int) -> int:
    if c < 128:
        return 1 << c
    ch = chr(c)
    return _NA_DIGIT if ch.isdigit() else _NA_SPACE if ch.isspace() else \
        _NA_WORD if ch.isalnum() or ch == "_" else _NA_OTHER


def _class_bits(ch: Callable[[int], bool], nonascii: int) -> int:
    bits = nonascii
    for c in range(128):
        if ch(c):
            bits |= 1 << c
    return bits


_DIGIT = _class_bits(lambda c: chr(c).isdigit(), _NA_DIGIT)
_SPACE = _class_bits(lambda c: chr(c).isspace(), _NA_SPACE)
_WORD = _class_bits(lambda c: chr(c).isalnum() or c == 95, _NA_DIGIT | _NA_WORD)
_CATEGORIES = {
    "CATEGORY_DIGIT": _DIGIT, "CATEGORY_NOT_DIGIT": _ALL & ~_DIGIT,
    "CATEGORY_SPACE": _SPACE, "CATEGORY_NOT_SPACE": _ALL & ~_SPACE,
    "CATEGORY_WORD": _WORD, "CATEGORY_NOT_WORD": _ALL & ~_WORD,
}


@dataclass(slots=True)
class _Info:
    chars: int = 0  # characters the node can consume
    first: int = 0  # characters a non-empty match can start with
    nullable: bool = True
    unbounded: bool = False  # holds an unbounded repeat
    tail: int = 0  # characters by which a match could still be extended at its end (a trailing repeat)
    risk: str | None = None
    rep: int = 0  # characters its unbounded repeats can take


def _casefold_bits(bits: int) -> int:
    out = bits
    for c in range(65, 91):
        if bits & (1 << c) or bits & (1 << (c + 32)):
            out |= (1 << c) | (1 << (c + 32))
    return out


def _in_bits(items: Any, icase: bool) -> int:
    bits, negate = 0, False
    for op, av in items:
        name = str(op)
        if name == "NEGATE":
            negate = True
        elif name == "LITERAL":
            bits |= _bit(av)
        elif name == "RANGE":
            lo, hi = av
            for c in range(lo, min(hi, 127) + 1):
                bits |= 1 << c
            if hi >= 128:
                bits |= _NONASCII  # a non-ASCII range: assume it may hold any kind
        elif name == "CATEGORY":
            bits |= _CATEGORIES.get(str(av), _ALL)
        else:
            bits |= _ALL
    if icase:
        bits = _casefold_bits(bits)
    return _ALL & ~bits if negate else bits


def _seq_info(items: Any, icase: bool) -> _Info:
    infos = [_node_info(op, av, icase) for op, av in items]
    out = _Info()
    for info in infos:
        if out.risk is None and info.risk:
            out.risk = info.risk
        if out.nullable:
            out.first |= info.first
        out.chars |= info.chars
        out.tail = (out.tail | info.tail) if info.nullable else info.tail
        out.nullable = out.nullable and info.nullable
        out.unbounded = out.unbounded or info.unbounded
        out.rep |= info.rep
    if out.risk is None:
        out.risk = _overlap_risk(infos)
    return out


def _overlap_risk(infos: list[_Info]) -> str | None:
    """A repeat followed by another that can take over its characters: O(n^2) backtracking on failure.

    Walks from each item that ends in a repeat over what follows, as far as that repeat could reach.
    """
    for i, a in enumerate(infos):
        reach = a.tail
        if not reach:
            continue
        gap = 0
        for b in infos[i + 1:]:
            if b.unbounded and b.first & reach and (gap & reach) & ~b.rep == 0:
                return "two repeats in a row can match the same text (quadratic backtracking)"
            if not b.nullable and not b.chars & reach:
                break  # the repeat cannot run past this item
            if not b.nullable and b.unbounded:
                break  # b takes over from here; its own tail is checked when the walk starts at b
            gap |= b.chars
    return None


def _node_info(op: Any, av: Any, icase: bool) -> _Info:
    name = str(op)
    if name == "LITERAL":
        b = _casefold_bits(_bit(av)) if icase else _bit(av)
        return _Info(b, b, False)
    if name == "NOT_LITERAL":
        b = _ALL & ~_bit(av) if av < 128 else _ALL
        return _Info(b, b, False)
    if name == "ANY":
        b = _ALL & ~(1 << 10)
        return _Info(b, b, False)
    if name == "IN":
        b = _in_bits(av, icase)
        return _Info(b, b, False)
    if name in ("AT", "ASSERT", "ASSERT_NOT"):
        return _Info()
    if name == "SUBPATTERN":
        _gid, add_flags, _del, sub = av
        return _seq_info(sub, icase or bool(add_flags & _C.SRE_FLAG_IGNORECASE))
    if name == "ATOMIC_GROUP":
        info = _seq_info(av, icase)
        info.tail = 0  # an atomic group never gives characters back
        return info
    if name == "BRANCH":
        out = _Info(nullable=False)
        for alt in av[1]:
            info = _seq_info(alt, icase)
            out.chars |= info.chars
            out.first |= info.first
            out.tail |= info.tail
            out.nullable = out.nullable or info.nullable
            out.unbounded = out.unbounded or info.unbounded
            out.risk = out.risk or info.risk
            out.rep |= info.rep
        return out
    if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
        lo, hi, sub = av
        body = _seq_info(sub, icase)
        unbounded = hi == _C.MAXREPEAT or hi >= _BIG_REPEAT
        # more rounds extend the match by the body's own trailing repeat or by a new round's first char
        tail = (body.tail | body.first) if unbounded else body.tail
        if name == "POSSESSIVE_REPEAT":
            tail = 0
        info = _Info(body.chars, body.first, lo == 0 or body.nullable, unbounded or body.unbounded, tail,
                     body.risk, (body.chars | body.rep) if unbounded else body.rep)
        if info.risk is None and unbounded and name != "POSSESSIVE_REPEAT":
            info.risk = _nested_risk(sub, body, icase)
        return info
    if name == "GROUPREF_EXISTS":
        _gid, yes, no = av
        ya = _seq_info(yes, icase)
        na = _seq_info(no, icase) if no is not None else _Info()
        return _Info(ya.chars | na.chars, ya.first | na.first, ya.nullable or na.nullable,
                     ya.unbounded or na.unbounded, ya.tail | na.tail, ya.risk or na.risk, ya.rep | na.rep)
    # back-references and anything unknown: assume the worst about what they consume
    return _Info(_ALL, _ALL, True, True, _ALL, None, _ALL)


def _nested_risk(sub: Any, body: _Info, icase: bool) -> str | None:
    """An unbounded repeat of a body that can split the same text two ways: exponential backtracking."""
    if body.unbounded and body.tail & body.first:
        return "a repeated group ends in a repeat that can also start the next round (exponential)"
    items = list(sub)
    if len(items) == 1 and str(items[0][0]) == "BRANCH":
        seen = 0
        for alt in items[0][1][1]:
            f = _seq_info(alt, icase).first
            if f & seen:
                return "a repeated alternation whose branches can start alike (exponential)"
            seen |= f
    return None


def _is_catch_all(op: Any, av: Any) -> bool:
    if str(op) not in ("MAX_REPEAT", "MIN_REPEAT") or av[1] != _C.MAXREPEAT:
        return False
    body = list(av[2])
    return len(body) == 1 and str(body[0][0]) == "ANY"


def _drop_trailing_catch_all(items: list[Any]) -> list[Any]:
    """A final `.*` (also inside a final optional group) cannot fail, so it cannot cause backtracking."""
    # a greedy `.*` followed by nothing that must match: it takes the rest of the line and succeeds
    j = len(items)
    while j > 0:
        op, av = items[j - 1]
        if _is_catch_all(op, av) and str(op) == "MAX_REPEAT":
            return items[:j - 1]
        if not _node_info(op, av, False).nullable:
            break
        j -= 1
    while items and str(items[-1][0]) == "AT":
        items = items[:-1]
    if not items:
        return items
    op, av = items[-1]
    if str(op) == "SUBPATTERN":
        gid, add, dele, sub = av
        return [*items[:-1], (op, (gid, add, dele, _drop_trailing_catch_all(list(sub))))]
    if str(op) in ("MAX_REPEAT", "MIN_REPEAT") and av[1] == 1:
        return [*items[:-1], (op, (av[0], 1, _drop_trailing_catch_all(list(av[2]))))]
    return items


def lint_regex(pattern: str) -> str | None:
    """Why `pattern` may backtrack super-linearly on Python's `re`, or None if it cannot.

    Conservative: a flagged pattern may be fine, an unflagged one is linear up to a constant (the shapes
    that make a backtracking engine quadratic or exponential are all caught by these rules).
    """
    try:
        parsed = _sre.parse(pattern)
    except REGEX_ERRORS as exc:
        return f"not a valid regex: {exc}"
    icase = bool(parsed.state.flags & _C.SRE_FLAG_IGNORECASE)
    items = _drop_trailing_catch_all(list(parsed))
    info = _seq_info(items, icase)
    if info.risk:
        return info.risk
    anchored = bool(items) and str(items[0][0]) == "AT" and str(items[0][1]) in ("AT_BEGINNING",
                                                                                  "AT_BEGINNING_STRING")
    if not anchored and info.unbounded:
        return "not anchored with ^ and holds an unbounded repeat (search retries it at every position)"
    return None


def exponential_risk(pattern: str) -> str | None:
    """Why `pattern` backtracks exponentially (`^(a+)+$`: an unbounded repeat of a body that can split the
    same text two ways), or None. Narrower than `lint_regex`, which also names quadratic and unanchored
    shapes that RE2 or the line cap make harmless: this is the shape an operator is warned about, since on
    `re` one line of 30 characters can take minutes. The shipped filters and fail2ban's stock ones have none."""
    try:
        parsed = _sre.parse(pattern)
    except REGEX_ERRORS:
        return None  # compiling reports it
    icase = bool(parsed.state.flags & _C.SRE_FLAG_IGNORECASE)
    for op, av in _sre_walk(parsed):
        if str(op) not in ("MAX_REPEAT", "MIN_REPEAT") or not (av[1] == _C.MAXREPEAT or av[1] >= _BIG_REPEAT):
            continue
        sub = av[2]
        body = _seq_info(sub, icase)
        # Sure cases only: the body's trailing repeat can take every character a round must hold, so a run
        # splits into rounds in exponentially many ways (`(a+)+`, `(\w+\s?)+`). A round with a character its
        # tail cannot take (sendmail-reject's `(?:, arg\d+=\S*)*`: the space) splits one way only; a
        # lookaround in the body is left to lint_regex and RE2.
        inner = list(sub)
        while len(inner) == 1 and str(inner[0][0]) == "SUBPATTERN":
            inner = list(inner[0][1][3])
        must = 0
        for sop, sav in inner:
            item = _node_info(sop, sav, icase)
            must |= 0 if item.nullable else item.chars
        if must & ~body.tail == 0 and not _has_lookaround(sub):
            risk = _nested_risk(sub, body, icase)
            if risk is not None:
                return risk
    return None


def _has_lookaround(items: Any) -> bool:
    return any(str(op) in ("ASSERT", "ASSERT_NOT") for op, _av in _sre_walk(items))


def _sre_walk(items: Any) -> list[tuple[Any, Any]]:
    """Every node of a parse tree, depth first."""
    out: list[tuple[Any, Any]] = []
    stack = [list(items)]
    while stack:
        for op, av in stack.pop():
            out.append((op, av))
            name = str(op)
            if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                stack.append(list(av[2]))
            elif name == "SUBPATTERN":
                stack.append(list(av[3]))
            elif name == "ATOMIC_GROUP":
                stack.append(list(av))
            elif name in ("ASSERT", "ASSERT_NOT"):
                stack.append(list(av[1]))
            elif name == "BRANCH":
                stack += [list(alt) for alt in av[1]]
            elif name == "GROUPREF_EXISTS":
                stack += [list(x) for x in av[1:] if x is not None]
    return out


def _literal_runs(items: Any, icase: bool, runs: list[str], cur: list[str]) -> None:
    """Collect runs of characters every match must contain, in order (approximate, never wrong)."""
    for op, av in items:
        name = str(op)
        if name == "LITERAL" and not icase:
            cur.append(chr(av))
            continue
        if name == "AT":
            continue
        if name == "SUBPATTERN" and not (av[1] & _C.SRE_FLAG_IGNORECASE) and not icase:
            _literal_runs(av[3], icase, runs, cur)
            continue
        if name == "IN" and not icase and len(av) == 1 and str(av[0][0]) == "LITERAL":
            cur.append(chr(av[0][1]))
            continue
        if cur:
            runs.append("".join(cur))
            cur.clear()
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") and av[0] >= 1:
            _literal_runs(av[2], icase, runs, [])
    if cur:
        runs.append("".join(cur))
        cur.clear()


_DATE_HOLE = re.compile(r'\[\]|\(\)|""|<>|\{\}')


def matches_newline(pattern: str) -> bool:
    """True if the regex spells a line break: it was written for fail2ban's multi-line buffer."""
    try:
        parsed = _sre.parse(pattern)
    except REGEX_ERRORS:
        return False

    def walk(items: Any) -> bool:
        for op, av in items:
            name = str(op)
            if name == "LITERAL" and av == 10:
                return True
            if name == "SUBPATTERN" and walk(av[3]):
                return True
            if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") and walk(av[2]):
                return True
            if name == "BRANCH" and any(walk(alt) for alt in av[1]):
                return True
        return False

    return walk(list(parsed))


def required_literal(pattern: str, min_len: int = 3) -> str | None:
    """The longest literal text every match of `pattern` contains, or None if there is none that long."""
    try:
        parsed = _sre.parse(pattern)
    except REGEX_ERRORS:
        return None
    icase = bool(parsed.state.flags & _C.SRE_FLAG_IGNORECASE)
    runs: list[str] = []
    _literal_runs(list(parsed), icase, runs, [])
    # An empty pair such as `[]` is where fail2ban-style regexes expect a cut-out timestamp: text across
    # it is not in the raw line, which is what the prefilter looks at.
    runs = [part for run in runs for part in _DATE_HOLE.split(run)]
    best = max(runs, key=len, default="")
    return best if len(best) >= min_len else None


def literal_heads(pattern: str, limit: int = 32) -> frozenset[str] | None:
    """The literal texts a match of an anchored `pattern` can start with (`^[iI]nvalid` -> Invalid,
    invalid), or None when some match may start with a non-literal."""
    try:
        parsed = _sre.parse(pattern)
    except REGEX_ERRORS:
        return None
    if parsed.state.flags & _C.SRE_FLAG_IGNORECASE:
        return None
    items = list(parsed)
    if not items or str(items[0][0]) != "AT":
        return None

    heads, _ = _extend_heads(items[1:], {""}, limit)
    return frozenset(heads) if heads and all(heads) else None


def _extend_heads(seq: list[Any], starts: set[str], limit: int) -> tuple[set[str], bool]:
    """Extend `starts` through `seq`; the flag says whether all of seq was literal."""
    for op, av in seq:
        name = str(op)
        if name == "AT":
            continue
        if name == "LITERAL":
            starts = {s + chr(av) for s in starts}
            continue
        if name == "IN" and all(str(o) == "LITERAL" for o, _ in av) and len(av) <= 4:
            starts = {s + chr(c) for s in starts for _, c in av}
            if len(starts) > limit:
                return starts, False
            continue
        if name == "SUBPATTERN" and not av[1] & _C.SRE_FLAG_IGNORECASE:
            starts, whole = _extend_heads(list(av[3]), starts, limit)
            if not whole:
                return starts, False
            continue
        if name == "BRANCH":
            starts, whole = _branch_heads(av[1], starts, limit)
            if not whole:
                return starts, False
            continue
        return starts, False
    return starts, True


def _branch_heads(alts: list[Any], starts: set[str], limit: int) -> tuple[set[str], bool]:
    """Each alternative extends its own copy of `starts`; past `limit` heads, `starts` stay as they were."""
    out: set[str] = set()
    whole = True
    for alt in alts:
        sub, w = _extend_heads(list(alt), set(starts), limit)
        out |= sub
        whole = whole and w
    if len(out) > limit:
        return starts, False
    return out, whole

