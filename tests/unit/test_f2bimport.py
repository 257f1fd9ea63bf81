"""Reading fail2ban's database: fixtures with fail2ban 1.0.2's exact schema, older schemas, and one made by
fail2ban itself when its package is installed. sqlite3 is imported here only to build the fixtures."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from nftblockd.addr import AddressError, parse_target
from nftblockd.durations import PERMANENT
from nftblockd.events import Ban
from nftblockd.state.f2bimport import UNKNOWN_BANTIME, F2bBan, F2bImportError, read_fail2ban_bans

NOW = 1_800_000_000.0

# fail2ban 1.0.2, fail2ban/server/database.py, Fail2BanDb._CREATE_SCRIPTS (schema version 4), verbatim.
F2B_SCHEMA_V4 = (
    "CREATE TABLE IF NOT EXISTS fail2banDb(version INTEGER);",
    "CREATE TABLE IF NOT EXISTS jails("
    "name TEXT NOT NULL UNIQUE, "
    "enabled INTEGER NOT NULL DEFAULT 1"
    ");"
    "CREATE INDEX IF NOT EXISTS jails_name ON jails(name);",
    "CREATE TABLE IF NOT EXISTS logs("
    "jail TEXT NOT NULL, "
    "path TEXT, "
    "firstlinemd5 TEXT, "
    "lastfilepos INTEGER DEFAULT 0, "
    "FOREIGN KEY(jail) REFERENCES jails(name) ON DELETE CASCADE, "
    "UNIQUE(jail, path),"
    "UNIQUE(jail, path, firstlinemd5)"
    ");"
    "CREATE INDEX IF NOT EXISTS logs_path ON logs(path);"
    "CREATE INDEX IF NOT EXISTS logs_jail_path ON logs(jail, path);",
    "CREATE TABLE IF NOT EXISTS bans("
    "jail TEXT NOT NULL, "
    "ip TEXT, "
    "timeofban INTEGER NOT NULL, "
    "bantime INTEGER NOT NULL, "
    "bancount INTEGER NOT NULL default 1, "
    "data JSON, "
    "FOREIGN KEY(jail) REFERENCES jails(name) "
    ");"
    "CREATE INDEX IF NOT EXISTS bans_jail_timeofban_ip ON bans(jail, timeofban);"
    "CREATE INDEX IF NOT EXISTS bans_jail_ip ON bans(jail, ip);"
    "CREATE INDEX IF NOT EXISTS bans_ip ON bans(ip);",
    "CREATE TABLE IF NOT EXISTS bips("
    "ip TEXT NOT NULL, "
    "jail TEXT NOT NULL, "
    "timeofban INTEGER NOT NULL, "
    "bantime INTEGER NOT NULL, "
    "bancount INTEGER NOT NULL default 1, "
    "data JSON, "
    "PRIMARY KEY(ip, jail), "
    "FOREIGN KEY(jail) REFERENCES jails(name) "
    ");"
    "CREATE INDEX IF NOT EXISTS bips_timeofban ON bips(timeofban);"
    "CREATE INDEX IF NOT EXISTS bips_ip ON bips(ip);",
)

# Schema version 2 (fail2ban 0.9/0.10): no bips, and bans has neither bantime nor bancount.
F2B_SCHEMA_V2 = (
    "CREATE TABLE fail2banDb(version INTEGER);",
    "CREATE TABLE jails(name TEXT NOT NULL UNIQUE, enabled INTEGER NOT NULL DEFAULT 1);",
    "CREATE TABLE bans(jail TEXT NOT NULL, ip TEXT, timeofban INTEGER NOT NULL, data JSON,"
    " FOREIGN KEY(jail) REFERENCES jails(name));",
)

T = int(NOW)
DATA = '{"matches": ["Dec  2 10:00:00 host sshd[1]: Failed password"], "failures": 5}'
# (jail, ip, timeofban, bantime, bancount): what fail2ban's addBan writes into both bans and bips
ROWS = [
    ("sshd", "192.0.2.1", T - 100, 600, 1),  # 500 s left
    ("sshd", "192.0.2.2", T - 10_000, -1, 3),  # permanent
    ("sshd", "192.0.2.3", T - 700, 600, 1),  # over 100 s ago
    ("sshd", "192.0.2.4", T - 600, 600, 1),  # ends exactly now: over
    ("sshd", "2001:db8::7", T - 10, 3600, 2),
    ("sshd", "198.51.100.0/24", T - 10, 3600, 1),
    ("sshd", "host.example", T - 10, 3600, 1),  # a custom filter's <HOST> that is a name
    ("sshd", "", T - 10, 3600, 1),  # fail2ban itself skips empty ids
    ("recidive", "192.0.2.1", T - 50, 604800, 1),  # the same address in another jail
    ("old", "203.0.113.5", T - 100, -2, 1),  # unknown bantime (upgraded from schema 2)
]


def make_v4(path: Path, rows: list[tuple[str, str, int, int, int]] = ROWS) -> Path:
    with contextlib.closing(sqlite3.connect(path)) as c:
        for script in F2B_SCHEMA_V4:
            c.executescript(script)
        c.execute("INSERT INTO fail2banDb(version) VALUES(4)")
        for jail in {r[0] for r in rows}:
            c.execute("INSERT OR IGNORE INTO jails(name, enabled) VALUES(?, 0)", (jail,))  # fail2ban stopped
        for jail, ip, at, bantime, count in rows:
            c.execute("INSERT INTO bans(jail, ip, timeofban, bantime, bancount, data) VALUES(?,?,?,?,?,?)",
                      (jail, ip, at, bantime, count, DATA))
            c.execute("INSERT OR REPLACE INTO bips(ip, jail, timeofban, bantime, bancount, data)"
                      " VALUES(?,?,?,?,?,?)", (ip, jail, at, bantime, count, DATA))
        c.commit()
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_reads_active_bans_with_remaining_time(tmp_path: Path) -> None:
    db = make_v4(tmp_path / "fail2ban.sqlite3")
    bans = read_fail2ban_bans(db, NOW)
    assert bans == [
        F2bBan("old", "203.0.113.5", NOW - 100, UNKNOWN_BANTIME, 1, NOW + 500, 500.0),
        F2bBan("recidive", "192.0.2.1", NOW - 50, 604800.0, 1, NOW + 604750, 604750.0),
        F2bBan("sshd", "192.0.2.2", NOW - 10_000, PERMANENT, 3, None, PERMANENT),
        F2bBan("sshd", "192.0.2.1", NOW - 100, 600.0, 1, NOW + 500, 500.0),
        F2bBan("sshd", "198.51.100.0/24", NOW - 10, 3600.0, 1, NOW + 3590, 3590.0),
        F2bBan("sshd", "2001:db8::7", NOW - 10, 3600.0, 2, NOW + 3590, 3590.0),
        F2bBan("sshd", "host.example", NOW - 10, 3600.0, 1, NOW + 3590, 3590.0),
    ]


def test_jail_filter_and_unknown_bantime(tmp_path: Path) -> None:
    db = make_v4(tmp_path / "fail2ban.sqlite3")
    assert [b.ip for b in read_fail2ban_bans(db, NOW, jails={"recidive"})] == ["192.0.2.1"]
    assert read_fail2ban_bans(db, NOW, jails=["old"], unknown_bantime=60) == []


def test_conversion_to_our_ban(tmp_path: Path) -> None:
    by_ip = {(b.jail, b.ip): b for b in read_fail2ban_bans(make_v4(tmp_path / "f.sqlite3"), NOW)}
    assert by_ip["sshd", "192.0.2.2"].to_ban("default") == Ban(
        parse_target("192.0.2.2"), "default", None, "fail2ban", "imported from fail2ban jail sshd", "sshd")
    net = by_ip["sshd", "198.51.100.0/24"].to_ban("ssh", reason="x").target
    assert net == parse_target("198.51.100.0/24")
    assert by_ip["sshd", "2001:db8::7"].to_ban("v6").until == NOW + 3590
    with pytest.raises(AddressError):
        by_ip["sshd", "host.example"].target()


def test_old_schema_without_bips(tmp_path: Path) -> None:
    db = tmp_path / "fail2ban.sqlite3"
    with contextlib.closing(sqlite3.connect(db)) as c:
        for script in F2B_SCHEMA_V2:
            c.executescript(script)
        c.execute("INSERT INTO fail2banDb(version) VALUES(2)")
        c.executemany("INSERT INTO bans(jail, ip, timeofban, data) VALUES(?,?,?,?)", [
            ("sshd", "192.0.2.1", T - 5000, DATA),  # an earlier ban of the same address ...
            ("sshd", "192.0.2.1", T - 100, DATA),  # ... the latest one counts
            ("sshd", "192.0.2.9", T - 5000, DATA),
        ])
        c.commit()
    assert read_fail2ban_bans(db, NOW) == [
        F2bBan("sshd", "192.0.2.1", NOW - 100, UNKNOWN_BANTIME, 1, NOW + 500, 500.0)]


def test_schema_3_without_bips_uses_the_latest_ban(tmp_path: Path) -> None:
    db = tmp_path / "fail2ban.sqlite3"
    with contextlib.closing(sqlite3.connect(db)) as c:
        c.executescript(F2B_SCHEMA_V4[3])
        c.executemany("INSERT INTO bans(jail, ip, timeofban, bantime, bancount, data) VALUES(?,?,?,?,?,?)", [
            ("sshd", "192.0.2.1", T - 100, -1, 1, DATA),
            ("sshd", "192.0.2.1", T - 50, 30, 2, DATA),  # the latest: 30 s from T - 50, over
        ])
        c.commit()
    assert read_fail2ban_bans(db, NOW) == []


def test_read_leaves_the_file_alone_and_holds_no_lock(tmp_path: Path) -> None:
    db = make_v4(tmp_path / "fail2ban.sqlite3")
    before = digest(db)
    with contextlib.closing(sqlite3.connect(db, timeout=0)) as fail2ban:
        fail2ban.execute("BEGIN IMMEDIATE")  # fail2ban in the middle of a write: readers still read
        fail2ban.execute("INSERT INTO jails(name) VALUES('new')")
        assert len(read_fail2ban_bans(db, NOW)) == 7
        fail2ban.rollback()
        read_fail2ban_bans(db, NOW)
        fail2ban.execute("BEGIN EXCLUSIVE")  # no lock left behind by the reader: fail2ban can commit at once
        fail2ban.rollback()
    assert digest(db) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fail2ban.sqlite3"]  # no journal, no -wal


@pytest.mark.root
def test_read_only_file_in_a_read_only_directory(tmp_path: Path) -> None:
    if shutil.which("chattr") is None:
        pytest.skip("needs chattr")
    d = tmp_path / "f2b"
    d.mkdir()
    db = make_v4(d / "fail2ban.sqlite3")
    if subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode != 0:
        pytest.skip("needs root and a filesystem with chattr +i")
    try:
        assert len(read_fail2ban_bans(db, NOW)) == 7
    finally:
        subprocess.run(["chattr", "-i", str(d)], check=True)


@pytest.mark.parametrize("content, words", [
    (None, "does not exist"),
    (b"this is not sqlite" * 100, "is corrupt (file is not a database)"),
    (b"", "no bans table: it is not a fail2ban database"),
])
def test_unreadable_databases_are_reported(tmp_path: Path, content: bytes | None, words: str) -> None:
    db = tmp_path / "fail2ban.sqlite3"
    if content is not None:
        db.write_bytes(content)
    with pytest.raises(F2bImportError) as e:
        read_fail2ban_bans(db, NOW)
    assert str(db) in str(e.value) and words in str(e.value)


def test_a_directory_is_reported(tmp_path: Path) -> None:
    with pytest.raises(F2bImportError, match="is not a regular file"):
        read_fail2ban_bans(tmp_path, NOW)


MAKE_WITH_FAIL2BAN = r"""
import sys
from fail2ban.server.database import Fail2BanDb
from fail2ban.server.ticket import BanTicket

