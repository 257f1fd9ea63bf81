"""The matcher's native scanning core: builds a `_scan.Scanner` (C, PCRE2 with its JIT) for a compiled
`Filter`, and translates Python `re` syntax into PCRE2 syntax of the same meaning.

Pure: no IO, no clock. It never changes what a filter matches: the Scanner does per line what
`Filter._scan_py` does and hands every line it cannot take exactly back to it (see _scan.c), and a regex
this module cannot translate with certainty stays on `re`. Without the extension (not built, or a PCRE2
library it cannot load) every filter runs on the Python path; `Filter.scanner` says which engine runs.

Why a C extension against libpcre2-8, measured on this project's 2-core VM (bench_matcher, a server under
brute force): `re` plus per-line Python costs ~5.5 us a line, the regex calls alone 5-9 us on a relevant
sshd line. PCRE2's JIT runs the same patterns in a fraction of that, but only a loop in C over the whole
block of lines gets the per-line Python cost out: cffi would still call into C once per line and convert
each string, and Cython would generate the same CPython API calls as the hand-written loop, plus a build
dependency. The extension is built against the stable ABI (one binary for every CPython >= 3.11) and needs
only a C compiler and libpcre2-dev to build.

Equal meaning on ASCII text. The Scanner only runs ASCII lines without CR/LF (everything else goes to the
Python path), and PCRE2 runs without UCP, so `\\d`, `\\w`, `\\b` and case folding are ASCII on both sides.
What still differs on ASCII, and how `to_pcre2` handles it:
- `\\s`: Python's also matches \\x1c-\\x1f (str.isspace): `\\s` becomes `[\\s\\x1c-\\x1f]` (in a class:
  `\\s\\x1c-\\x1f`), `\\S` becomes `[^\\s\\x1c-\\x1f]`; `\\S` inside a class cannot be written so: refused.
- `\\v` is one character (\\x0b) to Python, a class of vertical space to PCRE2: written `\\x0b`.
- `\\Z` is "end of text" to Python, "end or before a final newline" to PCRE2: written `\\z`.
- `x{,n}` is a repeat to Python 3.11, literal text to PCRE2 10.42: written `x{0,n}`.
- `[[:alpha:]]` is a POSIX class to PCRE2, a set with "[" to Python: refused, as are `\\u`, `\\U`, `\\N{}`,
  the flags `a`, `L`, `u` and verbose patterns (`x`), which this translator does not read.
Anything PCRE2 itself refuses, or numbers differently (the group table is compared), stays on `re`. The
differential tests (tests/unit/test_native.py) run both paths over fail2ban's sample logs, generated logs
and hypothesis-made hostile lines and require identical results.
"""

from __future__ import annotations

import importlib
import ipaddress
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from nftblockd.detect.rxlint import REGEX_ERRORS
from nftblockd.detect.timestamps import FAST_SYSLOG, DateParser

__all__ = ["Built", "Hooks", "Parts", "Rule", "Untranslatable", "available", "build", "compile_pcre2", "describe",
           "split_rule", "to_pcre2"]

_scan: Any = None
_why_not = ""
# NFTBLOCK_NATIVE=0 in the environment: the operator's way out if the native core ever misbehaves, and the
# benchmarks' way to measure the Python path in a daemon (read once, at import)
if os.environ.get("NFTBLOCK_NATIVE", "1") == "0":
    _why_not = "native core disabled (NFTBLOCK_NATIVE=0)"
else:
    try:
        _scan = importlib.import_module("nftblockd.detect._scan")
    except ModuleNotFoundError as exc:  # not built: the optional build failed when this copy was installed
        if exc.name != "nftblockd.detect._scan":
            raise
        _why_not = ("native core not built (this copy was installed without a C compiler or libpcre2-dev; "
                    "reinstall with both to get it)")
    except ImportError as exc:  # built, but it cannot load here (libpcre2-8 missing, another platform)
        _why_not = f"native core unavailable ({exc})"

# group names whose values the decision reads (matcher._FLAGS and the connection id), in Scanner order
_CORE = ("ip4", "ip6", "dns", "fid", "nofail", "mlfgained", "mlfforget", "mlfid")
_INTERNAL = frozenset({"ip4", "ip6", "dns", "cidr", "content", "mlfid", "nofail", "mlfforget", "mlfgained",
                       "mlfpending"})
