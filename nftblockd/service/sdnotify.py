"""sd_notify(3) over the datagram socket systemd names in $NOTIFY_SOCKET, and a watchdog task.

A few lines of socket code instead of libsystemd: it supports filesystem and abstract (`@name`) sockets,
and tests can point it at a socket they own. Without $NOTIFY_SOCKET every call is a no-op that returns
False, so the daemon runs the same in a terminal, a container or under systemd.

Sending never raises: if systemd's socket is gone the daemon keeps enforcing bans; the failure is logged
once. `watchdog_loop` pings from the event loop itself, never from a thread, so a stuck loop stops the
pings and systemd restarts the daemon after WatchdogSec=.

This module never touches the kernel's nf_tables, the store or the config.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

from nftblockd.service.loops import wait_or_stop

log = logging.getLogger("nftblockd.sdnotify")

# Bound on a blocked send (systemd's socket buffer full): an event-loop stall, never a hang.
SEND_TIMEOUT = 1.0


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, the clock systemd compares MONOTONIC_USEC= against."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def _one_line(text: str) -> str:
    # A newline would start a new assignment: STATUS=x\nREADY=1 must not be possible from a value.
    return " ".join(text.splitlines())


class Notifier:
    """Talks to the service manager; `Notifier(None)` (or `from_env()` outside systemd) does nothing."""

    def __init__(self, address: str | None, *, watchdog_usec: int | None = None) -> None:
        self._address: str | None = None
        if address:
            if address.startswith("@"):
                self._address = "\0" + address[1:]  # abstract namespace
            elif address.startswith("/"):
                self._address = address
            else:  # e.g. vsock:… (systemd ≥ 253 for VMs); not needed on a host
                log.warning("NOTIFY_SOCKET=%s is not a UNIX socket path; not notifying systemd", address)
        self._watchdog_usec = watchdog_usec if watchdog_usec and watchdog_usec > 0 else None
        self._sock: socket.socket | None = None
        self._failed = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, pid: int | None = None) -> Notifier:
        """Read NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID (the watchdog is ours only if the PID is)."""
        env = os.environ if environ is None else environ
        usec: int | None = None
        raw = env.get("WATCHDOG_USEC", "")
        if raw.isdigit() and int(raw) > 0:
            usec = int(raw)
        wpid = env.get("WATCHDOG_PID", "")
        ours = os.getpid() if pid is None else pid
        if wpid and not (wpid.isdigit() and int(wpid) == ours):
            usec = None  # systemd meant the watchdog for another process (we were forked or exec'd)
        return cls(env.get("NOTIFY_SOCKET") or None, watchdog_usec=usec)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, *assignments: str) -> bool:
        """Send `KEY=value` lines as one datagram; True if systemd's socket took it."""
        if self._address is None or not assignments:
            return False
        payload = "\n".join(assignments).encode("utf-8")
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.settimeout(SEND_TIMEOUT)
            self._sock.sendto(payload, self._address)
        except OSError as exc:
            if not self._failed:
                log.warning("cannot notify systemd through %s: %s", self._address.replace("\0", "@"), exc)
                self._failed = True
            return False
        if self._failed:
            log.info("notifying systemd works again")
            self._failed = False
        return True

    def _with_status(self, first: str, status: str | None) -> bool:
        return self.notify(first, f"STATUS={_one_line(status)}") if status else self.notify(first)

    def ready(self, status: str | None = None) -> bool:
        return self._with_status("READY=1", status)

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={_one_line(text)}")

    def reloading(self, status: str | None = None) -> bool:
        """RELOADING=1 with MONOTONIC_USEC=, as Type=notify-reload requires; send ready() when done."""
        first = f"RELOADING=1\nMONOTONIC_USEC={monotonic_usec()}"
        return self._with_status(first, status)

    def stopping(self, status: str | None = None) -> bool:
        return self._with_status("STOPPING=1", status)

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for `seconds` more before the start/stop timeout fires (a long restore of saved bans)."""
        return self.notify(f"EXTEND_TIMEOUT_USEC={max(1, int(seconds * 1_000_000))}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def watchdog_interval(self) -> float | None:
        """Seconds between pings: half of WatchdogSec=, as sd_watchdog_enabled(3) advises; None if off."""
        return None if self._watchdog_usec is None else self._watchdog_usec / 2 / 1_000_000

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


async def watchdog_loop(notifier: Notifier, stop_event: asyncio.Event, health: Callable[[], bool]) -> None:
    """Ping the watchdog every `watchdog_interval()` while `health()` holds, until `stop_event` is set.

    Runs as a task on the daemon's loop: if the loop is blocked, no ping goes out. An unhealthy (or
    raising) `health()` withholds pings, so systemd restarts the daemon unless it recovers within
    WatchdogSec=. Returns at once when the watchdog is off.
    """
    interval = notifier.watchdog_interval()
    if interval is None:
        return
    healthy = True
    while not stop_event.is_set():
        error: Exception | None = None
        try:
            ok = bool(health())
        except Exception as exc:
            ok, error = False, exc
        if ok:
            notifier.watchdog()
        if ok != healthy:  # log transitions only: one line per incident, not one per interval
            if ok:
                log.info("healthy again; watchdog pings resume")
            else:
                log.error("health check failed%s; withholding watchdog pings, so systemd restarts nftblockd "
                          "unless it recovers", f" ({error!r})" if error else "", exc_info=error)
            healthy = ok
        await wait_or_stop(interval, stop_event)


__all__ = ["Notifier", "monotonic_usec", "watchdog_loop"]
