"""The targets of `nftblock ban`/`unban` as the operator typed them: checked and made canonical before
anything is sent, from the command line or from stdin a block of lines at a time.

Pure text work (and reading the given stream): no socket, no daemon, nothing from the daemon's side. Like
cli/main.py, whose start-up it is part of, it imports only what a plain IPv4 ban needs: `ipaddress` (through
addr.py) is imported only for a target the quick rules cannot decide.
"""

from __future__ import annotations

import _socket  # not socket: see control/client.py
import itertools

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (cli/main.py); mypy reads it the same way
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import BinaryIO, TextIO

# A canonical dotted quad parses to itself, and inet_pton accepts exactly those (no leading zeros, four parts):
# 120 ns a check against 2.5 us for ipaddress, which matters for `ban -` with a million lines (a compiled
# regex took 225 ns, and 1 ms of every process's start-up to compile). Anything else goes to
# addr.parse_target.
_AF_INET, _AF_INET6 = _socket.AF_INET, _socket.AF_INET6
_inet_pton = _socket.inet_pton


def _plain_v4(s: str) -> bool:
    try:
        _inet_pton(_AF_INET, s)
    except (OSError, ValueError):  # ValueError: NUL or non-ASCII characters
        return False
    return True


class UsageError(Exception):
    """The operator's input is wrong (exit 2)."""


def quick_canonical(text: str) -> str | None:
    """`canonical_target` for single addresses without importing events or ipaddress (15 M instructions of
    start-up for an IPv6 ban), or None when the full rules must decide. Agrees with addr.parse_target
    (tests/unit/test_cli.py)."""
    s = text.strip()
    if _plain_v4(s):
        return s
    if ":" not in s or "/" in s or "%" in s or len(s) > 64:
        return None
    try:
        packed = _inet_pton(_AF_INET6, s)
    except (OSError, ValueError):
        return None  # ipaddress may still accept it, or say why not
    n = int.from_bytes(packed, "big")
    if n >> 32 == 0xFFFF:  # `::ffff:192.0.2.1` is the IPv4 address, as addr.normalise_network has it
        return _socket.inet_ntoa(packed[12:])
    return _v6_text(n)


def _v6_text(n: int) -> str:
    """str(ipaddress.IPv6Address(n)): lower-case hextets, the longest run of two or more zero hextets (the
    first of equals) as `::` (RFC 5952)."""
    hextets = [f"{n >> (112 - 16 * i) & 0xFFFF:x}" for i in range(8)]
    best_start, best_len, start, length = -1, 0, -1, 0
    for i, h in enumerate(hextets):
        if h == "0":
            length += 1
            if start < 0:
                start = i
            if length > best_len:
                best_start, best_len = start, length
        else:
            start, length = -1, 0
    if best_len > 1:
        end = best_start + best_len
        hextets[best_start:end] = [""]
        if end == 8:
            hextets.append("")
        if best_start == 0:
            hextets.insert(0, "")
    return ":".join(hextets)


def canonical_target(text: str) -> str:
    """The target as the daemon will print it; raises AddressError (a ValueError). A CIDR with host bits set
    is refused."""
    quick = quick_canonical(text)
    if quick is not None:
        return quick
    from nftblockd.addr import format_target, parse_target

    return format_target(parse_target(text.strip()))


class _Raw(list[str]):
    """A block's lines as given (plain addresses, some IPv6 spelled any way inet_pton takes): canonical text
    only when `Targets.strings()` asks for it, which a bulk ban sent packed never does."""

    __slots__ = ()


