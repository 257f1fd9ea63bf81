"""A real systemd-journald for tests, in a private mount namespace, with its sockets and files in a tmp dir.

What works here (Debian 12, systemd 252, systemd not PID 1, as root), and why each step is there:

1. `unshare --mount --propagation private` gives journald a mount table of its own: nothing it does lands in
   the host's /run, and everything disappears with the process.
2. Inside it: a tmpfs on /run, then two bind mounts from the test's tmp dir:
   `<root>/sockets` on /run/systemd/journal — not socket-activated, journald binds its sockets itself there:
   `socket` (native protocol), `stdout`, `dev-log` (syslog), `io.systemd.journal` (varlink), and later the
   `synced` and `rotated` flag files; and `<root>/journal` on /run/log/journal, where volatile storage puts
   `<machine-id>/system.journal` (and archived `system@….journal` files after a rotation).
3. A drop-in `/run/systemd/journald.conf.d/test.conf`: Storage=volatile (persistent storage would wait for a
   flush request from systemd-journal-flush.service), ReadKMsg=no (no kernel ring buffer), no forwarding,
   no rate limit; tests can add settings (`conf=`). SYSTEMD_LOG_TARGET=console keeps journald's own log on
   its stderr instead of /dev/kmsg.
4. Writing: datagrams in journald's native protocol (`FIELD=value\\n`, or `FIELD\\n<le64 size><bytes>\\n` for
   values with newlines or binary data) sent to `<root>/sockets/socket`. That is what `sd_journal_send()`
   does, but libsystemd hard-codes /run/systemd/journal/socket; a UNIX socket path works from any mount
   namespace because the inode lives in the host's tmp dir. (`systemd-cat` and `logger --journald` work
   too when run under `nsenter --mount=/proc/<journald pid>/ns/mnt`.)
5. Trusted fields: journald derives `_SYSTEMD_UNIT` from the sender's /proc/<pid>/cgroup. A sender process
   that moved itself into a cgroup named `<unit>` in the cgroup2 hierarchy gets `_SYSTEMD_UNIT=<unit>`
   (`send_as_unit`; the cgroup is removed afterwards).
6. Control without PID 1 (`journalctl --sync/--rotate` would ask systemd over D-Bus): SIGRTMIN+1 makes
   journald write out everything received so far — it handles the signal after pending datagrams — and touch
   `synced`; SIGUSR2 rotates (archives system.journal, opens a new one) and touches `rotated`.
7. Reading: `systemd.journal.Reader(path=<root>/journal)` (sd_journal_open_directory finds the machine-id
   subdirectory). `journalctl -D <root>/journal` works for eyeballing.
"""

from __future__ import annotations

import os
import signal
import socket as socketlib
import struct
import subprocess
import sys
import uuid
from pathlib import Path

from tests.helpers.sources import wait_for_condition

_MOUNT_AND_EXEC = r"""
set -e
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/systemd/journal /run/log/journal /run/systemd/journald.conf.d
mount --bind "$1" /run/systemd/journal
mount --bind "$2" /run/log/journal
cp "$3" /run/systemd/journald.conf.d/test.conf
exec "$4"
"""

_BASE_CONF = {
    "Storage": "volatile",
    "ReadKMsg": "no",
    "ForwardToSyslog": "no",
    "ForwardToKMsg": "no",
    "ForwardToConsole": "no",
    "ForwardToWall": "no",
    "RateLimitIntervalSec": "0",
    "RateLimitBurst": "0",
}

# A sender that joins a cgroup (so journald attributes it to a unit), sends one datagram, then waits for
# its stdin to close: journald reads /proc/<pid>/cgroup when it handles the datagram, so it must be alive.
_UNIT_SENDER = r"""
import os, socket, sys
open(sys.argv[1], "w").write(str(os.getpid()))
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(sys.stdin.buffer.read(int(sys.argv[3])), sys.argv[2])
sys.stdout.write("sent\n"); sys.stdout.flush()
sys.stdin.read()
"""


def skip_reason() -> str | None:
    """Why the real journald cannot be used here, or None. Only a missing root is a reason to skip."""
    if os.geteuid() != 0:
        return "needs root: journald runs in a private mount namespace"
    return None


def journald_binary() -> str:
    for p in ("/lib/systemd/systemd-journald", "/usr/lib/systemd/systemd-journald"):
        if os.access(p, os.X_OK):
            return p
    raise RuntimeError("systemd-journald not found: install systemd (make deps)")


def native_datagram(fields: dict[str, str | bytes]) -> bytes:
    out = bytearray()
    for key, value in fields.items():
        v = value.encode() if isinstance(value, str) else value
        if b"\n" in v:
            out += key.encode() + b"\n" + struct.pack("<Q", len(v)) + v + b"\n"
        else:
            out += key.encode() + b"=" + v + b"\n"
    return bytes(out)


