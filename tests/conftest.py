from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.helpers.journald import Journald, skip_reason
from tests.helpers.netns import NetNS

# Hypothesis' deadline (200 ms per example) and its too-slow health check are wall-clock limits inside unit
# tests: on a loaded 2-core machine they failed properties that hold (test_metrics, test_restore). What a
# property checks is correctness; speed is measured by `make bench`.
settings.register_profile("nftblockd", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("nftblockd")


def _kernel_ok() -> str | None:
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) for network namespaces"
    if not shutil.which("nft") or not shutil.which("ip"):
        return "needs nft and ip (make deps)"
    return None


@pytest.fixture
def netns() -> Iterator[NetNS]:
    reason = _kernel_ok()
    if reason:
        pytest.skip(reason)
    ns = NetNS()
    try:
        yield ns
    finally:
        ns.delete()


@pytest.fixture
async def jd(tmp_path: Path) -> AsyncIterator[Journald]:
    """A real systemd-journald of the test's own (tests/helpers/journald.py), stopped afterwards."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    j = Journald(tmp_path / "jd")
    try:
        yield await j.start()
    finally:
        j.stop()


@pytest.fixture(scope="session")
def built_deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package as `make deb` builds it, once per test session (the packaging, lintian and real-systemd
    tests share it)."""
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed")
    root = Path(__file__).resolve().parents[1]
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, OUT_DIR=str(out), PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(root / "packaging" / "build-deb.sh")], env=env, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    debs = list(out.glob("nftblockd_*.deb"))
    assert len(debs) == 1, proc.stdout
    return debs[0]
