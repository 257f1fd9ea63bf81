"""Follow log files with inotify: several names and globs, rotation, truncation, restarts without loss.

An idle tailer sleeps in inotify; it never polls. It does not parse lines (the matcher does), and it holds at
most one chunk plus one partial line per open file. Lines go into the daemon's bounded queue, one batch per
chunk read; a full queue stops reading (the offset makes waiting safe; see `base` for the Source contract).

How files are followed:

- Watches. Every directory a pattern names is watched for entries created, moved and deleted; every open file
  is watched by inode for writes, attribute changes, moves and deletion. A directory that does not exist yet
  is waited for through a watch on its nearest existing ancestor. Globs (`*?[`) are allowed in the file name
  only, and are matched again whenever an entry of the directory changes.
- Identity. A file is known by (device, inode), not by name. A name that starts pointing at an inode we do
  not follow is a new file and is read from offset 0, except at startup: then a saved position for the name
  is resumed if the inode (and the fingerprint of its first bytes) still match, and otherwise reading starts
  at the end (`start="end"`, the last complete line) or at 0 (`start="beginning"`).
- Rotation (rename + create, or delete). The old file is read to its end before the new one is read, then
  kept open and watched for `rotate_wait` seconds, since a writer goes on writing to it until it reopens its
  log; then it is read a last time (a final line without newline included) and closed. A rotated file that
  reappears under a name a pattern matches (`auth.log*` also matches `auth.log.1`) stays followed under that
  name, so renamed files are never read twice.
- Truncation (copytruncate). Every read checks, right after it, that the TAIL_BYTES bytes just before the
  offset are still the ones read there. A file truncated below the offset fails the check, and so does one
  truncated and rewritten past it before we looked (size alone missed that, and lines were lost: issue 13);
  inode and ctime cannot tell, since copytruncate keeps the inode and every write moves ctime. Then:
  1. what the file held past our offset is read from logrotate's copy, if there is one: a regular file in
     the same directory whose name starts with the file's (auth.log.1, auth.log-20240101), not followed
     already, holding our last bytes at our offset; reading goes on there, partial line included
     (`truncated_salvaged` counts the bytes);
  2. what was written (the largest size seen) and could be read neither from the file nor from a copy is
     counted in `truncated_lost` and logged as a warning (no copy, a compressed one, lines written between
     logrotate's copy and its truncate);
  3. the file is read again from 0.
- Restart. Positions are saved per name as JSON {dev, ino, offset, head_len, head}: the offset of the end of
  the last line handed over, and a hash of the file's first bytes. At startup, a name that now holds another
  inode makes the tailer look for the old inode in the same directory (rotated while we were down) and read
  it from the saved offset to its end before reading the new file from 0. A device number that changed across
  a reboot is forgiven when the inode and the first bytes match.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: inotify tails on the event loop)
import contextlib
import errno
import fnmatch
import hashlib
import json
import logging
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from asyncinotify import Event, Inotify, Mask, Watch

from nftblockd.sources.base import LineBatch, PositionStore, SourceError, SourceStats
from nftblockd.sources.linesplit import DEFAULT_MAX_LINE, Lines, LineSplitter

__all__ = ["FilePosition", "FileTail", "missing_files"]

log = logging.getLogger(__name__)

DEFAULT_CHUNK = 256 * 1024
HEAD_BYTES = 1024  # fingerprint length: enough to cover a few timestamped lines
TAIL_BYTES = 64  # bytes kept from just before the read offset: a truncated and rewritten file differs there
MAX_EVENTS = 4096  # inotify events taken per round before the work they cause is done
DIR_MASK = (Mask.CREATE | Mask.MOVED_TO | Mask.MOVED_FROM | Mask.DELETE | Mask.DELETE_SELF | Mask.MOVE_SELF
            | Mask.ONLYDIR)
FILE_MASK = Mask.MODIFY | Mask.ATTRIB | Mask.MOVE_SELF | Mask.DELETE_SELF
_GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True, slots=True)
class FilePosition:
    """A saved position: `offset` is the end of the last line handed over in the file (dev, ino)."""

    dev: int
    ino: int
    offset: int
    head_len: int = 0
    head: str = ""

    def dumps(self) -> str:
        return json.dumps({"dev": self.dev, "ino": self.ino, "offset": self.offset,
                           "head_len": self.head_len, "head": self.head}, separators=(",", ":"))

    @classmethod
    def loads(cls, text: str | None) -> FilePosition | None:
        """None for anything that is not a position we wrote (the file is then treated as unseen)."""
        if not text:
            return None
        try:
            d = json.loads(text)
            pos = cls(int(d["dev"]), int(d["ino"]), int(d["offset"]), int(d.get("head_len", 0)),
                      str(d.get("head", "")))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        return pos if pos.offset >= 0 and pos.head_len >= 0 else None


def _ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def _tail_at(fd: int, offset: int) -> bytes:
    """The TAIL_BYTES (or fewer) bytes before `offset`."""
    n = min(TAIL_BYTES, offset)
    return os.pread(fd, n, offset - n) if n else b""


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _why_missing(pattern: str, d: str, base: str, present: Sequence[str]) -> str | None:
    """Why `pattern` (directory `d`, file name or glob `base`) names nothing, given the file names of `d`
    that exist; None if it names something."""
    if not os.path.isdir(d):
        return f"{pattern}: its directory {d} does not exist"
    if _GLOB.search(base):
        rx = re.compile(fnmatch.translate(base))
        if any(rx.match(n) and (base.startswith(".") or n[0] != ".") for n in present):
            return None
        return f"{pattern}: no file matches"
    if base in present:
        return None
    try:
        st = os.stat(os.path.join(d, base))
    except OSError:
        return f"{pattern} does not exist"
    return f"{pattern} is {_kind(st.st_mode)}, not a regular file"


def missing_files(patterns: Sequence[str]) -> list[str]:
    """One sentence for each configured name or glob that names no regular file now (for `--check-config`:
    the daemon follows such a name as soon as it appears, but until then reads nothing from it)."""
    out = []
    for p in patterns:
        d, base = os.path.split(os.path.abspath(p))
        try:
            with os.scandir(d) as it:
                present = [e.name for e in it if e.is_file()]
        except OSError:
            present = []
        why = _why_missing(p, d, base, present)
        if why is not None:
            out.append(why)
    return out


class _File:
    """One open file (mutable, private to FileTail)."""

    __slots__ = ("dev", "expiry", "fd", "head", "head_len", "ino", "offset", "path", "position", "rotated",
                 "saved", "seen", "splitter", "tail", "watch")

    def __init__(self, path: str, fd: int, st: os.stat_result, max_line: int) -> None:
        self.path = path  # the name it is followed under (its current name if rotated and found)
        self.fd = fd
        self.dev = st.st_dev
        self.ino = st.st_ino
        self.offset = 0  # next byte to read
        self.position = 0  # end of the last line handed over: what is saved
        self.saved = -1  # position last written to the store
        self.splitter = LineSplitter(max_line)
        self.watch: Watch | None = None
        self.rotated = False
        self.expiry: asyncio.TimerHandle | None = None
        self.head_len = 0
        self.head = ""
        self.tail = b""  # the last bytes before `offset`, as read (at most TAIL_BYTES)
        self.seen = 0  # the largest size seen while the file was its old self: what was written, read or not


class FileTail:
    """Tail the files named by `paths` (absolute or relative names; globs in the file name only).

    `name` labels the source: it is `LineBatch.source` of every batch and part of the position keys
    (`tail:<name>:<path>`), so two sources may follow the same file independently.
    `save_interval` bounds how often positions are written (0: after every chunk handed over).
    """

    def __init__(self, name: str, paths: Sequence[str], store: PositionStore, *,
                 start: Literal["end", "beginning"] = "end", max_line: int = DEFAULT_MAX_LINE,
                 chunk_size: int = DEFAULT_CHUNK, rotate_wait: float = 5.0,
                 save_interval: float = 1.0) -> None:
        if not paths:
            raise ValueError(f"source {name!r}: no files to follow")
        if start not in ("end", "beginning"):
            raise ValueError(f"source {name!r}: start must be 'end' or 'beginning', not {start!r}")
        if chunk_size < 1 or max_line < 1 or rotate_wait < 0 or save_interval < 0:
            raise ValueError(f"source {name!r}: chunk_size and max_line must be positive, "
                             "rotate_wait and save_interval not negative")
        self.name = name
        self.stats = SourceStats()
        self.ready = asyncio.Event()
        self._configured = [(p, *os.path.split(os.path.abspath(p))) for p in paths]
        self._store = store
        self._start = start
        self._max_line = max_line
        self._chunk = chunk_size
        self._rotate_wait = rotate_wait
        self._save_interval = save_interval
        # directory -> (exact names, [(compiled glob, whether it may match a name starting with a dot)])
        self._patterns: dict[str, tuple[set[str], list[tuple[re.Pattern[str], bool]]]] = {}
        for p in paths:
            d, base = os.path.split(os.path.abspath(p))
            if not base or _GLOB.search(d):
                raise ValueError(f"source {name!r}: {p!r}: wildcards are allowed in the file name only, "
                                 "and the path must name a file")
            exact, globs = self._patterns.setdefault(d, (set(), []))
            if _GLOB.search(base):
                globs.append((re.compile(fnmatch.translate(base)), base.startswith(".")))
            else:
                exact.add(base)
        self._ino: Inotify | None = None
        self._active: dict[str, _File] = {}  # followed name -> file
        self._by_ident: dict[tuple[int, int], _File] = {}  # every open file, rotated ones included
        self._by_wd: dict[int, _File] = {}
        # pattern dir -> (its watch, (dev, ino) of the dir itself, or None while an ancestor stands in)
        self._dir_wd: dict[str, tuple[Watch, tuple[int, int] | None]] = {}
        self._dirs_by_wd: dict[int, set[str]] = {}  # one watch may serve several dirs (ancestor, symlinks)
        self._dirty: set[_File] = set()
        self._save_handle: asyncio.TimerHandle | None = None
        self._warned: set[str] = set()

    # ------------------------------------------------------------------ run

    async def run(self, out: asyncio.Queue[LineBatch]) -> None:
        try:
            ino = Inotify(cache_size=64, sync_timeout=0)  # sync_get() then never blocks
        except OSError as exc:
            raise SourceError(f"source {self.name!r}: cannot create an inotify instance ({exc}); "
                              "see fs.inotify.max_user_instances") from exc
        self._ino = ino
        try:
            with ino:
                await self._startup(out)
                self.ready.set()
                while True:
                    events = [await ino.get()]
                    while len(events) < MAX_EVENTS and (ev := ino.sync_get()) is not None:
                        events.append(ev)
                    await self._handle(events, out)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        if self._save_handle is not None:
            self._save_handle.cancel()
        self._save_dirty()
        for f in list(self._by_ident.values()):
            if f.expiry is not None:
                f.expiry.cancel()
            os.close(f.fd)
        self._by_ident.clear()
        self._active.clear()
        self._by_wd.clear()
        self._dir_wd.clear()
        self._dirs_by_wd.clear()
        self._ino = None

    async def _startup(self, out: asyncio.Queue[LineBatch]) -> None:
        for d in self._patterns:
            self._watch_dir(d)
        scans = {d: self._scan(d) for d in self._patterns}
        # Files rotated while we were down are finished first, so that their lines come before the new ones.
        for d, current in scans.items():
            for path in sorted(set(current) | {os.path.join(d, n) for n in self._patterns[d][0]}):
                saved = FilePosition.loads(self._store.get(self._key(path)))
                st = current.get(path)
                if saved is not None and (st is None or not self._same(saved, st)):
                    await self._recover(path, saved, out)
        for d in self._patterns:
            await self._reconcile(d, out, initial=True)
        for why in self.missing():
            # Said once at start: a jail that silently reads nothing is the worst failure a tailer can have.
            log.warning("source %s: %s; it will be followed as soon as it appears, nothing is read from it "
                        "until then", self.name, why)

    # --------------------------------------------------------------- events

    async def _handle(self, events: list[Event], out: asyncio.Queue[LineBatch]) -> None:
        to_read, dirs, closing = self._sort_events(events)
        for f in to_read:
            if f.fd >= 0:
                await self._drain(f, out)
        for d in sorted(dirs):
            self._watch_dir(d)
            await self._reconcile(d, out)
        for f in closing:
            if f.rotated or not self._rewatch(f):
                await self._close(f, out)

    def _sort_events(self, events: list[Event]) -> tuple[dict[_File, None], set[str], list[_File]]:
        """Which files to read, directories to rescan and files whose watch ended, for one batch of events.

        Drops the watches the kernel removed (IN_IGNORED) from the tables as it goes; reads nothing.
        """
        to_read: dict[_File, None] = {}  # insertion-ordered set
        dirs: set[str] = set()
        closing: list[_File] = []
        for ev in events:
            mask = ev.mask
            if Mask.Q_OVERFLOW in mask:
                log.warning("source %s: inotify queue overflowed; checking every file", self.name)
                dirs.update(self._patterns)
                to_read.update(dict.fromkeys(self._by_ident.values()))
                continue
            watch = ev.watch
            if watch is None:
                continue
            f = self._by_wd.get(watch.wd)
            if f is not None:
                if Mask.IGNORED in mask:
                    del self._by_wd[watch.wd]
                    f.watch = None
                    closing.append(f)
                else:
                    to_read[f] = None
                    if mask & (Mask.ATTRIB | Mask.MOVE_SELF | Mask.DELETE_SELF):
                        dirs.add(os.path.dirname(f.path))
                continue
            served = self._dirs_by_wd.get(watch.wd)
            if not served:
                continue
            if mask & (Mask.IGNORED | Mask.MOVE_SELF | Mask.DELETE_SELF):
                self._unwatch_dirs(watch, served)
                dirs.update(served)
                continue
            name = str(ev.name) if ev.name is not None else None
            for d in served:
                if self._dir_wd[d][1] is None or name is None or self._matches(d, name):
                    dirs.add(d)
        return to_read, dirs, closing

    # ---------------------------------------------------------- directories

    def _watch_dir(self, d: str) -> None:
        """Watch `d`, or while it does not exist, its nearest existing ancestor."""
        assert self._ino is not None
        held = self._dir_wd.get(d)
        if held is not None and held[1] is not None:
            if _ident(d) == held[1]:
                return
            # Removed or replaced. Its IN_DELETE_SELF can come much later: an open file that was in it
            # (a deleted log still draining) keeps the old directory's inode alive.
            del self._dir_wd[d]
            self._unserve(held[0], d)
            held = None
        target = d
        while True:
            try:
                watch = self._ino.add_watch(target, DIR_MASK)
            except (FileNotFoundError, NotADirectoryError):
                parent = os.path.dirname(target)
                if parent == target:
                    return
                target = parent
                continue
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise SourceError(f"source {self.name!r}: cannot watch {target}: inotify watch limit "
                                      "reached; raise fs.inotify.max_user_watches") from exc
                self._warn(target, f"cannot watch directory {target} ({exc.strerror}); "
                           "changes in it will only be seen when the files are written to")
                return
            break
        if held is not None:
            if held[0].wd == watch.wd:
                return  # still waiting on the same ancestor
            self._unserve(held[0], d)
        self._dir_wd[d] = (watch, _ident(d) if target == d else None)
        self._dirs_by_wd.setdefault(watch.wd, set()).add(d)
        if target != d:
            log.info("source %s: directory %s does not exist yet; waiting for it to appear", self.name, d)
            if os.path.isdir(d):  # created while we were setting up: take the direct watch now
                self._watch_dir(d)

    def _unserve(self, watch: Watch, d: str) -> None:
        served = self._dirs_by_wd.get(watch.wd)
        if served is None:
            return
        served.discard(d)
        if not served:
            del self._dirs_by_wd[watch.wd]
            self._rm_watch(watch)

    def _unwatch_dirs(self, watch: Watch, served: set[str]) -> None:
        for d in served:
            if self._dir_wd.get(d, (None,))[0] is watch:
                del self._dir_wd[d]
        self._dirs_by_wd.pop(watch.wd, None)
        self._rm_watch(watch)

    def _rm_watch(self, watch: Watch) -> None:
        if self._ino is None:
            return
        with contextlib.suppress(OSError):  # already gone: the kernel drops watches of deleted objects
            self._ino.rm_watch(watch)

    def _matches(self, d: str, name: str) -> bool:
        exact, globs = self._patterns[d]
        if name in exact:
            return True
        # As glob(): a leading dot is only matched by a pattern that starts with one.
        return any(g.match(name) and (dot or name[0] != ".") for g, dot in globs)

    def _scan(self, d: str) -> dict[str, os.stat_result]:
        """The regular files in `d` that a pattern names, by path."""
        exact, globs = self._patterns[d]
        names = set(exact)
        if globs:
            try:
                with os.scandir(d) as it:
                    names.update(e.name for e in it if self._matches(d, e.name))
            except OSError:
                pass
        found = {}
        for name in names:
            path = os.path.join(d, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                found[path] = st
        return found

    async def _reconcile(self, d: str, out: asyncio.Queue[LineBatch], *, initial: bool = False) -> None:
        """Make the followed files of `d` agree with what its names point at now."""
        current = self._scan(d)
        for path, f in list(self._active.items()):
            if os.path.dirname(path) != d:
                continue
            st = current.get(path)
            if st is None or (st.st_dev, st.st_ino) != (f.dev, f.ino):
                await self._drain(f, out)  # finish the old file before the new one
                self._detach(f, "deleted" if st is None else "replaced by a new file")
        for path in sorted(current):
            if path in self._active:
                continue
            st = current[path]
            known = self._by_ident.get((st.st_dev, st.st_ino))
            if known is not None:
                if known.rotated:  # renamed to a name we follow: carry on, never read it again
                    self._attach(known, path)
                continue  # else a second name (hard link) of a file we follow
            await self._start_file(path, out, initial=initial)

    # ---------------------------------------------------------------- files

    def _open(self, path: str) -> _File | None:
        assert self._ino is not None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                self._warn(path, f"cannot open {path} ({exc.strerror}); will retry when it changes")
            return None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in self._by_ident:
            os.close(fd)
            return None
        try:
            # Watching the open descriptor, not the name, pins the watch to this very inode.
            watch = self._ino.add_watch(f"/proc/self/fd/{fd}", FILE_MASK)
        except OSError as exc:
            os.close(fd)
            if exc.errno == errno.ENOSPC:
                raise SourceError(f"source {self.name!r}: cannot watch {path}: inotify watch limit reached; "
                                  "raise fs.inotify.max_user_watches") from exc
            self._warn(path, f"cannot watch {path} ({exc.strerror})")
            return None
        f = _File(path, fd, st, self._max_line)
        f.watch = watch
        self._by_wd[watch.wd] = f
        self._by_ident[(f.dev, f.ino)] = f
        self._warned.discard(path)
        self.stats.files_opened += 1
        return f

    async def _start_file(self, path: str, out: asyncio.Queue[LineBatch], *, initial: bool) -> None:
        f = self._open(path)
        if f is None:
            return
        self._active[path] = f
        if initial:
            saved = FilePosition.loads(self._store.get(self._key(path)))
            size = os.fstat(f.fd).st_size
            if saved is not None and self._same(saved, os.fstat(f.fd)):
                if saved.offset <= size and self._head_matches(f, saved.head_len, saved.head):
                    f.offset = saved.offset
                    f.head_len, f.head = saved.head_len, saved.head
                    log.info("source %s: resuming %s at offset %d", self.name, path, f.offset)
                else:
                    self.stats.truncations += 1
                    log.info("source %s: %s was truncated or replaced while stopped; reading it from the "
                             "start", self.name, path)
            elif saved is not None:
                log.info("source %s: %s is a new file since the last run; reading it from the start",
                         self.name, path)
            elif self._start == "end":
                f.offset = self._end_boundary(f, size)
        else:
            log.info("source %s: following new file %s from the start", self.name, path)
        f.position = f.offset
        f.tail = _tail_at(f.fd, f.offset)
        self._mark(f)
        await self._drain(f, out)

    async def _recover(self, path: str, saved: FilePosition, out: asyncio.Queue[LineBatch]) -> None:
        """At startup: the name holds another file now; finish the old one if it is still in the directory."""
        try:
            with os.scandir(os.path.dirname(path)) as it:
                candidates = [e.path for e in it if e.inode() == saved.ino and not e.is_symlink()]
        except OSError:
            return
        for cand in candidates:
            f = self._open(cand)
            if f is None:
                continue
            if not self._head_matches(f, saved.head_len, saved.head) or os.fstat(f.fd).st_size < saved.offset:
                await self._close(f, out, final=False)
                continue
            log.info("source %s: %s was rotated to %s while stopped; reading the rest of it", self.name, path,
                     cand)
            f.offset = f.position = saved.offset
            f.tail = _tail_at(f.fd, f.offset)
            self._detach(f, f"rotated to {cand}", active=False)
            await self._drain(f, out)
            return

    def _rewatch(self, f: _File) -> bool:
        """A followed file lost its watch (re-attached as its expiry fired, or an unmount): watch it again."""
        assert self._ino is not None
        try:
            f.watch = self._ino.add_watch(f"/proc/self/fd/{f.fd}", FILE_MASK)
        except OSError:
            return False
        self._by_wd[f.watch.wd] = f
        return True

    def _attach(self, f: _File, path: str) -> None:
        if f.expiry is not None:
            f.expiry.cancel()
            f.expiry = None
        f.rotated = False
        f.path = path
        self._active[path] = f
        self._mark(f)

    def _detach(self, f: _File, why: str, *, active: bool = True) -> None:
        """The name no longer points at `f`: keep reading it for rotate_wait seconds, then close it."""
        if active:
            del self._active[f.path]
        f.rotated = True
        self._dirty.discard(f)  # its name now belongs to the next file
        self.stats.rotations += 1
        log.info("source %s: %s was %s; reading what is still written to it for %gs", self.name, f.path, why,
                 self._rotate_wait)
        f.expiry = asyncio.get_running_loop().call_later(self._rotate_wait, self._expire, f)

    def _expire(self, f: _File) -> None:
        # Removing the watch makes the kernel queue IN_IGNORED for it: the main loop then closes the file.
        f.expiry = None
        if f.watch is not None:
            self._rm_watch(f.watch)

    async def _close(self, f: _File, out: asyncio.Queue[LineBatch], *, final: bool = True) -> None:
        if f.fd < 0:
            return
        if f.watch is not None:
            self._by_wd.pop(f.watch.wd, None)
            self._rm_watch(f.watch)
            f.watch = None
        if final:
            await self._drain(f, out)
            await self._hand_over(f, f.splitter.flush(), out)
        if f.expiry is not None:
            f.expiry.cancel()
        if self._active.get(f.path) is f:
            del self._active[f.path]
        self._dirty.discard(f)
        self._by_ident.pop((f.dev, f.ino), None)
        os.close(f.fd)
        f.fd = -1

    def _end_boundary(self, f: _File, size: int) -> int:
        """Where "start at the end" starts: after the last complete line, never in the middle of one."""
        n = min(size, self._max_line + 1)
        tail = os.pread(f.fd, n, size - n)
        nl = tail.rfind(b"\n")
        if nl >= 0:
            return size - n + nl + 1
        if size <= self._max_line:
            return 0  # one unfinished line: it is read when it is finished
        f.splitter.skip_to_next_line()
        return size

    # -------------------------------------------------------------- reading

    async def _drain(self, f: _File, out: asyncio.Queue[LineBatch]) -> None:
        """Read `f` to its end, handing lines over chunk by chunk; notice a truncation (module rules)."""
        try:
            size = os.fstat(f.fd).st_size
            checked = False
            while True:
                data = os.pread(f.fd, self._chunk, f.offset)
                # Then the bytes just before the offset: still ours, or the file was truncated (and maybe
                # rewritten past the offset) before this read, which then holds new bytes, not ours.
                back = len(f.tail)
                if back and os.pread(f.fd, back, f.offset - back) != f.tail:
                    await self._truncated(f, out)
                    continue
                if not checked:
                    checked = True
                    f.seen = max(f.seen, size)  # the file was its old self at this size
                if not data:
                    return
                self.stats.bytes_read += len(data)
                lines = f.splitter.feed(data)
                f.offset += len(data)
                f.tail = data[-TAIL_BYTES:] if len(data) >= TAIL_BYTES else (f.tail + data)[-TAIL_BYTES:]
                await self._hand_over(f, lines, out)
                if len(data) < self._chunk:
                    return
                await asyncio.sleep(0)  # a long file must not starve the rest of the daemon
        except OSError as exc:
            self.stats.errors += 1
            log.warning("source %s: cannot read %s: %s", self.name, f.path, exc.strerror)

    async def _hand_over(self, f: _File, lines: Lines, out: asyncio.Queue[LineBatch]) -> None:
        self.stats.overlong += lines.overlong
        self.stats.invalid_utf8 += lines.invalid
        self.stats.nul += lines.nul
        if lines.text:
            # If cancelled while the queue is full, the batch is not handed over and the position stays
            # before it: it is read again after a restart.
            await out.put(LineBatch(self.name, lines.text))
            self.stats.lines += len(lines.text)
        f.position = f.offset - f.splitter.pending
        self._mark(f)

    async def _truncated(self, f: _File, out: asyncio.Queue[LineBatch]) -> None:
        """`f` was truncated in place: finish its old content from logrotate's copy if one is found, count
        what could not be read, and read the file again from 0."""
        self.stats.truncations += 1
        salvaged = await self._salvage(f, out)
        lost = max(0, f.seen - f.offset)  # written (we saw the size) and read neither here nor from a copy
        self.stats.truncated_salvaged += salvaged
        self.stats.truncated_lost += lost
        if lost:
            log.warning("source %s: %s was truncated with %d bytes not yet read and no copy holding them; they "
                        "are lost (see logrotate's copytruncate)", self.name, f.path, lost)
        else:
            log.info("source %s: %s was truncated; reading it again from the start%s", self.name, f.path,
                     f" (the {salvaged} bytes not yet read came from its copy)" if salvaged else "")
        f.offset = f.position = f.seen = 0
        f.tail = b""
        f.head_len, f.head = 0, ""
        f.splitter.reset()
        self._mark(f)

    async def _salvage(self, f: _File, out: asyncio.Queue[LineBatch]) -> int:
        """Read what `f` held past our offset from the copy copytruncate made (bytes read, 0 if none).

        The copy is a regular file in the same directory whose name starts with `f`'s (auth.log.1,
        auth.log-20240101), that we do not follow already, and that holds our last bytes at our offset:
        reading it on from there continues exactly where we stopped, partial line included.
        """
        back = len(f.tail)
        if not back:
            return 0  # nothing read yet: no way to tell a copy of this file from any other file
        d, base = os.path.split(f.path)
        try:
            with os.scandir(d) as it:
                names = [e.path for e in it if e.name != base and e.name.startswith(base)]
        except OSError:
            return 0
        for path in sorted(names):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in self._by_ident \
                        or st.st_size < f.offset or os.pread(fd, back, f.offset - back) != f.tail:
                    continue
                start = f.offset
                while True:
                    data = os.pread(fd, self._chunk, f.offset)
                    if not data:
                        break
                    self.stats.bytes_read += len(data)
                    lines = f.splitter.feed(data)
                    f.offset += len(data)
                    await self._hand_over(f, lines, out)
                    await asyncio.sleep(0)
                return f.offset - start
            except OSError:
                continue
            finally:
                os.close(fd)
        return 0

    def _head_matches(self, f: _File, head_len: int, head: str) -> bool:
        if head_len == 0:
            return True
        return _digest(os.pread(f.fd, head_len, 0)) == head

    @staticmethod
    def _same(saved: FilePosition, st: os.stat_result) -> bool:
        # A device number may change across reboots; the head fingerprint then decides (checked later).
        return saved.ino == st.st_ino and (saved.dev == st.st_dev or saved.head_len > 0)

    # ------------------------------------------------------------ positions

    def _key(self, path: str) -> str:
        return f"tail:{self.name}:{path}"

    def _mark(self, f: _File) -> None:
        if f.rotated or f.position == f.saved:
            return
        self._dirty.add(f)
        if self._save_interval <= 0:
            self._save_dirty()
        elif self._save_handle is None:
            self._save_handle = asyncio.get_running_loop().call_later(self._save_interval, self._save_dirty)

    def _save_dirty(self) -> None:
        self._save_handle = None
        dirty, self._dirty = self._dirty, set()
        for f in dirty:
            if f.fd >= 0 and not f.rotated and f.position != f.saved:
                self._save(f)

    def _save(self, f: _File) -> None:
        try:
            want = min(HEAD_BYTES, f.position)
            if f.head_len < want:
                f.head_len, f.head = want, _digest(os.pread(f.fd, want, 0))
            pos = FilePosition(f.dev, f.ino, f.position, f.head_len, f.head)
            self._store.set(self._key(f.path), pos.dumps())
        except Exception as exc:  # a store failure must not stop reading; it is retried with the next chunk
            self.stats.errors += 1
            log.warning("source %s: cannot save the position of %s: %s", self.name, f.path, exc)
            return
        f.saved = f.position
        self.stats.positions_saved += 1

    def _warn(self, key: str, message: str) -> None:
        self.stats.errors += 1
        if key not in self._warned:  # once per name until it works again: no log flood on every event
            self._warned.add(key)
            log.warning("source %s: %s", self.name, message)

    def missing(self) -> list[str]:
        """A sentence for each configured name or glob that this tailer follows no file for (status)."""
        active: dict[str, list[str]] = {}
        for path in self._active:
            d, base = os.path.split(path)
            active.setdefault(d, []).append(base)
        return [why for p, d, base in self._configured
                if (why := _why_missing(p, d, base, active.get(d, []))) is not None]

    def followed(self) -> dict[str, int]:
        """Followed name -> read offset (for status output and tests)."""
        return {path: f.offset for path, f in self._active.items()}

    def draining(self) -> list[str]:
        """Last known names of rotated files still open for `rotate_wait`."""
        return [f.path for f in self._by_ident.values() if f.rotated]
