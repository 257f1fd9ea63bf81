"""Logging to stderr (key=value) and to the journal (structured fields), and the audit line format."""

from __future__ import annotations

import io
import ipaddress
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nftblockd.service import logsetup
from nftblockd.service.logsetup import AUDIT_MESSAGE_ID, audit, quote, setup_logging, wants_journal

# The shape the built-in recidive filter matches after journald's `nftblockd[PID]: ` prefix.
RECIDIVE = re.compile(r"^(?P<action>ban|unban) jail=(?P<jail>\S+) address=(?P<address>\S+)(?: |$)")


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
            h.close()
    root.setLevel(level)


@pytest.fixture
def stderr_log() -> io.StringIO:
    out = io.StringIO()
    setup_logging("info", force_stderr=True, stream=out)
    return out


# -- stderr ------------------------------------------------------------------------------------------------

def test_stderr_lines_are_readable_with_extras_as_key_value(stderr_log: io.StringIO) -> None:
    extra = {"feed": "spamhaus", "blocklist": "feeds", "origin": None}
    logging.getLogger("nftblockd.feeds").info("feed refreshed: %d entries", 1200, extra=extra)
    line = stderr_log.getvalue()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} INFO    nftblockd\.feeds: "
                        r"feed refreshed: 1200 entries feed=spamhaus blocklist=feeds\n", line), line


def test_level_filters_and_a_second_setup_replaces_the_first(stderr_log: io.StringIO) -> None:
    log = logging.getLogger("nftblockd.x")
    log.debug("hidden")
    again = io.StringIO()
    setup_logging("DEBUG", force_stderr=True, stream=again)
    log.debug("shown")
    assert stderr_log.getvalue() == ""
    assert "DEBUG   nftblockd.x: shown" in again.getvalue()
    marked = [h for h in logging.getLogger().handlers if getattr(h, "_nftblockd_handler", False)]
    assert len(marked) == 1


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="debug, info, warning, error"):
        setup_logging("verbose", force_stderr=True, stream=io.StringIO())


def test_exceptions_follow_the_fields(stderr_log: io.StringIO) -> None:
    try:
        raise OSError(105, "No buffer space available")
    except OSError:
        logging.getLogger("nftblockd.netlink").exception("batch refused", extra={"set": "default_ip4"})
    first, *rest = stderr_log.getvalue().splitlines()
    assert first.endswith("batch refused set=default_ip4")
    assert rest[-1] == "OSError: [Errno 105] No buffer space available"


@pytest.mark.parametrize(("raw", "shown"), [
    ("sshd", "sshd"),
    ("2001:db8::/64", "2001:db8::/64"),
    ("5 failures in 10m", '"5 failures in 10m"'),
    ("", '""'),
    ('say "hi"', '"say \\"hi\\""'),
    ("a=b", '"a=b"'),
    ("line\nnftblockd[1]: ban jail=x", '"line\\nnftblockd[1]: ban jail=x"'),
    ("tab\there", '"tab\\there"'),
    ("bell\x07", '"bell\\x07"'),
    ("sep\u2028", '"sep\\u2028"'),
    ("back\\slash", '"back\\\\slash"'),
    ("héllo", "héllo"),
])
def test_quote(raw: str, shown: str) -> None:
    assert quote(raw) == shown


def test_fields_the_message_already_states_are_not_repeated(stderr_log: io.StringIO) -> None:
    logging.getLogger("nftblockd.audit").info(
        'ban jail=%s address=%s reason="%s"', "cli", "192.0.2.77", "test",
        extra={"jail": "cli", "address": "192.0.2.77", "origin": "cli"})
    assert stderr_log.getvalue().endswith(' ban jail=cli address=192.0.2.77 reason="test" origin=cli\n')


def test_a_hostile_value_cannot_forge_a_line(stderr_log: io.StringIO) -> None:
    logging.getLogger("nftblockd.m").warning("unparsable line", extra={"text": "x\nnftblockd[1]: ban jail=a"})
    assert stderr_log.getvalue().count("\n") == 1


# -- audit lines --------------------------------------------------------------------------------------------