class Targets:
    """The targets of a `ban`/`unban`, as read and checked: every target in order (duplicates kept, a list per
    block read), the ones checked line by line (`slow`, canonical, without duplicates) and the plain
    addresses of the blocks checked at once, packed as inet_pton gave them: IPv4 4 bytes each (`hosts4`),
    IPv6 16 bytes each (`hosts6`, IPv4-mapped ones included: the daemon reads those as IPv4, as it reads the
    text).

    `hosts4`/`hosts6` are the form a bulk ban is sent in (the request's `hosts4`/`hosts6`): the check already
    produced them, and sending the addresses as JSON strings cost encoding them here and parsing them again in
    the daemon (~50 ms of `nftblock ban -` of 100,000 IPv4 addresses; for IPv6 the canonical spelling alone
    was ~4 us an address). `strings()` is every target as text, for everything else."""

    __slots__ = ("chunks", "hosts4", "hosts6", "slow")

    def __init__(self, chunks: list[list[str]], slow: list[str], hosts4: bytes = b"", hosts6: bytes = b"") -> None:
        self.chunks = chunks
        self.slow = slow
        self.hosts4 = hosts4
        self.hosts6 = hosts6

    def __len__(self) -> int:
        """Targets read, duplicates counted (a cheap size for choosing how to ask)."""
        return sum(map(len, self.chunks))

    def strings(self) -> list[str]:
        """Every target as canonical text, in order, without duplicates."""
        return list(dict.fromkeys(itertools.chain.from_iterable(
            [canonical_plain(t) for t in c] if isinstance(c, _Raw) else c for c in self.chunks)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Targets) and self.strings() == other.strings()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Targets({self.strings()!r})"


def canonical_plain(text: str) -> str:
    """`canonical_target` of a line inet_pton took (a `_Raw` block's): quick_canonical always answers."""
    quick = quick_canonical(text)
    assert quick is not None
    return quick


def targets_from_lines(lines: Iterable[str]) -> Targets:
    """One target per line; blank lines and `#` comments (whole-line or trailing) are skipped. The plain
    reader (one line at a time through `_Lines.lines`): `targets_from_stream`'s block checks are tested
    against it."""
    acc = _Lines()
    it = iter(lines)
    while True:
        try:
            line = next(it)
        except StopIteration:
            return acc.result()
        except UnicodeDecodeError as exc:
            raise UsageError(f"stdin line {acc.lineno + 1}: not text ({exc.reason}); nothing was sent") from None
        acc.lines((line,))


_STDIN_BLOCK = 1 << 20  # bytes read from stdin at a time: validated while the writer is still writing
# `ban -`/`unban -` read stdin whole before sending: a line (a target and its comment) longer than this, or
# more targets than one request may carry, is refused while reading, not after filling memory (`ban - <
# /dev/zero` never ends a line). control.protocol.MAX_TARGETS, repeated so that the CLI imports no control
# module it does not need; tests/unit/test_limits_doc.py holds them equal.
MAX_STDIN_LINE = 64 * 1024
MAX_STDIN_TARGETS = 1_000_000


class _Lines:
    """`targets_from_lines`'s result, fed a block of whole lines at a time (`targets_from_stream`)."""

    __slots__ = ("blobs", "blobs6", "chunks", "first_bad", "lineno", "nbad", "slow")

    def __init__(self) -> None:
        self.chunks: list[list[str]] = []  # every target, in order: Targets.chunks
        self.slow: dict[str, None] = {}  # the targets checked line by line: Targets.slow
        self.blobs: list[bytes] = []  # the blocks checked at once, packed: Targets.hosts4
        self.blobs6: list[bytes] = []  # their IPv6 lines, packed: Targets.hosts6
        self.first_bad: str | None = None
        self.nbad = 0
        self.lineno = 0  # lines taken so far

    def take(self, text: str) -> None:
        """Whole lines (`\n`-separated; a final part without `\n` is a line too). A block of nothing but
        dotted quads (what `ban -` is mostly given) is checked with inet_pton mapped over it, no Python per
        line: the per-line loop below was half of the process's CPU for 100,000 addresses. Anything else in
        the block (comments, blanks inside lines, CIDRs, an error) sends the whole block to that loop.

        IPv6 lines (those with a `:`) go through inet_pton too, 16 bytes each: canonical text per line
        (`_v6_text`) was ~4 us an address, most of `nftblock ban -` of 100,000 IPv6 addresses. inet_pton
        takes exactly what quick_canonical takes through it; a zone (`%`) or anything longer than it reads is
        left to the loop, as quick_canonical leaves it to the full rules."""
        lines = text.split("\n")
        if lines and not lines[-1]:
            lines.pop()  # the newline that ends the block ends its last line; it starts no new one
        if "#" not in text and " " not in text and "\t" not in text and "\r" not in text and "/" not in text \
                and "%" not in text:
            plain = list(filter(None, lines))
            try:
                # raises at the first line that is not an address; kept, as what is sent (Targets.hosts4/6)
                if ":" not in text:
                    blob, blob6 = b"".join(map(_inet_pton, itertools.repeat(_AF_INET, len(plain)), plain)), b""
                else:
                    v6 = plain if "." not in text else [t for t in plain if ":" in t]
                    v4 = [] if v6 is plain else [t for t in plain if ":" not in t]
                    blob6 = b"".join(map(_inet_pton, itertools.repeat(_AF_INET6, len(v6)), v6))
                    blob = b"".join(map(_inet_pton, itertools.repeat(_AF_INET, len(v4)), v4))
                    if max(map(len, v6)) > 64:  # quick_canonical's limit (inet_pton itself stops at 45)
                        raise ValueError("long")
            except (OSError, ValueError):
                pass
            else:
                self.blobs.append(blob)
                self.blobs6.append(blob6)
                self.chunks.append(_Raw(plain) if blob6 else plain)
                self.lineno += len(lines)
                return
        self.lines(lines)

    def lines(self, lines: Iterable[str]) -> None:
        out = self.slow
        chunk: list[str] = []
        lineno = self.lineno
        for lineno, line in enumerate(lines, self.lineno + 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            try:
                target = canonical_target(text)
            except ValueError as exc:  # addr.AddressError
                self.nbad += 1
                if self.first_bad is None:
                    self.first_bad = f"stdin line {lineno}: {exc}"
                continue
            out[target] = None
            chunk.append(target)
        self.chunks.append(chunk)
        self.lineno = lineno

    def result(self) -> Targets:
        if self.first_bad is not None:
            more = f" (and {self.nbad - 1} more invalid lines)" if self.nbad > 1 else ""
            raise UsageError(f"{self.first_bad}{more}; nothing was sent")
        return Targets(self.chunks, list(self.slow), b"".join(self.blobs), b"".join(self.blobs6))


def targets_from_stream(stream: TextIO, block: int = _STDIN_BLOCK) -> Targets:
    """`targets_from_lines` over a stream, read and checked a block of whole lines at a time. The bytes
    under a text stream are read when there are some (sys.stdin): decoding one block is cheaper than the
    text layer's line iteration, and an invalid byte gets the exact line number. Line ends are the text
    layer's (universal newlines: `\n`, `\r\n`, a lone `\r`)."""
    acc = _Lines()
    raw: BinaryIO | None = getattr(stream, "buffer", None)
    if raw is None:  # a text stream only (tests: io.StringIO)
        tail = ""
        while True:
            chunk = stream.read(block)
            data = tail + chunk
            cut = data.rfind("\n") + 1 if chunk else len(data)
            data, tail = data[:cut], data[cut:]
            _take(acc, data)
            _check_bounds(acc, len(tail))
            if not chunk:
                return acc.result()
    btail = b""
    while True:
        bblock = raw.read(block)
        bdata = btail + bblock
        cut = bdata.rfind(b"\n") + 1 if bblock else len(bdata)
        bdata, btail = bdata[:cut], bdata[cut:]
        try:
            text = bdata.decode()
        except UnicodeDecodeError as exc:
            before = bdata[:exc.start]
            line = acc.lineno + before.count(b"\n") + before.count(b"\r") - before.count(b"\r\n") + 1
            raise UsageError(f"stdin line {line}: not text ({exc.reason}); nothing was sent") from None
        _take(acc, text)
        _check_bounds(acc, len(btail))
        if not bblock:
            return acc.result()


def _check_bounds(acc: _Lines, unfinished: int) -> None:
    if unfinished > MAX_STDIN_LINE:
        raise UsageError(f"stdin line {acc.lineno + 1}: longer than {MAX_STDIN_LINE} bytes (not a list of "
                         "targets?); nothing was sent")
    n = sum(map(len, acc.chunks))
    if n > MAX_STDIN_TARGETS:
        raise UsageError(f"stdin: more than {MAX_STDIN_TARGETS} targets (one request carries at most that "
                         "many); split the list; nothing was sent")


def _take(acc: _Lines, text: str) -> None:
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if text:
        acc.take(text)
