"""Read the bans still in force from fail2ban's own database, for `nftblock import-fail2ban [PATH]`.

fail2ban (0.11 - 1.1; Debian 12 ships 1.0.2) keeps its bans in an SQLite file, by default
/var/lib/fail2ban/fail2ban.sqlite3, schema version 4:

    bans(jail, ip, timeofban, bantime, bancount, data)                      every ban ever made
    bips(ip, jail, timeofban, bantime, bancount, data, PRIMARY KEY(ip, jail)) the latest per (ip, jail)

`bantime` is in seconds; -1 is permanent; -2 means "unknown" (rows carried over from a schema-2 database,
which had no bantime column), which fail2ban replaces with the jail's bantime when it restores them. Older
databases have no `bips` table, and schema 2 has no `bantime` or `bancount` columns; all of them are read.

The file is opened read-only (`mode=ro`) through store.py (the only module that speaks SQLite): no journal is
created, nothing is written, and no lock is held after the call returns, so a running fail2ban is not
disturbed. `ip` is returned as fail2ban wrote it (usually an address, sometimes a CIDR or, with custom
filters, a name): the caller parses it (`F2bBan.target()`) and decides what to skip. This module never touches
the kernel or our own state.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from nftblockd.addr import IPNet, parse_target
from nftblockd.durations import PERMANENT, BanLength, Permanent
from nftblockd.events import Ban
from nftblockd.neverban import never_ban_reason
from nftblockd.state.foreign import open_readonly
from nftblockd.state.store import StoreError

__all__ = ["DEFAULT_DB", "MAX_AHEAD", "UNKNOWN_BANTIME", "F2bBan", "F2bImportError", "read_fail2ban_bans",
           "refusal"]

DEFAULT_DB = "/var/lib/fail2ban/fail2ban.sqlite3"
UNKNOWN_BANTIME = 600.0  # fail2ban's default jail bantime, for rows whose bantime it never recorded (-2)
# fail2ban writes its database on this host, with this clock: a ban that starts more than this far ahead of
# `now` was not written by it honestly (a forged or corrupted row), and would otherwise last its bantime
# *plus* however far ahead it claims to start.
MAX_AHEAD = 60.0


class F2bImportError(Exception):
    """fail2ban's database cannot be read; the message names the file and says why."""


@dataclass(frozen=True, slots=True)
class F2bBan:
    """One fail2ban ban still in force at the `now` it was read at."""

    jail: str
    ip: str  # as fail2ban stored it
    time_of_ban: float
    ban_time: BanLength  # seconds, or PERMANENT (fail2ban's -1)
    ban_count: int
    until: float | None  # time_of_ban + ban_time; None: never ends (as events.Ban.until)
    remaining: BanLength  # seconds left at `now`, or PERMANENT

    def target(self) -> IPNet:
        """The address or CIDR banned; raises addr.AddressError when fail2ban's id is not one."""
        return parse_target(self.ip)

    def to_ban(self, blocklist: str, *, reason: str | None = None) -> Ban:
        """The same ban for our `blocklist` (same end time); raises AddressError like `target()`."""
        return Ban(self.target(), blocklist, self.until, origin="fail2ban",
                   reason=reason if reason is not None else f"imported from fail2ban jail {self.jail}",
                   jail=self.jail)


def read_fail2ban_bans(db_path: str | Path, now: float, *, jails: Collection[str] | None = None,
                       unknown_bantime: float = UNKNOWN_BANTIME) -> list[F2bBan]:
    """Bans in fail2ban's database at `db_path` still in force at `now`, ordered by jail then time of ban.

    `jails` keeps only those jails. Raises F2bImportError when the file is missing, unreadable, not a
    SQLite database or not fail2ban's. `now` is an argument: this module never reads the clock.
    """
    path = Path(db_path)
    try:
        with open_readonly(path) as db:
            tables = db.tables()
            if "bips" in tables:
                rows = db.query("SELECT jail, ip, timeofban, bantime, bancount FROM bips")
            elif "bans" in tables:
                cols = set(db.columns("bans"))
                bantime = "bantime" if "bantime" in cols else "-2"
                bancount = "bancount" if "bancount" in cols else "1"
                # SQLite takes the bare columns from the row holding max(): the latest ban per (jail, ip).
                rows = db.query(f"SELECT jail, ip, max(timeofban), {bantime}, {bancount} FROM bans"
                                " GROUP BY jail, ip")
            else:
                raise F2bImportError(f"{path} has no bans table: it is not a fail2ban database")
    except StoreError as exc:
        raise F2bImportError(str(exc)) from None
    wanted = None if jails is None else set(jails)
    out: list[F2bBan] = []
    for row in rows:
        ban = _active(row, now, unknown_bantime)
        if ban is not None and (wanted is None or ban.jail in wanted):
            out.append(ban)
    out.sort(key=lambda b: (b.jail, b.time_of_ban, b.ip))
    return out


def _active(row: tuple[object, ...], now: float, unknown_bantime: float) -> F2bBan | None:
    jail, ip, timeofban, bantime, bancount = row
    if not ip or not isinstance(ip, str | bytes) or jail is None:
        return None  # fail2ban skips such rows too (it calls them "sporadical wrong-empty rows")
    try:
        at = float(timeofban)  # type: ignore[arg-type]
        bt = int(bantime)  # type: ignore[call-overload]
        count = int(bancount) if bancount is not None else 1  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    ip_text = (ip.decode("utf-8", "replace") if isinstance(ip, bytes) else ip).strip()
    duration: BanLength
    if bt == -2:
        duration = unknown_bantime
    elif bt < 0:
        duration = PERMANENT  # -1 (and anything else negative, as fail2ban's own query reads it)
    else:
        duration = float(bt)
    if isinstance(duration, Permanent):
        return F2bBan(str(jail), ip_text, at, PERMANENT, count, None, PERMANENT)
    until = at + duration
    if until <= now:
        return None
    return F2bBan(str(jail), ip_text, at, duration, count, until, until - now)


def refusal(ban: F2bBan, target: IPNet, now: float, *, max_ahead: float = MAX_AHEAD) -> str | None:
    """Why `ban` (whose address `target` the caller parsed) must not be imported, or None.

    Never-ban space (`neverban.py`) is refused as from any other path; so is a ban whose time of ban lies
    more than `max_ahead` seconds after `now`.
    """
    why = never_ban_reason(target)
    if why is not None:
        return f"{ban.ip} (fail2ban jail {ban.jail}) is never banned: {why}"
    ahead = ban.time_of_ban - now
    if ahead > max_ahead:
        return (f"{ban.ip} (fail2ban jail {ban.jail}) has a time of ban {ahead:.0f}s in the future (more than "
                f"{max_ahead:.0f}s ahead of this clock): not imported")
    return None
