"""A Debian container (13 trixie or 12 bookworm) with systemd as PID 1, driven through tests/systemd/harness.sh.

`rootfs(suite)` builds (once) or finds the harness's cached tree of a release, with `extra` packages a test
needs on top (part of the cache key). `Container(bind, suite=...).boot()` starts one on that tree
(throw-away: every write goes to a tmpfs overlay), `run()` executes a command inside as root, `show()` reads
unit properties the way an operator's `systemctl show` does, and `wait_for()` polls a condition with a bound.
Nothing here touches the host beyond the harness's cache and cgroup: the container has its own network
namespace with only `lo`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "systemd" / "harness.sh"
T = TypeVar("T")
# The releases the package supports, the current stable first (what a new server gets).
SUITES = ("trixie", "bookworm")


def harness_env(suite: str, extra: Sequence[str] = ()) -> dict[str, str]:
    if suite not in SUITES:
        raise ValueError(f"suite {suite!r}: one of {', '.join(SUITES)}")
    return dict(os.environ, NFTBLOCKD_TEST_SUITE=suite, NFTBLOCKD_TEST_EXTRA=" ".join(extra))


def unavailable() -> str | None:
    """Why this machine cannot boot the container (None: it can). Missing tools are not a reason to skip
    under `make test`, which installs them; only a non-root run is."""
    if os.geteuid() != 0:
        return "needs root (systemd-nspawn, cgroups, mmdebstrap)"
    if os.environ.get("NFTBLOCKD_TEST_SYSTEMD") == "skip":
        return "NFTBLOCKD_TEST_SYSTEMD=skip"
    return None


def rootfs(suite: str, extra: Sequence[str] = ()) -> Path:
    """The cached rootfs of `suite` with `extra` packages, built on first use (a minute or two, network
    needed then only)."""
    proc = subprocess.run(["bash", str(HARNESS), "rootfs"], capture_output=True, text=True, check=False,
                          env=harness_env(suite, extra))
    if proc.returncode != 0:
        raise RuntimeError(f"building the {suite} container rootfs failed:\n{proc.stderr}")
    return Path(proc.stdout.strip())


def rootfs_all(suites: Sequence[str] = SUITES, extra: Sequence[str] = ()) -> dict[str, Path]:
    """`rootfs()` of several suites, built side by side: on a fresh machine (CI) the builds wait on the
    network and dpkg more than on the CPU, so two take little longer than one."""
    procs = {s: subprocess.Popen(["bash", str(HARNESS), "rootfs"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=harness_env(s, extra)) for s in suites}
    done = {s: p.communicate() for s, p in procs.items()}
    failed = [f"{s}:\n{err}" for s, (_out, err) in done.items() if procs[s].returncode != 0]
    if failed:
        raise RuntimeError("building the container rootfs failed for " + "\n".join(failed))
    return {s: Path(out.strip()) for s, (out, _err) in done.items()}


class Container:
    def __init__(self, bind: Path, suite: str, prefix: str = "nbt",
                 extra: Sequence[str] = ()) -> None:
        self.env = harness_env(suite, extra)
        self.suite = suite
        self.name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.bind = bind  # host directory seen read-only at /srv/test inside

    def boot(self) -> Container:
        proc = subprocess.run(["bash", str(HARNESS), "boot", self.name, str(self.bind)], capture_output=True,
                              text=True, check=False, env=self.env)
        if proc.returncode != 0:
            self.stop()
            raise RuntimeError(f"booting {self.name} failed:\n{proc.stderr}")
        return self

    def stop(self) -> None:
        subprocess.run(["bash", str(HARNESS), "stop", self.name], capture_output=True, check=False)

    def run(self, *cmd: str, check: bool = True, input: str | None = None,
            timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["bash", str(HARNESS), "run", self.name, *cmd], capture_output=True, text=True,
                              input=input, check=False, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"`{shlex.join(cmd)}` in {self.name} exited {proc.returncode}:\n"
                                 f"{proc.stdout}{proc.stderr}")
        return proc

    def sh(self, script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("sh", "-ec", script, check=check)

    def write(self, path: str, text: str) -> None:
        self.run("sh", "-ec", f'mkdir -p "$(dirname {shlex.quote(path)})" && cat > {shlex.quote(path)}',
                 input=text)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.run("systemctl", "show", unit, *(f"--property={p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, unit: str, *args: str) -> str:
        return self.run("journalctl", "--no-pager", "-b", "-u", unit, *args).stdout

    def peer_netns(self, ns: str, local: str, remote: Sequence[str], prefix: int = 24) -> None:
        """A network namespace `ns` inside the container behind a veth pair: the container's end holds
        `local`, the namespace's end the `remote` addresses. A server started there (`ip netns exec NS`) is
        on another host as far as the unit's IPAddressAllow= is concerned: not loopback, not this host's
        own address. (The host kernel may have no `dummy` module; veth is always there.)"""
        dev = f"v-{ns}"[:15]
        script = [f"ip netns add {ns}", f"ip link add {dev} type veth peer name eth0 netns {ns}",
                  f"ip address add {local}/{prefix} dev {dev}", f"ip link set {dev} up",
                  f"ip -n {ns} link set eth0 up", f"ip -n {ns} link set lo up",
                  *(f"ip -n {ns} address add {a}/{prefix} dev eth0" for a in remote)]
        self.sh("\n".join(script))

    def wait_for(self, check: Callable[[], T | None], what: str, bound: float = 60.0,
                 interval: float = 0.1) -> T:
        """Poll `check` until it returns something other than None/False; fail after `bound` seconds."""
        deadline = time.monotonic() + bound
        while True:
            value = check()
            if value is not None and value is not False:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: {what} not reached within {bound:g}s")
            time.sleep(interval)


def copy_into_bind(bind: Path, *files: Path) -> None:
    bind.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy2(f, bind / f.name)


# What the real-systemd tier measured per release (install time, start to READY, the stock start's journal),
# kept on the pytest config for tests/systemd/conftest.py to print and save at the end of the run.
RECORDS_KEY = pytest.StashKey[dict[str, dict[str, object]]]()


def records(config: pytest.Config) -> dict[str, dict[str, object]]:
    return config.stash.setdefault(RECORDS_KEY, {})
