"""Whether the Redis client this Python finds can run fleet mode, and if not, one sentence that says what to
install: for `--check-config` and for the daemon's start, before anything imports `redis`.

`problem()` is pure (the versions found are arguments); `found_versions()` is the one IO (package metadata,
never an import of `redis` itself: a broken install must give the sentence, not a traceback). This module
must NOT import `redis`, connect to anything or decide anything about the config beyond "fleet is on".

Why the minimum is 5.0 and not Debian 12's python3-redis 4.3.4 (measured, see docs/fleet.md):
- 4.3.4's async client polls the socket under `async_timeout(0)`; with Debian 12's python3-async-timeout
  4.0.2 every poll leaves a cancel request counted on the calling task (`Task.cancelling()` 0 -> 2 after two
  commands), so the fleet's receiver takes it for a stop request and ends: bans are published, never
  received.
- it lacks the fixes for CVE-2023-28858/28859 (a cancelled command leaves its reply for the next caller on the
  same connection); Debian 12's 4.3.4-3 carries no patch for them.
- a redis-py >= 5 next to Debian 12's python3-hiredis 1.0.1 fails at connect (5.0.x hands hiredis 1.x a
  keyword it does not know); from 6.0 on redis-py checks and falls back to its own parser.
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import NamedTuple

MIN_REDIS = (5, 0)
MIN_HIREDIS = (2, 0)  # with a redis-py older than HIREDIS_CHECKED
HIREDIS_CHECKED = (6, 0)  # redis-py from here ignores a hiredis it cannot use


class Found(NamedTuple):
    redis: str | None  # version text, None: not installed
    hiredis: str | None


def _version(text: str) -> tuple[int, ...]:
    """The leading numeric fields: '4.3.4' -> (4, 3, 4), '6.1.0rc1' -> (6, 1, 0), 'x' -> ()."""
    out: list[int] = []
    for part in text.split("."):
        m = re.match(r"\d+", part)
        if m is None:
            break
        out.append(int(m.group()))
        if m.end() != len(part):
            break
    return tuple(out)


def _text(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def problem(found: Found) -> str | None:
    """None when the client serves fleet mode, else the sentence naming the package and version to install."""
    need = _text(MIN_REDIS)
    pip = f"pip install --break-system-packages 'redis>={need}'"
    if found.redis is None:
        return (f"fleet mode needs the Python Redis client, redis-py >= {need}, which is not installed: "
                f"apt install python3-redis (Debian 13 has 6.1); on Debian 12, whose python3-redis is 4.3.4, "
                f"{pip}; elsewhere pip install 'nftblockd[fleet]'")
    rv = _version(found.redis)
    if rv < MIN_REDIS:
        return (f"fleet mode needs python3-redis >= {need} (found {found.redis}): apt install python3-redis on "
                f"Debian 13 (6.1), or {pip} (it goes to /usr/local, ahead of the Debian package)")
    if found.hiredis is not None and rv < HIREDIS_CHECKED and _version(found.hiredis) < MIN_HIREDIS:
        return (f"fleet mode with redis-py {found.redis} needs hiredis >= {_text(MIN_HIREDIS)} or none "
                f"(found {found.hiredis}): apt remove python3-hiredis, or "
                f"pip install --break-system-packages 'hiredis>={_text(MIN_HIREDIS)}'")
    return None


def found_versions() -> Found:
    """The versions the running Python would import (IO: the installed packages' metadata)."""
    def get(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None
    return Found(get("redis"), get("hiredis"))


def check() -> str | None:
    """`problem()` for this Python."""
    return problem(found_versions())


__all__ = ["MIN_REDIS", "Found", "check", "found_versions", "problem"]
