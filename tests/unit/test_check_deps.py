"""tools/check_deps.py: a declared dependency nothing in nftblockd/ imports fails `make lint`, named."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.check_deps import (
    Dependency,
    declared,
    imported_roots,
    main,
    package_imports,
    requirement_name,
    unused,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("spec", "name"), [
    ("pyyaml>=6.0", "pyyaml"),
    ("prometheus_client >= 0.20", "prometheus-client"),
    ("google-re2>=1.1; platform_machine == 'x86_64'", "google-re2"),
    ("Systemd.Python", "systemd-python"),
    ("redis[hiredis]>=5", "redis"),
])
def test_requirement_names_are_normalised(spec: str, name: str) -> None:
    assert requirement_name(spec) == name


def test_requirement_name_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="not a requirement"):
        requirement_name(">=1.0")


def test_dependencies_and_runtime_extras_are_declared_dev_is_not() -> None:
    project = {"project": {"dependencies": ["pyyaml>=6"], "optional-dependencies": {
        "fleet": ["redis>=5", "hiredis"], "dev": ["pytest>=8"]}}}
    assert declared(project) == [Dependency("pyyaml", "dependencies"), Dependency("redis", "extra fleet"),
                                 Dependency("hiredis", "extra fleet")]


def test_every_kind_of_import_is_seen() -> None:
    source = """
import yaml, os.path
from systemd import journal
from . import sibling
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from redis.asyncio import Redis
def late():
    import asyncinotify
    return importlib.import_module("re2"), __import__("aiohttp.web")
"""
    assert imported_roots(source) == {"yaml", "os", "systemd", "typing", "redis", "asyncinotify", "re2",
                                      "aiohttp"}


def test_unused_names_what_is_not_imported() -> None:
    deps = [Dependency("pyyaml", "dependencies"), Dependency("pyroute2", "dependencies"),
            Dependency("prometheus-client", "dependencies"), Dependency("hiredis", "extra fleet"),
            Dependency("not-installed-here", "extra x")]
    installed = {"pyyaml": {"yaml", "_yaml"}}
    imported = {"yaml", "prometheus_client"}  # prometheus-client: found by its name with "_"
    # hiredis is exempt (redis-py uses it); the rest are named
    assert unused(deps, imported, installed) == [deps[1], deps[4]]


def test_the_table_maps_what_is_not_installed() -> None:
    # systemd-python imports as `systemd`: known without the distribution installed
    assert unused([Dependency("systemd-python", "dependencies")], {"systemd"}, {}) == []


def test_the_repository_declares_only_what_it_imports(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check_deps", str(ROOT)]) == 0, capsys.readouterr().err
    assert package_imports([ROOT / "nftblockd" / "config" / "yamlsrc.py"]) >= {"yaml"}


def test_a_dead_dependency_fails_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nftblockd").mkdir()
    (tmp_path / "nftblockd" / "__init__.py").write_text("import yaml\n")
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["pyyaml", "pyroute2>=0.9"]\n'
        '[project.optional-dependencies]\ndev = ["pytest"]\n')
    assert main(["check_deps", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        "pyproject.toml: pyroute2 (dependencies) is declared but nothing in nftblockd/ imports it\n")
