"""yamlsrc: values with their lines, and YAML's aliases kept within bounds (issue 13, item 5): an alias bomb made
`--check-config` run for over a minute at 778 MB, a recursive alias gave a traceback. Both are refused now, at
once, with file:line."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from nftblockd.config import ConfigError, parse_config
from nftblockd.config.yamlsrc import YamlError, load_yaml

REPO = Path(__file__).resolve().parents[2]

# The "billion laughs": nine levels of nine aliases to the level below, 9**9 (387 million) strings.
BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
allowlist: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_values_and_their_lines() -> None:
    doc = load_yaml("a: 1\nb:\n  - x\n  - {c: 2}\n", "f.yaml")
    assert doc.value == {"a": 1, "b": ["x", {"c": 2}]}
    assert doc.line(("b", 1, "c")) == 4 and doc.line(("a",)) == 1


def test_ordinary_aliases_still_work() -> None:
    doc = load_yaml("common: &c [10.0.0.0/8, 192.0.2.0/24]\nx: *c\ny: *c\n", "f.yaml")
    assert doc.value["x"] == doc.value["y"] == ["10.0.0.0/8", "192.0.2.0/24"]


def test_an_alias_bomb_is_refused_fast_and_small() -> None:
    tracemalloc.start()
    try:
        with pytest.raises(YamlError) as e:
            load_yaml(BOMB, "bomb.yaml")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.file == "bomb.yaml" and 2 <= e.value.line <= 9
    assert "aliases" in e.value.reason
    assert peak < 50 * 1024 * 1024  # it was 778 MB and counting


@pytest.mark.parametrize("text", ["a: &a [*a]\n", "a: &a {b: *a}\n", "x: 1\na: &a\n  - 1\n  - [2, *a]\n"])
def test_a_recursive_alias_is_refused_with_its_line(text: str) -> None:
    with pytest.raises(YamlError, match=r"r\.yaml:\d+: .*refers to itself"):
        load_yaml(text, "r.yaml")


def test_check_config_reports_both_with_file_and_line(tmp_path: Path) -> None:
    for name, text in (("bomb.yaml", BOMB), ("loop.yaml", "jails: &j {sshd: *j}\n")):
        cfg = tmp_path / name
        cfg.write_text(text)
        r = subprocess.run([sys.executable, "-m", "nftblockd.daemon.main", "--check-config", str(cfg)],
                           capture_output=True, text=True, cwd=REPO, timeout=120)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith(f"{cfg}:"), r.stderr


def test_deep_nesting_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nested"):
        parse_config("a: " + "[" * 1000 + "]" * 1000 + "\n", "deep.yaml")


# Issue 33: each of these crashed `--check-config` and the daemon with a traceback (a tag SafeLoader cannot
# construct, a merge key, an int past Python's 4300-digit limit) or, for `!custom`, was taken silently.
@pytest.mark.parametrize(("text", "line", "reason"), [
    ("table: !!python/name:os.system x\n", 1, "the YAML tag !!python/name:os.system is not supported"),
    ("jails: !custom {}\n", 1, "the YAML tag !custom is not supported"),
    ("batch:\n  max_ops: !!binary aGVsbG8=\n", 2, "the YAML tag !!binary is not supported"),
    ("a: &a {x: 1}\nbatch:\n  <<: *a\n", 3, "YAML merge keys (<<) are not supported"),
    ("batch:\n  max_ops: " + "9" * 5000 + "\n", 2, "a number written with 5000 characters"),
    ("x: 2020-13-45\n", 1, "invalid value '2020-13-45'"),
])
def test_tags_merge_keys_and_huge_numbers_are_problems_with_their_line(text: str, line: int, reason: str) -> None:
    doc = load_yaml(text, "c.yaml")
    assert [(p.line, p.reason.startswith(reason)) for p in doc.problems] == [(line, True)]
    with pytest.raises(ConfigError) as err:
        parse_config(text, "c.yaml")
    assert f"c.yaml:{line}: {reason}" in str(err.value)


def test_plain_values_and_explicit_standard_tags_still_load() -> None:
    doc = load_yaml("a: !!str 12\nb: 3\nc: [1.5, null, true]\n", "c.yaml")
    assert doc.problems == [] and doc.value == {"a": "12", "b": 3, "c": [1.5, None, True]}
