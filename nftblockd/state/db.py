"""The SQLite layer the state modules share: connections, transactions, and sqlite3 errors as problem kinds.

Internal to `nftblockd.state`. It knows no table: the schema is in schema.py, the daemon's database in
store.py. It never touches the kernel, reads no config and runs no asyncio.
"""

from __future__ import annotations

import contextlib
import sqlite3
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeAlias

__all__ = ["BUSY_TIMEOUT", "WHAT", "ProblemKind", "StoreError", "StoreProblem", "Unusable", "classify", "connect",
           "ro_uri", "transaction"]

BUSY_TIMEOUT = 5.0  # seconds to wait for another process's lock (an operator's sqlite3 shell)
ProblemKind: TypeAlias = Literal["corrupt", "unwritable", "full", "busy", "too_new", "foreign", "io",
                                 "closed"]


class StoreError(Exception):
    """The state database failed; `str()` is a sentence for operators naming the file.

    `kind`: corrupt | unwritable | full | busy | too_new | foreign | io | closed.
    """

    def __init__(self, kind: ProblemKind, path: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.path = path


@dataclass(frozen=True, slots=True)
class StoreProblem:
    """Something went wrong with the database and the store worked around it; log `message`, count `kind`.

    `in_memory`: state is now kept in memory only (nothing survives a restart until the operator fixes it).
    `lost_state`: the database was replaced; the daemon should save again the bans it holds (`save_bans`).
    A corrupt file's salvage: `salvaged_rows` rows were read from it and kept, `dropped_rows` were read but
    did not fit the schema; `truncated_bytes` is how much shorter the file was than its own header says (a
    truncated copy or a half-written file: whatever was in those bytes is lost, and the kernel's sets are what
    the reconcile adopts it from).
    """

    kind: ProblemKind
    path: str
    message: str
    moved_to: str | None = None
    in_memory: bool = False
    lost_state: bool = False
    recovered_bans: int = 0
    salvaged_rows: int = 0
    dropped_rows: int = 0
    truncated_bytes: int = 0


class Unusable(Exception):
    """The database cannot be used as it is: `kind` says why, `detail` what SQLite or the OS said.

    Never leaves the package: the store turns it into a `StoreProblem` (and works around it) or a `StoreError`.
    """

    def __init__(self, kind: ProblemKind, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


def classify(exc: BaseException) -> ProblemKind:
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc).lower()
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in text \
            or "not a database" in text:
        return "corrupt"
    if name.startswith("SQLITE_FULL") or "disk is full" in text:
        return "full"
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return "busy"
    if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH")):
        return "unwritable"
    return "io"


WHAT = {
    "corrupt": "is corrupt", "unwritable": "cannot be written", "full": "cannot grow: the disk is full",
    "busy": "is locked by another process", "io": "failed", "too_new": "is too new", "foreign": "is not ours",
    "closed": "is closed",
}


def connect(target: str, *, uri: bool = False) -> sqlite3.Connection:
    return sqlite3.connect(target, uri=uri, isolation_level=None, check_same_thread=False,
                           timeout=BUSY_TIMEOUT, cached_statements=64)


def ro_uri(path: Path, *, immutable: bool = False) -> str:
    q = "immutable=1" if immutable else "mode=ro"
    return f"file:{urllib.parse.quote(str(path.absolute()))}?{q}"


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