_ALT_NAME = re.compile(r"^alt_(.*?)(?:_\d+)?$")


class Untranslatable(ValueError):
    """The pattern uses a construct whose PCRE2 meaning this module cannot guarantee to equal `re`'s."""


def available() -> bool:
    return _scan is not None


def describe() -> str:
    """One line for operators: which engine the filters run on, or why not the native one."""
    if _scan is None:
        return f"pure Python (re): {_why_not}"
    jit = _scan.compile("x").jit
    return f"native core, PCRE2 {_scan.pcre2_version().split()[0]}" + ("" if jit else " (no JIT: interpreted)")



# complexity exempt (C901): a translator over regex syntax: one branch per construct, in one place
def to_pcre2(pattern: str) -> str:  # noqa: C901
    """`pattern` in Python `re` syntax -> the PCRE2 pattern with the same meaning on ASCII text."""
    out: list[str] = []
    i = 0
    n = len(pattern)
    in_class = False
    class_body = 0  # index where the current class's members start (a "]" there is a member)
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                raise Untranslatable("trailing backslash")
            d = pattern[i + 1]
            if d == "s":
                out.append(r"\s\x1c-\x1f" if in_class else r"[\s\x1c-\x1f]")
            elif d == "S":
                if in_class:
                    raise Untranslatable(r"\S inside a character class")
                out.append(r"[^\s\x1c-\x1f]")
            elif d == "v":
                out.append(r"\x0b")
            elif d == "Z" and not in_class:
                out.append(r"\z")
            elif d in "uUN":
                raise Untranslatable(f"\\{d} escapes")
            elif not d.isascii():
                raise Untranslatable("an escaped non-ASCII character")
            else:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            if c == "[" and i + 1 < n and pattern[i + 1] in ":=.":
                raise Untranslatable(f"'[{pattern[i + 1]}' inside a character class (a POSIX class to PCRE2)")
            if c == "]" and i > class_body:
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append(c)
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            class_body = i + 1 if i < n and pattern[i] == "]" else i
            continue
        if c == "{":
            m = re.match(r"\{,(\d+)\}", pattern[i:])
            if m is not None:
                out.append(f"{{0,{m.group(1)}}}")
                i += m.end()
                continue
        if c == "(" and pattern.startswith("(?", i):
            if pattern.startswith("(?#", i):
                j = pattern.find(")", i)
                if j < 0:
                    raise Untranslatable("unterminated comment")
                i = j + 1
                continue
            m = re.match(r"\(\?([a-zA-Z]+)(?:-([a-zA-Z]+))?[:)]", pattern[i:])
            if m is not None and not m.group(1).startswith("P"):
                flags = m.group(1) + (m.group(2) or "")
                bad = set(flags) - set("ims")
                if bad:
                    raise Untranslatable(f"inline flag(s) {''.join(sorted(bad))}")
        out.append(c)
        i += 1
    if in_class:
        raise Untranslatable("unterminated character class")
    return "".join(out)


def compile_pcre2(pattern: str, *, anchored: bool = False, groups: dict[str, int] | None = None,
                  count: int | None = None) -> Any:
    """A `_scan.Regex` for a Python pattern, or Untranslatable. With `groups`/`count` (a `re` pattern's
    groupindex and group count), the PCRE2 numbering must equal it."""
    if _scan is None:
        raise Untranslatable(_why_not)
    try:
        rx = _scan.compile(to_pcre2(pattern), anchored)
    except _scan.error as exc:
        raise Untranslatable(f"PCRE2: {exc}") from None
    if groups is not None and (dict(rx.names) != groups or rx.groups != count):
        raise Untranslatable("PCRE2 numbers its groups differently")
    return rx


_USER_ANY = "(?P<user>.*)"
_LITERAL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-:;,=/'\"<>@#%&!~`")
_QUANT = frozenset("*+?{")


