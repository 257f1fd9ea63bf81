"""Logging: the journal with structured fields under systemd, readable `key=value` lines on stderr otherwise.

Context goes in `extra`: `log.info("feed refreshed", extra={"feed": "spamhaus", "blocklist": "feeds"})`
becomes the journal fields FEED= and BLOCKLIST= (plus LOGGER=, PRIORITY=, CODE_*) and, in the message
text and on stderr, trailing `feed=spamhaus blocklist=feeds` (unless the message already says `feed=`).
Field values are quoted and escaped when needed, so a value taken from a log line or a feed can neither
start a new line nor forge a field; put untrusted text in fields, not in the %-formatted message.

`audit()` writes the one line per ban or unban that operators grep for:

    ban jail=sshd address=203.0.113.7 set=default_ip4 duration=1h reason="5 failures in 10m"

The built-in `recidive` filter matches `nftblockd[PID]: ban jail=JAIL address=ADDR`, so the message of an
audit line always starts with the action, then `jail=`, then `address=`; the journal identifier is always
`nftblockd`. Every audit line carries MESSAGE_ID=AUDIT_MESSAGE_ID (`journalctl MESSAGE_ID=...` lists
them all) and ACTION=ban|unban|...

This module only configures logging; it reads no config file and touches neither the kernel nor the store.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import stat
import sys
import uuid
from collections.abc import Callable, Mapping
from typing import IO, Any

from nftblockd.addr import format_target
from nftblockd.durations import PERMANENT, format_duration

SYSLOG_IDENTIFIER = "nftblockd"
AUDIT_MESSAGE_ID = uuid.UUID("5c0f4a1e-2b7d-4f57-9a51-3d1f0c6b8e42")
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
STDERR_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

# Attributes every LogRecord has; anything else on a record came from `extra`.
_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message", "asctime", "taskName"}
# Journal fields the handler sets itself; an `extra` of the same name must not overwrite them.
_RESERVED = frozenset({"MESSAGE", "MESSAGE_ID", "PRIORITY", "LOGGER", "THREAD_NAME", "PROCESS_NAME",
                       "CODE_FILE", "CODE_LINE", "CODE_FUNC", "SYSLOG_IDENTIFIER", "EXCEPTION_TEXT"})
_AUDIT_FLAG = "_nftblockd_audit"  # the message already spells out its fields
_MARK = "_nftblockd_handler"  # handlers this module installed, replaced on the next setup_logging()
_STATED = re.compile(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_-]*)=")  # `key=` already written in a message
_SYSLOG_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
                    logging.CRITICAL: 2}


# -- values -------------------------------------------------------------------------------------------------

def format_value(value: object) -> str:
    """A value as operators read it: `1.2.3.4/32` prints as `1.2.3.4`, booleans as yes/no."""
    if isinstance(value, ipaddress.IPv4Network | ipaddress.IPv6Network):
        return format_target(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def quote(text: str) -> str:
    """Bare if it is one printable word without `"`, `=` or `\\`; otherwise in double quotes, escaped."""
    if text and all(c.isprintable() and c not in ' "=\\' for c in text):
        return text
    out = []
    for c in text:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif not c.isprintable() or c in "\u2028\u2029":
            out.append(f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def record_fields(record: logging.LogRecord) -> dict[str, object]:
    """The `extra` values of a record, in the order given; private (`_x`) and None values left out."""
    return {k: v for k, v in record.__dict__.items()
            if k not in _RECORD_ATTRS and not k.startswith("_") and v is not None and k != "message_id"}


def journal_field_name(key: str) -> str | None:
    """`jail` → `JAIL`; None for a name the journal would drop or that would overwrite our own fields."""
    name = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in key.upper())[:64]
    if not name or name[0].isdigit() or name[0] == "_" or name in _RESERVED:
        return None
    return name


def _suffix(record: logging.LogRecord) -> str:
    """` key=value` for each extra field the message does not already state as `key=`."""
    if getattr(record, _AUDIT_FLAG, False):
        return ""
    fields = record_fields(record)
    if not fields:
        return ""
    stated = set(_STATED.findall(record.getMessage()))
    return "".join(f" {k}={quote(format_value(v))}" for k, v in fields.items() if k not in stated)


# -- formatters and the journal handler ----------------------------------------------------------------------

class KeyValueFormatter(logging.Formatter):
    """`fmt` followed by the record's extra fields as ` key=value`; with `syslog_prefix`, a `<N>` level
    prefix that journald understands on a stream (used when stderr is the journal but the native journal
    protocol is unavailable)."""

    default_msec_format = "%s.%03d"

    def __init__(self, fmt: str = STDERR_FORMAT, *, syslog_prefix: bool = False) -> None:
        super().__init__(fmt)
        self.syslog_prefix = syslog_prefix

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record) + _suffix(record)
        if self.syslog_prefix:
            text = f"<{_SYSLOG_PRIORITY.get(record.levelno, 6)}>{text}"
        return text


def _journal_handler_class() -> Callable[..., logging.Handler] | None:
    try:
        from systemd.journal import JournalHandler
    except ImportError:
        return None

    class StructuredJournalHandler(JournalHandler):  # type: ignore[misc]
        """systemd-python's handler, sending each `extra` as an upper-case journal field.

        The stock emit() passes every LogRecord attribute as a field (MSG=, ARGS=, lower-case names the
        journal drops); this one sends MESSAGE, PRIORITY, LOGGER, CODE_* and the extras only.
        """

        def emit(self, record: logging.LogRecord) -> None:
            try:
                message = self.format(record)
                fields: dict[str, Any] = dict(self._extra)
                for key, value in record_fields(record).items():
                    name = journal_field_name(key)
                    if name is not None:
                        fields[name] = format_value(value)
                message_id = getattr(record, "message_id", None)
                if message_id is not None:
                    fields["MESSAGE_ID"] = message_id
                if record.exc_text:
                    fields["EXCEPTION_TEXT"] = record.exc_text
                self.send(message, PRIORITY=str(self.map_priority(record.levelno)), LOGGER=record.name,
                          THREAD_NAME=record.threadName, CODE_FILE=record.pathname, CODE_LINE=record.lineno,
                          CODE_FUNC=record.funcName, **fields)
            except Exception:
                self.handleError(record)

    return StructuredJournalHandler


# -- choosing where logs go ------------------------------------------------------------------------------

def stderr_is_journal(environ: Mapping[str, str], stream: IO[str]) -> bool:
    """True if systemd connected `stream` to the journal (JOURNAL_STREAM names its device and inode)."""
    dev, _, ino = environ.get("JOURNAL_STREAM", "").partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError):
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def wants_journal(environ: Mapping[str, str], stream: IO[str]) -> bool:
    """Log to the journal when systemd runs us and stderr is the journal, or goes nowhere useful.

    A service whose stderr is a terminal or a regular file (StandardError=tty, file:...) keeps stderr:
    someone asked to see the output there. JOURNAL_STREAM that does not match stderr means stderr was
    redirected after systemd set it up (a wrapper script), which counts as such a request.
    """
    if stderr_is_journal(environ, stream):
        return True
    if not environ.get("INVOCATION_ID") or environ.get("JOURNAL_STREAM"):
        return False
    try:
        if stream.isatty():
            return False
        return not stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (OSError, ValueError):
        return True  # no usable stderr at all


def setup_logging(level: str, *, force_stderr: bool = False, environ: Mapping[str, str] | None = None,
                  stream: IO[str] | None = None) -> logging.Handler:
    """Install one handler on the root logger (replacing one installed earlier, so a reload may call this
    again with a new level) and return it. `level` is debug, info, warning or error."""
    try:
        levelno = LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}") from None
    env = os.environ if environ is None else environ
    out = sys.stderr if stream is None else stream

    handler: logging.Handler | None = None
    if not force_stderr and wants_journal(env, out):
        cls = _journal_handler_class()
        if cls is not None:
            handler = cls(SYSLOG_IDENTIFIER=SYSLOG_IDENTIFIER)
            handler.setFormatter(KeyValueFormatter("%(message)s"))
        elif stderr_is_journal(env, out):
            handler = logging.StreamHandler(out)
            handler.setFormatter(KeyValueFormatter("%(message)s", syslog_prefix=True))
    if handler is None:
        handler = logging.StreamHandler(out)
        handler.setFormatter(KeyValueFormatter())
    setattr(handler, _MARK, True)

    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _MARK, False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(levelno)
    return handler


# -- audit lines ------------------------------------------------------------------------------------------

def audit(logger: logging.Logger, action: str, *, jail: str | None = None, address: object = None,
          level: int = logging.INFO, **fields: object) -> str:
    """Log one audit line and return its text: `ACTION jail=J address=A key=value ...`.

    `duration` is seconds (None: permanent) and prints as `1h30m`; other None values are left out.
    Addresses and networks print as `1.2.3.4` or `10.0.0.0/8`. The fields also become journal fields.
    """
    if not action or not all(c.isalnum() or c in "-_" for c in action):
        raise ValueError(f"an audit action is one word such as ban or unban, got {action!r}")
    clash = sorted(k for k in fields if k in _RECORD_ATTRS or k in ("action", "message_id"))
    if clash:
        raise ValueError(f"audit field names clash with logging's own: {', '.join(clash)}")
    values: dict[str, str] = {"jail": format_value(jail) if jail is not None else "-",
                              "address": format_value(address) if address is not None else "-"}
    for key, value in fields.items():
        if key == "duration":
            values[key] = value if isinstance(value, str) else format_duration(
                PERMANENT if value is None else float(value))  # type: ignore[arg-type]
        elif value is not None:
            values[key] = format_value(value)
    text = action + "".join(f" {k}={quote(v)}" for k, v in values.items())
    extra: dict[str, object] = {**values, "action": action, "message_id": AUDIT_MESSAGE_ID, _AUDIT_FLAG: True}
    logger.log(level, "%s", text, extra=extra)
    return text


__all__ = [
    "AUDIT_MESSAGE_ID", "SYSLOG_IDENTIFIER", "KeyValueFormatter", "audit", "format_value",
    "journal_field_name", "quote", "record_fields", "setup_logging", "stderr_is_journal", "wants_journal",
]
