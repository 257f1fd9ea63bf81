"""Real `redis-server` processes (and Sentinels) for fleet tests, on free loopback ports with temporary dirs.

Never port 6379 or 26379: on a machine where the Debian package started its own server, that one is the
operator's. Every process is a child of the test, started with its own config file and killed by its PID.
Readiness is polled with a bound (a TCP connect, then PING), never slept for.

    srv = RedisServer(tmp_path / "r1").start()
    url = srv.url
    srv.kill()                    # SIGKILL, as a crash
    srv.start(wipe=True)          # same port, empty data: a server that lost everything
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.netns import NetNS, inside

RESERVED = {6379, 26379}


def free_port() -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in RESERVED:
            return port


def _ping(port: int, tls: bool, host: str = "127.0.0.1", ns: NetNS | None = None) -> bool:
    try:
        if ns is None:
            conn = socket.create_connection((host, port), timeout=0.5)
        else:
            with inside(ns):  # the socket lives in the namespace it was made in
                conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            conn.settimeout(0.5)
            try:
                conn.connect((host, port))
            except OSError:
                conn.close()
                raise
        with conn as s:
            if tls:
                return True  # a TLS port answers PING only after a handshake; an open port is enough
            s.sendall(b"PING\r\n")
            reply = s.recv(64)
            return reply.startswith((b"+PONG", b"-NOAUTH", b"-LOADING")) and not reply.startswith(b"-LOADING")
    except OSError:
        return False


class RedisServer:
    """One redis-server (or Sentinel, `sentinel=True`) child process."""

    def __init__(self, directory: Path, *, port: int | None = None, conf: str = "", tls_port: bool = False,
                 sentinel: bool = False, ns: NetNS | None = None, bind: str = "127.0.0.1") -> None:
        self.ns = ns  # run inside this network namespace (its hosts reach it over veth pairs)
        self.bind = bind
        self.dir = directory
        self.port = port or free_port()
        self.conf = conf
        self.tls_port = tls_port  # `port` is a TLS port (plain port 0)
        self.sentinel = sentinel
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls_port else 'redis'}://127.0.0.1:{self.port}/0"

    def _write_conf(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / ("sentinel.conf" if self.sentinel else "redis.conf")
        lines = [f"bind {self.bind}", f"dir {self.dir}", "daemonize no", f"logfile {self.dir / 'log'}",
                 "protected-mode no"]
        if self.tls_port:
            lines += ["port 0", f"tls-port {self.port}"]
        else:
            lines.append(f"port {self.port}")
        if not self.sentinel:
            lines += ['save ""', "appendonly no"]
        path.write_text("\n".join(lines) + "\n" + self.conf + "\n")
        return path

    def start(self, *, wipe: bool = False, limit: float = 10.0) -> RedisServer:
        if wipe:
            for p in self.dir.glob("*"):
                if p.name not in ("log",) and not p.name.endswith(".conf"):
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
        conf = self.dir / ("sentinel.conf" if self.sentinel else "redis.conf")
        if not (self.sentinel and conf.exists()):  # a Sentinel rewrites its file with what it learnt: keep it
            conf = self._write_conf()
        args = ["redis-server", str(conf)] + (["--sentinel"] if self.sentinel else [])
        if self.ns is not None:
            self.proc = self.ns.popen(*args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + limit
        host = "127.0.0.1" if self.bind in ("0.0.0.0", "*") else self.bind.split()[0]
        while not _ping(self.port, self.tls_port, host, self.ns):
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited {self.proc.returncode}: {self.log()[-2000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server on {self.port} not ready in {limit}s: {self.log()[-2000:]}")
            time.sleep(0.01)
        return self

    def log(self) -> str:
        try:
            return (self.dir / "log").read_text(errors="replace")
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)
            self.proc.wait(10)
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def redis_available() -> bool:
    return shutil.which("redis-server") is not None


# -- fixtures for the client-level fleet tests (imported by name into their modules) --------------------


@pytest.fixture(name="server")
def plain_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own on a free loopback port, killed after it."""
    srv = RedisServer(tmp_path / "redis").start()
    try:
        yield srv
    finally:
        srv.kill()


@pytest.fixture
def connections_left_open_fail_their_own_test() -> Iterator[None]:
    """Finalise what the test dropped before the next one starts: a client connection it left open warns
    (ResourceWarning, an error here) in this test's teardown, not in the session's last garbage collection,
    where CI once reported one that nobody could attribute. Modules make it autouse."""
    yield
    gc.collect()


# -- the ACL docs/fleet.md documents (schema 2), as the fleet tests create their users -----------------

HOST_COMMANDS = ("+ping", "+hello", "+info", "+role", "+time", "+multi", "+exec", "+discard", "+client|setname",
                 "+xread", "+xrange", "+xinfo|stream", "+scan", "+exists", "+zrange", "+zmscore", "+zcount",
                 "+get", "+xadd", "+zadd", "+zrem", "+zremrangebyscore", "+set", "+del", "+publish",
                 "+subscribe", "+unsubscribe")


def host_acl(fleet: str, host: str, password: str) -> list[str]:
    """`ACL SETUSER <host> ...`'s arguments for one member: every fleet key read-only, its own keys writable,
    nothing else (docs/fleet.md, "ACL")."""
    return [host, "reset", "on", f">{password}", "resetkeys", "resetchannels", f"&nftblock:{{{fleet}}}:bell",
            f"%R~nftblock:{{{fleet}}}:*",
            f"~nftblock:{{{fleet}}}:h:{host}:*", "-@all", *HOST_COMMANDS]


def operator_acl(fleet: str, user: str, password: str) -> list[str]:
    """The operator role: every fleet key writable (its unbans lift any host's bans, docs/fleet.md)."""
    return [user, "reset", "on", f">{password}", "resetkeys", "resetchannels", f"&nftblock:{{{fleet}}}:bell",
            f"~nftblock:{{{fleet}}}:*", "-@all",
            *HOST_COMMANDS, "+zrem", "+xtrim"]
