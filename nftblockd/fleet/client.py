"""Whether the Redis client this Python finds can run fleet mode, and if not, one sentence that says what to
install: for `--check-config` and for the daemon's start, before anything imports `redis`.

`problem()` is pure (the version found is its argument); `found_version()` reads package metadata, and only
when that version serves does `check()` import `redis.asyncio`, turning a broken install (a dependency
missing) into a sentence too, never a traceback. This module must NOT connect to anything or decide anything
about the config beyond "fleet is on".

Why the minimum is 6.1, Debian 13's python3-redis (measured, see docs/fleet.md): it is the oldest release
the fleet's unit and Redis integration tests were run on in full (the package meets only Debian's 4.3.4 and
6.1.0). Debian 12's 4.3.4 does not serve:
- 4.3.4's async client polls the socket under `async_timeout(0)`; with Debian 12's python3-async-timeout
  4.0.2 every poll leaves a cancel request counted on the calling task (`Task.cancelling()` 0 -> 2 after two
  commands), so the fleet's receiver takes it for a stop request and ends: bans are published, never
  received (seen in the fleet's Redis integration tests).
- it lacks the fixes for CVE-2023-28858/28859 (a cancelled command leaves its reply for the next caller on the
  same connection); Debian 12's 4.3.4-3 carries no patch for them.
Debian 12's python3-hiredis 1.0.1 is no obstacle: redis-py 6 checks the hiredis version and falls back to its
own parser (measured with 6.1.0 next to it).
"""

from __future__ import annotations

import re
from importlib import metadata

MIN_REDIS = (6, 1)


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


def problem(found: str | None) -> str | None:
    """None when redis-py `found` (its version; None: not installed) serves fleet mode, else the sentence naming
    the package and version to install."""
    need = _text(MIN_REDIS)
    pip = f"pip install --break-system-packages 'redis>={need}'"
    if found is None:
        return (f"fleet mode needs the Python Redis client, redis-py >= {need}, which is not installed: "
                f"apt install python3-redis (Debian 13 has 6.1); on Debian 12, whose python3-redis is 4.3.4, "
                f"{pip}; elsewhere pip install 'nftblockd[fleet]'")
    if _version(found) < MIN_REDIS:
        return (f"fleet mode needs python3-redis >= {need} (found {found}): apt install python3-redis on "
                f"Debian 13 (6.1), or {pip} (it goes to /usr/local, ahead of the Debian package)")
    return None


def found_version() -> str | None:
    """The redis-py version the running Python would import (IO: the installed packages' metadata)."""
    try:
        return metadata.version("redis")
    except metadata.PackageNotFoundError:
        return None


def check() -> str | None:
    """`problem()` for this Python, then whether the client imports at all."""
    found = found_version()
    msg = problem(found)
    if msg is not None:
        return msg
    try:
        import redis.asyncio  # noqa: F401 (the import is the check: fleet/link.py needs it next)
    except ImportError as exc:  # e.g. a dependency of a pip-installed redis-py that is not there
        return (f"fleet mode cannot import python3-redis {found} ({exc}): reinstall it, "
                f"apt install --reinstall python3-redis or pip install --force-reinstall 'redis>={_text(MIN_REDIS)}'")
    return None


__all__ = ["MIN_REDIS", "check", "found_version", "problem"]
