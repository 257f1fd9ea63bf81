"""JournalSource._read against a fake sd-journal reader: which time each line gets, and what is counted.

The real reader is exercised in tests/integration/test_journal.py; a local client cannot set a trusted field
such as _SOURCE_REALTIME_TIMESTAMP, so a bad one (journal-remote passes on what a remote sent) is shown here.
"""

from __future__ import annotations

from typing import Any

from nftblockd.sources.base import MemoryPositionStore
from nftblockd.sources.journal import JournalSource

JOURNALD_US = 1_700_000_100_000_000  # when journald wrote each entry (__REALTIME_TIMESTAMP)


class FakeReader:
    """The part of systemd.journal.Reader that `_read` calls, over a list of entries (field -> value)."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries
        self.at = -1

    def _next(self) -> bool:
        self.at += 1
        return self.at < len(self.entries)

    def _get(self, field: str) -> Any:
        return self.entries[self.at][field]

    def _get_realtime(self) -> int:
        return JOURNALD_US

    def _get_cursor(self) -> str:
        return f"c{self.at}"

    def test_cursor(self, cursor: str) -> bool:
        return cursor == f"c{self.at}"


def test_a_source_time_that_is_not_a_number_is_counted_and_journalds_time_used() -> None:
    src = JournalSource("sshd", [("SYSLOG_IDENTIFIER", "sshd")], MemoryPositionStore())
    reader = FakeReader([
        {"MESSAGE": b"good", "_SOURCE_REALTIME_TIMESTAMP": b"1700000000000000"},
        {"MESSAGE": b"no source time"},
        {"MESSAGE": b"garbage source time", "_SOURCE_REALTIME_TIMESTAMP": b"yesterday"},
        {"MESSAGE": b"empty source time", "_SOURCE_REALTIME_TIMESTAMP": b""},
        {"MESSAGE": b"after"},
    ])
    batch, more, cursor = src._read(reader, 10)
    assert batch.texts == ["good", "no source time", "garbage source time", "empty source time", "after"]
    assert batch.times == [1_700_000_000.0] + [JOURNALD_US / 1e6] * 4
    assert (more, cursor) == (False, "c5")
    assert src.stats.bad_time == 2  # a missing field is journald's own case, not a bad one


def test_nul_bytes_in_a_message_are_removed_and_counted() -> None:
    """Issue 33, the journal's side of linesplit's rule 5: the message is matched without its NUL bytes."""
    src = JournalSource("sshd", [("SYSLOG_IDENTIFIER", "sshd")], MemoryPositionStore())
    reader = FakeReader([{"MESSAGE": b"Failed password for root from 203.0.113.1\0\0\0 port 22 ssh2"},
                         {"MESSAGE": b"\0\0fine"}, {"MESSAGE": b"plain"}])
    batch, _more, _cursor = src._read(reader, 10)
    assert batch.texts == ["Failed password for root from 203.0.113.1 port 22 ssh2", "fine", "plain"]
    assert src.stats.nul == 2
