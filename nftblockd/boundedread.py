"""Read a file whose path an operator wrote, bounded in size and in time: the one way such files are read.

The config, the files it names (filters, fail2ban filter and action files and their includes, password and
key files, feed `file:` sources) and fail2ban's own files for the importer all come through here. Each read:

- opens with O_NONBLOCK | O_NOCTTY | O_CLOEXEC, so a FIFO or a device cannot block the open (a FIFO without
  a writer made `import-fail2ban-config` and `--check-config` hang);
- fstat()s the open descriptor (not the path: no race with a rename) and refuses anything but a regular
  file before reading a byte (`/dev/zero` was read to 3.7 GB, then a traceback);
- refuses a file whose size is over the cap, then reads at most cap + 1 bytes, so a file that grows while
  it is read is refused too, never read on.

A regular file on a local file system cannot block, so these three are the time bound; a hung network file
system is outside what a process can bound. A refusal is a `BoundedReadError`, an OSError whose text is one
line, `path: reason`, so callers that already report OSError's strerror need no new case. A missing file
stays FileNotFoundError. This module must NOT parse what it reads or log: callers know what the file is for.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

# Caps, each written once (docs/limits.md lists them, tests/unit/test_limits_doc.py checks it).
CONFIG_MAX_BYTES = 4 * 1024 * 1024  # the YAML config: the largest real one is a few hundred KiB of allowlist
FILTER_MAX_BYTES = 1024 * 1024  # one filter, action or fail2ban INI file (stock ones are under 40 KiB)
SECRET_MAX_BYTES = 64 * 1024  # a password file, a key or a certificate
LOG_SAMPLE_MAX_BYTES = 256 * 1024 * 1024  # the log file `nftblock test-filter` reads whole

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class BoundedReadError(OSError):
    """A file refused before or while reading: not regular, or over its cap. `str()` is `path: reason`."""

    def __init__(self, path: str, reason: str, code: int = errno.EINVAL) -> None:
        super().__init__(code, reason, path)
        self.path, self.reason = path, reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def read_bytes(path: str | Path, cap: int) -> bytes:
    """The whole of the regular file at `path`, at most `cap` bytes; raises BoundedReadError or OSError."""
    name = str(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BoundedReadError(name, f"is {_kind(st.st_mode)}, not a regular file; refused")
        if st.st_size > cap:
            raise BoundedReadError(name, f"is {st.st_size} bytes, over the limit of {cap}; refused", errno.EFBIG)
        chunks: list[bytes] = []
        got = 0
        while got <= cap:  # st_size can be 0 for a file that has content (procfs): the cap, not st_size, ends it
            chunk = os.read(fd, min(cap + 1 - got, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if got > cap:
        raise BoundedReadError(name, f"holds more than {cap} bytes (it grew while read); refused", errno.EFBIG)
    return b"".join(chunks)


def read_text(path: str | Path, cap: int) -> str:
    """`read_bytes` decoded as UTF-8; a file that is not UTF-8 is refused with the offset of the bad byte."""
    data = read_bytes(path, cap)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BoundedReadError(str(path), f"is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
