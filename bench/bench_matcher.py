"""Matcher throughput: nftblockd's sshd filter vs Debian's `fail2ban-regex` with fail2ban's sshd filter.

Generates a realistic 1,000,000-line auth.log of an internet-facing server in a temporary directory:
SSH brute force from many addresses (a few heavy hitters, a long tail), each attempt logged the way
OpenSSH logs it (invalid user, PAM check, failed password, disconnect), half of them by the
`sshd-session[PID]` processes of OpenSSH >= 9.8, scanners that never authenticate, legitimate
public-key logins with their session lines, and cron / systemd / sudo noise. Timestamps advance a few
lines per second, as on a busy server.

nftblockd runs over the whole file (the jail's matching exactly as the daemon does it: one filter, one
MatchContext, `Filter.scan` over batches of lines as the tailer hands them over). fail2ban-regex is slow,
so it runs on the first 100,000 lines and its own "processed in" time gives its lines/s. The recorded ratio
is ours / theirs (higher is better).

Run: `.venv/bin/python bench/bench_matcher.py [--lines N] [--f2b-lines N] [--engine auto|re|re2]`.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import record
from nftblockd.detect.filterload import load_filter
from nftblockd.detect.matcher import Match, MatchContext

START = 1796205190.0 - 3 * 86400  # three days before 2026-12-02 09:53 UTC
USERS = ["admin", "test", "user", "oracle", "ubuntu", "postgres", "git", "guest", "ftpuser", "pi", "support",
         "deploy1", "jenkins", "hadoop", "minecraft", "steam", "nagios", "teamspeak", "ts3", "odoo", ""]
BATCH = 2500  # lines per scan() call: about what one 256 KiB read of the tailer gives the jail
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def _stamp(t: float) -> str:
    tm = time.gmtime(t)
    return f"{MONTHS[tm.tm_mon - 1]} {tm.tm_mday:2d} {tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}"


def generate(path: Path, n: int, seed: int = 1, attack: float = 0.55) -> dict[str, int]:
    """Write `n` lines; `attack` is the share of events that are brute-force attempts (each is several
    lines); returns counts per kind (for the record's note)."""
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
    return counts


def ours(path: Path, engine: str) -> tuple[float, int, int]:
    """(lines/s, lines, failures) for nftblockd's sshd filter over the whole file."""
    flt = load_filter("sshd", engine=engine)  # type: ignore[arg-type]
    lines = path.read_text().splitlines()
    ctx = MatchContext()
    now = START + 3.5 * 86400
    best = 0.0
    found = 0
    batches = [lines[i:i + BATCH] for i in range(0, len(lines), BATCH)]
    for _ in range(2):  # best of two passes, each with a fresh context
        ctx = MatchContext()
        found = 0
        t0 = time.perf_counter()
        for batch in batches:
            for _i, r in flt.scan(batch, now, ctx):
                if type(r) is Match and not r.ignored:
                    found += 1
        best = max(best, len(lines) / (time.perf_counter() - t0))
    return best, len(lines), found


def theirs(path: Path, n: int, tmp: Path) -> tuple[float, int] | None:
    """(lines/s, failures) of fail2ban-regex on the first `n` lines, from its own processing time."""
    exe = shutil.which("fail2ban-regex")
    conf = Path("/etc/fail2ban/filter.d/sshd.conf")
    if exe is None or not conf.is_file():
        return None
    part = tmp / "prefix.log"
    with path.open() as src, part.open("w") as dst:
        for i, line in enumerate(src):
            if i >= n:
                break
            dst.write(line)
    proc = subprocess.run([exe, str(part), str(conf)], capture_output=True, text=True, check=False)
    m = re.search(r"processed in ([\d.]+) sec", proc.stdout)
    hits = re.search(r"Lines: \d+ lines, \d+ ignored, (\d+) matched", proc.stdout)
    if m is None:
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
        return None
    return n / float(m.group(1)), int(hits.group(1)) if hits else -1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--f2b-lines", type=int, default=100_000)
    ap.add_argument("--engine", default="auto", choices=["auto", "re", "re2"])
    ap.add_argument("--attack", type=float, default=0.55,
                    help="share of events that are brute-force attempts (0.55: a server under attack, whose "
                         "auth.log is three quarters sshd; 0.1: a quieter one)")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nftblock-bench-") as d:
        tmp = Path(d)
        log = tmp / "auth.log"
        t0 = time.perf_counter()
        counts = generate(log, args.lines, attack=args.attack)
        print(f"generated {args.lines:,} lines in {time.perf_counter() - t0:.1f}s: {counts}", flush=True)
        lps, n, found = ours(log, args.engine)
        print(f"nftblockd sshd ({args.engine}): {lps:,.0f} lines/s over {n:,} lines, {found:,} failures",
              flush=True)
        ref = theirs(log, min(args.f2b_lines, args.lines), tmp)
        if ref is None:
            print("fail2ban-regex not available: no reference", file=sys.stderr)
        else:
            n_ref = min(args.f2b_lines, args.lines)
            print(f"fail2ban-regex sshd: {ref[0]:,.0f} lines/s over {n_ref:,} lines, "
                  f"{ref[1]:,} failures (it misses sshd-session lines)", flush=True)
        if not args.no_record:
            name = "matcher sshd lines/s (ratio = ours/fail2ban, higher is better)"
            if args.engine != "auto":
                name = f"matcher sshd lines/s, engine={args.engine} (ratio = ours/fail2ban)"
            if args.attack != 0.55:
                name = name.replace("lines/s", f"lines/s, attack share {args.attack}")
            record(name, lps, "lines/s", reference="fail2ban-regex 1.0.2 sshd.conf",
                   reference_value=ref[0] if ref else None,
                   target=">= 20x" if args.engine == "auto" and args.attack == 0.55 else None,
                   note=f"{n:,}-line synthetic auth.log ({counts}); fail2ban-regex on the first "
                        f"{min(args.f2b_lines, args.lines):,} lines; ours: one filter + MatchContext, "
                        f"best of 2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
