"""A jail's matching with actions that show an offender's lines, that do not, and without actions.

A jail with actions used to keep each offender's recent lines for `{matches}` whatever its actions showed,
which made a jail whose every line is a failure 25-35 % slower (docs/actions.md). Now only a jail with an
action that shows them (a command or webhook, a fail2ban file naming `<matches>`, `<F-*>`, `<failures>`)
keeps any. This times `JailRunner.process` (filter, tracker, match memory; no sources, no kernel) over
150,000 sshd failure lines, 3 per address (no address reaches maxretry: every line is a counted failure
that the memory would keep), in three jails taken in turn each round, the order rotating, after one pass
of each that is not counted (imports, the filter's first use, the allocator's first pools):

- `none`: the jail has no actions (the floor);
- `quiet`: one fail2ban action whose actionban names only `<ip>`, `<name>`, `<bantime>`;
- `lines`: one fail2ban action whose actionban names `<matches>` (what keeping the lines costs).

The figure is `quiet` against `none` (1.0: the action costs the matching nothing), `lines` against `none`
the cost of keeping lines. Each ratio is the median of the rounds' own ratios (the two jails' passes of one
round run next to each other), not the ratio of two medians: on the shared 2-core VM the speed drifts by
10-25 % over a run (the rounds of one jail read 176k-222k lines/s in one run), and two separate medians
can then fall on different rounds. Round three read 0.906 for `quiet` from two medians of 5 rounds in one
quiet merged run, 0.99 in the helper's; `quiet` and `none` run the same code in `JailRunner.process` (the
memory is consulted once per batch, `memory.keep` is false for `quiet`), and 3 runs of 5 rounds here gave
0.977, 0.987 and 1.016 by the old statistic: noise, not a cost.

Run: `.venv/bin/python bench/bench_jailmem.py [--lines N] [--rounds N]`
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import paired_ratio, record
from nftblockd.actions.f2baction import F2bAction, load_action
from nftblockd.actions.hub import ActionHub
from nftblockd.actions.render import Run
from nftblockd.config import Config, parse_config
from nftblockd.daemon.root import tune_gc
from nftblockd.detect.filterload import load_filter
from nftblockd.detect.jails import JailRunner
from nftblockd.detect.tracker import BanRecord, JailPolicy, Tracker
from nftblockd.events import Ban, LogLine
from nftblockd.sources.base import LineBatch, MemoryPositionStore

NOW = 1796205190.0  # 2026-12-02 09:53:10 UTC
BATCH = 2500  # lines per process() call: about one 256 KiB read of the tailer
CONFIG = """
state_dir: {d}
actions:
  quiet: {{type: fail2ban, file: {d}/quiet.conf}}
  lines: {{type: fail2ban, file: {d}/lines.conf}}
jails:
  none: {{filter: sshd, files: [{d}/none.log]}}
  quiet: {{filter: sshd, files: [{d}/quiet.log], actions: [quiet]}}
  lines: {{filter: sshd, files: [{d}/lines.log], actions: [lines]}}
"""
SCRIPTS = {"quiet": "echo <ip> banned by <name> for <bantime>", "lines": "printf %%s <matches> | mail -s <ip> ops"}


class NullSink:
    async def submit(self, bans: list[Ban], records: list[BanRecord], arrival: float) -> None:
        return None

    def submit_nowait(self, bans: list[Ban], records: list[BanRecord], arrival: float) -> bool:
        return True


async def nothing(run: Run) -> None:
    return None


def failure_lines(n: int) -> list[LogLine]:
    """`n` sshd failure lines, 3 per address, the addresses' lines spread over the whole log."""
    hosts = n // 3
    out = []
    for i in range(n):
        h = (i * 7919) % hosts  # each address 3 times, far apart
        t = NOW - n + i
        ts = time.strftime("%b %e %H:%M:%S", time.gmtime(t))
        out.append(LogLine("bench", f"{ts} web1 sshd[{1000 + i % 30000}]: Failed password for invalid user u{i % 97} "
                                    f"from 10.{h >> 16 & 255}.{h >> 8 & 255}.{h & 255} port {1024 + i % 60000} ssh2"))
    return out


