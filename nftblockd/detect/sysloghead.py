"""The built-in `<syslog>` header, and when the native core may read it by hand instead of running it.

Every YAML filter's prefix starts `<F-MLFID><syslog></F-MLFID>`: a syslog, journal or RFC 5424 header up to
the message, naming the program through the filter's `daemon` var. On a busy sshd log the prefix regex is a
fifth of a line's cost with PCRE2's JIT and a third interpreted (docs/matcher-speed.md), for a header that is
nearly always `" HOST DAEMON[PID]: "`.

`syslog_head` says, from the prefix's text after its vars are expanded, whether it is that fragment with a
daemon var that names a finite set of plain program names (`sshd(?:-session|-auth)?`), and what follows
it (the tail, matched after the header). The native core then reads a header of exactly that shape itself
(`syslog_head_end` in _scan.c) and runs only the tail, and falls back to the whole regex on any other header.
Why the hand reading gives the regex's own first match, step by step, is written beside it in _scan.c; the
tests hold the two equal on generated headers, hostile ones included.

Pure text work, no IO.
"""

from __future__ import annotations

__all__ = ["MAX_TEXTS", "SYSLOG", "daemon_names", "literal_texts", "syslog_head"]

# The fragment, after the timestamp has been cut out; `<daemon>` is the filter's daemon var.
SYSLOG = (
    r"\s*(?:<\d{1,3}>\d{1,2}\s+)?(?:<[^.>\s]+\.[^.>\s]+>\s+)?(?:\[\]\s*)?(?:[\w.\-@:]+\s+)?"
    r"(?:kernel:\s?\[ *\d+\.\d+\]:?\s+)?(?:@vserver_\S+\s+)?"
    r"[\[(]?(?:<daemon>)(?:\(\S+\))?[\])]?(?:\[\d+\])?:?(?:\s+kernel:\s?\[ *\d+\.\d+\]:?)?"
    r"(?: \d+ \S+ (?:-|\[[^\]\"]*(?:\"[^\"]*\"[^\]\"]*)*\](?:\[[^\]\"]*(?:\"[^\"]*\"[^\]\"]*)*\])*))?"
    r"\s+(?:\[ID \d+ \S+\]\s+)?"
)
_BEFORE, _AFTER = SYSLOG.split("<daemon>")
_OPEN, _CLOSE = "<F-MLFID>", "</F-MLFID>"

MAX_TEXTS = 32  # a regex naming more texts than this is left to the regex engine (C compares them in turn)
# What a program name may hold for the hand reading to be the regex's: none of the characters that can end
# the daemon part of the header (`(`, `[`, `]`, `)`, `:`, white space), nor `@` or `<`.
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_META = frozenset("\\.^$*+?{}[]()|<>")  # and <...>: a tag (<HOST>, <F-USER>) the filter expands later


class _NotPlain(Exception):
    pass


def literal_texts(regex: str) -> tuple[str, ...] | None:
    """Every text `regex` matches, in the order a backtracking engine tries them, when it is made of plain
    characters, escaped punctuation, `(?:a|b)` groups and greedy `?` only and names at most MAX_TEXTS texts;
    None for anything else (`\\S+` among them). Where nothing follows the regex, the first of these texts the
    subject starts with is the engine's match there."""
    try:
        texts, end = _alternation(regex, 0)
    except _NotPlain:
        return None
    if end != len(regex):
        return None  # an unbalanced `)`
    return tuple(dict.fromkeys(texts))


def daemon_names(regex: str) -> tuple[str, ...] | None:
    """The program names a daemon var names (sorted, the empty text left out), when it is literal_texts'
    kind and every name is plain name characters; None otherwise."""
    texts = literal_texts(regex)
    if texts is None:
        return None
    names = tuple(sorted(t for t in texts if t))
    if not names or not all(set(n) <= _NAME_CHARS for n in names):
        return None
    return names


def _alternation(s: str, i: int) -> tuple[list[str], int]:
    texts, i = _sequence(s, i)
    while i < len(s) and s[i] == "|":
        more, i = _sequence(s, i + 1)
        texts += more
    return texts, i


def _sequence(s: str, i: int) -> tuple[list[str], int]:
    out = [""]
    while i < len(s) and s[i] not in "|)":
        if s.startswith("(?:", i):
            item, i = _alternation(s, i + 3)
            if i >= len(s) or s[i] != ")":
                raise _NotPlain
            i += 1
        elif s[i] == "\\":
            if i + 1 >= len(s) or s[i + 1].isalnum() or s[i + 1].isspace() or not s[i + 1].isascii():
                raise _NotPlain  # \d, \s, \1, \x41 ...: not one plain character
            item, i = [s[i + 1]], i + 2
        elif s[i] not in _META and s[i].isascii() and s[i].isprintable():
            item, i = [s[i]], i + 1
        else:
            raise _NotPlain
        if i < len(s) and s[i] == "?":
            if s.startswith(("??", "?+"), i):
                raise _NotPlain
            item = [*item, ""]
            i += 1
        if i < len(s) and s[i] in "*+{":
            raise _NotPlain
        out = [a + b for a in out for b in item]
        if len(out) > MAX_TEXTS:
            raise _NotPlain
    return out, i


def syslog_head(prefix: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(the daemon names, the texts the tail matches in priority order) when `prefix` (vars expanded) is
    `<F-MLFID><syslog></F-MLFID>` followed by a tail of literal_texts' kind (or nothing); None otherwise. The
    check is on the text itself, so whatever vars produced it, a prefix it accepts is that very regex."""
    start = _OPEN + _BEFORE
    if not prefix.startswith(start):
        return None
    rest = prefix[len(start):]
    end = rest.find(_AFTER + _CLOSE)
    if end < 0:
        return None
    names = daemon_names(rest[:end])
    tails = literal_texts(rest[end + len(_AFTER) + len(_CLOSE):])
    if names is None or tails is None:
        return None
    return names, tails
