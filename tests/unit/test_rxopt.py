"""rxopt.cheap_optionals: `(?:X)?` → `(?:X|)` must never change what a regex matches or captures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.detect.filterload import builtin_filters, load_yaml_filter
from nftblockd.detect.matcher import expand_tags
from nftblockd.detect.rxopt import cheap_optionals

FILTERS = Path(__file__).resolve().parents[2] / "nftblockd" / "detect" / "filters"


@pytest.mark.parametrize(("before", "after"), [
    (r"(?:a)?b", r"(?:a|)b"),
    (r"(?:a|b)?", r"(?:a|b|)"),
    (r"(?:x(?:y)?z)?", r"(?:x(?:y|)z|)"),
    (r"(?:a)??", r"(?:a)??"),  # lazy: tries nothing first
    (r"(?:a)?+", r"(?:a)?+"),  # possessive
    (r"(a)?", r"(a)?"),  # capturing: None vs "" when it does not take part
    (r"(?P<n>a)?", r"(?P<n>a)?"),
    (r"(?>a)?", r"(?>a)?"),  # atomic: (?>a|) could not backtrack to the empty branch
    (r"(?=a)?b", r"(?=a)?b"),
    (r"[(?:x)?]", r"[(?:x)?]"),  # a character class is literal text
    (r"[]()?]x(?:y)?", r"[]()?]x(?:y|)"),
    (r"\(?:a\)?", r"\(?:a\)?"),  # escaped parentheses
    (r"(?#c)(?:d)?", r"(?#c)(?:d|)"),
    (r"(?x)(?:a)?  # c", r"(?x)(?:a)?  # c"),  # verbose: left as written
    (r"(?:a){0,1}", r"(?:a){0,1}"),
    (r"(?:a", r"(?:a"),  # unbalanced: re reports it as written
])
def test_rewrites(before: str, after: str) -> None:
    assert cheap_optionals(before) == after


def _builtin_patterns() -> list[str]:
    out = []
    for name in builtin_filters():
        d = load_yaml_filter(FILTERS / f"{name}.yaml")
        for src in (*d.failregex, *d.ignoreregex, *([d.prefix] if d.prefix else [])):
            try:
                out.append(expand_tags(src.text))
            except ValueError:
                continue
    return out


PATTERNS = _builtin_patterns()
# text that exercises the optional parts: syslog heads, addresses, ports, brackets
ALPHABET = st.sampled_from(["sshd", "[123]", ": ", " ", "from ", "1.2.3.4", "::1", " port 22", " ssh2", "[preauth]",
                            "Failed password for ", "invalid user ", "x", "Invalid user", "web1 ", "error: ",
                            "on eth0", "\t", ":", "(", ")", "<13>1 ", "kernel: [ 1.2]", "user=root"])


def test_builtin_patterns_are_rewritten() -> None:
    changed = sum(cheap_optionals(p) != p for p in PATTERNS)
    assert changed >= len(PATTERNS) // 4  # the rewrite does apply to the filters that matter


@settings(max_examples=300, deadline=None)
@given(st.lists(ALPHABET, max_size=14).map("".join), st.integers(0, 10_000))
def test_same_matches_and_groups(text: str, which: int) -> None:
    p = PATTERNS[which % len(PATTERNS)]
    a, b = re.compile(p), re.compile(cheap_optionals(p))
    for start in range(min(len(text), 4) + 1):
        ma, mb = a.match(text, start), b.match(text, start)
        assert (ma is None) == (mb is None), (p, text)
        if ma is not None and mb is not None:
            assert ma.span() == mb.span() and ma.groups() == mb.groups(), (p, text)