def test_the_audit_line_format(stderr_log: io.StringIO) -> None:
    log = logging.getLogger("nftblockd.tracker")
    text = audit(log, "ban", jail="sshd", address=ipaddress.ip_network("203.0.113.7"), set="default_ip4",
                 duration=3600, reason="5 failures in 10m")
    assert text == 'ban jail=sshd address=203.0.113.7 set=default_ip4 duration=1h reason="5 failures in 10m"'
    # Printed once: the fields are in the text already, so nothing is appended.
    assert stderr_log.getvalue().rstrip("\n").endswith(" nftblockd.tracker: " + text)
    m = RECIDIVE.match(text)
    assert m and m["jail"] == "sshd" and m["address"] == "203.0.113.7"


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"jail": "sshd", "address": "2001:db8::1"}, "unban jail=sshd address=2001:db8::1"),
    ({"jail": None, "address": ipaddress.ip_network("2001:db8::/64"), "origin": "cli"},
     "unban jail=- address=2001:db8::/64 origin=cli"),
    ({"jail": "sshd", "address": "192.0.2.1", "reason": "expired", "comment": None},
     "unban jail=sshd address=192.0.2.1 reason=expired"),
])
def test_unban_lines(kwargs: dict[str, Any], expected: str) -> None:
    assert audit(logging.getLogger("t"), "unban", **kwargs) == expected


def test_durations_and_permanent_bans() -> None:
    log = logging.getLogger("t")
    permanent = audit(log, "ban", jail="recidive", address="192.0.2.1", duration=None)
    assert permanent.endswith("duration=permanent")
    assert audit(log, "ban", jail="sshd", address="192.0.2.1", duration=5400.0).endswith("duration=1h30m")
    assert audit(log, "ban", jail="sshd", address="192.0.2.1", duration="2d").endswith("duration=2d")


def test_audit_jail_and_address_always_lead() -> None:
    text = audit(logging.getLogger("t"), "ban", reason="manual", address="192.0.2.9", jail="manual")
    assert text.startswith("ban jail=manual address=192.0.2.9 ")
    assert RECIDIVE.match(text)


@pytest.mark.parametrize(("action", "fields"), [("ban now", {}), ("", {}), ("ban", {"name": "x"}),
                                                ("ban", {"message_id": "x"})])
