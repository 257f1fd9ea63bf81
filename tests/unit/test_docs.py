"""The project's documentation is its own: no file points outside the repository, every `docs/*.md` it names
exists, and every fact the code cites by label (`docs/netlink.md` F1.5, `docs/why.md` #4) is in that page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ["README.md", "docs", "nftblockd", "packaging", "systemd", "config", "tests", "bench", "tools", "Makefile"]


def files() -> list[Path]:
    out: list[Path] = []
    for t in TREES:
        p = ROOT / t
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out += [f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts
                    and not any(part.startswith(".") for part in f.relative_to(p).parts)
                    and f.suffix in {".py", ".md", ".sh", ".conf", ".yaml", ".service", ".json", ""}]
    return [f for f in out if f != Path(__file__).resolve()]


def test_nothing_points_outside_the_repository() -> None:
    bad = [f"{f.relative_to(ROOT)}:{n}" for f in files()
           for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1)
           if re.search(r"\.\./shared|shared/(docs|tools)/|/work/", line)]
    assert bad == []


def test_named_docs_exist() -> None:
    named = {m for f in files() for m in re.findall(r"\bdocs/[\w.-]+\.md\b", f.read_text(errors="replace"))}
    assert {"docs/netlink.md", "docs/why.md", "docs/control-protocol.md"} <= named
    assert [d for d in named if not (ROOT / d).exists()] == []


def test_cited_labels_exist() -> None:
    netlink = (ROOT / "docs" / "netlink.md").read_text()
    why = (ROOT / "docs" / "why.md").read_text()
    labels = set(re.findall(r"\*\*(F\d+\.\d+|§\d+)\b", netlink))
    entries = {int(n) for n in re.findall(r"^(\d+)\. \*\*", why, re.M)}
    for f in files():
        if f.suffix != ".py":
            continue
        text = f.read_text()
        cites_netlink = "docs/netlink.md" in text or "netlink" in f.name or f.parent.name == "kernel"
        for label in re.findall(r"\b(F\d+\.\d+)\b|(§\d+)", text):
            label = label[0] or label[1]
            if cites_netlink:
                assert label in labels, (f.relative_to(ROOT), label)
        for n in re.findall(r"docs/why\.md #(\d+)", text):
            assert int(n) in entries, (f.relative_to(ROOT), n)
