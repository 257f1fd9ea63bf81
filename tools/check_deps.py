"""Every declared dependency is imported: `make lint` fails naming any that nothing in nftblockd/ imports.

Reads pyproject.toml's `dependencies` and its optional extras (all but the development ones, DEV_EXTRAS),
maps each distribution to the names it is imported by (the installed distribution's own record, through
importlib.metadata.packages_distributions, or the IMPORT_NAMES table when it is not installed) and looks for
them among the imports of every module under nftblockd/ (import statements anywhere, also under TYPE_CHECKING
and inside functions, and `importlib.import_module("name")` with a literal name). A dependency another one
uses on its own (IMPLICIT) is exempt, with its reason.

Usage: python tools/check_deps.py [REPO]. Reads files only; never installs or imports what it checks.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

# Extras of tools for working on the project, not for running it: nothing in nftblockd/ imports them.
DEV_EXTRAS = frozenset({"dev"})

# Import names of dependencies whose distribution name says otherwise, for when they are not installed.
IMPORT_NAMES: Mapping[str, frozenset[str]] = {
    "pyyaml": frozenset({"yaml"}),
    "systemd-python": frozenset({"systemd"}),
    "google-re2": frozenset({"re2"}),
}

# Declared for another dependency's sake, never imported by the package itself.
IMPLICIT: Mapping[str, str] = {
    "hiredis": "redis-py parses replies with it when it is installed (fleet extra; docs/fleet.md measures it)",
}


class Dependency(NamedTuple):
    name: str  # normalised distribution name (PEP 503)
    where: str  # "dependencies" or "extra <name>"


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec: str) -> str:
    """The distribution name of a PEP 508 requirement ("redis>=5.0; python_version>'3'" -> "redis")."""
    m = re.match(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)", spec)
    if m is None:
        raise ValueError(f"not a requirement: {spec!r}")
    return normalise(m.group(1))


def declared(pyproject: Mapping[str, object]) -> list[Dependency]:
    """The dependencies the package's users get: `dependencies` and the extras not in DEV_EXTRAS."""
    project = pyproject.get("project")
    if not isinstance(project, dict):
        raise ValueError("pyproject.toml has no [project] table")
    out = [Dependency(requirement_name(s), "dependencies") for s in project.get("dependencies", [])]
    for extra, specs in sorted(project.get("optional-dependencies", {}).items()):
        if extra not in DEV_EXTRAS:
            out += [Dependency(requirement_name(s), f"extra {extra}") for s in specs]
    return out


def installed_import_names() -> dict[str, set[str]]:
    """Normalised distribution name -> the top-level names it installs, for what is installed here."""
    out: dict[str, set[str]] = {}
    for top, dists in importlib.metadata.packages_distributions().items():
        if "/" in top or not top.isidentifier():  # extension modules listed without a top_level.txt
            continue
        for dist in dists:
            out.setdefault(normalise(dist), set()).add(top)
    return out


def import_names(dist: str, installed: Mapping[str, set[str]]) -> set[str]:
    return set(installed.get(dist, ())) | set(IMPORT_NAMES.get(dist, ())) | {dist.replace("-", "_")}


def imported_roots(source: str, filename: str = "<source>") -> set[str]:
    """Top-level names a module imports, by any means the checker can see without running it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in {"import_module", "__import__"}))):
            found.add(node.args[0].value.split(".")[0])
    return found


def package_imports(files: Iterable[Path]) -> set[str]:
    out: set[str] = set()
    for path in files:
        out |= imported_roots(path.read_text(), str(path))
    return out


def unused(deps: Iterable[Dependency], imported: set[str], installed: Mapping[str, set[str]]) -> list[Dependency]:
    """The dependencies none of whose import names is imported (and that IMPLICIT does not exempt)."""
    return [d for d in deps if d.name not in IMPLICIT and not import_names(d.name, installed) & imported]


def main(argv: list[str]) -> int:
    repo = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    deps = declared(tomllib.loads((repo / "pyproject.toml").read_text()))
    imported = package_imports(sorted((repo / "nftblockd").rglob("*.py")))
    bad = unused(deps, imported, installed_import_names())
    for d in bad:
        print(f"pyproject.toml: {d.name} ({d.where}) is declared but nothing in nftblockd/ imports it",
              file=sys.stderr)
    if not bad:
        print(f"check_deps: all {len(deps)} declared dependencies are imported by nftblockd/"
              f" ({len([d for d in deps if d.name in IMPLICIT])} used through another: "
              f"{', '.join(sorted(IMPLICIT))})")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