def split_rule(rx: re.Pattern[str]) -> tuple[str, str, str] | None:
    """`rx` as (A, L, B) when it is `^A(?P<user>.*)L B` with L a literal text the Scanner can find by memcmp
    (run_rule in _scan.c says why that gives what the whole regex gives), else None. Refused: a top-level
    `|` (it would cut the pattern elsewhere), back-references and conditionals (B would depend on A's
    groups), inline flags and the IGNORECASE/VERBOSE flags (L is compared byte for byte), unnamed capturing
    groups (the parts' groups are mapped by name), and `.*` anywhere but at the top level."""
    p = rx.pattern
    if rx.flags & (re.IGNORECASE | re.VERBOSE) or not p.startswith("^") or p.count(_USER_ANY) != 1:
        return None
    if "(?P=" in p or "(?(" in p or "(*" in p or re.search(r"\\[1-9GK]|\(\?[a-zA-Z]", p.replace("(?P<", "")):
        return None
    at = p.index(_USER_ANY)
    depth, i, class_at = 0, 0, -1  # class_at: where the open class's members start (-1: not in one)
    while i < len(p):  # the depth at the user group, and no alternation at the top level
        c = p[i]
        if c == "\\":
            i += 2
            continue
        if class_at >= 0:
            if c == "]" and i > class_at:  # (a "]" first in the class is a member)
                class_at = -1
        elif c == "[":
            class_at = i + 2 if p.startswith("[^", i) else i + 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            return None
        if i == at and depth != 1:  # (counted after its own "(")
            return None
        i += 1
    j = at + len(_USER_ANY)
    k = j
    while k < len(p) and p[k] in _LITERAL:
        k += 1
    if k < len(p) and p[k] in _QUANT:
        k -= 1  # that character is repeated, not literal
    lit = p[j:k]
    if not lit:
        return None
    return p[:at], lit, p[k:]


def _split(rx: re.Pattern[str]) -> tuple[Any, bytes, int, tuple[int, ...], Any, tuple[int, ...]] | None:
    """The Scanner's split form of a rule (see split_rule), or None."""
    parts = split_rule(rx)
    if parts is None:
        return None
    a_text, lit, b_text = parts
    try:
        a_re, b_re = re.compile(a_text, rx.flags), re.compile(b_text, rx.flags)
    except REGEX_ERRORS:
        return None
    if a_re.groups != len(a_re.groupindex) or b_re.groups != len(b_re.groupindex):
        return None  # an unnamed capturing group
    whole = dict(rx.groupindex)

    def mapped(part: re.Pattern[str]) -> tuple[int, ...]:
        by_number = {v: k for k, v in part.groupindex.items()}
        return tuple(whole[by_number[g]] for g in range(1, part.groups + 1))

    try:
        a = compile_pcre2(a_text, anchored=True, groups=dict(a_re.groupindex), count=a_re.groups)
        b = compile_pcre2(b_text, anchored=True, groups=dict(b_re.groupindex), count=b_re.groups)
    except Untranslatable:
        return None
    return a, lit.encode("ascii"), whole["user"], mapped(a_re), b, mapped(b_re)


def _ipv4_by_slot() -> type | None:
    """IPv4Address, when `object.__new__` plus its `_ip` slot makes exactly what its constructor makes (the
    Scanner then builds parse_host's common result without a Python call), else None."""
    cls = ipaddress.IPv4Address
    fast = object.__new__(cls)
    try:
        fast._ip = 0xC0000201  # type: ignore[attr-defined]
    except AttributeError:
        return None
    real = cls(0xC0000201)
    same = (getattr(cls, "__slots__", None) == ("_ip", "__weakref__") and fast == real and hash(fast) == hash(real)
            and str(fast) == str(real) and int(fast) == int(real) and fast.packed == real.packed)
    return cls if same else None


IPV4_BY_SLOT = _ipv4_by_slot()


def _ipv6_by_slot() -> type | None:
    """IPv6Address, when `object.__new__` plus its `_ip` and `_scope_id` slots make exactly what its
    constructor makes (the Scanner then builds parse_host's IPv6 results without a Python call), else None."""
    cls = ipaddress.IPv6Address
    value = 0x20010DB8000000000000000000000001
    fast = object.__new__(cls)
    try:
        fast._ip = value  # type: ignore[attr-defined]
        fast._scope_id = None  # type: ignore[attr-defined]
    except AttributeError:
        return None
    real = cls(value)
    same = (getattr(cls, "__slots__", None) == ("_ip", "_scope_id", "__weakref__") and fast == real
            and hash(fast) == hash(real) and str(fast) == str(real) and int(fast) == int(real)
            and fast.packed == real.packed and fast.scope_id is None and fast.ipv4_mapped is None)
    return cls if same else None


