"""Split a byte stream into complete text lines: bytes in, lines out, the unfinished last line kept.

Pure: no IO, no asyncio, no clock. The file tailer feeds it chunks as it reads them.

The rules, as they apply to every chunk fed:

1. A line ends at b"\\n"; the newline is not part of the line. A "\\r" before it is kept (no CRLF handling).
2. Bytes after the last newline are held (the partial line) until a later chunk brings its newline.
   `pending` is the number of bytes fed since the last line boundary, so a reader's safe resume offset is
   always (bytes fed) - pending.
3. A line longer than `max_line` bytes (newline excluded) is skipped whole and counted in `Lines.overlong`.
   It is never buffered beyond `max_line` bytes: once a partial line outgrows the limit, input is discarded
   up to the next newline, and splitting carries on in sync with the line after it.
4. Text is UTF-8. Invalid bytes become U+FFFD and each line that needed one counts in `Lines.invalid`.
   Nothing here raises on any input.
5. NUL bytes are not text (a crash's zero-filled block, a sparse file after copytruncate, a binary write):
   they are removed from the line, which is then matched, and each line that had one counts in `Lines.nul`.
   A NUL never ends a line: that would let whoever can put a NUL into a logged field start a line of their
   own. Removed, it leaves the line beginning where it began (issue 33: one of three failures was lost).

Whichever way the same bytes are cut into chunks, the same lines come out (tests check this with hypothesis).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_LINE", "LineSplitter", "Lines"]

DEFAULT_MAX_LINE = 16 * 1024


@dataclass(frozen=True, slots=True)
class Lines:
    """The complete lines of one `feed`, and what was dropped or mended on the way."""

    text: list[str]
    overlong: int = 0  # lines skipped for being longer than max_line
    invalid: int = 0  # lines in `text` whose invalid UTF-8 was replaced
    nul: int = 0  # lines in `text` whose NUL bytes were removed (rule 5)


class LineSplitter:
    """Stateful splitter for one byte stream (one open file). See the module docstring for the rules."""

    __slots__ = ("_held", "_skip", "_skip_counts", "_skipped", "max_line")

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        if max_line < 1:
            raise ValueError(f"max_line must be at least 1, not {max_line}")
        self.max_line = max_line
        self._held = b""  # the partial line, at most max_line bytes
        self._skip = False  # discarding up to the next newline
        self._skip_counts = True  # ... because of an overlong line (counted), not skip_to_next_line
        self._skipped = 0  # bytes discarded so far while skipping

    @property
    def pending(self) -> int:
        """Bytes fed since the last line boundary (held or being discarded)."""
        return self._skipped if self._skip else len(self._held)

    def reset(self) -> None:
        """Forget the partial line (the stream starts again, e.g. after a truncation)."""
        self._held = b""
        self._skip = False
        self._skipped = 0

    def skip_to_next_line(self) -> None:
        """Discard input up to the next newline without counting it: the stream was joined mid-line."""
        self.reset()
        self._skip = True
        self._skip_counts = False

    def feed(self, data: bytes) -> Lines:
        max_line = self.max_line
        overlong = 0
        if self._skip:
            nl = data.find(b"\n")
            if nl < 0:
                self._skipped += len(data)
                return Lines([])
            overlong = 1 if self._skip_counts else 0
            self._skip = False
            self._skip_counts = True
            self._skipped = 0
            data = data[nl + 1:]
        last = data.rfind(b"\n")
        if last < 0:
            self._hold(self._held + data if self._held else data)
            return Lines([], overlong)
        region = self._held + data[:last] if self._held else data[:last]
        self._hold(data[last + 1:])
        try:
            text = region.decode("utf-8").split("\n")
        except UnicodeDecodeError:
            out = self._slow(region, overlong)
        else:
            # A line can only be too long if the region is; and a line of c characters has at most 4c bytes.
            out = self._slow(region, overlong) if len(region) > max_line and max(map(len, text)) * 4 > max_line \
                else Lines(text, overlong)
        return _without_nul(out) if b"\0" in region else out

    def flush(self) -> Lines:
        """The held partial line as a last line (the stream has ended without its newline)."""
        held, skipping = self._held, self._skip
        self.reset()
        if skipping or not held:
            return Lines([])
        try:
            out = Lines([held.decode("utf-8")])
        except UnicodeDecodeError:
            out = Lines([held.decode("utf-8", "replace")], invalid=1)
        return _without_nul(out) if b"\0" in held else out

    def _hold(self, rest: bytes) -> None:
        if len(rest) > self.max_line:
            self._held = b""
            self._skip = True
            self._skip_counts = True
            self._skipped = len(rest)
        else:
            self._held = rest

    def _slow(self, region: bytes, overlong: int) -> Lines:
        """Line by line: some line is overlong or not valid UTF-8."""
        max_line = self.max_line
        text: list[str] = []
        invalid = 0
        for raw in region.split(b"\n"):
            if len(raw) > max_line:
                overlong += 1
                continue
            try:
                text.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                text.append(raw.decode("utf-8", "replace"))
                invalid += 1
        return Lines(text, overlong, invalid)


def _without_nul(lines: Lines) -> Lines:
    """Rule 5: the lines with their NUL bytes removed, and how many had one (only called when some do)."""
    text = lines.text
    n = 0
    for i, t in enumerate(text):
        if "\0" in t:
            text[i] = t.replace("\0", "")
            n += 1
    return Lines(text, lines.overlong, lines.invalid, n)