def runner(cfg: Config, hub: ActionHub, name: str) -> JailRunner:
    jail = next(j for j in cfg.jails if j.name == name)
    return JailRunner(jail, load_filter(jail.filter), Tracker([JailPolicy.from_config(jail)]), NullSink(),
                      MemoryPositionStore(), sources=[], memory=hub.memory(name))


def one_pass(cfg: Config, f2b: dict[str, F2bAction], name: str, batches: list[list[LogLine]]
             ) -> tuple[float, int]:
    """CPU seconds of one jail over every batch (a fresh hub, runner and tracker), and the failures it
    counted."""
    r = runner(cfg, ActionHub(cfg, f2b, nothing), name)
    prepared = [LineBatch.of(b) for b in batches]  # as a source hands them over, before the clock starts
    c0 = time.process_time()
    for b in prepared:
        r.process(b, NOW, True, 0.0)
    return time.process_time() - c0, r.stats.failures


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--lines", type=int, default=150_000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nftblock-bench-") as d:
        for name, script in SCRIPTS.items():
            Path(d, f"{name}.conf").write_text(f"[Definition]\nactionban = {script}\n")
        cfg = parse_config(CONFIG.format(d=d))
        f2b = {a.name: load_action(a.file, dict(a.options)) for a in cfg.actions}
        hub = ActionHub(cfg, f2b, nothing)
        # (getattr: the same script measures the commit before `keep`, for the A/B)
        keeps = {n: (getattr(m, "keep", True) if (m := hub.memory(n)) is not None else None)
                 for n in ("none", "quiet", "lines")}
        lines = failure_lines(args.lines)
        batches = [lines[i:i + BATCH] for i in range(0, len(lines), BATCH)]
        tune_gc()  # as the daemon runs
        times: dict[str, list[float]] = {"none": [], "quiet": [], "lines": []}
        names = list(times)
        for name in names:  # warm-up, not counted
            one_pass(cfg, f2b, name, batches)
            gc.collect()
        for k in range(args.rounds):
            for name in names[k % 3:] + names[:k % 3]:  # each jail first, second, third in turn
                cpu, failures = one_pass(cfg, f2b, name, batches)
                assert failures == len(lines), (name, failures)
                times[name].append(cpu)
                gc.collect()
    med = {n: statistics.median(t) for n, t in times.items()}
    lps = {n: len(lines) / s for n, s in med.items()}
    # lines/s against the jail without actions, round by round: the inverse of the time ratio
    rel = {n: paired_ratio(times["none"], times[n]) for n in times}
    print(f"match memory kept: {keeps}")
    for n in times:
        print(f"jail with {'no actions' if n == 'none' else n + ' action'}: {lps[n]:,.0f} lines/s "
              f"(median of {args.rounds}, CPU time; rounds {', '.join(f'{len(lines) / s:,.0f}' for s in times[n])})")
    print(f"lines/s against no actions, median of the rounds' ratios: quiet {rel['quiet']:.3f}, lines "
          f"{rel['lines']:.3f} (ratio of the medians: {lps['quiet'] / lps['none']:.3f}, "
          f"{lps['lines'] / lps['none']:.3f})")
    if not args.no_record:
        note = (f"{len(lines):,} sshd failure lines, 3 per address, JailRunner.process (filter + tracker + match "
                f"memory), median of {args.rounds} interleaved rounds after a warm-up; reference: the same jail "
                f"without actions; ratio: the median of the rounds' own ratios (bench docstring)")
        record("jail with an action that shows no lines: lines/s", lps["quiet"], "lines/s",
               reference="no actions", reference_value=lps["none"], target=">= 0.95x", note=note,
               ratio=rel["quiet"])
        record("jail with an action that shows <matches>: lines/s", lps["lines"], "lines/s",
               reference="no actions", reference_value=lps["none"], note=note, ratio=rel["lines"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
