"""The manual pages are rendered from the real parsers and the example config (packaging/manpages.py), so they
cannot drift: every command, sub-command and option, and every top-level config key, is in its page, and
man(1) renders the pages without a warning."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from nftblockd.cli.main import build_parser as cli_parser
from nftblockd.daemon.main import build_parser as daemon_parser

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "nftblockd.yaml"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("manpages", ROOT / "packaging" / "manpages.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["manpages"] = mod
    spec.loader.exec_module(mod)
    return mod


manpages = _load()


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("man")
    manpages.render(out, EXAMPLE, "9.9.9", "2026-01-02")
    return {p.name: p.read_text() for p in out.iterdir()}


def plain(roff: str) -> str:
    """What a reader sees, near enough to search for names: roff escapes undone."""
    return roff.replace("\\-", "-").replace("\\e", "\\").replace("\\&", "")


def option_strings(parser: object) -> set[str]:
    import argparse

    assert isinstance(parser, argparse.ArgumentParser)
    return {o for a in parser._actions for o in a.option_strings if a.help != argparse.SUPPRESS}


def test_three_pages_with_version_and_date(pages: dict[str, str]) -> None:
    assert set(pages) == {"nftblockd.8", "nftblock.8", "nftblockd.yaml.5"}
    for name, text in pages.items():
        title, section = name.rsplit(".", 1)
        assert f'.TH {title.upper()} {section} "2026-01-02" "nftblockd 9.9.9"' in text


def test_every_cli_command_and_option_is_in_nftblock_8(pages: dict[str, str]) -> None:
    text = plain(pages["nftblock.8"])
    subs = list(manpages.subcommands(cli_parser()))
    names = {name for name, _, _ in subs}
    # The commands the CLI has today, so that a walk finding nothing cannot pass.
    assert {"ban", "unban", "list", "check", "status", "feeds", "feeds refresh", "feeds accept",
            "test-filter", "import-fail2ban"} <= names
    for name, _, sub in subs:
        assert f".SS {name}\n" in text, name
        section = text.split(f".SS {name}\n", 1)[1].split(".SS ", 1)[0]
        for opt in option_strings(sub) - {"-h", "--help"}:
            assert opt in section, (name, opt)
    for opt in option_strings(cli_parser()):
        assert opt in text.split(".SH COMMANDS")[0], opt


def test_every_daemon_option_is_in_nftblockd_8(pages: dict[str, str]) -> None:
    text = plain(pages["nftblockd.8"])
    opts = option_strings(daemon_parser())
    assert {"--config", "--check-config", "--log-level"} <= opts
    for opt in opts:
        assert opt in text, opt
    assert "debug, info, warning, error" in text  # choices are listed


def config_top_level_keys() -> set[str]:
    """The keys config/load.py accepts at the top level: the set literal build() hands to self.mapping()."""
    tree = ast.parse((ROOT / "nftblockd" / "config" / "load.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "build":
            for call in ast.walk(node):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "mapping" and len(call.args) == 3
                        and isinstance(call.args[2], ast.Set)):
                    return {ast.literal_eval(e) for e in call.args[2].elts}
    raise AssertionError("config/load.py's top-level keys not found")


def test_every_config_key_is_documented_in_the_example_and_the_page(pages: dict[str, str]) -> None:
    keys = config_top_level_keys()
    assert {"table", "blocklists", "jails", "feeds"} <= keys
    _, sections = manpages.config_sections(EXAMPLE.read_text())
    assert {s.key for s in sections} == keys
    text = plain(pages["nftblockd.yaml.5"])
    for k in keys:
        assert f".SS {k}\n" in text, k


def test_config_sections_keep_comments_and_examples() -> None:
    head, sections = manpages.config_sections(
        "# head\n\n# The table.\n# Second line.\ntable: inet x\n\nchain:\n  hook: prerouting\n\n  priority: raw\n"
        "feeds: {}\n#  x:\n#    url: u\n")
    assert head == "head"
    assert [(s.key, s.comment) for s in sections] == [("table", "The table. Second line."), ("chain", ""),
                                                     ("feeds", "")]
    assert sections[1].example == "chain:\n  hook: prerouting\n\n  priority: raw"
    assert sections[2].example == "feeds: {}\n#  x:\n#    url: u"


@pytest.mark.parametrize("text", ["-x", ".start", "'quote", "back\\slash"])
def test_roff_escaping(text: str) -> None:
    out = manpages.esc(text)
    assert not out.startswith((".", "'")) and plain(out) == text


@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
def test_man_renders_the_pages_without_warnings(pages: dict[str, str], tmp_path: Path) -> None:
    for name, text in pages.items():
        path = tmp_path / name
        path.write_text(text)
        proc = subprocess.run(["man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", str(path)],
                              capture_output=True, text=True, check=False,
                              env={"LC_ALL": "C.UTF-8", "MANROFFSEQ": "", "MANWIDTH": "80", "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0 and proc.stderr == "", (name, proc.stderr)
        assert re.search(r"\S", proc.stdout)


# The config reader's sections: the function of config/load.py / config/sections.py that reads it -> the path of
# its keys in the page's KEY REFERENCE (a function that reads nested mappings, such as jails' escalation or
# fleet's tls, has their keys too: each must be somewhere below that path).
READERS = {"build": "", "table": "table.", "chain": "chain.", "control": "control.", "batch": "batch.",
           "reconcile": "reconcile.", "metrics": "metrics.", "blocklists": "blocklists.NAME.",
           "subnet_escalation": "blocklists.NAME.subnet_escalation.", "jails": "jails.NAME.",
           "feeds": "feeds.NAME.", "action": "actions.NAME.", "fleet": "fleet."}


def reader_keys() -> dict[str, set[str]]:
    """Every key each reader function accepts: the string sets given to SectionReader.mapping, directly or
    through a local name (an action's `common | specific[type]`)."""
    out: dict[str, set[str]] = {}
    for name in ("config/load.py", "config/sections.py"):
        tree = ast.parse((ROOT / "nftblockd" / name).read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            local = {t.id: n.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
                     for t in n.targets if isinstance(t, ast.Name)}
            for call in ast.walk(fn):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "mapping" and len(call.args) == 3):
                    continue
                arg = call.args[2]
                sources = [arg, *(local[n.id] for n in ast.walk(arg) if isinstance(n, ast.Name) and n.id in local)]
                keys = {c.value for src in sources for st in ast.walk(src) if isinstance(st, ast.Set)
                        for c in st.elts if isinstance(c, ast.Constant) and isinstance(c.value, str)}
                if keys:
                    out.setdefault(fn.name, set()).update(keys)
    return out


def test_every_config_key_the_reader_knows_is_in_the_page(pages: dict[str, str]) -> None:
    text = pages["nftblockd.yaml.5"]
    assert ".SH KEY REFERENCE" in text
    reference = text.split(".SH KEY REFERENCE", 1)[1].split("\n.SH ", 1)[0]
    terms = [plain(m) for m in re.findall(r"^\.TP\n\\fB(.+?)\\fR$", reference, re.M)]
    known = reader_keys()
    assert set(known) == set(READERS), f"a config section without a page path: {set(known) ^ set(READERS)}"
    assert sum(map(len, known.values())) > 90  # the walk found the reader's sets

    def described(prefix: str, key: str) -> bool:
        if not prefix:  # a top-level key: itself
            return key in terms
        return any(t.startswith(prefix) and t.rsplit(".", 1)[-1] == key for t in terms)

    missing = sorted(f"{READERS[fn]}{k}" for fn, keys in known.items() for k in keys if not described(READERS[fn], k))
    assert missing == [], f"keys the config reader knows but nftblockd.yaml(5) does not describe: {missing}"
