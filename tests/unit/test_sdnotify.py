"""sd_notify against a NOTIFY_SOCKET the test owns (a filesystem and an abstract AF_UNIX datagram socket).

Bounds (BOUND) only keep a broken test from hanging; nothing here asserts how fast something happens.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nftblockd.service.sdnotify import Notifier, monotonic_usec, watchdog_loop

BOUND = 30.0  # seconds; a safety net for a broken test, never a timing assertion


@pytest.fixture(params=["path", "abstract"])
def listener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket standing in for systemd, and the NOTIFY_SOCKET value that names it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    short_dir = None
    if request.param == "path":
        path = tmp_path / "notify"
        if len(str(path)) > 100:  # sun_path holds 108 bytes
            short_dir = tempfile.mkdtemp(prefix="nbd")
            path = Path(short_dir) / "notify"
        sock.bind(str(path))
        address = str(path)
    else:
        name = f"nftblockd-test-{uuid.uuid4().hex}"
        sock.bind("\0" + name)
        address = "@" + name
    sock.settimeout(BOUND)
    try:
        yield sock, address
    finally:
        sock.close()
        if short_dir:
            for p in Path(short_dir).iterdir():
                p.unlink()
            os.rmdir(short_dir)


def recv_fields(sock: socket.socket) -> dict[str, str]:
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.split("\n"))


def drain(sock: socket.socket) -> list[bytes]:
    """Everything already queued on the socket, without waiting for more."""
    timeout = sock.gettimeout()
    sock.setblocking(False)
    out = []
    try:
        while True:
            out.append(sock.recv(4096))
    except BlockingIOError:
        return out
    finally:
        sock.settimeout(timeout)


# -- environment ------------------------------------------------------------------------------------------

def test_without_notify_socket_every_call_is_a_no_op() -> None:
    n = Notifier.from_env({})
    assert not n.enabled
    assert n.ready("up") is False
    assert n.status("x") is False
    assert n.reloading() is False
    assert n.stopping() is False
    assert n.watchdog() is False
    assert n.watchdog_interval() is None


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    n = Notifier.from_env({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "30000000"})
    assert n.watchdog_interval() == 15.0


@pytest.mark.parametrize("env", [
    {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"},  # the watchdog belongs to another process
    {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "abc"},
    {"WATCHDOG_USEC": "0"},
    {"WATCHDOG_USEC": "-5"},
    {"WATCHDOG_USEC": "soon"},
    {},
])
def test_watchdog_is_off_unless_the_environment_gives_it_to_us(env: dict[str, str]) -> None:
    assert Notifier.from_env({"NOTIFY_SOCKET": "@x", **env}, pid=4242).watchdog_interval() is None


def test_watchdog_pid_matching_our_pid_enables_it() -> None:
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    assert Notifier.from_env(env).watchdog_interval() == 1.0


def test_a_non_unix_notify_socket_is_refused_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        n = Notifier.from_env({"NOTIFY_SOCKET": "vsock:2:1234"})
    assert not n.enabled
    assert "not a UNIX socket path" in caplog.text


# -- messages ---------------------------------------------------------------------------------------------

def test_ready_with_status(listener: tuple[socket.socket, str]) -> None:
    sock, address = listener
    n = Notifier.from_env({"NOTIFY_SOCKET": address})
    assert n.enabled
    assert n.ready("enforcing 3 blocklists") is True
    assert recv_fields(sock) == {"READY": "1", "STATUS": "enforcing 3 blocklists"}
    n.close()


def test_status_stopping_and_watchdog(listener: tuple[socket.socket, str]) -> None:
    sock, address = listener
    n = Notifier(address)
    n.status("reconciling")
    n.stopping()
    n.watchdog()
    n.stopping("leaving bans in place")
    assert recv_fields(sock) == {"STATUS": "reconciling"}
    assert recv_fields(sock) == {"STOPPING": "1"}
    assert recv_fields(sock) == {"WATCHDOG": "1"}
    assert recv_fields(sock) == {"STOPPING": "1", "STATUS": "leaving bans in place"}
    n.close()


def test_reloading_carries_monotonic_usec(listener: tuple[socket.socket, str]) -> None:
    sock, address = listener
    n = Notifier(address)
    before = monotonic_usec()
    n.reloading("reloading the config")
    after = monotonic_usec()
    fields = recv_fields(sock)
    assert fields["RELOADING"] == "1"
    assert before <= int(fields["MONOTONIC_USEC"]) <= after
    assert fields["STATUS"] == "reloading the config"
    n.close()


def test_extend_timeout(listener: tuple[socket.socket, str]) -> None:
    sock, address = listener
    n = Notifier(address)
    n.extend_timeout(90)
    assert recv_fields(sock) == {"EXTEND_TIMEOUT_USEC": "90000000"}
    n.close()


def test_a_status_text_cannot_inject_assignments(listener: tuple[socket.socket, str]) -> None:
    sock, address = listener
    n = Notifier(address)
    n.status("config /etc/x\nREADY=1\r\nMAINPID=1")
    assert recv_fields(sock) == {"STATUS": "config /etc/x READY=1 MAINPID=1"}
    n.close()


def test_a_vanished_socket_is_reported_once_and_never_raises(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    n = Notifier(str(tmp_path / "gone"))
    with caplog.at_level(logging.WARNING, logger="nftblockd.sdnotify"):
        assert n.ready() is False
        assert n.watchdog() is False
    assert caplog.text.count("cannot notify systemd") == 1
    n.close()


# -- the watchdog task ------------------------------------------------------------------------------------

class Waker:
    """Lets a test await "until this holds" without polling: whatever changes the state pokes it."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def poke(self) -> None:
        self._event.set()

    async def until(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(BOUND):
            while not predicate():
                self._event.clear()
                await self._event.wait()


class RecordingNotifier(Notifier):
    """The real notifier, also noting the event-loop time of each ping and waking the test."""

    def __init__(self, address: str, watchdog_usec: int) -> None:
        super().__init__(address, watchdog_usec=watchdog_usec)
        self.pings: list[float] = []
        self.waker = Waker()

    def watchdog(self) -> bool:
        self.pings.append(asyncio.get_running_loop().time())
        self.waker.poke()
        return super().watchdog()


async def test_watchdog_pings_arrive_at_half_the_watchdog_period(listener: tuple[socket.socket, str]) -> None:
    sock, address = listener
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    n = RecordingNotifier(address, watchdog_usec=40_000)  # pings every 20 ms
    stop = asyncio.Event()
    task = asyncio.create_task(watchdog_loop(n, stop, lambda: True))
    received: list[bytes] = []
    async with asyncio.timeout(BOUND):
        while len(received) < 6:
            received.append(await loop.sock_recv(sock, 4096))
    stop.set()
    async with asyncio.timeout(BOUND):
        await task
    assert set(received) == {b"WATCHDOG=1"}
    gaps = [b - a for a, b in zip(n.pings, n.pings[1:], strict=False)]
    # Never faster than the interval (a timer may fire a hair early, hence the 0.9).
    assert all(g >= 0.020 * 0.9 for g in gaps), gaps
    n.close()


async def test_stop_event_ends_the_loop_without_waiting_for_the_next_ping(
        listener: tuple[socket.socket, str]) -> None:
    _, address = listener
    n = RecordingNotifier(address, watchdog_usec=3600 * 1_000_000)  # next ping in half an hour
    stop = asyncio.Event()
    task = asyncio.create_task(watchdog_loop(n, stop, lambda: True))
    await n.waker.until(lambda: len(n.pings) == 1)
    stop.set()
    async with asyncio.timeout(BOUND):
        await task
    assert len(n.pings) == 1
    n.close()


async def test_a_blocked_event_loop_stops_the_pings(listener: tuple[socket.socket, str]) -> None:
    sock, address = listener
    n = RecordingNotifier(address, watchdog_usec=20_000)  # pings every 10 ms
    stop = asyncio.Event()
    task = asyncio.create_task(watchdog_loop(n, stop, lambda: True))
    await n.waker.until(lambda: len(n.pings) >= 2)
    drain(sock)
    seen = len(n.pings)
    # The simulated hang itself: the loop is stuck in synchronous code for five ping intervals.
    hang_until = time.monotonic() + 0.050
    while time.monotonic() < hang_until:
        pass
    assert len(n.pings) == seen
    assert drain(sock) == []
    await n.waker.until(lambda: len(n.pings) > seen)  # pings resume once the loop runs again
    stop.set()
    async with asyncio.timeout(BOUND):
        await task
    n.close()


async def test_pings_are_withheld_while_unhealthy(listener: tuple[socket.socket, str],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    _, address = listener
    n = RecordingNotifier(address, watchdog_usec=2_000)  # a check every millisecond
    stop = asyncio.Event()
    checks: list[bool] = []
    answers = iter([True, False, False, False, True])

    def health() -> bool:
        ok = next(answers, True)
        checks.append(ok)
        n.waker.poke()
        return ok

    with caplog.at_level(logging.INFO, logger="nftblockd.sdnotify"):
        task = asyncio.create_task(watchdog_loop(n, stop, health))
        await n.waker.until(lambda: len(checks) >= 6)
        stop.set()
        async with asyncio.timeout(BOUND):
            await task
    # One ping per healthy check, none for the three unhealthy ones.
    assert len(n.pings) == checks.count(True)
    assert checks[:5] == [True, False, False, False, True]
    assert caplog.text.count("health check failed") == 1
    assert caplog.text.count("healthy again") == 1
    n.close()


async def test_a_raising_health_check_counts_as_unhealthy(listener: tuple[socket.socket, str],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    _, address = listener
    n = RecordingNotifier(address, watchdog_usec=2_000)
    stop = asyncio.Event()
    calls = 0

    def health() -> bool:
        nonlocal calls
        calls += 1
        n.waker.poke()
        raise RuntimeError("store unreachable")

    with caplog.at_level(logging.ERROR, logger="nftblockd.sdnotify"):
        task = asyncio.create_task(watchdog_loop(n, stop, health))
        await n.waker.until(lambda: calls >= 3)
        stop.set()
        async with asyncio.timeout(BOUND):
            await task
    assert n.pings == []
    assert caplog.text.count("health check failed (RuntimeError('store unreachable'))") == 1


@pytest.mark.parametrize("socket_set", [False, True])
async def test_without_a_watchdog_the_loop_returns_at_once(listener: tuple[socket.socket, str],
                                                           socket_set: bool) -> None:
    sock, address = listener
    # no NOTIFY_SOCKET at all, or NOTIFY_SOCKET without WATCHDOG_USEC: either way the watchdog is off
    n = RecordingNotifier(address, watchdog_usec=0) if socket_set else Notifier(None)
    checks: list[bool] = []

    def health() -> bool:
        checks.append(True)
        return True

    # The stop event is never set: only returning at once ends the loop (the bound catches a loop that runs).
    async with asyncio.timeout(BOUND):
        await watchdog_loop(n, asyncio.Event(), health)
    assert n.watchdog_interval() is None
    assert checks == []  # it returned before the first health check, so no ping either
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(4096)  # and nothing reached the service manager's socket
    n.close()
