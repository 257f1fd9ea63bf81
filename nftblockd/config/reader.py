"""The typed getters the config builder reads sections with: each records a Problem and returns a default.

It must NOT know any section of the config (which keys a jail or a fleet has): config/load.py and
config/sections.py do; it reads no file beyond checking the ones a config names (secret and plain files).
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any

from nftblockd.addr import AddressError, IPNet, parse_target
from nftblockd.config.model import Problem
from nftblockd.config.yamlsrc import Located, Path_
from nftblockd.durations import (
    BanLength,
    format_duration,
    parse_duration,
    parse_timeout,
)

# Unknown keys listed per mapping: 200k of them took 12-21 s and 344 MB of problems, each with the known keys.
MAX_UNKNOWN_KEYS = 20


class SectionReader:
    """Walks the document once, collecting problems instead of stopping at the first."""

    def __init__(self, doc: Located) -> None:
        self.doc = doc
        self.problems: list[Problem] = []

    def fail(self, path: Path_, reason: str) -> None:
        where = ".".join(str(p) for p in path)
        self.problems.append(Problem(self.doc.file, self.doc.line(path), where, reason))

    def mapping(self, value: Any, path: Path_, known: set[str]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {type(value).__name__}")
            return {}
        unknown = [key for key in value if key not in known]
        hint = f" (known: {', '.join(sorted(known))})" if known else ""
        for key in unknown[:MAX_UNKNOWN_KEYS]:
            self.fail((*path, key), f"unknown key {key!r}{hint}")
        if len(unknown) > MAX_UNKNOWN_KEYS:
            self.fail((*path, unknown[MAX_UNKNOWN_KEYS]), f"unknown key {unknown[MAX_UNKNOWN_KEYS]!r} and "
                      f"{len(unknown) - MAX_UNKNOWN_KEYS - 1} more after it (only the first {MAX_UNKNOWN_KEYS} of "
                      "a mapping are listed one by one)")
        return value

    def get(self, m: dict[str, Any], key: str, path: Path_, kind: type | tuple[type, ...], default: Any) -> Any:
        if key not in m or m[key] is None:
            return default
        v = m[key]
        if isinstance(v, bool) and kind in (int, float, (int, float)):
            self.fail((*path, key), f"expected a number, got {v!r}")
            return default
        if not isinstance(v, kind):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            self.fail((*path, key), f"expected {names}, got {v!r}")
            return default
        return v

    def duration(self, m: dict[str, Any], key: str, path: Path_, default: float, *, positive: bool = False,
                 most: float | None = None) -> float:
        """A duration; `positive` refuses 0 (a findtime or an interval of 0 has no meaning and made the
        daemon fail at start with a traceback instead of here with file:line), `most` caps it."""
        if key not in m:
            return default
        try:
            value = parse_duration(m[key])
        except ValueError as exc:
            self.fail((*path, key), str(exc))
            return default
        if positive and value <= 0:
            self.fail((*path, key), f"must be longer than 0, got {m[key]!r}")
            return default
        if most is not None and value > most:
            self.fail((*path, key), f"must be at most {format_duration(most)}, got {m[key]!r}")
            return default
        return value

    def timeout(self, m: dict[str, Any], key: str, path: Path_, default: BanLength) -> BanLength:
        if key not in m:
            return default
        try:
            return parse_timeout(m[key])
        except ValueError as exc:
            self.fail((*path, key), str(exc))
            return default

    def positive_int(self, m: dict[str, Any], key: str, path: Path_, default: int, lo: int = 1,
                     hi: int = 2**31) -> int:
        v = self.get(m, key, path, int, default)
        if not lo <= v <= hi:
            self.fail((*path, key), f"must be between {lo} and {hi}, got {v}")
            return default
        return int(v)

    def addresses(self, value: Any, path: Path_) -> tuple[IPNet, ...]:
        """A list of addresses or CIDRs. A CIDR with host bits set (`10.0.0.1/8`) is refused, as the CLI
        refuses it: the operator meant either the address or the network, and guessing could allow a whole
        /8 where one host was meant."""
        if value is None:
            return ()
        if not isinstance(value, list):
            self.fail(path, "expected a list of addresses or CIDRs")
            return ()
        out = []
        for i, item in enumerate(value):
            try:
                out.append(parse_target(str(item)))
            except AddressError as exc:
                self.fail((*path, i), str(exc))
        return tuple(out)

    def names(self, m: dict[str, Any], key: str, path: Path_) -> tuple[str, ...]:
        """A list of action names (checked against `actions:` in action_refs, once every section is read)."""
        raw = m.get(key)
        if raw is None:
            return ()
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
            self.fail((*path, key), "actions is a list of action names (defined under the top-level actions:)")
            return ()
        return tuple(raw)

    def str_pairs(self, value: Any, path: Path_, key_re: re.Pattern[str], what: str,
                  banned: str = "\r\n\0") -> list[tuple[str, str]]:
        """A mapping of names to scalar values (numbers become text), each name matching `key_re`, no value
        holding a character of `banned`."""
        if value is None:
            return []
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping of {what}")
            return []
        out = []
        for k, v in value.items():
            if not isinstance(k, str) or not key_re.fullmatch(k):
                self.fail((*path, k), f"{k!r} is not a valid {what} name")
            elif isinstance(v, dict | list) or v is None:
                self.fail((*path, k), f"the value of {k!r} must be a string or a number")
            elif any(c in str(v) for c in banned):
                self.fail((*path, k), f"the value of {k!r} must be one line (no CR, LF or NUL)" if "\n" in banned
                          else f"the value of {k!r} cannot hold a NUL")
            else:
                out.append((k, str(v).lower() if isinstance(v, bool) else str(v)))
        return out

    def secret_file(self, m: dict[str, Any], key: str, path: Path_) -> str | None:
        """A path to a file only root (its owner) may read: a secret readable by others is refused."""
        value = self.get(m, key, path, str, None)
        if value is None:
            return None
        try:
            st = os.stat(value)
        except OSError as exc:
            self.fail((*path, key), f"cannot use {value}: {exc.strerror}")
            return str(value)
        if not stat.S_ISREG(st.st_mode):
            self.fail((*path, key), f"{value} is not a regular file")
        elif st.st_mode & 0o077:
            self.fail((*path, key), f"{value} is readable by group or others (mode {stat.S_IMODE(st.st_mode):04o});"
                      f" chmod 0600 it")
        return str(value)

    def plain_file(self, m: dict[str, Any], key: str, path: Path_) -> str | None:
        value = self.get(m, key, path, str, None)
        if value is not None and not os.path.isfile(value):
            self.fail((*path, key), f"{value} is not a readable file")
        return value if value is None else str(value)
