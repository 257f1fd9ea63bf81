"""The reader edge of the fail2ban migration: fail2ban's files and systemd's unit aliases on this machine.

Reads files under the fail2ban directory it is given (and systemd's unit directories for aliases); never
writes, never runs anything. Everything it answers is what f2bjail.Host asks.
"""

from __future__ import annotations

import contextlib
import glob
import grp
import os
import pwd
import stat
from collections.abc import Mapping
from pathlib import Path

from nftblockd.actions.f2baction import check_action, load_action
from nftblockd.detect.f2b import F2bConfig, read_config, read_filter
from nftblockd.detect.matcher import FilterError
from nftblockd.migrate.sandbox import (
    SERVICE_GROUPS,
    SERVICE_USER,
    FileFacts,
    Identity,
    hidden_by,
    parse_acl,
    read_denied,
)

__all__ = ["FsHost", "read_jails"]

_UNIT_DIRS = ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
_JOURNALMATCH = "journalmatch: "  # how read_filter reports a filter's journalmatch (Filter.notes)
_MAX_MATCHES = 64  # a logpath glob's files looked at (the first, in order)
_GLOB = frozenset("*?[")  # the characters that make a logpath a glob


def read_jails(confdir: str | Path) -> F2bConfig:
    """jail.conf, jail.d/*.conf, jail.local, jail.d/*.local and what they include, merged as fail2ban does."""
    return read_config(Path(confdir).absolute() / "jail.conf")


class FsHost:
    def __init__(self, confdir: str | Path, unit_dirs: tuple[str, ...] = _UNIT_DIRS) -> None:
        self.confdir = Path(confdir).absolute()  # the paths it answers end up in the config
        self.unit_dirs = unit_dirs
        self._who: tuple[Identity, tuple[str, ...]] | None = None

    def _find(self, sub: str, name: str) -> str | None:
        for suffix in (".conf", ".local"):
            p = self.confdir / sub / f"{name}{suffix}"
            if p.is_file():
                return str(p)
        return None

    def filter_file(self, name: str) -> str | None:
        return self._find("filter.d", name)

    def journalmatch(self, filter_path: str, options: Mapping[str, str]) -> str | None:
        for note in read_filter(filter_path, options).notes:
            if note.startswith(_JOURNALMATCH):
                return note[len(_JOURNALMATCH):]
        return None

    def action_file(self, name: str) -> str | None:
        return self._find("action.d", name)

    def ban_action(self, path: str, options: Mapping[str, str]) -> str | None:
        # Read without the jail's options: what makes a ban action is its script's command, and a ban
        # action's options (`chain="<known/chain>"`) need fail2ban's own reading of [Init] to resolve
        for why in check_action(path, {}, ("ban",)):
            if "is a ban action" in why:
                return why.split("(", 1)[1].split(")", 1)[0] if "(" in why else why
        return None

    def action_problems(self, path: str, options: Mapping[str, str]) -> list[str]:
        return check_action(path, options, ("ban",))

    def action_events(self, path: str, options: Mapping[str, str]) -> tuple[str, ...]:
        try:
            action = load_action(path, options)
        except FilterError:
            return ("ban",)  # action_problems has said why it cannot run
        return ("ban", "unban") if action.command("actionunban") is not None else ("ban",)

    def real_unit(self, unit: str) -> str:
        for d in self.unit_dirs:
            p = Path(d) / unit
            if p.is_symlink():
                target = p.resolve().name
                if target.endswith(".service") and target != unit:
                    return target
        return unit

    def log_access(self, path: str) -> str | None:
        why = hidden_by(path)
        if why is None and not any(c in path for c in _GLOB):
            real = os.path.realpath(path)  # a link into a hidden place (/var/log/app -> /home/app/logs)
            why = hidden_by(real) if real != path else None
            why = f"{path} is {real}: {why}" if why else None
        if why is not None:
            return why
        who, groups = self._identity()
        if any(c in path for c in _GLOB):
            fixed = path[:min(path.index(c) for c in _GLOB if c in path)].rsplit("/", 1)[0] or "/"
            found = sorted(p for p in glob.glob(path) if os.path.isfile(p))[:_MAX_MATCHES]
            return next((w for p in [fixed, *found] if (w := read_denied(p, _chain(p), who, groups))), None)
        return read_denied(path, _chain(path), who, groups)

    def _identity(self) -> tuple[Identity, tuple[str, ...]]:
        if self._who is None:
            try:
                uid: int | None = pwd.getpwnam(SERVICE_USER).pw_uid
            except KeyError:
                uid = None  # not installed yet: only the groups count
            gids, names = set(), []
            for g in SERVICE_GROUPS:
                try:
                    gids.add(grp.getgrnam(g).gr_gid)
                    names.append(g)
                except KeyError:
                    continue
            self._who = (Identity(uid, frozenset(gids)), tuple(names))
        return self._who


def _chain(path: str) -> list[FileFacts]:
    """The facts of `path`'s directories from the root and of `path` itself, as far as they exist."""
    parts = [x for x in os.path.normpath(path).split("/") if x]
    out = []
    for cur in ["/", *("/" + "/".join(parts[:i + 1]) for i in range(len(parts)))]:
        try:
            st = os.stat(cur)
        except OSError:
            break
        acl: tuple[tuple[int, int, int], ...] = ()
        # no ACL (ENODATA), none supported, or one we cannot read: the mode decides
        with contextlib.suppress(OSError, ValueError):
            acl = parse_acl(os.getxattr(cur, "system.posix_acl_access"))
        out.append(FileFacts(cur, st.st_uid, st.st_gid, st.st_mode, acl, _user(st.st_uid), _group(st.st_gid)))
        if not stat.S_ISDIR(st.st_mode):
            break
    return out


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
