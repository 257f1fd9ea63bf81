"""`nftblock test-filter FILTER LOGFILE [--json]`: what fail2ban-regex does, without a daemon.

This is an IO edge: it reads log files or the journal, prints, and reads the clock (for lines/s and, when
no `now` is given, for year inference). The matching itself is matcher.Filter, exactly as the daemon runs
it, including the multi-line context. With `journal` matches it reads the journal's matching entries from
its head as a journal jail reads them (sources/journal.py: "HOST IDENT[PID]: MESSAGE", the entry's own
time) and matches them stamped, as the jail does (fail2ban-regex's `systemd-journal`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TextIO

from nftblockd import boundedread
from nftblockd.detect.filterload import load_filter
from nftblockd.detect.matcher import (
    FilterError,
    Match,
    MatchContext,
    Rejected,
)

__all__ = ["run"]

_SHOW_MAX = 200  # matched lines printed in text mode; --json lists them all


def printable(s: str) -> str:
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat()


def _journal_lines(matches: Sequence[tuple[str, str]], path: str | None, err: TextIO
                   ) -> tuple[list[str], list[float] | None] | None:
    """The matching entries' lines and times, as a journal jail reads them; None after saying why not."""
    try:
        from nftblockd.sources.journal import JournalSource  # systemd-python: only this mode needs it
    except ImportError:
        print("test-filter: reading the journal needs systemd-python (Debian: python3-systemd)", file=err)
        return None
    from nftblockd.sources.base import MemoryPositionStore, SourceError

    try:
        src = JournalSource("test-filter", matches, MemoryPositionStore(), path=path, syslog_format=True)
        lines: list[str] = []
        times: list[float] | None = []
        for batch in src.read_all():
            lines += batch.texts
            # a batch without times would shift every later time onto the wrong line; its lines are in
            # syslog format (date in the text), so the whole run falls back to unstamped matching instead
            if times is not None and batch.times is not None:
                times += batch.times
            else:
                times = None
    except (ValueError, SourceError) as exc:
        print(f"test-filter: {exc}", file=err)
        return None
    for why in src.missing():
        print(f"test-filter: {why}", file=err)
    return lines, times


def _file_lines(logfile: str, err: TextIO) -> tuple[list[str], None] | None:
    try:
        data = boundedread.read_bytes(logfile, boundedread.LOG_SAMPLE_MAX_BYTES)
    except OSError as exc:
        print(f"test-filter: cannot read {logfile}: {exc.strerror or exc}", file=err)
        return None
    return data.decode("utf-8", "surrogateescape").splitlines(), None


def run(filter_spec: str, logfile: str | None, *, json_output: bool, out: TextIO, now: float | None = None,
        err: TextIO | None = None, journal: Sequence[tuple[str, str]] = (), journal_dir: str | None = None
        ) -> int:
    """Match every line of `logfile` (or with `journal` matches, every matching journal entry of the local
    journal or of `journal_dir`) with `filter_spec` and report. 0: done; 1: filter, file or journal error
    (one line on stderr). `now` is the reference time for logs without a year (default: the clock).
    """
    err = err if err is not None else sys.stderr
    try:
        flt = load_filter(filter_spec)
    except FilterError as exc:
        print(f"test-filter: bad filter {filter_spec!r}: {exc}", file=err)
        return 1
    got = _journal_lines(journal, journal_dir, err) if journal else _file_lines(logfile or "", err)
    if got is None:
        return 1
    lines, times = got
    ref = time.time() if now is None else now
    ctx = MatchContext()
    matches: list[tuple[int, Match]] = []
    ignored: list[tuple[int, Match | Rejected]] = []
    rejected: list[tuple[int, Rejected]] = []
    t0 = time.perf_counter()
    # the jails' path, so lines/s is the daemon's; journal lines carry their time (stamped), as in a jail
    for i, r in flt.scan(lines, ref, ctx, stamped=times is not None):
        n = i + 1
        if r.ignored:
            ignored.append((n, r))
        elif isinstance(r, Match):
            matches.append((n, r if times is None else r._replace(time=times[i])))
        else:
            rejected.append((n, r))
    elapsed = time.perf_counter() - t0
    lps = len(lines) / elapsed if elapsed > 0 else float(len(lines))
    if json_output:
        doc = {
            "filter": flt.name,
            "lines": len(lines),
            "matched": len(matches),
            "ignored": len(ignored),
            "rejected": len(rejected),
            "lines_per_second": round(lps, 1),
            "matches": [{"line": n, "host": str(m.host), "time": _iso(m.time)} for n, m in matches],
            "ignored_lines": [n for n, _ in ignored],
            "rejected_hosts": [{"line": n, "text": printable(r.text), "reason": r.reason}
                               for n, r in rejected],
            "notes": [printable(s) for s in flt.notes],
            "engine": flt.scanner,
            "engine_notes": list(flt.native_notes),
            "native": flt.native_stats,
        }
        out.write(json.dumps(doc) + "\n")
        return 0
    w = out.write
    w(f"Filter: {flt.name} ({flt.definition.source}), {len(flt.engines)} regexes "
      f"({flt.engines.count('re2')} on RE2)\n")
    w(f"Engine: {flt.scanner}\n")
    for note in (*flt.notes, *flt.native_notes):
        w(f"  note: {printable(note)}\n")
    w(f"\nMatched lines ({len(matches)}):\n")
    for n, m in matches[:_SHOW_MAX]:
        w(f"  {n:>7}  {m.host!s:<39}  {_iso(m.time) or '-':<25}  {printable(lines[n - 1])}\n")
    if len(matches) > _SHOW_MAX:
        w(f"  ... {len(matches) - _SHOW_MAX} more (--json lists them all)\n")
    if ignored:
        w(f"\nIgnored lines (ignoreregex, {len(ignored)}):\n")
        for n, _r in ignored[:_SHOW_MAX]:
            w(f"  {n:>7}  {printable(lines[n - 1])}\n")
    if rejected:
        w(f"\nSkipped, host is not an address nftblockd bans ({len(rejected)}):\n")
        for n, r in rejected[:_SHOW_MAX]:
            w(f"  {n:>7}  {r.reason:<12} {printable(r.text)!r}\n")
    hosts = len({m.host for _, m in matches})
    w(f"\nLines: {len(lines)}, matched: {len(matches)} ({hosts} hosts), ignored: {len(ignored)}, "
      f"skipped hosts: {len(rejected)}, missed: {len(lines) - len(matches) - len(ignored) - len(rejected)}\n")
    w(f"Speed: {lps:,.0f} lines/s\n")
    stats = flt.native_stats
    if stats is not None and (stats["python_lines"] or stats["limited"]):
        w(f"Native core: {stats['python_lines']} lines on the Python path (not ASCII, no usual timestamp, or a "
          f"rule PCRE2 cannot run), {stats['limited']} skipped at the regex match limit\n")
    return 0
