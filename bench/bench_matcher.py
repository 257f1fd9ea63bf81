"""Matcher throughput: nftblockd's sshd filter vs Debian's `fail2ban-regex` with fail2ban's sshd filter, on
three auth.logs, each figure next to fail2ban-regex measured in the same run:

- `brute`: a server under brute force (bench/authlog.py, `attack=0.55`): per failing connection the seven
  or so lines OpenSSH and PAM write, ~20 % other daemons' lines, ~10 % IPv6 attackers, scanners, logins;
- `quiet`: a quiet server's log (`attack=0.02`): mostly other daemons' lines;
- `synthetic`: the previous benchmark's shape (kept for comparison with earlier figures), half of its sshd
  lines from the `sshd-session[PID]` processes of OpenSSH >= 9.8, which fail2ban 1.0.2 misses;
- `journal`: the `brute` log as a journal jail sees it (Debian's default sshd jail reads the journal): each
  line "web1 sshd[PID]: message", its date cut off (the journal's time travels beside the text), matched
  stamped (`Filter.scan(..., stamped=True)`, no date search) as JailRunner matches JournalSource batches.
  Two references: fail2ban-regex on the same messages with `--datepattern {NONE}` and sshd.conf's
  `logtype=journal` (no date search either, as its systemd backend: filter.processLine with the journal's
  date; reading a journal of 100k entries would time sd-journal too), and ours on the same lines from the
  file, interleaved in the same run (the journal row must not be slower than the file row).
- `field-mixed`, `field-brute`, `field-quiet`, `field-journal` (issue #38): the same four kinds of log from
  bench/fieldlogs.py, a generator written apart from authlog.py and never tuned against (RFC 3339 stamps,
  several OpenSSH versions' wordings and preauth noise, IPv4-mapped and full IPv6, postfix/dovecot/named
  lines; its docstring lists what differs); each row's note names the generator.

nftblockd runs over the whole file as the daemon's jail does (one filter, one MatchContext, `Filter.scan`
over batches of lines as the tailer hands them over, the daemon's garbage collector settings: daemon.tune_gc),
best of two passes; it reports lines/s and CPU seconds per million lines (process time of the scan loop).
Two modes of the native core, each named in its line: PCRE2 with its JIT (a daemon run without the unit's
sandbox, `MemoryDenyWriteExecute=no`), and PCRE2 interpreted, as the packaged unit runs it
(`MemoryDenyWriteExecute=yes` refuses the JIT's executable memory; measured in a child process that sets the
kernel's PR_SET_MDWE, the flag systemd sets). fail2ban-regex is slow, so it runs on the first
100,000 lines: its own "processed in" time gives its lines/s, and its CPU time (rusage of the child, minus
that of a run on a one-line log, i.e. its start-up) its CPU seconds per million lines. The ratios are
ours / theirs for lines/s (higher is better) and for CPU seconds (lower is better).

Where the time goes (callgrind and perf, brute-force log, this project's 2-core VM, issue #22; the details
in docs/matcher-speed.md). With the JIT, ~0.4 CPU-s per 1M lines: PCRE2's rule calls ~37 % of the
instructions, the rest the C glue and the Python objects a matched line makes (connection memory, Match,
address objects). Interpreted (the packaged unit) ~0.95 CPU-s: PCRE2's interpreter is most of it, the rule
that matches costing 270 ns (pam_unix) to 1.8 us (the `<F-USER>.*</F-USER> from <HOST>` rules backtrack
over the user field one character at a time), so the interpreted figure stays near 25x fail2ban-regex; the
unit's comment tells how to allow the JIT (MemoryDenyWriteExecute=no). The syslog timestamp and sshd's
usual syslog header are read in C, not by a regex; tried and dropped: PCRE2 without UTF mode (no gain).

Run: `.venv/bin/python bench/bench_matcher.py [--lines N] [--f2b-lines N] [--shape brute,quiet,synthetic]
[--engine auto|re|re2] [--python] [--gc default]` (`--python`: the pure-Python reference path, not the native
core; `--gc default`: Python's default collector thresholds instead of the daemon's).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import fieldlogs
from bench.authlog import LogStats, server_log
from bench.common import record
from nftblockd.daemon.root import tune_gc
from nftblockd.detect.filterload import load_filter
from nftblockd.detect.matcher import Match, MatchContext

START = 1796205190.0 - 3 * 86400  # three days before 2026-12-02 09:53 UTC
USERS = ["admin", "test", "user", "oracle", "ubuntu", "postgres", "git", "guest", "ftpuser", "pi", "support",
         "deploy1", "jenkins", "hadoop", "minecraft", "steam", "nagios", "teamspeak", "ts3", "odoo", ""]
DEFAULT_GC = gc.get_threshold()  # Python's own, before anything changes them
BATCH = 2500  # lines per scan() call: about what one 256 KiB read of the tailer gives the jail
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def _stamp(t: float) -> str:
    tm = time.gmtime(t)
    return f"{MONTHS[tm.tm_mon - 1]} {tm.tm_mday:2d} {tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}"


def synthetic(path: Path, n: int, seed: int = 1, attack: float = 0.55) -> str:
    """The previous benchmark's log: `n` lines; `attack` is the share of events that are brute-force
    attempts (each is several lines); returns counts per kind (for the record's note)."""
    rnd = random.Random(seed)
    attackers = [f"{rnd.randint(1, 223)}.{rnd.randint(0, 255)}.{rnd.randint(0, 255)}.{rnd.randint(1, 254)}"
                 for _ in range(40000)]
    attackers += [f"2001:db8:{rnd.randint(0, 0xffff):x}::{rnd.randint(1, 0xffff):x}" for _ in range(2000)]
    heavy = attackers[:50]
    t = START
    pid = 20000
    out: list[str] = []
    counts = {"attack": 0, "scan": 0, "login": 0, "noise": 0}
    host = "web1"
    while len(out) < n:
        t += rnd.expovariate(3.0)  # about three events a second
        ts = _stamp(t)
        pid += rnd.randint(1, 7)
        r = rnd.random()
        daemon = "sshd-session" if rnd.random() < 0.5 else "sshd"
        pfx = f"{ts} {host} {daemon}[{pid}]: "
        if r < attack:  # a brute-force attempt: several lines per connection
            counts["attack"] += 1
            ip = rnd.choice(heavy) if rnd.random() < 0.3 else rnd.choice(attackers)
            port = rnd.randint(1024, 65535)
            if rnd.random() < 0.75:
                u = rnd.choice(USERS)
                out += [f"{pfx}Invalid user {u} from {ip} port {port}",
                        f"{pfx}pam_unix(sshd:auth): check pass; user unknown",
                        f"{pfx}pam_unix(sshd:auth): authentication failure; logname= uid=0 euid=0 tty=ssh "
                        f"ruser= rhost={ip}",
                        f"{pfx}Failed password for invalid user {u} from {ip} port {port} ssh2",
                        f"{pfx}Received disconnect from {ip} port {port}:11: Bye Bye [preauth]",
                        f"{pfx}Disconnected from invalid user {u} {ip} port {port} [preauth]"]
            else:
                out += [f"{pfx}pam_unix(sshd:auth): authentication failure; logname= uid=0 euid=0 tty=ssh "
                        f"ruser= rhost={ip}  user=root",
                        f"{pfx}Failed password for root from {ip} port {port} ssh2",
                        f"{pfx}Connection closed by authenticating user root {ip} port {port} [preauth]"]
        elif r < attack + 0.10:  # scanners
            counts["scan"] += 1
            ip = rnd.choice(attackers)
            port = rnd.randint(1024, 65535)
            out.append(rnd.choice([
                f"{pfx}Connection closed by {ip} port {port} [preauth]",
                f"{pfx}banner exchange: Connection from {ip} port {port}: invalid format",
                f"{pfx}error: kex_exchange_identification: Connection closed by remote host",
                f"{ts} {host} sshd[811]: Timeout before authentication for connection from {ip} "
                f"to 192.0.2.1, pid = {pid}",
                f"{pfx}Connection reset by {ip} port {port} [preauth]",
            ]))
        elif r < attack + 0.17:  # legitimate logins
            counts["login"] += 1
            ip = f"10.0.{rnd.randint(0, 3)}.{rnd.randint(2, 250)}"
            port = rnd.randint(1024, 65535)
            out += [f"{pfx}Accepted publickey for deploy from {ip} port {port} ssh2: ED25519 "
                    f"SHA256:0xnYs2T5eSEy8a3dbQ2VgJqz6Gb4sRy0M7kfcnGdnuk",
                    f"{pfx}pam_unix(sshd:session): session opened for user deploy(uid=1000) by deploy(uid=0)",
                    f"{ts} {host} systemd-logind[512]: New session {pid} of user deploy.",
                    f"{pfx}Received disconnect from {ip} port {port}:11: disconnected by user",
                    f"{pfx}Disconnected from user deploy {ip} port {port}",
                    f"{pfx}pam_unix(sshd:session): session closed for user deploy",
                    f"{ts} {host} systemd-logind[512]: Session {pid} logged out. "
                    f"Waiting for processes to exit."]
        else:  # the rest of auth.log
            counts["noise"] += 1
            out.append(rnd.choice([
                f"{ts} {host} CRON[{pid}]: pam_unix(cron:session): session opened for user root(uid=0) by "
                f"root(uid=0)",
                f"{ts} {host} CRON[{pid}]: pam_unix(cron:session): session closed for user root",
                f"{ts} {host} sudo:   deploy : TTY=pts/0 ; PWD=/home/deploy ; USER=root ; COMMAND=/usr/bin/"
                f"systemctl status nginx",
                f"{ts} {host} sudo: pam_unix(sudo:session): session opened for user root(uid=0) by "
                f"deploy(uid=1000)",
                f"{ts} {host} systemd-logind[512]: Removed session {pid}.",
                f"{ts} {host} systemd[1]: Started session-{pid}.scope - Session {pid} of User deploy.",
                f"{ts} {host} polkitd[633]: Registered Authentication Agent for unix-process:{pid}:1 "
                f"(system bus name :1.{pid})",
            ]))
    path.write_text("\n".join(out[:n]) + "\n")
    return f"{n:,} lines, synthetic: {counts}"


def realistic(path: Path, n: int, attack: float) -> str:
    st = LogStats()
    with path.open("w") as f:
        for line in server_log(n, attack=attack, start=START, stats=st):
            f.write(line + "\n")
    return st.summary()


@dataclass(frozen=True, slots=True)
class Run:
    lps: float  # lines per second
    cpu: float  # CPU seconds per million lines
    lines: int
    failures: int


_HEAD_DATE = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d ")


def journal_shaped(path: Path, out: Path) -> None:
    """The log's lines as a journal source hands them over: "host ident[pid]: message", no date."""
    with path.open() as src, out.open("w") as dst:
        for line in src:
            dst.write(_HEAD_DATE.sub("", line, count=1))


def ours(path: Path, engine: str, python: bool, daemon_gc: bool = True, stamped: bool = False) -> tuple[Run, str]:
    """nftblockd's sshd filter over the whole file: best of two passes, each with a fresh context;
    `stamped`: the lines are a journal's (see `journal_shaped`)."""
    flt = load_filter("sshd", engine=engine)  # type: ignore[arg-type]
    if python:
        flt.disable_native()
    lines = path.read_text().splitlines()
    if daemon_gc:  # as the daemon runs after start-up (its config, filters and state frozen)
        tune_gc()
    now = START + 3.5 * 86400
    batches = [lines[i:i + BATCH] for i in range(0, len(lines), BATCH)]
    best: Run | None = None
    for _ in range(2):
        ctx = MatchContext()
        found = 0
        c0 = time.process_time()
        t0 = time.perf_counter()
        for batch in batches:
            for _i, r in flt.scan(batch, now, ctx, stamped=stamped):
                if type(r) is Match and not r.ignored:
                    found += 1
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        run = Run(len(lines) / wall, cpu / len(lines) * 1e6, len(lines), found)
        if best is None or run.lps > best.lps:
            best = run
    assert best is not None
    return best, flt.scanner


PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1


def ours_interpreted(path: Path, engine: str, daemon_gc: bool, stamped: bool = False) -> tuple[Run, str] | None:
    """`ours` in a child process without executable memory (PR_SET_MDWE, as MemoryDenyWriteExecute=yes
    sets it): PCRE2 runs interpreted, as under the packaged unit. None: the kernel has no PR_SET_MDWE."""
    proc = subprocess.run([sys.executable, __file__, "--child-mdwe", str(path), "--engine", engine,
                           "--gc", "daemon" if daemon_gc else "default", *(["--stamped"] if stamped else [])],
                          capture_output=True, text=True, check=False)
    if proc.returncode == 77:
        return None
    if proc.returncode != 0:
        raise RuntimeError(f"interpreted run failed: {proc.stderr[-2000:]}")
    got = json.loads(proc.stdout)
    return Run(got["lps"], got["cpu"], got["lines"], got["failures"]), got["scanner"]


def _child_mdwe(path: Path, engine: str, daemon_gc: bool, stamped: bool) -> int:
    if ctypes.CDLL(None).prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        return 77
    run, scanner = ours(path, engine, False, daemon_gc, stamped)
    print(json.dumps({"lps": run.lps, "cpu": run.cpu, "lines": run.lines, "failures": run.failures,
                      "scanner": scanner}))
    return 0


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def theirs(path: Path, n: int, tmp: Path, journal: bool = False) -> Run | None:
    """fail2ban-regex on the first `n` lines: lines/s from its own processing time, CPU per line from its
    rusage minus that of a run on a one-line file (interpreter start, filter compilation). `journal`: the
    lines are journal-shaped; no date is searched (`{NONE}`) and the filter's prefix is the journal's."""
    exe = shutil.which("fail2ban-regex")
    conf = Path("/etc/fail2ban/filter.d/sshd.conf")
    if exe is None or not conf.is_file():
        return None
    spec = f"{conf}[logtype=journal]" if journal else str(conf)
    opts = ["--datepattern", "{NONE}"] if journal else []
    part = tmp / "prefix.log"
    one = tmp / "one.log"
    with path.open() as src, part.open("w") as dst, one.open("w") as first:
        for i, line in enumerate(src):
            if i >= n:
                break
            if i == 0:
                first.write(line)
            dst.write(line)

    def run(log: Path) -> tuple[subprocess.CompletedProcess[str], float]:
        c0 = _children_cpu()
        proc = subprocess.run([exe, *opts, str(log), spec], capture_output=True, text=True, check=False)
        return proc, _children_cpu() - c0

    _, startup = run(one)
    proc, cpu = run(part)
    m = re.search(r"processed in ([\d.]+) sec", proc.stdout)
    hits = re.search(r"Lines: \d+ lines, \d+ ignored, (\d+) matched", proc.stdout)
    if m is None:
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
        return None
    return Run(n / float(m.group(1)), max(cpu - startup, 1e-9) / n * 1e6, n, int(hits.group(1)) if hits else -1)


SHAPES = {
    # name: (title, attack share, target for lines/s)
    "brute": ("server under brute force", 0.55, ">= 50x"),  # issue #22
    "quiet": ("quiet server (--attack 0.02)", 0.02, ">= 50x"),
    "synthetic": ("synthetic (previous benchmark)", 0.55, None),
    "journal": ("server under brute force, journal lines", 0.55, ">= 50x"),  # Debian's sshd jail: the journal
    # issue #38: shapes from bench/fieldlogs.py, a generator the matcher's speed work was never measured on;
    # their targets are the packaged unit's (interpreted) rows
    "field-mixed": ("fieldlogs mixed mail/web server (RFC 3339 stamps)", 0.0, ">= 50x"),
    "field-brute": ("fieldlogs brute force (300 x ~200 tries)", 0.0, ">= 50x"),
    "field-quiet": ("fieldlogs quiet server", 0.0, ">= 50x"),
    "field-journal": ("fieldlogs mixed server, journal lines", 0.0, ">= 50x"),
}
FIELD = tuple(s for s in SHAPES if s.startswith("field-"))


def field(path: Path, shape: str, n: int) -> str:
    """A bench/fieldlogs.py shape's first `n` lines into `path`; the note says which generator made them."""
    sshd = 0
    with path.open("w") as f:
        for line in fieldlogs.SHAPES[shape](n):
            sshd += "sshd" in line
            f.write(line + "\n")
    return f"{n:,} lines from bench/fieldlogs.py {shape} (not tuned against), {sshd:,} of them sshd's"


def generate(shape: str, log: Path, n: int, attack: float) -> str:
    if shape in FIELD:
        return field(log, shape[6:], n)
    return synthetic(log, n) if shape == "synthetic" else realistic(log, n, attack)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--f2b-lines", type=int, default=100_000)
    ap.add_argument("--shape", default="brute,quiet,synthetic,journal," + ",".join(FIELD))
    ap.add_argument("--engine", default="auto", choices=["auto", "re", "re2"])
    ap.add_argument("--python", action="store_true", help="the pure-Python reference path")
    ap.add_argument("--gc", default="daemon", choices=["daemon", "default"],
                    help="the collector as the daemon sets it (tune_gc), or Python's default thresholds")
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--child-mdwe", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--stamped", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    daemon_gc = args.gc == "daemon"
    if args.child_mdwe is not None:
        return _child_mdwe(args.child_mdwe, args.engine, daemon_gc, args.stamped)
    if not daemon_gc:
        gc.set_threshold(*DEFAULT_GC)
    for shape in args.shape.split(","):
        title, attack, target = SHAPES[shape]
        with tempfile.TemporaryDirectory(prefix="nftblock-bench-") as d:
            tmp = Path(d)
            log = tmp / "auth.log"
            t0 = time.perf_counter()
            what = generate(shape, log, args.lines, attack)
            print(f"[{shape}] generated in {time.perf_counter() - t0:.1f}s: {what}", flush=True)
            stamped = shape in ("journal", "field-journal")
            filed: list[tuple[str, Run]] = []
            if shape == "journal":
                filed = file_runs(log, args.engine, args.python, daemon_gc)
                journal_shaped(log, tmp / "journal.log")
                log = tmp / "journal.log"
            runs = [("", *ours(log, args.engine, args.python, daemon_gc, stamped))]
            if shape == "journal":  # interleaved with the file runs: a busy machine slows both alike
                filed = [(m, max(r, more, key=lambda x: x.lps)) for (m, r), (_, more)
                         in zip(filed, file_runs(log.with_name("auth.log"), args.engine, args.python, daemon_gc),
                                strict=True)]
                again = ours(log, args.engine, args.python, daemon_gc, stamped)
                runs = [("", max(runs[0][1], again[0], key=lambda x: x.lps), again[1])]
            if not args.python and "JIT)" in runs[0][2]:  # the packaged unit's mode too
                got = ours_interpreted(log, args.engine, daemon_gc, stamped)
                if got is None:
                    print("the kernel has no PR_SET_MDWE: no interpreted run", file=sys.stderr)
                else:
                    runs.append((", interpreted (packaged unit)", *got))
            for _mode, mine, scanner in runs:
                print(f"[{shape}] nftblockd sshd ({scanner}; gc {args.gc}): {mine.lps:,.0f} lines/s, "
                      f"{mine.cpu:.2f} CPU-s per 1M lines, over {mine.lines:,} lines, {mine.failures:,} failures",
                      flush=True)
            n_ref = min(args.f2b_lines, args.lines)
            ref = theirs(log, n_ref, tmp, journal=stamped)
            if ref is None:
                print("fail2ban-regex not available: no reference", file=sys.stderr)
            else:
                print(f"[{shape}] fail2ban-regex sshd: {ref.lps:,.0f} lines/s, {ref.cpu:.2f} CPU-s per 1M lines, "
                      f"over {n_ref:,} lines, {ref.failures:,} failures", flush=True)
                for mode, mine, _scanner in runs:
                    print(f"[{shape}] ratio{mode or ''}: {mine.lps / ref.lps:.1f}x lines/s, "
                          f"{ref.cpu / mine.cpu:.1f}x less CPU", flush=True)
            for (mode, mine, _scanner), (_, file_run) in zip(runs, filed, strict=False):
                print(f"[{shape}] journal lines / file lines{mode}: {mine.lps / file_run.lps:.2f}x lines/s "
                      f"({file_run.lps:,.0f} lines/s from the file, {file_run.failures:,} failures)", flush=True)
            if args.no_record:
                continue
            variant = "" if args.engine == "auto" and not args.python else \
                f", {'python' if args.python else 'engine=' + args.engine}"
            variant += "" if daemon_gc else ", default gc"
            reference = "fail2ban-regex 1.0.2 sshd.conf" + ("[logtype=journal], {NONE}" if stamped else "")
            for mode, mine, scanner in runs:
                note = (f"{what}; ours: {scanner}, one filter + MatchContext, gc {args.gc}, best of 2; "
                        f"fail2ban-regex on the first {n_ref:,} lines")
                record(f"matcher sshd, {title}{mode}{variant}: lines/s", mine.lps, "lines/s",
                       reference=reference, reference_value=ref.lps if ref else None,
                       target=target if not variant else None, note=note)
                record(f"matcher sshd, {title}{mode}{variant}: CPU-s per 1M lines", mine.cpu, "s",
                       reference=reference, reference_value=ref.cpu if ref else None,
                       note=note + " (ratio: ours / theirs, lower is better)")
            for (mode, mine, _scanner), (_, file_run) in zip(runs, filed, strict=False):
                record(f"matcher sshd, journal vs file lines{mode}{variant}: lines/s", mine.lps, "lines/s",
                       reference="the same lines from the file (ours, interleaved)", reference_value=file_run.lps,
                       target="ratio >= 0.9" if not variant else None,
                       note="the journal row's lines with their dates, scanned as a file tail hands them over")
    return 0


def file_runs(log: Path, engine: str, python: bool, daemon_gc: bool) -> list[tuple[str, Run]]:
    """The file-line runs the journal row is compared with: JIT and (when it runs) interpreted."""
    run, scanner = ours(log, engine, python, daemon_gc)
    out = [("", run)]
    if not python and "JIT)" in scanner:
        got = ours_interpreted(log, engine, daemon_gc)
        if got is not None:
            out.append((", interpreted (packaged unit)", got[0]))
    return out


if __name__ == "__main__":
    sys.exit(main())
