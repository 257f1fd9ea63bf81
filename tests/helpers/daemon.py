"""Run the real nftblockd in a test's network namespace and talk to it like an operator would.

The daemon gets a NOTIFY_SOCKET owned by the test, so "started" means it sent READY=1 (after table, sets and
saved bans were in place), not that some time has passed. The control socket lives in the test's tmp dir:
UNIX sockets are filesystem objects, so the CLI reaches it from outside the namespace.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.helpers.netns import NetNS, inside

REPO = Path(__file__).resolve().parents[2]


def scrape(ns: NetNS, port: int) -> str:
    """One scrape of the metrics endpoint a daemon in `ns` listens on at 127.0.0.1:`port` (the connection is
    made inside the namespace; the socket keeps working from outside it)."""
    with inside(ns):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.connect()
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    conn.close()
    return body


class DaemonProc:
    def __init__(self, ns: NetNS, workdir: Path, config: str, *, extra_args: tuple[str, ...] = ()) -> None:
        self.ns = ns
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.socket = str(self.dir / "control.sock")
        self.state_dir = str(self.dir / "state")
        self.config_path = self.dir / "nftblockd.yaml"
        self.config_path.write_text(config)
        self.log_path = self.dir / "daemon.log"
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.notify_path = str(self.dir / "notify.sock")
        self.notify: socket.socket | None = None
        self.messages: list[str] = []

    def start(self, timeout: float = 30.0) -> DaemonProc:
        if self.notify is None:
            self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.notify.bind(self.notify_path)
        env = dict(os.environ, NOTIFY_SOCKET=self.notify_path, PYTHONPATH=str(REPO))
        env.pop("INVOCATION_ID", None)
        env.pop("JOURNAL_STREAM", None)
        log = open(self.log_path, "ab")  # noqa: SIM115 (handed to the child, closed right after)
        self.proc = self.ns.popen(sys.executable, "-m", "nftblockd.daemon.main", "--config", str(self.config_path),
                                  "--socket", self.socket, "--state-dir", self.state_dir, *self.extra_args,
                                  stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        self.wait_notify("READY=1", timeout)
        return self

    def wait_notify(self, what: str, timeout: float = 30.0) -> str:
        assert self.notify is not None
        deadline = time.monotonic() + timeout
        while True:
            for m in self.messages:
                if what in m.split("\n"):
                    self.messages.remove(m)
                    return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"daemon did not send {what} within {timeout}s; log:\n{self.log()}")
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}; log:\n{self.log()}")
            self.notify.settimeout(min(left, 0.5))
            with contextlib.suppress(TimeoutError):
                self.messages.append(self.notify.recv(4096).decode())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def cli(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        return subprocess.run([sys.executable, "-m", "nftblockd.cli.main", "--socket", self.socket, *args],
                              capture_output=True, text=True, input=input, env=env, timeout=120)

    def cli_json(self, *args: str, ok: tuple[int, ...] = (0,)) -> Any:
        """The CLI's JSON answer; `ok` the exit codes that still carry one (`status` exits 3 when degraded)."""
        r = self.cli("--json", *args)
        assert r.returncode in ok, r.stderr
        return json.loads(r.stdout)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        return rc

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        if self.notify is not None:
            self.notify.close()
            self.notify = None
