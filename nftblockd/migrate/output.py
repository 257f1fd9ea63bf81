"""The writer edge of the fail2ban migration: `import-fail2ban-config -o FILE` puts its text in place.

The new text goes to a temporary file in FILE's own directory, is flushed to disk and renamed over FILE, so a
reader (the daemon at a reload, `--check-config`) sees the old file or the new one, never half of one. FILE
itself is never opened for writing: a symbolic link at FILE is refused with the reason (writing through it
would replace whatever it points to, /etc/shadow as well as a config), and so is anything but a regular
file. A replaced file keeps its owner and group, and its mode less any access for others (the packaged
config is root:nftblockd 0640, so that the service's user can read it); a new file is 0600, or root:nftblockd
0640 when run as root on a host with the nftblockd group, as the package's postinst makes the config.

This module must NOT decide what the text is; it reads FILE only through `read_existing` (bounded).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_EXISTING", "OutputError", "read_existing", "write_config"]

# The config the import merges into is read whole; a real one is a few kB (the example is 7 kB).
MAX_EXISTING = 4 << 20
_SERVICE_GROUP = "nftblockd"  # the unit's Group= (systemd/nftblockd.service)


class OutputError(Exception):
    """FILE cannot be read or written as asked; the message names it and says why."""


@dataclass(frozen=True, slots=True)
class Existing:
    text: str | None  # None: FILE does not exist


def read_existing(path: str) -> Existing:
    """FILE's text if it exists (refusing a symbolic link, a non-regular file, a huge or non-UTF-8 one)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Existing(None)
    except OSError as exc:
        raise OutputError(f"{path}: {exc.strerror}") from None
    _check_target(path, st)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise OutputError(f"{path}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OutputError(f"{path}: not a regular file")
        data = os.read(fd, MAX_EXISTING + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_EXISTING:
        raise OutputError(f"{path}: larger than {MAX_EXISTING >> 20} MiB: not an nftblockd config")
    try:
        return Existing(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise OutputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _check_target(path: str, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise OutputError(f"{path} is a symbolic link (to {target}): not written through it; give the file "
                          "itself as -o, or remove the link")
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{path}: not a regular file")


def write_config(path: str, text: str, *, replace: bool) -> None:
    """Put `text` at `path` atomically. `replace` False refuses an existing FILE; a link is always refused."""
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(f"{path}: {exc.strerror}") from None
    if st is not None:
        _check_target(path, st)
        if not replace:
            raise OutputError(f"{path} exists; give --force to merge the import into it")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{Path(path).name}.", suffix=".tmp", dir=folder)  # mode 0600
    except OSError as exc:
        raise OutputError(f"{path}: cannot write in {folder}: {exc.strerror}") from None
    try:
        try:
            _own(fd, st)
            view = memoryview(text.encode())
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OutputError(f"{path}: {exc.strerror}") from None


def _own(fd: int, old: os.stat_result | None) -> None:
    if old is not None:
        if os.geteuid() == 0:
            os.fchown(fd, old.st_uid, old.st_gid)
        os.fchmod(fd, stat.S_IMODE(old.st_mode) & 0o640)  # it may hold API keys: never for others
        return
    if os.geteuid() != 0:
        return
    import grp

    try:
        gid = grp.getgrnam(_SERVICE_GROUP).gr_gid
    except KeyError:
        return
    os.fchown(fd, 0, gid)
    os.fchmod(fd, 0o640)
