"""The tree is the data flow: packages import only from layers below them, and the pure modules import no IO.

Layers, lowest first (a module may import its own package and anything in a lower layer):
  0  nftblockd/*.py (shared values), config/ (the config) and service/ (logging, sd_notify, metrics)
  1  sources/, state/
  2  detect/, kernel/
  3  feeds/, fleet/, actions/
  4  control/, migrate/
  5  the entry points: cli/ (`nftblock`) and daemon/ (`nftblockd`: the composition root and its parts)

And no import cycle anywhere inside nftblockd/, counting imports under TYPE_CHECKING and inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "nftblockd"

RANK = {"config": 0, "service": 0, "sources": 1, "state": 1, "detect": 2, "kernel": 2, "actions": 3, "feeds": 3,
        "fleet": 3, "control": 4, "migrate": 4, "cli": 5, "daemon": 5}

# Pure: parsing, matching, tracking, diffing, encoding. No IO, no event loop, no clock. (`socket` is allowed:
# its inet_pton/inet_ntoa are the fast pure address codecs.)
PURE = {
    "nftblockd.events", "nftblockd.durations", "nftblockd.allowlist", "nftblockd.addr", "nftblockd.neverban",
    "nftblockd.argtemplate",
    "nftblockd.detect.matcher", "nftblockd.detect.native", "nftblockd.detect.timestamps", "nftblockd.detect.rxlint",
    "nftblockd.detect.rxopt", "nftblockd.detect.tracker", "nftblockd.detect.subnet",
    "nftblockd.feeds.parse", "nftblockd.feeds.aggregate", "nftblockd.feeds.delta",
    "nftblockd.kernel.bans", "nftblockd.kernel.nfmsg", "nftblockd.kernel.rtnl",
    "nftblockd.control.protocol", "nftblockd.control.wire", "nftblockd.sources.linesplit",
    "nftblockd.migrate.f2bjail", "nftblockd.migrate.render", "nftblockd.migrate.merge", "nftblockd.migrate.sandbox",
    "nftblockd.migrate.dropin",
    "nftblockd.detect.multiline",
    "nftblockd.service.health", "nftblockd.service.startline",
}
IMPURE_IMPORTS = {"asyncio", "sqlite3", "pyroute2", "subprocess", "aiohttp", "redis", "systemd",
                  "asyncinotify", "prometheus_client", "time", "threading"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                if not is_pkg:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)  # `from pkg import module`
    return found


def _package(module: str) -> str | None:
    """The subpackage a module is in (nftblockd.kernel.sink and nftblockd.kernel: kernel), None at the top level."""
    parts = module.split(".")
    return parts[1] if len(parts) >= 3 or (len(parts) == 2 and parts[1] in RANK) else None


def _rank(module: str) -> int:
    pkg = _package(module)
    return 0 if pkg is None else RANK[pkg]


MODULES = _modules()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_upward_import(name: str) -> None:
    mine = _rank(name)
    own_pkg = _package(name)
    bad = []
    for imp in _imports(name, MODULES[name]):
        if imp not in MODULES or imp == "nftblockd":
            continue
        pkg = _package(imp)
        if pkg is not None and pkg == own_pkg:
            continue
        if _rank(imp) > mine or (_rank(imp) == mine and mine > 0 and pkg != own_pkg):
            bad.append(imp)
    assert not bad, f"{name} (layer {mine}) imports upward or sideways: {sorted(bad)}"


def test_every_package_has_a_layer() -> None:
    # a new subpackage is placed in the data flow on purpose, not ranked 0 by default
    packages = {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(RANK), f"give these a layer in RANK: {sorted(packages - set(RANK))}"


@pytest.mark.parametrize("name", sorted(PURE & set(MODULES)))
def test_pure_modules_import_no_io(name: str) -> None:
    roots = {imp.split(".")[0] for imp in _imports(name, MODULES[name])}
    assert not roots & IMPURE_IMPORTS, f"{name} is pure but imports {sorted(roots & IMPURE_IMPORTS)}"


def test_the_pure_list_names_real_modules() -> None:
    # addr/neverban may not exist yet on every branch; everything else must, or the list has gone stale
    missing = PURE - set(MODULES) - {"nftblockd.addr", "nftblockd.neverban"}
    assert not missing


def test_the_coverage_floor_measures_exactly_the_pure_modules() -> None:
    # pyproject.toml's [tool.coverage.run] source_pkgs is what `make coverage` holds to its floor: a pure
    # module missing there would escape the floor (one listed but absent would make coverage warn)
    import tomllib

    config = tomllib.loads((PKG.parent / "pyproject.toml").read_text())
    measured = set(config["tool"]["coverage"]["run"]["source_pkgs"])
    assert measured == PURE & set(MODULES)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle() -> None:
    # Every import counts, also those under TYPE_CHECKING and inside functions: a cycle hidden from the
    # interpreter is still two modules that cannot be understood (or moved) one without the other.
    graph = {name: {imp for imp in _imports(name, path) if imp in MODULES and imp != name}
             for name, path in MODULES.items()}
    cycles = _cycles(graph)
    assert not cycles, f"import cycles inside nftblockd/: {cycles}"


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
