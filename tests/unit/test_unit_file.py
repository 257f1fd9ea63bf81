"""systemd/nftblockd.service: `systemd-analyze verify` is clean, the exposure score stays ≤ 2.0, and the
paths it creates are the ones nftblockd's config defaults use.

systemd is not PID 1 here, so the unit cannot actually be started; these tests check the file, and the MDWE
test checks that the Python runtime copes with MemoryDenyWriteExecute= (the kernel's PR_SET_MDWE is the
same policy).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest

from nftblockd.config import Config

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "nftblockd.service"
FEEDS_DROPIN = ROOT / "packaging" / "debian" / "examples" / "feeds.conf"
MAX_EXPOSURE = 2.0

analyze = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(analyze is None, reason="systemd-analyze is not installed")


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections → key → every value in order (systemd allows repeated keys)."""
    out: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out[section][key.strip()].append(value.strip())
    return out


UNIT_TEXT = UNIT.read_text()
SERVICE = parse_unit(UNIT_TEXT)["Service"]


def one(key: str) -> str:
    values = SERVICE[key]
    assert len(values) == 1, f"{key} is set {len(values)} times"
    return values[0]


def checkable_copy(tmp_path: Path, *, dropin: Path | None = None) -> Path:
    """The unit with /usr/bin/nftblockd and nftblock (not installed here) replaced by /usr/bin/true, since verify checks
    that each Exec*= command exists; everything else is unchanged."""
    true = shutil.which("true")
    assert true, "no `true` binary"
    unit = tmp_path / "nftblockd.service"
    unit.write_text(re.sub(r"=/usr/bin/nftblockd? ", f"={true} ", UNIT_TEXT))
    if dropin is not None:
        (tmp_path / "nftblockd.service.d").mkdir()
        shutil.copy(dropin, tmp_path / "nftblockd.service.d" / dropin.name)
    return unit


def run_analyze(*args: str) -> subprocess.CompletedProcess[str]:
    assert analyze is not None
    return subprocess.run([analyze, *args], capture_output=True, text=True, check=False)


def verify_output(unit: Path) -> str:
    """Everything `systemd-analyze verify` says. It exits 0 on unknown keys and unparsable values and only
    prints them, so any output at all is a finding."""
    proc = run_analyze("verify", "--man=no", str(unit))
    return proc.stdout + proc.stderr + (f"(exit status {proc.returncode})" if proc.returncode else "")


def exposure(unit: Path) -> float:
    proc = run_analyze("security", "--offline=true", "--no-pager", str(unit))
    m = re.search(r"Overall exposure level for nftblockd\.service: (\d+\.\d+)", proc.stdout)
    assert m, proc.stdout + proc.stderr
    return float(m.group(1))


# -- systemd's own checks -----------------------------------------------------------------------------------

@needs_analyze
def test_systemd_analyze_verify_is_clean(tmp_path: Path) -> None:
    assert verify_output(checkable_copy(tmp_path)) == ""


@needs_analyze
def test_exposure_score_is_at_most_two(tmp_path: Path) -> None:
    assert exposure(checkable_copy(tmp_path)) <= MAX_EXPOSURE


@needs_analyze
def test_the_feeds_drop_in_is_valid_and_keeps_the_score(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "feeds").mkdir()
    plain = checkable_copy(tmp_path / "plain")
    with_feeds = checkable_copy(tmp_path / "feeds", dropin=FEEDS_DROPIN)
    assert verify_output(with_feeds) == ""
    assert exposure(plain) < exposure(with_feeds) <= MAX_EXPOSURE  # read, and still within the target


# -- what the daemon relies on -----------------------------------------------------------------------------

def test_service_lifecycle() -> None:
    assert one("Type") == "notify"  # READY=1 once table, sets and saved bans are in the kernel
    assert one("NotifyAccess") == "main"
    assert one("WatchdogSec") == "30s"
    assert one("ExecStart") == "/usr/bin/nftblockd --config /etc/nftblockd/nftblockd.yaml"
    # the daemon's own verdict, so that a refused reload fails `systemctl reload` (a SIGHUP cannot fail)
    assert SERVICE["ExecReload"] == ["/usr/bin/nftblock reload"]
    assert one("Restart") == "on-failure"