class Actions:
    def getBanTime(self):
        return 600

class Jail:
    def __init__(self, name):
        self.name = name
        self.actions = Actions()

db = Fail2BanDb(sys.argv[1])
now = float(sys.argv[2])
sshd = Jail("sshd")
db.addJail(sshd)
for ip, at, bantime, count in [("192.0.2.1", now - 100, 3600, 1), ("192.0.2.2", now - 100, -1, 3),
                               ("2001:db8::5", now - 10000, 600, 1)]:
    t = BanTicket(ip, at)
    t.setBanTime(bantime)
    t.setBanCount(count)
    db.addBan(sshd, t)
db.close()
"""


def test_a_database_written_by_fail2ban_itself(tmp_path: Path) -> None:
    python3 = shutil.which("python3", path="/usr/bin")
    if python3 is None or subprocess.run([python3, "-c", "import fail2ban"], capture_output=True).returncode:
        pytest.skip("fail2ban is not installed for the system python")
    db = tmp_path / "fail2ban.sqlite3"
    subprocess.run([python3, "-c", MAKE_WITH_FAIL2BAN, str(db), str(NOW)], check=True, capture_output=True)
    assert read_fail2ban_bans(db, NOW) == [
        F2bBan("sshd", "192.0.2.1", float(T - 100), 3600.0, 1, float(T + 3500), T + 3500 - NOW),
        F2bBan("sshd", "192.0.2.2", float(T - 100), PERMANENT, 3, None, PERMANENT),
    ]


def test_refusal_of_never_ban_space_and_of_bans_from_the_future() -> None:
    from nftblockd.state.f2bimport import MAX_AHEAD, refusal

    def ban(ip: str, at: float) -> F2bBan:
        return F2bBan("sshd", ip, at, 600.0, 1, at + 600.0, at + 600.0 - NOW)

    assert refusal(ban("192.0.2.1", NOW - 10), parse_target("192.0.2.1"), NOW) is None
    why = refusal(ban("0.0.0.0", NOW - 10), parse_target("0.0.0.0"), NOW)
    assert why is not None and "never banned" in why and "unspecified" in why
    assert refusal(ban("192.0.2.1", NOW + MAX_AHEAD), parse_target("192.0.2.1"), NOW) is None  # within skew
    why = refusal(ban("192.0.2.1", NOW + 1000 * 86400), parse_target("192.0.2.1"), NOW)
    assert why is not None and "in the future" in why
