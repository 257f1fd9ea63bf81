"""Every jail `nftblock import-fail2ban-config` writes matches what fail2ban itself matches: for each scenario
of tests/unit/test_f2bmigrate.py, each jail's filter spec is run over a sample log by `nftblock test-filter`
and by fail2ban's `fail2ban-regex`, and the addresses they would ban must be the same, in the same order."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from nftblockd.detect.testfilter import run
from nftblockd.migrate.f2bjail import plan_migration
from nftblockd.migrate.host import FsHost, read_jails

DATA = Path(__file__).resolve().parents[1] / "data" / "fail2ban"
LOGS = {"sshd": "sshd.log", "nginx_http_auth": "nginx-error.log", "postfix": "mail.log", "myapp": "myapp.log"}

pytestmark = pytest.mark.skipif(shutil.which("fail2ban-regex") is None, reason="fail2ban-regex is not installed")


def _ours(spec: str, log: Path) -> list[str]:
    out = io.StringIO()
    assert run(spec, str(log), json_output=True, out=out, now=1_800_000_000.0, err=io.StringIO()) == 0
    return [m["host"] for m in json.loads(out.getvalue())["matches"]]


def _fail2ban(spec: str, log: Path) -> list[str]:
    p = subprocess.run(["fail2ban-regex", "--out", "ip", str(log), spec], capture_output=True, text=True,
                       timeout=120, check=True)
    return [line.strip() for line in p.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("scenario", ["sshd_only", "web_mail", "custom", "actions"])
def test_each_jail_matches_what_fail2ban_regex_matches(tmp_path: Path, scenario: str) -> None:
    etc = tmp_path / "fail2ban"
    shutil.copytree(DATA / "debian", etc)
    shutil.copytree(DATA / "scenarios" / scenario, etc, dirs_exist_ok=True)
    m = plan_migration(read_jails(etc), str(etc), FsHost(etc, unit_dirs=()))
    compared = 0
    for jail in m.jails:
        if jail.recidive:
            continue  # no filter: nftblockd counts the other jails' bans
        log = DATA / "logs" / LOGS[jail.name]
        ours = _ours(jail.filter, log)
        assert ours, f"{jail.name}: the sample log should hold failures"
        assert ours == _fail2ban(jail.filter, log), jail.filter
        compared += 1
    assert compared >= 1