IPV6_BY_SLOT = _ipv6_by_slot()


@dataclass(frozen=True, slots=True)
class Hooks:
    """What the Scanner builds results and connection state with (matcher's types and helpers)."""

    match_type: type
    rejected_type: type
    evict: Callable[[Any], None]
    parse_host: Callable[[str], Any]
    host_memo: int
    max_line: int


class Rule(Protocol):
    """What the Scanner reads of one failregex (matcher's compiled rule has these, and more)."""

    @property
    def rx(self) -> re.Pattern[str] | None: ...  # the `re` pattern (None: the rule runs on RE2)
    @property
    def index(self) -> int: ...
    @property
    def engine(self) -> str: ...
    @property
    def limit(self) -> int | None: ...  # characters of the message the rule looks at (None: all)


@dataclass(frozen=True, slots=True)
class Parts:
    """A compiled filter as the Scanner is built from it. matcher.Filter hands these over, so the dependency
    goes one way (matcher -> native) and this module never needs the Filter class."""

    dates: DateParser
    pref_rx: tuple[str, re.Pattern[str] | None, int | None] | None  # ("prefregex"|"prefix", rx or None, limit)
    # the built-in syslog header the prefix starts with: its daemon names, the texts the rest of the prefix
    # matches in priority order (sysloghead.syslog_head); None: the prefix is something else
    pref_head: tuple[tuple[str, ...], tuple[str, ...]] | None
    ignore_rx: tuple[tuple[re.Pattern[str], int | None] | None, ...]  # None: that ignoreregex runs on RE2
    ignore_whole: bool
    rules: Sequence[Rule]
    heads: Mapping[str, Sequence[Rule]]  # the message's first characters -> the rules worth trying
    heads_len: int
    unheaded: Sequence[Rule]
    gate: tuple[str, ...] | None
    hosts: dict[str, Any]  # the filter's memo of parsed host texts (the Scanner adds to it)


@dataclass(frozen=True, slots=True)
class Built:
    scanner: Any  # _scan.Scanner, or None: the filter runs on the Python path
    engine: str  # what test-filter shows
    notes: tuple[str, ...] = ()  # what stays on the Python path, and why


def _of(rx: re.Pattern[str], anchored: bool = False) -> Any:
    return compile_pcre2(rx.pattern, anchored=anchored, groups=dict(rx.groupindex), count=rx.groups)


def _head(head: tuple[tuple[str, ...], tuple[str, ...]] | None, prefix: re.Pattern[str]
          ) -> tuple[tuple[bytes, ...] | None, tuple[bytes, ...] | None]:
    """The Scanner's syslog-header arguments (daemon names, tail texts), or (None, None) unless the
    prefix's only group is the header's F-MLFID."""
    if head is None or dict(prefix.groupindex) != {"mlfid": 1} or prefix.groups != 1:
        return None, None
    return tuple(n.encode("ascii") for n in head[0]), tuple(t.encode("ascii") for t in head[1])


def _fields(names: list[str]) -> list[str]:
    return [n for n in names if n not in _INTERNAL and not n.startswith(("cond_", "alt_", "_"))]



