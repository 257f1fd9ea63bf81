"""A real fail2ban-server (Debian's) with nftblockd's actions, next to the real daemon.

fail2ban detects (its own sshd filter on a log file we append to); its ban action talks to nftblockd's
control socket (in-process action) or runs `nftblock` (shell action; the script the package installs, made
for this checkout by packaging/entry-script.sh); the address must end up in nftblockd's kernel set with the
jail's name in the audit log, fail2ban's unban must remove it, and stopping fail2ban must keep the others.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.daemon import REPO, DaemonProc
from tests.helpers.netns import NetNS, wait_for
from tests.helpers.package import write_entry_script

pytestmark = pytest.mark.skipif(shutil.which("fail2ban-server") is None, reason="fail2ban is not installed")


def f2b_conf(root: Path, log: Path, socket: str, action: str) -> Path:
    conf = root / "f2b"
    (conf / "action.d").mkdir(parents=True)
    shutil.copy(REPO / "packaging" / "fail2ban" / "action.d" / "nftblock.py", conf / "action.d")
    shutil.copy(REPO / "packaging" / "fail2ban" / "action.d" / "nftblock.conf", conf / "action.d")
    (conf / "filter.d").symlink_to("/etc/fail2ban/filter.d")
    (conf / "fail2ban.conf").write_text(f"""[Definition]
loglevel = INFO
logtarget = {root / "f2b.log"}
socket = {root / "f2b.sock"}
pidfile = {root / "f2b.pid"}
dbfile = {root / "f2b.sqlite3"}
""")
    (conf / "jail.conf").write_text(f"""[DEFAULT]
backend = polling
[sshd]
enabled = true
filter = sshd
logpath = {log}
maxretry = 3
findtime = 600
bantime = 600
action = {action}
""")
    return conf


def f2b(conf: Path, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["fail2ban-client", "-c", str(conf), "-s", str(root / "f2b.sock"), *args],
                          capture_output=True, text=True, timeout=60)


def fails(addr: str, n: int) -> str:
    stamp = time.strftime("%b %e %H:%M:%S")
    return "".join(f"{stamp} host sshd[{3000 + i}]: Failed password for invalid user bob from {addr} port "
                   f"{5000 + i} ssh2\n" for i in range(n))


@pytest.mark.parametrize("kind", ["python", "command"])
def test_fail2ban_bans_land_in_nftblockd_and_unbans_remove_them(netns: NetNS, tmp_path: Path, kind: str) -> None:
    d = DaemonProc(netns, tmp_path / "d", "reconcile: {interval: 1h}\n").start()
    log = tmp_path / "auth.log"
    log.write_text("")
    action = f"nftblock.py[socket={d.socket}, set=default]" if kind == "python" else \
        f"nftblock[nftblock_socket={d.socket}]"
    conf = f2b_conf(tmp_path, log, d.socket, action)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    write_entry_script(bindir, "nftblock")
    env_path = f"{bindir}:/usr/sbin:/usr/bin:/sbin:/bin"
    server = netns.popen("env", f"PATH={env_path}", "fail2ban-server", "-f",
                         "-x", "-c", str(conf), "-s", str(tmp_path / "f2b.sock"), "-p", str(tmp_path / "f2b.pid"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: f2b(conf, tmp_path, "status", "sshd").returncode == 0, timeout=60,
                 what="fail2ban-server up")
        with log.open("a") as f:
            f.write(fails("198.51.100.77", 3))
        wait_for(lambda: "198.51.100.77" in netns.set_elements("nftblock", "default_ip4"), timeout=30,
                 what=f"fail2ban's ban in nftblockd's set; fail2ban log:\n{_log(tmp_path)}")
        ban = {b["target"]: b for b in d.cli_json("list")["bans"]}["198.51.100.77"]
        assert 500 < ban["expires_in"] <= 600  # fail2ban's bantime became the kernel timeout
        with log.open("a") as f:
            f.write(fails("198.51.100.78", 3))
        wait_for(lambda: "198.51.100.78" in netns.set_elements("nftblock", "default_ip4"), timeout=30,
                 what="the second ban")
        r = f2b(conf, tmp_path, "set", "sshd", "unbanip", "198.51.100.77")
        assert r.returncode == 0, r.stderr
        wait_for(lambda: "198.51.100.77" not in netns.set_elements("nftblock", "default_ip4"), timeout=30,
                 what="fail2ban's unban")
        audit = [line for line in d.log().splitlines() if "address=198.51.100.77" in line]
        assert any(" ban jail=sshd " in line for line in audit), audit
        assert any(" unban jail=sshd " in line for line in audit), audit
        # Stopping fail2ban leaves its bans in nftblockd (the default of both actions), in one call.
        r = f2b(conf, tmp_path, "stop")
        assert r.returncode == 0, r.stderr
        server.wait(30)
        assert "198.51.100.78" in netns.set_elements("nftblock", "default_ip4")
        assert "198.51.100.78" in {b["target"] for b in d.cli_json("list")["bans"]}
    finally:
        f2b(conf, tmp_path, "stop")
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        d.close()


def _log(root: Path) -> str:
    p = root / "f2b.log"
    return p.read_text()[-3000:] if p.exists() else "(no log)"
