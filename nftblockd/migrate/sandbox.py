"""What the packaged unit lets the service read: may the daemon, under systemd/nftblockd.service, read a log?

fail2ban runs as root and unsandboxed; nftblockd's unit runs as the user `nftblockd` with the groups
`adm` and `systemd-journal`, and hides parts of the file system. A logpath imported from fail2ban that the
service cannot read would be a jail that never bans (and `logpath = /etc/shadow` is not a log at all), so
the import refuses it with the reason. The facts below are the unit's (tests/unit/test_f2bsandbox.py holds
them equal to the unit file); the decision on a file's owner, group, mode and POSIX ACL is the kernel's
(acl(5)'s access check algorithm).

Pure: this module must NOT read files, users or groups; migrate/host.py hands it what it found.
"""

from __future__ import annotations

import posixpath
import struct
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["HIDDEN", "SERVICE_GROUPS", "SERVICE_USER", "FileFacts", "Identity", "hidden_by", "parse_acl",
           "read_denied"]

SERVICE_USER = "nftblockd"  # User=
SERVICE_GROUPS = ("nftblockd", "adm", "systemd-journal")  # Group= and SupplementaryGroups=
# What the unit keeps from the service: (path, how), each the unit's own setting
HIDDEN: tuple[tuple[str, str], ...] = (
    ("/home", "hides /home (ProtectHome=yes)"), ("/root", "hides /root (ProtectHome=yes)"),
    ("/run/user", "hides /run/user (ProtectHome=yes)"),
    ("/tmp", "gives the service a /tmp of its own (PrivateTmp=yes)"),
    ("/var/tmp", "gives the service a /var/tmp of its own (PrivateTmp=yes)"),
    ("/dev", "gives the service a /dev of its own, without devices (PrivateDevices=yes)"),
    ("/proc", "shows the service only its own processes (ProtectProc=invisible, ProcSubset=pid)"),
)

# acl(5) tags, as the kernel stores them in the system.posix_acl_access attribute
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_ACL_VERSION = 2
_READ, _EXEC = 4, 1


@dataclass(frozen=True, slots=True)
class Identity:
    """Who the service runs as; uid None when the user does not exist (yet) on this host."""

    uid: int | None
    gids: frozenset[int]


@dataclass(frozen=True, slots=True)
class FileFacts:
    """A file's or directory's owner, group, mode and its access ACL (empty when it has none)."""

    path: str
    uid: int
    gid: int
    mode: int  # st_mode
    acl: tuple[tuple[int, int, int], ...] = ()  # (tag, permission bits, id)
    owner: str = ""  # names for the reason (the number when unknown)
    group: str = ""


def hidden_by(path: str) -> str | None:
    """Why the unit hides `path` from the service (the setting), or None."""
    p = posixpath.normpath(path)
    for top, how in HIDDEN:
        if p == top or p.startswith(top + "/"):
            return f"the packaged unit {how}: the service cannot read {path}"
    return None


def parse_acl(data: bytes) -> tuple[tuple[int, int, int], ...]:
    """The system.posix_acl_access attribute (a version word, then 8-byte entries) as (tag, perm, id).
    Raises ValueError when it is not one."""
    if len(data) < 4 or (len(data) - 4) % 8:
        raise ValueError(f"an ACL attribute of {len(data)} bytes")
    (version,) = struct.unpack_from("<I", data)
    if version != _ACL_VERSION:
        raise ValueError(f"ACL version {version}")
    out = []
    for off in range(4, len(data), 8):
        tag, perm, ident = struct.unpack_from("<HHI", data, off)
        if tag not in (_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER) or perm > 7:
            raise ValueError(f"ACL entry tag {tag:#x} perm {perm}")
        out.append((tag, perm, ident))
    return tuple(out)


def _allowed(f: FileFacts, who: Identity, want: int) -> bool:
    """acl(5)'s access check for the bits `want` (with no ACL, the mode's classes are the ACL)."""
    mode = f.mode & 0o777
    classes = ((_USER_OBJ, mode >> 6, 0), (_GROUP_OBJ, (mode >> 3) & 7, 0), (_OTHER, mode & 7, 0))
    entries: tuple[tuple[int, int, int], ...] = f.acl or classes
    perms = {tag: perm for tag, perm, _ in entries if tag in (_USER_OBJ, _GROUP_OBJ, _MASK, _OTHER)}
    mask = perms.get(_MASK, 7)
    if who.uid is not None and who.uid == f.uid:
        return perms.get(_USER_OBJ, 0) & want == want
    if who.uid is not None:
        for tag, perm, ident in entries:
            if tag == _USER and ident == who.uid:
                return perm & mask & want == want
    groups = [perms.get(_GROUP_OBJ, 0)] if f.gid in who.gids else []
    groups += [perm for tag, perm, ident in entries if tag == _GROUP and ident in who.gids]
    if groups:
        return any(g & mask & want == want for g in groups)
    return perms.get(_OTHER, 0) & want == want


def read_denied(target: str, chain: Sequence[FileFacts], who: Identity, groups: Sequence[str]) -> str | None:
    """Why `who` may not read `target` (a file, or a directory to list), given `chain`: the facts of its
    directories from the root and of `target` itself, as far as they exist. None when it may (or when what
    is missing keeps the question open). `groups` names who.gids for the reason."""
    target = posixpath.normpath(target)
    for f in chain:
        is_dir = f.mode & 0o170000 == 0o040000
        last = f.path == target
        want = (_READ | _EXEC) if is_dir and last else (_EXEC if is_dir else _READ)
        if _allowed(f, who, want):
            continue
        what = "enter" if is_dir and not last else "read"
        acl = ", with an ACL" if f.acl else ""
        return (f"the service's user {SERVICE_USER} (groups {', '.join(groups) or 'none'}) may not {what} "
                f"{f.path} (owner {f.owner or f.uid}, group {f.group or f.gid}, mode {f.mode & 0o7777:04o}{acl})")
    return None