def test_directories_match_the_config_defaults() -> None:
    defaults = Config(file="<defaults>")
    assert one("StateDirectory") == "nftblockd" and one("StateDirectoryMode") == "0700"
    assert defaults.state_dir == "/var/lib/" + one("StateDirectory")
    assert one("RuntimeDirectory") == "nftblockd" and one("RuntimeDirectoryMode") == "0755"
    assert one("RuntimeDirectoryPreserve") == "no"
    assert str(Path(defaults.control.socket).parent) == "/run/" + one("RuntimeDirectory")
    assert one("ConfigurationDirectory") == "nftblockd"
    config_arg = one("ExecStart").split("--config ", 1)[1]
    assert str(Path(config_arg).parent) == "/etc/" + one("ConfigurationDirectory")


def test_privileges() -> None:
    assert one("User") == "nftblockd" and one("Group") == "nftblockd"
    assert set(one("SupplementaryGroups").split()) == {"adm", "systemd-journal"}  # logs and the journal
    assert one("CapabilityBoundingSet") == "CAP_NET_ADMIN"
    assert one("AmbientCapabilities") == "CAP_NET_ADMIN"
    assert one("NoNewPrivileges") == "yes"
    assert one("UMask") == "0077"
    assert set(one("RestrictAddressFamilies").split()) == {"AF_UNIX", "AF_NETLINK", "AF_INET", "AF_INET6"}


@pytest.mark.parametrize(("key", "value"), [
    ("ProtectSystem", "strict"), ("ProtectHome", "yes"), ("PrivateTmp", "yes"), ("PrivateDevices", "yes"),
    ("DevicePolicy", "closed"), ("ProtectKernelTunables", "yes"), ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"), ("ProtectControlGroups", "yes"), ("ProtectClock", "yes"),
    ("ProtectHostname", "yes"), ("ProtectProc", "invisible"), ("ProcSubset", "pid"),
    ("RestrictNamespaces", "yes"), ("RestrictRealtime", "yes"), ("RestrictSUIDSGID", "yes"),
    ("LockPersonality", "yes"), ("MemoryDenyWriteExecute", "yes"), ("SystemCallArchitectures", "native"),
    ("SystemCallErrorNumber", "EPERM"), ("KeyringMode", "private"), ("IPAddressDeny", "any"),
    ("IPAddressAllow", "localhost"),
])
def test_hardening(key: str, value: str) -> None:
    assert one(key) == value


def test_system_call_filter_keeps_chown_for_the_control_socket_group() -> None:
    assert SERVICE["SystemCallFilter"] == ["@system-service", "~@privileged @resources", "@chown"]


# -- the runtime under MemoryDenyWriteExecute= -------------------------------------------------------------

MDWE_PROBE = textwrap.dedent("""
    import ctypes, mmap, sys
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
    if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        sys.exit(77)  # kernel older than 6.3
    try:
        mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        sys.exit("W+X memory was allowed: MDWE is not in force")
    except OSError:
        pass
    import asyncio, hashlib, json, socket, sqlite3, ssl
    import asyncinotify, prometheus_client, yaml
    from systemd import journal
    import nftblockd.daemon.root, nftblockd.service.logsetup, nftblockd.service.sdnotify

    async def main():
        db = sqlite3.connect(":memory:")
        db.execute("create table t (x)")
        db.execute("insert into t values (1)")
        await asyncio.sleep(0)
        return db.execute("select x from t").fetchone()[0]

    assert asyncio.run(main()) == 1
    print("ok")
""")


def test_python_and_its_dependencies_run_with_memory_deny_write_execute() -> None:
    proc = subprocess.run([sys.executable, "-c", MDWE_PROBE], capture_output=True, text=True, check=False,
                          cwd=ROOT)
    if proc.returncode == 77:
        pytest.skip("the kernel has no PR_SET_MDWE (Linux < 6.3)")
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stdout + proc.stderr
