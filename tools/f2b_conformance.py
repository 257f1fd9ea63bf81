"""Developer tool, not shipped: score nftblockd's filters against fail2ban's annotated sample logs.

`python tools/f2b_conformance.py conformance [LOGDIR] [--filter-dir DIR] [--builtin|--imported]`

fail2ban ships sample logs (tests/files/logs/NAME) where each line is preceded by
`# failJSON: {"match": true, "host": "...", "time": "..."}`, with `# filterOptions:` blocks that re-run
lines under filter options (`mode`), `# fileOptions:` and `# addFILE:`. Every (line, option set) pair is an
assertion. We score "match" and "host"; `time` is scored separately. Hosts that are DNS names, have
leading-zero octets or are not addresses at all are out of scope (nftblockd skips them on purpose): they
are counted, and a Match with some *other* address on such a line still counts as a failure.

It lives outside the package (the wheel and the .deb do not carry it) and is used by the conformance tests.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any

from nftblockd.detect.filterload import builtin_filters, load_filter
from nftblockd.detect.matcher import Filter, FilterError, Match, MatchContext, parse_host
from nftblockd.detect.testfilter import printable as _printable

__all__ = ["SampleScore", "builtin_conformance", "conformance", "conformance_main", "imported_conformance"]


# --------------------------------------------------------------------------------------------------------
# Conformance against fail2ban's sample logs

F2B_TESTS = Path("/usr/lib/python3/dist-packages/fail2ban/tests")
F2B_LOGS = F2B_TESTS / "files" / "logs"
F2B_FILTERS = Path("/etc/fail2ban/filter.d")
TEST_NOW = 1124013600.0  # fail2ban's tests run at 2005-08-14 10:00 UTC ...
TEST_TZ = "Europe/Zurich"  # ... in CET/CEST

_DIRECTIVE = re.compile(r"^#+ ?(failJSON|fileOptions|filterOptions|addFILE):(.+)$")
_CONDITION = re.compile(r"""^\s*(name|opts\.get\(['"]([\w.\-]+)['"]\))\s*(==|!=)\s*['"]([^'"]*)['"]\s*$""")

# Deliberate differences of the built-in filters from fail2ban's expectations: (filter, text in the line).
DEVIATIONS: dict[tuple[str, str], str] = {
    ("sshd", "ssh2: from 10.10.1.2 port 55555 ssh2"):
        "a password failure never carries auth-info after 'ssh2: ', so the user name is 'test from 127.0.0.1 "
        "port 58946 ssh2:' and the client is 10.10.1.2; taking the first address instead lets a user name "
        "frame a victim (fail2ban 1.0.2 bans 6.6.6.6 for user 'x from 6.6.6.6 port 22 ssh2: y')",
}


@dataclass(slots=True)
class SampleScore:
    """One filter's result over its sample log(s)."""

    filter: str
    asserts: int = 0  # in scope
    passed: int = 0
    out_of_scope: int = 0  # expected host is a DNS name / leading-zero / not an address
    deviations: int = 0  # documented deliberate differences (counted as not passed)
    time_checked: int = 0
    time_ok: int = 0
    unsupported: bool = False  # the filter could not be loaded at all
    failures: list[str] = field(default_factory=list)

    @property
    def percent(self) -> float:
        return 100.0 * self.passed / self.asserts if self.asserts else 100.0


def _condition(expr: str, name: str, opts: dict[str, Any]) -> bool:
    m = _CONDITION.match(expr)
    if m is None:
        raise ValueError(f"unsupported sample condition {expr!r}")
    left = name if m.group(1) == "name" else opts.get(m.group(2))
    return (left == m.group(4)) == (m.group(3) == "==")


def _expected_time(text: str, tz: tzinfo) -> float:
    fmt = "%Y-%m-%dT%H:%M:%S.%f" if "." in text else "%Y-%m-%dT%H:%M:%S"
    return datetime.strptime(text, fmt).replace(tzinfo=tz).timestamp()


Loader = Callable[[str, dict[str, str]], Filter]


def conformance(name: str, loader: Loader, logdir: Path = F2B_LOGS, *, tz: tzinfo | None = None,
                now: float = TEST_NOW, sample: str | None = None) -> SampleScore:
    """Score the filter `loader(name, options)` against the sample log `logdir/(sample or name)`."""
    from zoneinfo import ZoneInfo

    zone = tz if tz is not None else ZoneInfo(TEST_TZ)
    score = SampleScore(name)
    files = [sample or name]
    cache: dict[str, tuple[Filter, MatchContext] | None] = {}
    common: dict[str, Any] = {}
    tests: list[tuple[str, dict[str, Any]]] | None = None
    skip_block = False

    def get(flt_key: str, opts: dict[str, Any]) -> tuple[Filter, MatchContext] | None:
        if flt_key not in cache:
            f_opts = {k: str(v) for k, v in opts.items() if not k.startswith("test.")}
            try:
                cache[flt_key] = (loader(name, f_opts), MatchContext())
            except FilterError as exc:
                score.failures.append(f"cannot load {name}{f_opts}: {exc}")
                cache[flt_key] = None
        return cache[flt_key]

    i = 0
    while i < len(files):
        path = logdir / files[i]
        i += 1
        try:
            raw_lines = path.read_text(encoding="utf-8", errors="surrogateescape").splitlines()
        except OSError as exc:
            score.failures.append(f"cannot read {path}: {exc}")
            continue
        it = iter(enumerate(raw_lines, 1))
        for lineno, line in it:
            faildata: dict[str, Any] = {}
            d = _DIRECTIVE.match(line)
            if d is not None:
                kind, payload = d.group(1), json.loads(d.group(2))
                if kind == "fileOptions":
                    common = payload
                    continue
                if kind == "addFILE":
                    files.append(payload)
                    continue
                if kind == "filterOptions":
                    tests, skip_block = _option_tests(payload, common, name)
                    continue
                faildata = payload
                nxt = next(it, None)
                if nxt is None:
                    break
                lineno, line = nxt
            elif skip_block or line.startswith("#") or not line.strip():
                continue
            if skip_block:
                continue
            if not tests:
                tests = [(name + (str(common) if common else ""), dict(common))]
            _score_line(score, name, tests, get, faildata, line, f"{path.name}:{lineno}", zone, now)
    return score


def _score_line(score: SampleScore, name: str, tests: list[tuple[str, dict[str, Any]]],
                get: Callable[[str, dict[str, Any]], tuple[Filter, MatchContext] | None], faildata: dict[str, Any],
                line: str, where: str, zone: tzinfo, now: float) -> None:
    """One sample line against each option set in force: match it and score the result."""
    for key, opts in tests:
        if faildata.get("constraint") and not _condition(faildata["constraint"], name, opts):
            continue
        got = get(key, opts)
        text = line
        if opts.get("logtype") == "journal" and opts.get("test.prefix-line"):
            text = opts["test.prefix-line"] + text
        if got is None:
            score.unsupported = True
            result = None  # a filter we cannot load matches nothing: its assertions count
        else:
            flt, ctx = got
            result = flt.match(text, now, ctx)
        _score_one(score, name, faildata, result, opts, where, text, zone, now)


def _option_tests(payload: Any, common: dict[str, Any], name: str) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
    """A `filterOptions` directive: the (cache key, options) to test the next lines with, and whether the
    block is skipped (an option set whose `test.condition` does not hold here)."""
    tests: list[tuple[str, dict[str, Any]]] = []
    skip_block = False
    for o in payload if isinstance(payload, list) else [payload]:
        opts = {**common, **o}
        if opts.get("test.condition") and not _condition(opts["test.condition"], name, opts):
            skip_block = True
            continue
        f_opts = {k: v for k, v in opts.items() if not k.startswith("test.")}
        key = opts.get("test.filter-name") or (str(f_opts) if f_opts else "")
        tests.append((name + key, opts))
    return tests, skip_block


def _score_one(score: SampleScore, name: str, faildata: dict[str, Any], result: Any, opts: dict[str, Any],
               where: str, line: str, zone: tzinfo, now: float) -> None:
    want = bool(faildata.get("match", False))
    got_fail = isinstance(result, Match) and not result.ignored
    host = faildata.get("host", faildata.get("ip4", faildata.get("ip6")))
    deviation = next((why for (flt, text), why in DEVIATIONS.items() if flt == name and text in line), None)
    label = f"{where} {opts or ''}"
    if want and host is not None and isinstance(parse_host(str(host)), str):
        # out of scope: we must skip it, never ban some other address instead
        if got_fail:
            score.asserts += 1
            score.failures.append(f"{label}: expected skip of {host!r}, got {result.host}: {line}")
        else:
            score.out_of_scope += 1
        return
    score.asserts += 1
    ok = got_fail == want
    if ok and want and host is not None:
        ok = str(result.host) == str(parse_host(str(host)))
    if ok:
        score.passed += 1
        if want and faildata.get("time"):
            expected = now if opts.get("logtype") == "journal" else _expected_time(faildata["time"], zone)
            actual = result.time if result.time is not None else now
            score.time_checked += 1
            if abs(actual - expected) < 1.0:
                score.time_ok += 1
        return
    if deviation:
        score.deviations += 1
        return
    shown = f"{type(result).__name__}({getattr(result, 'host', getattr(result, 'text', ''))})" if result \
        else "no match"
    score.failures.append(f"{label}: expected {'host ' + str(host) if want else 'no failure'}, got {shown}: "
                          f"{line}")


def _builtin_loader(tz: tzinfo) -> Loader:
    def load(name: str, opts: dict[str, str]) -> Filter:
        # our <syslog> prefix reads file, journal and RFC 5424 headers without being told which
        opts = {k: v for k, v in opts.items() if k != "logtype"}
        spec = name + ("[" + ", ".join(f'{k}="{v}"' for k, v in opts.items()) + "]" if opts else "")
        return load_filter(spec, tz=tz)

    return load


def _imported_loader(filter_dir: Path, tz: tzinfo) -> Loader:
    def load(name: str, opts: dict[str, str]) -> Filter:
        spec = str(filter_dir / f"{name}.conf")
        if opts:
            spec += "[" + ", ".join(f'{k}="{v}"' for k, v in opts.items()) + "]"
        return load_filter(spec, tz=tz)

    return load


# Our own annotated samples (same format) for what fail2ban's do not cover, e.g. OpenSSH >= 9.8.
EXTRA_SAMPLES = Path(__file__).resolve().parent.parent / "tests" / "data" / "logs"


def builtin_conformance(logdir: Path | None = F2B_LOGS, extra: Path | None = None) -> list[SampleScore]:
    """Score every built-in filter against fail2ban's sample of the same name (`logdir`) and/or our own
    annotated samples (`extra`: files named after the filter, e.g. sshd-session for sshd)."""
    from zoneinfo import ZoneInfo

    loader = _builtin_loader(ZoneInfo(TEST_TZ))
    scores = []
    for name in builtin_filters():
        sc = SampleScore(name)
        sources: list[tuple[Path, str]] = []
        if logdir is not None and (logdir / name).is_file():
            sources.append((logdir, name))
        if extra is not None and extra.is_dir():
            sources += [(extra, p.name) for p in sorted(extra.glob(f"{name}*"))
                        if p.is_file() and (p.name == name or p.name[len(name)] == "-")
                        and not any(p.name.startswith(o) and len(o) > len(name) for o in builtin_filters())]
        if not sources:
            continue
        for d, sample in sources:
            _add(sc, conformance(name, loader, d, sample=sample))
        scores.append(sc)
    return scores


def imported_conformance(logdir: Path = F2B_LOGS, filter_dir: Path = F2B_FILTERS) -> list[SampleScore]:
    """Score fail2ban's own filter files, read by nftblockd.detect.f2b, against their sample logs."""
    from zoneinfo import ZoneInfo

    loader = _imported_loader(filter_dir, ZoneInfo(TEST_TZ))
    scores = []
    for conf in sorted(filter_dir.glob("*.conf")):
        name = conf.stem
        if name.endswith("common") or not (logdir / name).is_file():
            continue
        scores.append(conformance(name, loader, logdir))
    return scores


def _add(total: SampleScore, s: SampleScore) -> None:
    total.asserts += s.asserts
    total.passed += s.passed
    total.out_of_scope += s.out_of_scope
    total.deviations += s.deviations
    total.time_checked += s.time_checked
    total.time_ok += s.time_ok
    total.unsupported = total.unsupported or s.unsupported
    total.failures += s.failures


def format_table(title: str, scores: Sequence[SampleScore]) -> str:
    rows = [f"{title}",
            f"  {'filter':<24} {'pass':>5} / {'of':<5} {'%':>6}  {'skip':>4} {'dev':>3}  {'time ok':>9}"]
    total = SampleScore("TOTAL")
    for s in scores:
        _add(total, s)
        rows.append(f"  {s.filter:<24} {s.passed:>5} / {s.asserts:<5} {s.percent:>6.1f}  {s.out_of_scope:>4} "
                    f"{s.deviations:>3}  {s.time_ok:>4}/{s.time_checked:<4}")
    rows.append(f"  {'TOTAL':<24} {total.passed:>5} / {total.asserts:<5} {total.percent:>6.1f}  "
                f"{total.out_of_scope:>4} {total.deviations:>3}  {total.time_ok:>4}/{total.time_checked:<4}")
    rows.append("  (skip: expected host is a DNS name or a leading-zero address, out of scope; "
                "dev: documented deliberate deviation)")
    return "\n".join(rows)


def _table(kind: str, logdir: Path, filter_dir: Path) -> tuple[str, list[SampleScore]]:
    """The title and scores of one table: `builtin`, `own` (nftblockd's own samples) or `imported`."""
    if kind == "builtin":
        return ("Built-in nftblockd filters vs fail2ban's annotated sample logs (match + host)",
                builtin_conformance(logdir))
    if kind == "own":
        return (f"Built-in nftblockd filters vs nftblockd's own annotated samples ({EXTRA_SAMPLES})",
                builtin_conformance(None, EXTRA_SAMPLES))
    return (f"fail2ban's own filters ({filter_dir}) read by nftblockd.detect.f2b, vs their sample logs",
            imported_conformance(logdir, filter_dir))


def conformance_main(argv: Sequence[str]) -> int:
    """CLI: print the per-filter conformance tables; exit 0 (the figures are the output)."""
    args = list(argv)
    logdir = F2B_LOGS
    filter_dir = F2B_FILTERS
    which = {"builtin", "imported"}
    verbose = False
    while args:
        a = args.pop(0)
        if a == "--filter-dir" and args:
            filter_dir = Path(args.pop(0))
        elif a == "--builtin":
            which = {"builtin"}
        elif a == "--imported":
            which = {"imported"}
        elif a in ("-v", "--verbose"):
            verbose = True
        elif not a.startswith("-"):
            logdir = Path(a)
        else:
            print(f"unknown argument {a!r}", file=sys.stderr)
            return 2
    for kind in ("builtin", "own", "imported"):
        if kind not in which and not (kind == "own" and "builtin" in which):
            continue
        title, scores = _table(kind, logdir, filter_dir)
        print(format_table(title, scores))
        if verbose:
            for s in scores:
                for f in s.failures:
                    print(f"    {s.filter}: {_printable(f)}")
        print()
    if "builtin" in which and DEVIATIONS:
        print("Documented deviations:")
        for (flt, text), why in DEVIATIONS.items():
            print(f"  {flt}: ...{text}...: {why}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python tools/f2b_conformance.py conformance [LOGDIR] [--filter-dir DIR] [--builtin|--imported]`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "conformance":
        print("usage: python tools/f2b_conformance.py conformance [LOGDIR] [--filter-dir DIR] "
              "[--builtin|--imported]", file=sys.stderr)
        return 2
    return conformance_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
