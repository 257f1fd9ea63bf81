"""Parse a threat feed's body into address prefixes: bytes in, `ParseResult` out.

Pure: no IO, no clock, no network. The fetcher (`sources/feed.py`) hands us a whole body that it has already
size-capped and decompressed; everything here is a function of that body and the feed's format settings.

Formats
    plain   one address or CIDR per line; `#` and `;` start a comment anywhere on a line. Covers Spamhaus
            DROP (`1.2.3.0/24 ; SBL123`), FireHOL netsets, blocklist.de, Emerging Threats and most others.
    csv     one column of a CSV or TSV file, by index or by header name. The delimiter is a tab if the
            first row has one, else `;` if it has `;` but no `,`, else `,`. Lines starting with `#` are
            comments, and a commented-out header (`# first_seen,dst_ip,...`, as abuse.ch writes it) is
            recognised. With an index, a first row whose cell is not an address is taken as a header.
    json    a JSON list of strings, or of objects read at `column` (a key); newline-delimited JSON (one
            value a line, as Spamhaus' drop_v4.json) is read the same way. Objects without the key
            (metadata records) are skipped, not counted as invalid.

Strictness (the feed's fault is reported, never guessed around)
    - An entry with host bits set (`45.67.89.10/9`) is refused, never widened to the network it lies in
      (`45.0.0.0/9`, 8.4 million addresses, for what is most likely a typo): it is counted in `host_bits`,
      quoted among the samples, and counts towards the garbage share like an invalid line (docs/feeds.md).
    - Garbage is counted in `invalid`, the first few samples kept for the operator, and skipped.
    - A body that is a markup document (an HTML error or captive-portal page, XML: its first line that is not
      blank or a `#` comment opens a document, `<!doctype`, `<html`, `<?xml`, `<head`, `<body`, `<title`)
      raises `FeedFormatError`: it is an error, never "a list with zero entries". So does a body whose lines
      are mostly garbage (more than `max_invalid_share` of its data lines), or that has garbage and no entry
      at all.
    - A markup line elsewhere (`<pre>` around a list, a `<br>`, a proxy's injected `<script>`) is skipped and
      counted in `markup`; such lines count towards the garbage share like invalid ones. One stray line
      among valid entries used to reject the whole body (issue 13).
    - An empty body (or only comments) is a valid, empty list: whether that is acceptable is the shrink
      guard's decision, not the parser's.
    - Addresses are accepted exactly as `addr.parse_target` accepts them (no leading zeros, no scoped
      addresses, no names, no host bits); IPv4-mapped IPv6 (`::ffff:1.2.3.4`) becomes IPv4. Each entry is read by
      `addr.parse_key`, the codec's fast parser.

Representation
    Entries are returned as addr's *net keys* (`network << 8 | prefixlen`), not `ipaddress` objects, because
    a feed can hold a million of them and an `IPv4Network` costs ~160 bytes and ~5 µs to build. Sorting net
    keys sorts by network. `ParseResult.networks()` builds the `ipaddress` objects when they are wanted
    (tests, small feeds).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from nftblockd.addr import AddressError, HostBitsError, IPNet, key_net, parse_key, parse_target

__all__ = [
    "FORMATS",
    "FeedFormatError",
    "ParseResult",
    "ParseStats",
    "parse_feed",
]

FORMATS = ("plain", "csv", "json")
MAX_SAMPLES = 5  # invalid lines quoted back to the operator


class FeedFormatError(ValueError):
    """The body is not a list we can read (the feed's fault, not the operator's; not transient)."""


# -- results ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParseStats:
    """What the parser saw. `entries` counts accepted addresses/CIDRs, duplicates included."""

    lines: int = 0  # lines (plain, csv) or items (json) read
    entries: int = 0
    v4: int = 0
    v6: int = 0
    host_bits: int = 0  # entries refused because host bits are set (never widened)
    invalid: int = 0
    skipped: int = 0  # blank and comment lines, the header, JSON objects without the key
    invalid_samples: tuple[str, ...] = ()
    markup: int = 0  # markup lines (`<...`) in a body that is not a markup document, skipped

    def as_dict(self) -> dict[str, Any]:
        return {
            "lines": self.lines, "entries": self.entries, "v4": self.v4, "v6": self.v6,
            "host_bits": self.host_bits, "invalid": self.invalid,
            "skipped": self.skipped, "invalid_samples": list(self.invalid_samples), "markup": self.markup,
        }


@dataclass(frozen=True, slots=True)
class ParseResult:
    """Net keys per family (see the module docstring; treat the lists as read-only) and stats."""

    v4: list[int]
    v6: list[int]
    stats: ParseStats

    @property
    def entries(self) -> int:
        return self.stats.entries

    def networks(self) -> list[IPNet]:
        """The entries as `ipaddress` networks, IPv4 first, in feed order (≈5 µs each: not for hot paths)."""
        out: list[IPNet] = [key_net(k, 4) for k in self.v4]
        out.extend(key_net(k, 6) for k in self.v6)
        return out


@dataclass(slots=True)
class _Collector:
    """Accumulates entries and counts while one body is parsed (private, mutable, short-lived)."""

    v4: list[int] = field(default_factory=list)
    v6: list[int] = field(default_factory=list)
    lines: int = 0
    host_bits: int = 0
    invalid: int = 0
    skipped: int = 0
    markup: int = 0
    samples: list[str] = field(default_factory=list)

    def add(self, text: str, where: str) -> None:
        got = parse_key(text)
        if got is None:
            self.bad(text, where)
            return
        (self.v4 if got[0] == 4 else self.v6).append(got[1])

    def bad(self, text: str, where: str) -> None:
        """A refused entry: markup, host bits set (asked of `parse_target`, the rule's one home), or garbage."""
        why = ""
        if text.lstrip().startswith("<"):
            self.markup += 1
        elif _host_bits(text):
            self.host_bits += 1
            why = " (host bits set, not widened)"
        else:
            self.invalid += 1
        if len(self.samples) < MAX_SAMPLES:
            self.samples.append(f"{where}: {text[:80]!r}{why}")

    def result(self, max_invalid_share: float) -> ParseResult:
        entries = len(self.v4) + len(self.v6)
        stats = ParseStats(
            lines=self.lines, entries=entries, v4=len(self.v4), v6=len(self.v6),
            host_bits=self.host_bits, invalid=self.invalid, skipped=self.skipped,
            invalid_samples=tuple(self.samples), markup=self.markup,
        )
        bad = self.invalid + self.markup + self.host_bits
        if bad and (entries == 0 or bad > max_invalid_share * (entries + bad)):
            sample = f" (first: {self.samples[0]})" if self.samples else ""
            raise FeedFormatError(
                f"not a list of addresses: {bad} of {entries + bad} entries are not an address or CIDR{sample}"
            )
        return ParseResult(self.v4, self.v6, stats)


# -- bodies -----------------------------------------------------------------------------------------------


def parse_feed(body: bytes | str, format: str = "plain", column: int | str = 0, *,
               max_invalid_share: float = 0.5) -> ParseResult:
    """Parse a whole feed body. Raises `FeedFormatError` if the body as a whole is not a list."""
    text = _decode(body)
    if _looks_like_markup(text):
        raise FeedFormatError("the body is an HTML/XML page, not a list (an error page or a login portal?)")
    if format == "plain":
        out = _parse_plain(text)
    elif format == "csv":
        out = _parse_csv(text, column)
    elif format == "json":
        out = _parse_json(text, column)
    else:
        raise ValueError(f"unknown feed format {format!r} (expected one of {', '.join(FORMATS)})")
    return out.result(max_invalid_share)


def _host_bits(text: str) -> bool:
    """Whether `text` is refused only because host bits are set (`addr.parse_target` says so)."""
    try:
        parse_target(text)
    except HostBitsError:
        return True
    except AddressError:
        return False
    return False


def _decode(body: bytes | str) -> str:
    text = body if isinstance(body, str) else body.decode("utf-8", errors="replace")
    return text[1:] if text.startswith("\ufeff") else text


_DOCUMENT_OPENERS = ("<!doctype", "<html", "<?xml", "<head", "<body", "<title")


def _looks_like_markup(text: str) -> bool:
    """Whether the body is a markup document: its first line that is not blank or a `#` comment opens one."""
    for line in text[:8192].splitlines():
        s = line.strip()
        if s and not s.startswith("#"):
            return s.lower().startswith(_DOCUMENT_OPENERS)
    return False


def _parse_plain(text: str) -> _Collector:
    c = _Collector()
    v4, v6 = c.v4, c.v6
    n = 0
    for n, raw in enumerate(_lines(text), 1):
        line = raw
        cut = line.find("#")
        if cut >= 0:
            line = line[:cut]
        cut = line.find(";")
        if cut >= 0:
            line = line[:cut]
        s = line.strip()
        if not s:
            c.skipped += 1
            continue
        # parse_key (inet_pton) per line costs less than the dict-per-octet parser this loop used to inline
        # (bench_feeds: feeds.1m.parse_s; bench_addr: addr.parse_key)
        got = parse_key(s)
        if got is None:
            c.bad(s, f"line {n}")
        else:
            (v4 if got[0] == 4 else v6).append(got[1])
    c.lines = n
    return c


def _lines(text: str, chunk: int = 1 << 20) -> Iterator[str]:
    """`text.splitlines()`, a megabyte at a time: a million-line feed never has all its lines alive at once.

    Chunks end just after a `\n`, so no line separator (not even `\r\n`) is cut in two.
    """
    start, size = 0, len(text)
    while start < size:
        end = text.find("\n", min(start + chunk, size))
        end = size if end < 0 else end + 1
        yield from text[start:end].splitlines()
        start = end


def _sniff_delimiter(text: str) -> str:
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if "\t" in s:
            return "\t"
        if ";" in s and "," not in s:
            return ";"
        return ","
    return ","


def _parse_csv(text: str, column: int | str) -> _Collector:
    c = _Collector()
    delimiter = _sniff_delimiter(text)
    if isinstance(column, int) and column < 0:
        raise ValueError("a CSV column index cannot be negative")
    index: int | None = column if isinstance(column, int) else None
    want = column.strip().lower() if isinstance(column, str) else ""
    seen_data = False
    for n, line in enumerate(text.splitlines(), 1):
        c.lines = n
        stripped = line.strip()
        if not stripped:
            c.skipped += 1
            continue
        if stripped.startswith("#"):
            c.skipped += 1
            if index is None:  # a commented-out header, as abuse.ch writes it
                index = _header_index(_split_row(stripped.lstrip("#"), delimiter), want)
            continue
        row = _split_row(line, delimiter)
        if index is None:
            index = _header_index(row, want)
            if index is None:
                raise FeedFormatError(f"no column named {column!r} in the CSV header {row!r}")
            c.skipped += 1
            seen_data = True
            continue
        cell = row[index].strip() if index < len(row) else ""
        if not seen_data and isinstance(column, int) and parse_key(cell) is None:
            seen_data = True
            c.skipped += 1  # a header row above an index-addressed column
            continue
        seen_data = True
        c.add(cell, f"line {n}")
    return c


def _split_row(line: str, delimiter: str) -> list[str]:
    """One CSV line (quoted fields spanning lines do not occur in address feeds)."""
    return next(csv.reader([line], delimiter=delimiter), [])


def _header_index(header: list[str], want: str) -> int | None:
    for i, name in enumerate(header):
        if name.strip().strip('"').lower() == want:
            return i
    return None


def _parse_json(text: str, column: int | str) -> _Collector:
    c = _Collector()
    items = _json_items(text)
    key = column if isinstance(column, str) else None
    for n, item in enumerate(items, 1):
        c.lines += 1
        if isinstance(item, str):
            c.add(item, f"item {n}")
        elif isinstance(item, dict):
            if key is None:
                raise FeedFormatError("the JSON list holds objects: set column: to the key of the address")
            value = item.get(key)
            if value is None:
                c.skipped += 1  # a metadata record, not an entry
            elif isinstance(value, str):
                c.add(value, f"item {n}")
            else:
                c.bad(repr(value), f"item {n}")
        else:
            c.bad(repr(item), f"item {n}")
    return c


def _json_items(text: str) -> Iterable[Any]:
    stripped = text.strip()
    if not stripped:
        return []
    try:
        doc = json.loads(stripped)
    except ValueError:
        return list(_ndjson(stripped))
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict | str):  # a one-line NDJSON document
        return [doc]
    raise FeedFormatError(f"a JSON feed must be a list, got {type(doc).__name__}")


def _ndjson(text: str) -> Iterator[Any]:
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except ValueError as exc:
            raise FeedFormatError(f"not JSON (line {n}: {exc})") from None
