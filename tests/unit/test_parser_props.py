"""Property tests for two parsers of operator input (issue 33): the YAML config loader and the fail2ban file
reader (INI, includes, interpolation). Any text in gives a value within the documented bounds or a refusal
with a reason (file and line), never another exception."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.config import examine_text
from nftblockd.config.yamlsrc import MAX_DEPTH, MAX_NUMBER_DIGITS, YamlError, load_yaml
from nftblockd.detect.f2b import read_filter
from nftblockd.detect.matcher import FilterDef, FilterError

# Pieces that make YAML (and fail2ban INI) interesting: indicators, tags, anchors, merge keys, numbers, the
# config's own keys, and line structure.
_YAML_TOKENS = st.sampled_from([
    "\n", "  ", ": ", "- ", "[", "]", "{", "}", ", ", "&a ", "*a", "!!python/name:os.system ", "!x ", "!!str ",
    "!!binary ", "<<: ", "'", '"', "#", "|", ">", "? ", "---\n", "...\n", "9" * 40, "0x1F", "1e999", ".inf",
    "2020-01-01", "jails", "sshd", "filter", "files", "maxretry", "batch", "allowlist", "10.0.0.1/8", "null",
    "true", "\t", "\x00", "\ufeff", "%", "@", "`",
])


def _bounded(value: Any, depth: int = 0) -> bool:
    """A loaded value holds only plain YAML types, no int longer than allowed, nested within MAX_DEPTH."""
    if depth > MAX_DEPTH + 1:
        return False
    if isinstance(value, dict):
        return all(isinstance(k, str) and _bounded(v, depth + 1) for k, v in value.items())
    if isinstance(value, list):
        return all(_bounded(v, depth + 1) for v in value)
    if isinstance(value, bool) or value is None or isinstance(value, str | float):
        return True
    if isinstance(value, int):
        return len(str(abs(value))) <= MAX_NUMBER_DIGITS
    return type(value).__name__ in ("date", "datetime")  # YAML timestamps, refused later by the typed getters


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.lists(_YAML_TOKENS, max_size=40).map("".join), st.text(max_size=200)))
def test_the_yaml_loader_returns_plain_values_or_a_located_refusal(text: str) -> None:
    try:
        doc = load_yaml(text, "c.yaml")
    except YamlError as exc:
        assert exc.file == "c.yaml" and exc.line >= 1 and exc.reason
    else:
        assert _bounded(doc.value)
        assert all(p.file == "c.yaml" and p.line >= 1 and p.reason for p in doc.problems)
    cfg, problems = examine_text(text, "c.yaml")  # the whole config builder: never raises either
    assert cfg is not None or problems
    assert all(p.file == "c.yaml" and p.reason for p in problems)


_INI_TOKENS = st.sampled_from([
    "\n", " ", "[Definition]\n", "[INCLUDES]\n", "[Init]\n", "[DEFAULT]\n", "[x]\n", "failregex = ",
    "ignoreregex = ", "prefregex = ", "before = ", "after = ", "a.conf", "b.conf", "/dev/null", "fifo",
    "%(a)s", "%(known/a)s", "%(x/a)s", "a = ", "<HOST>", "<F-USER>", "</F-USER>", "<a>", "^", "$", "(", ")",
    "\\", ";", "#", "=", ":", "maxlines = ", "5", "datepattern = ", "{^LN-BEG}", "journalmatch = ", "%%",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_INI_TOKENS, max_size=30).map("".join), min_size=1, max_size=3),
       st.dictionaries(st.sampled_from(["mode", "a", "known/a"]), st.sampled_from(["", "x", "%(a)s", "<a>"]),
                       max_size=2))
def test_the_fail2ban_reader_returns_a_filter_or_a_located_refusal(texts: list[str], opts: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        os.mkfifo(root / "fifo")  # an include of a FIFO must be refused, not waited on
        for name, text in zip(("main.conf", "a.conf", "b.conf"), texts, strict=False):
            (root / name).write_text(text)
        try:
            out = read_filter(root / "main.conf", opts)
        except FilterError as exc:
            assert str(exc)
        else:
            assert isinstance(out, FilterDef)
            assert all(r.text and r.where for r in out.failregex)
