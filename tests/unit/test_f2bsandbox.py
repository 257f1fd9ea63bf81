"""A logpath the packaged service may not read is refused by the import, with the reason.

The sandbox facts (migrate/sandbox.py) are held equal to systemd/nftblockd.service here; the access check
is acl(5)'s, tested on facts; the host edge on this machine's own /etc/shadow.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nftblockd.migrate.f2bjail import plan_migration
from nftblockd.migrate.host import FsHost, read_jails
from nftblockd.migrate.sandbox import (
    HIDDEN,
    SERVICE_GROUPS,
    SERVICE_USER,
    FileFacts,
    Identity,
    hidden_by,
    parse_acl,
    read_denied,
)
from tests.unit.test_f2bmigrate import BASE, FakeHost, _cfg, _setup

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "nftblockd.service"


def _unit() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out.setdefault(k.strip(), []).append(v.strip())
    return out


def test_the_facts_are_the_units() -> None:
    u = _unit()
    assert u["User"] == [SERVICE_USER]
    assert [u["Group"][0], *u["SupplementaryGroups"][0].split()] == list(SERVICE_GROUPS)
    settings = " ".join(how for _, how in HIDDEN)
    for key, value in (("ProtectHome", "yes"), ("PrivateTmp", "yes"), ("PrivateDevices", "yes"),
                       ("ProtectProc", "invisible"), ("ProcSubset", "pid")):
        assert u[key] == [value] and f"{key}={value}" in settings
    assert "InaccessiblePaths" not in u and "TemporaryFileSystem" not in u  # else: add them to HIDDEN


NFTBLOCKD = Identity(998, frozenset({998, 4, 101}))  # its own group, adm, systemd-journal
GROUPS = ("nftblockd", "adm", "systemd-journal")
ROOT_DIR = FileFacts("/", 0, 0, 0o40755)
ETC = FileFacts("/etc", 0, 0, 0o40755)


def _denied(*chain: FileFacts, who: Identity = NFTBLOCKD) -> str | None:
    return read_denied(chain[-1].path, [ROOT_DIR, *chain], who, GROUPS)


def test_owner_group_mode_and_acls_decide() -> None:
    shadow = FileFacts("/etc/shadow", 0, 42, 0o100640, owner="root", group="shadow")
    assert _denied(ETC, shadow) == ("the service's user nftblockd (groups nftblockd, adm, systemd-journal) may "
                                    "not read /etc/shadow (owner root, group shadow, mode 0640)")
    log = FileFacts("/var/log/auth.log", 0, 4, 0o100640)  # root:adm, as Debian's rsyslog writes it
    var = FileFacts("/var", 0, 0, 0o40755)
    vlog = FileFacts("/var/log", 0, 0, 0o40755)
    assert _denied(var, vlog, log) is None
    assert _denied(var, vlog, FileFacts("/var/log/x", 998, 998, 0o100600)) is None  # its own
    assert _denied(var, vlog, FileFacts("/var/log/x", 0, 0, 0o100604)) is None  # others may
    assert _denied(var, vlog, FileFacts("/var/log/x", 998, 0, 0o100060)) is not None  # owner bits rule the owner
    closed = FileFacts("/var/log/app", 0, 0, 0o40700)
    why = _denied(var, vlog, closed, FileFacts("/var/log/app/a.log", 0, 0, 0o100644))
    assert why is not None and "may not enter /var/log/app" in why
    assert _denied(var, vlog, FileFacts("/var/log/app", 0, 4, 0o40750)) is None  # a glob's directory: listed
    # setfacl -m u:nftblockd:r (what the unit's comment advises), and a mask that takes it back
    acl = ((1, 6, 0), (2, 4, 998), (4, 0, 0), (0x10, 4, 0), (0x20, 0, 0))
    assert _denied(ETC, FileFacts("/etc/app.log", 0, 0, 0o100640, acl)) is None
    masked = ((1, 6, 0), (2, 4, 998), (4, 0, 0), (0x10, 0, 0), (0x20, 0, 0))
    why = _denied(ETC, FileFacts("/etc/app.log", 0, 0, 0o100600, masked))
    assert why is not None and "with an ACL" in why
    group_acl = ((1, 6, 0), (4, 0, 0), (8, 4, 101), (0x10, 4, 0), (0x20, 0, 0))  # g:systemd-journal:r
    assert _denied(ETC, FileFacts("/etc/app.log", 0, 0, 0o100600, group_acl)) is None
    # the user does not exist yet: its groups still count, never an owner's bits
    assert _denied(var, vlog, log, who=Identity(None, frozenset({4}))) is None
    assert _denied(var, vlog, FileFacts("/var/log/x", 998, 0, 0o100600), who=Identity(None, frozenset())) \
        is not None


@pytest.mark.parametrize(("path", "hidden"), [
    ("/home/web/logs/a.log", "ProtectHome=yes"), ("/root/x.log", "ProtectHome=yes"), ("/tmp/app.log", "PrivateTmp"),
    ("/var/tmp/../tmp/x", "PrivateTmp"), ("/dev/stdin", "PrivateDevices"), ("/proc/kmsg", "ProcSubset"),
    ("/homework/a.log", None), ("/var/log/auth.log", None)])
def test_what_the_unit_hides(path: str, hidden: str | None) -> None:
    why = hidden_by(path)
    assert (why is None) if hidden is None else (why is not None and hidden in why and path in why)


def _acl_bytes(entries: list[tuple[int, int, int]]) -> bytes:
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def test_parse_acl_reads_the_kernels_attribute() -> None:
    entries = [(1, 6, 0xFFFFFFFF), (2, 4, 998), (4, 4, 0xFFFFFFFF), (0x10, 4, 0xFFFFFFFF), (0x20, 0, 0xFFFFFFFF)]
    assert parse_acl(_acl_bytes(entries)) == tuple(entries)
    for bad in (b"", b"\x02\x00\x00\x00\x01", struct.pack("<I", 1), _acl_bytes([(0x40, 4, 0)]),
                _acl_bytes([(1, 8, 0)])):
        with pytest.raises(ValueError):
            parse_acl(bad)


@given(st.binary(max_size=64))
def test_parse_acl_reads_or_refuses_any_bytes(data: bytes) -> None:
    try:
        entries = parse_acl(data)
    except ValueError:
        return  # refused with a reason, never another exception
    assert all(tag in (1, 2, 4, 8, 0x10, 0x20) and 0 <= perm <= 7 for tag, perm, _ in entries)
    why = read_denied("/x", [FileFacts("/x", 0, 0, 0o100600, entries)], NFTBLOCKD, GROUPS)
    assert why is None or why.startswith("the service's user nftblockd")


def test_a_jail_keeps_the_logpaths_the_service_may_read() -> None:
    m = plan_migration(_cfg(BASE + "[a]\nlogpath = /etc/shadow\n  /var/log/a.log\n  relative.log\n"
                            "[b]\nlogpath = /etc/shadow\n"), "/f", FakeHost())
    assert [(j.name, j.files) for j in m.jails] == [("a", ("/var/log/a.log",))]
    dropped = {(d.jail, d.what): d.reason for d in m.dropped}
    assert dropped[("a, b", "logpath /etc/shadow")] == "the service may not read it"
    assert dropped[("a", "logpath relative.log")] == "not an absolute path"
    assert "no logpath the service may read" in dropped[("b", "the whole jail")]


@pytest.mark.skipif(not Path("/etc/shadow").exists() or os.stat("/etc/shadow").st_mode & 0o004 != 0,
                    reason="no /etc/shadow closed to others here")
def test_this_hosts_shadow_is_refused(tmp_path: Path) -> None:
    etc, _ = _setup(tmp_path, None)
    (etc / "jail.local").write_text("[sshd]\nenabled = true\nlogpath = /etc/shadow\n  /var/log/auth.log\n"
                                    "[myapp]\nenabled = true\nfilter = sshd\nlogpath = /home/app/log/*.log\n")
    host = FsHost(etc)
    m = plan_migration(read_jails(etc), str(etc), host)
    assert [(j.name, j.files) for j in m.jails] == [("sshd", ("/var/log/auth.log",))]
    why = {(d.jail, d.what): d.reason for d in m.dropped}
    assert "may not read /etc/shadow (owner root, group shadow, mode 0640)" in why[("sshd", "logpath /etc/shadow")]
    assert "hides /home (ProtectHome=yes)" in why[("myapp", "logpath /home/app/log/*.log")]


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a link in /var/lib")
def test_a_link_into_a_hidden_place_is_refused(tmp_path: Path) -> None:
    (tmp_path / "app.log").write_text("")
    link = Path("/var/lib") / f"nftblockd-test-{os.getpid()}.log"  # outside what the unit hides...
    link.symlink_to(tmp_path / "app.log")  # ...pointing into its private /tmp
    try:
        why = FsHost(tmp_path).log_access(str(link))
    finally:
        link.unlink()
    assert why is not None and f"{link} is {tmp_path}/app.log: " in why and "PrivateTmp=yes" in why