# complexity exempt (C901): one pass mapping a compiled filter onto the native plan
def build(flt: Parts, hooks: Hooks) -> Built:  # noqa: C901
    """A Scanner for the filter `flt` holds the parts of, or the reason it runs on the Python path."""
    if _scan is None:
        return Built(None, f"python (re): {_why_not}")
    # The syslog and ISO forms at the line start are read natively; other lines, and filters whose
    # datepattern has other forms, ask DateParser.find_span for each line that passes the gate.
    shapes = flt.dates.fast_shapes
    ts = None
    if shapes is not None:
        try:
            ts = compile_pcre2(f"(?:({shapes[0]})|({shapes[1]}))", anchored=True)
        except Untranslatable as exc:
            return Built(None, f"python (re): timestamp: {exc}")
    prefix_kind, prefix, prefix_limit, content_group = 0, None, -1, 0
    pre_names: dict[str, int] = {}
    head_names: tuple[bytes, ...] | None = None
    head_tails: tuple[bytes, ...] | None = None
    if flt.pref_rx is not None:
        kind, prx, plimit = flt.pref_rx
        if prx is None:
            return Built(None, f"python (re): its {kind} runs on RE2")
        try:
            prefix = _of(prx, anchored=kind == "prefix")
        except Untranslatable as exc:
            return Built(None, f"python (re): {kind}: {exc}")
        prefix_kind = 1 if kind == "prefix" else 2
        prefix_limit = plimit if plimit is not None else -1
        pre_names = dict(prx.groupindex)
        content_group = pre_names.pop("content", 0) if prefix_kind == 2 else 0
        head_names, head_tails = _head(flt.pref_head, prx) if prefix_kind == 1 else (None, None)
    ignores = []
    for j, ig in enumerate(flt.ignore_rx):
        if ig is None:
            return Built(None, f"python (re): ignoreregex {j} runs on RE2")
        try:
            ignores.append((_of(ig[0]), ig[1] if ig[1] is not None else -1))
        except Untranslatable as exc:
            return Built(None, f"python (re): ignoreregex {j}: {exc}")
    rules = []
    notes: list[str] = []
    native_rules = 0
    for r in flt.rules:
        prx_rule = None
        if r.rx is None:
            notes.append(f"failregex {r.index} runs on {r.engine}: lines that reach it take the Python path")
        else:
            try:
                prx_rule = _of(r.rx)
                native_rules += 1
            except Untranslatable as exc:
                notes.append(f"failregex {r.index} stays on re ({exc}): lines that reach it take the Python path")
        own = dict(r.rx.groupindex) if r.rx is not None else {}

        def code(name: str, own: dict[str, int] = own) -> int:
            if name in own:
                return own[name]
            return -pre_names[name] if name in pre_names else 0

        names = [n for n in pre_names if n not in own] + list(own)
        fields = tuple((n, code(n)) for n in _fields(names))
        alts = tuple((_ALT_NAME.sub(r"\1", n), own[n]) for n in own if n.startswith("alt_"))
        core = tuple(code(n) for n in _CORE)
        split = _split(r.rx) if prx_rule is not None and r.rx is not None else None
        rules.append((prx_rule, r.limit if r.limit is not None else -1, r.index, core, fields, alts, split))
    if not native_rules:
        return Built(None, "python (re): no failregex runs on PCRE2", tuple(notes))
    position = {id(r): k for k, r in enumerate(flt.rules)}
    heads = tuple((key.encode("utf-8", "surrogatepass"), tuple(position[id(r)] for r in rs))
                  for key, rs in flt.heads.items())
    unheaded = tuple(position[id(r)] for r in flt.unheaded)
    gate = None if flt.gate is None else tuple(g.encode("utf-8", "surrogatepass") for g in flt.gate)
    scanner = _scan.Scanner(gate, hooks.max_line, ts, prefix_kind, prefix, prefix_limit, content_group,
                            flt.heads_len, heads, unheaded, tuple(rules), tuple(ignores), flt.ignore_whole,
                            flt.dates.stamp, flt.dates.year_of, flt.dates.hour_base,
                            flt.dates.find_span, flt.hosts, hooks.parse_host, hooks.host_memo, hooks.match_type,
                            hooks.rejected_type, hooks.evict, IPV4_BY_SLOT, ts is not None and shapes is not None
                            and shapes[0] == FAST_SYSLOG, IPV6_BY_SLOT, head_names, head_tails)
    mode = "JIT" if scanner.jit else "interpreted: no executable memory for the JIT"
    engine = f"native (PCRE2 {_scan.pcre2_version().split()[0]}, {mode})"
    if ts is None:
        engine += ", timestamps found by the Python side"
    if native_rules < len(flt.rules):
        engine += f", {native_rules} of {len(flt.rules)} failregexes"
    return Built(scanner, engine, tuple(notes))