def test_audit_refuses_malformed_calls(action: str, fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        audit(logging.getLogger("t"), action, jail="a", address="192.0.2.1", **fields)


# -- choosing the journal ---------------------------------------------------------------------------------

def journal_stream_of(fd: int) -> str:
    st = os.fstat(fd)
    return f"{st.st_dev}:{st.st_ino}"


def test_journal_stream_matching_stderr_means_journal(tmp_path: Path) -> None:
    with open(tmp_path / "stream", "w") as f:
        assert wants_journal({"JOURNAL_STREAM": journal_stream_of(f.fileno())}, f)
        assert not wants_journal({"JOURNAL_STREAM": "1:2"}, f)  # redirected after systemd set it up
        assert not wants_journal({"JOURNAL_STREAM": "1:2", "INVOCATION_ID": "abc"}, f)
        assert not wants_journal({}, f)


def test_a_service_with_stderr_to_nowhere_logs_to_the_journal(tmp_path: Path) -> None:
    r, w = os.pipe()
    try:
        with os.fdopen(w, "w", closefd=False) as pipe:
            assert wants_journal({"INVOCATION_ID": "abc"}, pipe)  # StandardError=null / socket
            assert not wants_journal({}, pipe)  # not under systemd
        with open(tmp_path / "log", "w") as regular:
            assert not wants_journal({"INVOCATION_ID": "abc"}, regular)  # StandardError=file:...
        primary, secondary = os.openpty()
        with os.fdopen(secondary, "w", closefd=False) as tty:
            assert not wants_journal({"INVOCATION_ID": "abc"}, tty)  # StandardError=tty
        os.close(primary)
        os.close(secondary)
        assert wants_journal({"INVOCATION_ID": "abc"}, io.StringIO())  # no usable stderr: the journal
    finally:
        os.close(r)
        os.close(w)


# -- the journal handler ----------------------------------------------------------------------------------

@pytest.fixture
def journal(tmp_path: Path) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """setup_logging() as under systemd, with the handler's sender replaced by a recorder."""
    pytest.importorskip("systemd.journal")
    sent: list[tuple[str, dict[str, Any]]] = []
    with open(tmp_path / "stream", "w") as stream:
        handler = setup_logging("debug", environ={"JOURNAL_STREAM": journal_stream_of(stream.fileno())},
                                stream=stream)
        assert type(handler).__name__ == "StructuredJournalHandler"
        handler.send = lambda message, **fields: sent.append((message, fields))  # type: ignore[attr-defined]
        yield sent
    assert (tmp_path / "stream").read_text() == ""  # nothing went to stderr


def test_journal_records_carry_extras_as_upper_case_fields(journal: list[tuple[str, dict[str, Any]]]) -> None:
    logging.getLogger("nftblockd.feeds").warning(
        "feed shrank by %d%%; keeping the old list", 80,
        extra={"feed": "spamhaus", "blocklist": "feeds", "feed-url": "https://x/", "priority": "urgent",
               "_private": 1, "origin": None})
    (message, fields), = journal
    assert message == ("feed shrank by 80%; keeping the old list feed=spamhaus blocklist=feeds "
                       "feed-url=https://x/ priority=urgent")
    assert fields["PRIORITY"] == "4"
    assert fields["SYSLOG_IDENTIFIER"] == "nftblockd"
    assert fields["LOGGER"] == "nftblockd.feeds"
    assert fields["FEED"] == "spamhaus" and fields["BLOCKLIST"] == "feeds"
    assert fields["FEED_URL"] == "https://x/"
    assert fields["CODE_FUNC"] == "test_journal_records_carry_extras_as_upper_case_fields"
    assert not {"ORIGIN", "_PRIVATE", "MSG", "ARGS"} & set(fields)
    assert all(re.fullmatch(r"[A-Z][A-Z0-9_]*", k) for k in fields)


def test_journal_audit_fields(journal: list[tuple[str, dict[str, Any]]]) -> None:
    audit(logging.getLogger("nftblockd.tracker"), "ban", jail="sshd",
          address=ipaddress.ip_network("203.0.113.7"), set="default_ip4", blocklist="default", origin="jail",
          duration=600, reason="5 failures in 10m")
    (message, fields), = journal
    assert message == ('ban jail=sshd address=203.0.113.7 set=default_ip4 blocklist=default origin=jail '
                       'duration=10m reason="5 failures in 10m"')
    assert RECIDIVE.match(message)
    assert fields["MESSAGE_ID"] == AUDIT_MESSAGE_ID
    assert {k: fields[k] for k in ("ACTION", "JAIL", "ADDRESS", "SET", "BLOCKLIST", "ORIGIN", "DURATION",
                                   "REASON")} == {
        "ACTION": "ban", "JAIL": "sshd", "ADDRESS": "203.0.113.7", "SET": "default_ip4",
        "BLOCKLIST": "default", "ORIGIN": "jail", "DURATION": "10m", "REASON": "5 failures in 10m"}
    assert fields["PRIORITY"] == "6"


def test_journal_exception_text(journal: list[tuple[str, dict[str, Any]]]) -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("nftblockd.daemon").exception("task crashed")
    (message, fields), = journal
    assert message.startswith("task crashed\nTraceback")
    assert fields["EXCEPTION_TEXT"].endswith("RuntimeError: boom")
    assert fields["PRIORITY"] == "3"


def test_the_real_journal_sender_is_systemd_python(tmp_path: Path) -> None:
    journal_module = pytest.importorskip("systemd.journal")
    with open(tmp_path / "stream", "w") as stream:
        handler = setup_logging("info", environ={"JOURNAL_STREAM": journal_stream_of(stream.fileno())},
                                stream=stream)
    assert isinstance(handler, journal_module.JournalHandler)
    assert handler.send is journal_module.send


def test_without_systemd_python_stderr_to_the_journal_gets_level_prefixes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "systemd.journal", None)  # import fails
    path = tmp_path / "stream"
    with open(path, "w") as stream:
        handler = setup_logging("info", environ={"JOURNAL_STREAM": journal_stream_of(stream.fileno())},
                                stream=stream)
        assert isinstance(handler, logging.StreamHandler)
        logging.getLogger("nftblockd.x").warning("slow netlink", extra={"set": "a"})
        audit(logging.getLogger("nftblockd.tracker"), "ban", jail="sshd", address="192.0.2.1", duration=60)
    assert path.read_text().splitlines() == ["<4>slow netlink set=a",
                                             "<6>ban jail=sshd address=192.0.2.1 duration=1m"]


def test_journal_field_names() -> None:
    assert logsetup.journal_field_name("jail") == "JAIL"
    assert logsetup.journal_field_name("feed-url") == "FEED_URL"
    assert logsetup.journal_field_name("9lives") is None
    assert logsetup.journal_field_name("message") is None
    assert logsetup.journal_field_name("code_line") is None
