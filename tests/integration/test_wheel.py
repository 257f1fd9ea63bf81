"""`pip install` of the project, as a user without the .deb gets it: the sdist and the wheel are built with the
standard frontend (`python -m build`: the sdist, then the wheel from the sdist) and each is installed into a
fresh virtual environment, whose installed `nftblockd` and `nftblock` commands must work:
`nftblockd --version` (and the matcher's engine), `nftblockd --check-config` on the example config and
`nftblock test-filter` on a sample log.

- the wheel carries the native core and is tagged for the stable ABI (cp311-abi3-linux_<arch>); it is
  installed into a venv of Debian's /usr/bin/python3, so the binary built by another interpreter must load
  in the one the package runs on;
- the sdist holds everything a build needs (the C source, the filters, py.typed, README, COPYING) and is
  built from source by pip in a venv of the interpreter running the tests;
- a build with no usable compiler (CC is a program that fails) still gives a wheel, a pure one
  (py3-none-any, no compiled code), whose install works and whose commands say the matcher runs on the
  Python path and why.

Dependencies come from PyPI through pip's cache (systemd-python has no wheel: pip builds it once and caches
the result). ~48 s on the project's 2-core VM, with a warm cache and with an empty one alike (PyPI is fast
from there; three venvs and three builds are most of it).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import pytest

from nftblockd import __version__

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DEBIAN_PYTHON = Path("/usr/bin/python3")
EXAMPLE_CONFIG = ROOT / "config" / "nftblockd.yaml"
SAMPLE_LOG = ROOT / "tests" / "data" / "logs" / "sshd-session"
NAME = f"nftblockd-{__version__}"
BOUND = 900  # seconds: only to stop a hung download or build, never a target


class Dists(NamedTuple):
    sdist: Path
    wheel: Path  # built from the sdist, with the native core
    pure_wheel: Path  # built from the sdist with a compiler that fails


def run(cmd: Sequence[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=BOUND, check=False)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def pip_env() -> dict[str, str]:
    return dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", out, ROOT], cwd=out, env=pip_env())
    sdist = out / f"{NAME}.tar.gz"
    wheel = out / f"{NAME}-cp311-abi3-linux_{platform.machine()}.whl"
    assert sorted(p.name for p in out.iterdir()) == sorted([sdist.name, wheel.name])

    # The same sdist, built where the C compiler fails: setuptools must give up on the optional extension only.
    src = tmp_path_factory.mktemp("src")
    with tarfile.open(sdist) as tar:
        tar.extractall(src, filter="data")
    cc = src / "failing-cc"
    cc.write_text("#!/bin/sh\necho 'failing-cc: no C compiler on this machine' >&2\nexit 1\n")
    cc.chmod(0o755)
    pure = tmp_path_factory.mktemp("pure")
    log = run([sys.executable, "-m", "build", "--wheel", "--outdir", pure, src / NAME], cwd=src,
              env=dict(pip_env(), CC=str(cc)))
    assert "failing-cc: no C compiler" in log  # the compiler was asked, and failed
    (pure_wheel,) = pure.iterdir()
    return Dists(sdist, wheel, pure_wheel)


def fresh_venv(where: Path, python: Path) -> Path:
    run([python, "-m", "venv", where], cwd=where.parent)
    return where / "bin"


def installed(bin_dir: Path, target: Path, tmp: Path) -> Path:
    """`pip install target` into the venv; the path its nftblockd package was installed at."""
    run([bin_dir / "pip", "install", "--quiet", target], cwd=tmp, env=pip_env())
    where = run([bin_dir / "python", "-c", "import nftblockd; print(nftblockd.__file__)"], cwd=tmp).strip()
    assert where.startswith(str(bin_dir.parent)), where  # the installed copy, not this checkout
    return Path(where).parent


def check_commands(bin_dir: Path, tmp: Path, engine: str, version_line: str) -> None:
    """The installed entry points, run from outside the checkout."""
    out = run([bin_dir / "nftblockd", "--version"], cwd=tmp)
    assert out.startswith(f"nftblockd {__version__}\nmatcher: {version_line}"), out
    out = run([bin_dir / "nftblockd", "--check-config", EXAMPLE_CONFIG], cwd=tmp)
    assert f"{EXAMPLE_CONFIG}: valid" in out, out
    out = run([bin_dir / "nftblock", "test-filter", "sshd", SAMPLE_LOG], cwd=tmp)
    assert f"Engine: {engine}" in out, out
    assert "matched: 7 (5 hosts)" in out, out  # the filters (package data) were found and ran


def test_the_sdist_holds_what_a_build_needs(dists: Dists) -> None:
    with tarfile.open(dists.sdist) as tar:
        names = {n.removeprefix(f"{NAME}/") for n in tar.getnames()}
    filters = {f"nftblockd/detect/filters/{p.name}" for p in (ROOT / "nftblockd/detect/filters").glob("*.yaml")}
    assert filters and filters <= names
    assert {"nftblockd/detect/_scan.c", "nftblockd/feeds/_sorted.c", "nftblockd/kernel/_nlenc.c",
            "nftblockd/py.typed", "README.md", "COPYING",
            "PKG-INFO", "pyproject.toml", "setup.py", "config/nftblockd.yaml"} <= names
    sources = {str(p.relative_to(ROOT)) for p in (ROOT / "nftblockd").rglob("*.py")}
    assert sources <= names


def test_the_wheel_carries_the_native_core_for_the_stable_abi(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as whl:
        names = set(whl.namelist())
        wheel_meta = whl.read(f"{NAME}.dist-info/WHEEL").decode()
    assert {"nftblockd/detect/_scan.abi3.so", "nftblockd/feeds/_sorted.abi3.so",
            "nftblockd/fleet/_plain.abi3.so", "nftblockd/kernel/_nlenc.abi3.so"} <= names
    assert f"Tag: cp311-abi3-linux_{platform.machine()}" in wheel_meta
    assert "nftblockd/py.typed" in names and f"{NAME}.dist-info/licenses/COPYING" in names
    assert not any(n.endswith(".c") for n in names)  # the source stays in the sdist


def test_the_wheel_installed_for_debians_python(dists: Dists, tmp_path: Path) -> None:
    if not DEBIAN_PYTHON.exists():
        pytest.skip("no /usr/bin/python3 (Debian's interpreter)")
    bin_dir = fresh_venv(tmp_path / "venv", DEBIAN_PYTHON)
    pkg = installed(bin_dir, dists.wheel, tmp_path)
    assert (pkg / "detect" / "_scan.abi3.so").exists()
    check_commands(bin_dir, tmp_path, "native (PCRE2 ", "native core, PCRE2 ")


def test_the_sdist_built_and_installed_by_pip(dists: Dists, tmp_path: Path) -> None:
    bin_dir = fresh_venv(tmp_path / "venv", Path(sys.executable))
    pkg = installed(bin_dir, dists.sdist, tmp_path)
    assert (pkg / "detect" / "_scan.abi3.so").exists()  # pip compiled the native core from the sdist
    check_commands(bin_dir, tmp_path, "native (PCRE2 ", "native core, PCRE2 ")


def test_without_a_compiler_the_matcher_runs_on_python_and_says_why(dists: Dists, tmp_path: Path) -> None:
    assert dists.pure_wheel.name == f"{NAME}-py3-none-any.whl"  # it does not pose as carrying the core
    with zipfile.ZipFile(dists.pure_wheel) as whl:
        assert not any(n.endswith(".so") for n in whl.namelist())
    bin_dir = fresh_venv(tmp_path / "venv", Path(sys.executable))
    installed(bin_dir, dists.pure_wheel, tmp_path)
    why = "native core not built (this copy was installed without a C compiler or libpcre2-dev"
    check_commands(bin_dir, tmp_path, f"python (re): {why}", f"pure Python (re): {why}")