def _cgroup2_root() -> Path | None:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "cgroup2":
                return Path(left.split()[4])
    return None


class Journald:
    """One journald process; `journal_dir` is what a Reader opens, `socket` is where entries are sent."""

    def __init__(self, root: Path, conf: dict[str, str] | None = None) -> None:
        self.root = root
        self.sockets = root / "sockets"
        self.journal_dir = root / "journal"
        self.socket = self.sockets / "socket"
        self.conf = {**_BASE_CONF, **(conf or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self._sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_DGRAM)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self) -> Journald:
        proc = self._spawn()
        await wait_for_condition(lambda: self.socket.exists() or proc.poll() is not None, 10,
                                 "journald's socket")
        if proc.poll() is not None:
            raise RuntimeError(f"journald exited: {(self.root / 'journald.log').read_text()}")
        await wait_for_condition(lambda: list(self.journal_dir.glob("*/system.journal")), 10,
                                 "system.journal")
        # The file exists from journald's open(O_CREAT) on, before its header is written: sd-journal refuses
        # a file shorter than a header with ENODATA, which `Reader(files=...)` (unlike a directory, which
        # skips such a file) passes on. journald creates system.journal before its event loop runs, and it
        # handles the sync signal in that loop: once `synced` appears, the header is on disk.
        await self.sync()
        return self

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.sockets.mkdir(parents=True, exist_ok=True)
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        conf = self.root / "journald.conf"
        conf.write_text("[Journal]\n" + "".join(f"{k}={v}\n" for k, v in self.conf.items()))
        env = {**os.environ, "SYSTEMD_LOG_TARGET": "console", "SYSTEMD_LOG_LEVEL": "info"}
        with open(self.root / "journald.log", "wb") as log:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNT_AND_EXEC, "sh",
                 str(self.sockets), str(self.journal_dir), str(conf), journald_binary()],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        return self.proc

    def send(self, message: str | bytes | None, **fields: str | bytes) -> None:
        """One entry through the native socket (binary-safe). `message=None` sends no MESSAGE field."""
        if message is not None:
            fields = {"MESSAGE": message, **fields}
        self._sock.sendto(native_datagram(fields), str(self.socket))

    async def sync(self) -> None:
        """Return once journald has written every entry sent before the call."""
        await self._signal_and_wait(signal.SIGRTMIN + 1, self.sockets / "synced")

    async def rotate(self) -> None:
        """Archive system.journal and start a new one (what `journalctl --rotate` asks for)."""
        await self._signal_and_wait(signal.SIGUSR2, self.sockets / "rotated")

    def archived(self) -> list[Path]:
        return sorted(self.journal_dir.glob("*/system@*.journal"))

    def vacuum(self) -> list[Path]:
        """Delete every archived journal file (what `journalctl --vacuum-files=1` does); return them."""
        gone = self.archived()
        for p in gone:
            p.unlink()
        return gone

    async def send_as_unit(self, unit: str, message: str, **fields: str) -> None:
        """Send from a process in cgroup `unit`, so that journald records `_SYSTEMD_UNIT=<unit>`."""
        child, cg = self._unit_sender(unit, native_datagram({"MESSAGE": message, **fields}))
        try:
            await self.sync()  # journald has handled the datagram (and read the cgroup) once this returns
        finally:
            self._reap(child, cg)

    def _unit_sender(self, unit: str, data: bytes) -> tuple[subprocess.Popen[bytes], Path]:
        root = _cgroup2_root()
        if root is None:
            raise RuntimeError("no cgroup2 hierarchy mounted: cannot attribute a sender to a unit")
        cg = root / unit
        cg.mkdir()
        child = subprocess.Popen(
            [sys.executable, "-c", _UNIT_SENDER, str(cg / "cgroup.procs"), str(self.socket), str(len(data))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(data)
        child.stdin.flush()
        if child.stdout.readline() != b"sent\n":
            self._reap(child, cg)
            raise RuntimeError("the unit sender failed")
        return child, cg

    @staticmethod
    def _reap(child: subprocess.Popen[bytes], cg: Path) -> None:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.close()
        child.wait(10)
        child.stdout.close()
        cg.rmdir()

    async def _signal_and_wait(self, sig: int, flag: Path) -> None:
        # journald creates the flag file when done; removing it first beats coarse tmpfs timestamps.
        self._signal(sig, flag)
        await wait_for_condition(flag.exists, 10, f"journald to create {flag.name}")

    def _signal(self, sig: int, flag: Path) -> None:
        flag.unlink(missing_ok=True)
        os.kill(self.pid, sig)

    def stop(self) -> None:
        self._sock.close()
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def unit_name() -> str:
    return f"nftblockd-test-{uuid.uuid4().hex[:12]}.service"


__all__ = ["Journald", "native_datagram", "skip_reason", "unit_name"]
