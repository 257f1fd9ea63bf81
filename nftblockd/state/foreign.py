"""Another program's SQLite database (fail2ban's), read-only: queries only, never a write, no lock held.

`f2bimport.py` reads fail2ban's bans through it. Errors become `StoreError` with the file named.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nftblockd.state.db import WHAT, StoreError, classify, connect, ro_uri

__all__ = ["ReadOnlyDatabase", "open_readonly"]


class ReadOnlyDatabase:
    """Another program's SQLite database (fail2ban's), opened read-only: queries only, no journal, no lock
    held between queries, so the program that owns it is not disturbed."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path

    def tables(self) -> set[str]:
        return {str(r[0]) for r in self.query("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def columns(self, table: str) -> list[str]:
        return [str(r[1]) for r in self.query(f"PRAGMA table_info({_quote_ident(table)})")]

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return list(self._conn.execute(sql, tuple(params)).fetchall())
        except sqlite3.Error as exc:
            kind = classify(exc)
            raise StoreError(kind, str(self.path), f"database {self.path} {WHAT[kind]} ({exc})") from None

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ReadOnlyDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def open_readonly(path: str | Path) -> ReadOnlyDatabase:
    """Open someone else's database with `mode=ro`; StoreError if missing, unreadable or not a database."""
    p = Path(path)
    if not p.exists():
        raise StoreError("io", str(p), f"database {p} does not exist")
    if not p.is_file():
        raise StoreError("io", str(p), f"database {p} is not a regular file")
    if not os.access(p, os.R_OK):
        raise StoreError("unwritable", str(p), f"database {p} is not readable by this user")
    conn: sqlite3.Connection | None = None
    try:
        conn = connect(ro_uri(p), uri=True)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # "file is not a database" shows here
    except sqlite3.Error as exc:
        if conn is not None:
            conn.close()
        kind = classify(exc)
        raise StoreError(kind, str(p), f"database {p} {WHAT[kind]} ({exc})") from None
    return ReadOnlyDatabase(conn, p)
