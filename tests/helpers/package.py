"""The package's console scripts as the .deb installs them (packaging/entry-script.sh), for a library
directory of the caller's choice (this checkout), so tests and benchmarks run and time what users run."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def entry_script(name: str, libdir: Path = REPO) -> str:
    target = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"][name]
    return subprocess.run(["bash", str(REPO / "packaging" / "entry-script.sh"), name, target, str(libdir), "test"],
                          capture_output=True, text=True, check=True).stdout


def write_entry_script(directory: Path, name: str, libdir: Path = REPO) -> Path:
    path = directory / name
    path.write_text(entry_script(name, libdir))
    path.chmod(0o755)
    return path
