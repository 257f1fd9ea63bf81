"""Whether the Redis client found can run fleet mode, and the sentence that says what to install if not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nftblockd.fleet.client import MIN_REDIS, problem

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("redis", ["6.1.0", "6.1", "6.4.0", "8.2.0", "10.0.0b1"])  # 6.1.0: Debian 13's
def test_clients_that_serve(redis: str) -> None:
    assert problem(redis) is None


def test_debian_12s_client_is_refused_with_what_to_install() -> None:
    msg = problem("4.3.4")
    assert msg is not None
    assert msg.startswith("fleet mode needs python3-redis >= 6.1 (found 4.3.4): ")
    assert "apt install python3-redis" in msg and "pip install --break-system-packages 'redis>=6.1'" in msg
    assert "\n" not in msg  # one journal line


# below 6.1: not run in full against the fleet's tests (Debian ships 4.3.4 and 6.1.0)
@pytest.mark.parametrize("old", ["6.0.0", "5.0.8", "4.3.4rc1", "3.5.3", "0", ""])
def test_every_older_or_unreadable_version_is_refused(old: str) -> None:
    msg = problem(old)
    assert msg is not None and f"(found {old})" in msg


def test_a_missing_client_names_the_package() -> None:
    msg = problem(None)
    assert msg is not None and "not installed" in msg and "apt install python3-redis" in msg
    assert f">= {'.'.join(map(str, MIN_REDIS))}" in msg and "nftblockd[fleet]" in msg


def _fake_client(site: Path, version: str) -> dict[str, str]:
    """A Python path on which the package metadata says redis `version` (what `apt install python3-redis`
    leaves on Debian 12), ahead of the real one."""
    info = site / f"redis-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: redis\nVersion: {version}\n")
    return {"PYTHONPATH": f"{site}:{REPO}", "PATH": "/usr/bin:/bin"}


FLEET = "fleet:\n  name: prod\n  url: redis://127.0.0.1:1\nallowlist_self: false\n"


def test_check_config_and_start_refuse_an_old_client_in_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(FLEET)
    env = _fake_client(tmp_path / "site", "4.3.4")
    r = subprocess.run([sys.executable, "-m", "nftblockd.daemon.main", "--check-config", str(cfg)],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 1
    assert r.stderr.startswith(f"{cfg}:1: fleet: fleet mode needs python3-redis >= 6.1 (found 4.3.4): ")
    r = subprocess.run([sys.executable, "-m", "nftblockd.daemon.main", "--config", str(cfg)],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "fleet mode needs python3-redis >= 6.1 (found 4.3.4)" in r.stderr


def test_a_client_that_does_not_import_is_refused_in_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(FLEET)
    env = _fake_client(tmp_path / "site", "6.1.0")
    (tmp_path / "site" / "redis").mkdir()
    (tmp_path / "site" / "redis" / "__init__.py").write_text("import async_timeout_not_here\n")
    r = subprocess.run([sys.executable, "-m", "nftblockd.daemon.main", "--config", str(cfg)],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "fleet mode cannot import python3-redis 6.1.0 (No module named 'async_timeout_not_here')" in r.stderr


def test_without_a_fleet_the_client_is_not_asked(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("allowlist_self: false\n")
    r = subprocess.run([sys.executable, "-m", "nftblockd.daemon.main", "--check-config", str(cfg)],
                       capture_output=True, text=True, cwd=tmp_path, env=_fake_client(tmp_path / "site", "4.3.4"))
    assert r.returncode == 0, r.stderr
