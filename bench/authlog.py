"""Realistic auth.log text for the benchmarks: what a Debian server's /var/log/auth.log holds when a botnet
tries passwords on its OpenSSH server. Deterministic for a given seed; writes nothing itself.

Two shapes:

- `server_log(n, attack=...)`: a long log of a server's life, `n` lines. Events arrive a few a second. An
  event is a brute-force connection (share `attack` of the events), a scanner that never authenticates, a
  legitimate login with its session lines, or a burst of other daemons' lines (CRON, sudo, systemd,
  systemd-logind, polkitd, kernel firewall lines). `attack=0.55` is a server under brute force (about 20 %
  of the lines are other daemons'); `attack=0.02` a quiet server.
- `burst(attackers, near_misses)`: what a botnet leaves within a few seconds: every attacker reaches
  exactly `maxretry` failures, every near-miss address exactly `maxretry - 1` (it must not be banned),
  their connections interleaved as concurrent sshd processes write them, with other daemons' lines
  (`noise` share of all lines), scanners and successful logins mixed in.

A brute-force connection is written as OpenSSH 9.2 (Debian 12) with PAM writes it, one of:

    Invalid user admin from 203.0.113.7 port 51234                                          failure
    pam_unix(sshd:auth): check pass; user unknown
    pam_unix(sshd:auth): authentication failure; logname= uid=0 euid=0 tty=ssh ruser= rhost=203.0.113.7
    Failed password for invalid user admin from 203.0.113.7 port 51234 ssh2                 failure
    (another "check pass" and "Failed password" per further password tried)
    Received disconnect from 203.0.113.7 port 51234:11: Bye Bye [preauth]
    Disconnected from invalid user admin 203.0.113.7 port 51234 [preauth]
      or, when the client just drops the connection:
    Connection closed by invalid user admin 203.0.113.7 port 51234 [preauth]

and for an existing account (root) without the "Invalid user" and "check pass" lines, `user=root` on the
PAM line and "authenticating user root" in the last line. The failure counts are those of fail2ban's
sshd filter and nftblockd's (normal mode): "Invalid user" and each "Failed password" count; the PAM and
disconnect lines are connection helpers. `bench_matcher` and `bench_e2e` check the counts against both.

IPv6 attackers (`ipv6` share) each use their own /64, so a jail with `ipv6_prefix: 64` bans them one by
one as well.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
HOST = "web1"
# user names bots try (from real logs); "" is a client that sends an empty user name
USERS = ("admin", "test", "user", "oracle", "ubuntu", "postgres", "git", "guest", "ftpuser", "pi", "support",
         "deploy1", "jenkins", "hadoop", "minecraft", "steam", "nagios", "teamspeak", "ts3", "odoo", "ansible",
         "elastic", "dev", "tomcat", "mysql", "ftp", "www", "sol", "validator", "")
KEY = "SHA256:0xnYs2T5eSEy8a3dbQ2VgJqz6Gb4sRy0M7kfcnGdnuk"


def syslog_stamp(t: float) -> str:
    """`Dec  2 09:53:10`, in UTC (the benchmarks give the matcher a UTC zone-free `now` near `t`)."""
    tm = time.gmtime(t)
    return f"{MONTHS[tm.tm_mon - 1]} {tm.tm_mday:2d} {tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}"


def ipv4(rnd: random.Random) -> str:
    """A public-looking IPv4 address (no 0/8, 10/8, 127/8, multicast)."""
    while True:
        a = rnd.randint(1, 223)
        if a not in (10, 127):
            return f"{a}.{rnd.randint(0, 255)}.{rnd.randint(0, 255)}.{rnd.randint(1, 254)}"


def ipv6(rnd: random.Random) -> str:
    """An address in its own /64 under 2001:db8::/32 (documentation space)."""
    return f"2001:db8:{rnd.randint(0, 0xffff):x}:{rnd.randint(1, 0xffff):x}::{rnd.randint(1, 0xffff):x}"


# -- one sshd connection ------------------------------------------------------------------------------------

def attempt(rnd: random.Random, ip: str, passwords: int, *, root: bool | None = None) -> tuple[list[str], int]:
    """The messages of one password-guessing connection (without the syslog header) and its failures."""
    port = rnd.randint(1024, 65535)
    if root is None:
        root = rnd.random() < 0.25
    out: list[str] = []
    if root:
        user, who = "root", "authenticating user root"
        out.append(f"pam_unix(sshd:auth): authentication failure; logname= uid=0 euid=0 tty=ssh ruser= "
                   f"rhost={ip}  user=root")
        for _ in range(passwords):
            out.append(f"Failed password for root from {ip} port {port} ssh2")
        failures = passwords
    else:
        user = rnd.choice(USERS)
        who = f"invalid user {user}"
        out.append(f"Invalid user {user} from {ip} port {port}")
        for n in range(passwords):
            out.append("pam_unix(sshd:auth): check pass; user unknown")
            if n == 0:
                out.append(f"pam_unix(sshd:auth): authentication failure; logname= uid=0 euid=0 tty=ssh "
                           f"ruser= rhost={ip}")
            out.append(f"Failed password for invalid user {user} from {ip} port {port} ssh2")
        failures = 1 + passwords
    if rnd.random() < 0.7:
        out.append(f"Received disconnect from {ip} port {port}:11: Bye Bye [preauth]")
        out.append(f"Disconnected from {who} {ip} port {port} [preauth]")
    else:
        out.append(f"Connection closed by {who} {ip} port {port} [preauth]")
    if passwords > 1 and rnd.random() < 0.3:
        extra = "  user=root" if root else ""
        out.append(f"PAM {passwords - 1} more authentication failure{'s' if passwords > 2 else ''}; logname= "
                   f"uid=0 euid=0 tty=ssh ruser= rhost={ip}{extra}")
    del user
    return out, failures


def attempts_for(rnd: random.Random, ip: str, failures: int) -> list[list[str]]:
    """Connections that add up to exactly `failures` failures (bots guess one to three passwords each)."""
    conns: list[list[str]] = []
    left = failures
    while left > 0:
        if left == 1:
            lines, n = attempt(rnd, ip, 1, root=True)
        else:
            root = rnd.random() < 0.4  # root is what bots try most
            most = left if root else left - 1  # an invalid user's connection counts its "Invalid user" too
            # most bots try all their passwords on one connection; some reconnect
            passwords = min(3, most) if rnd.random() < 0.75 else rnd.randint(1, min(3, most))
            lines, n = attempt(rnd, ip, passwords, root=root)
        conns.append(lines)
        left -= n
    return conns


def scanner(rnd: random.Random, ip: str) -> list[str]:
    """A connection that never authenticates (no failure in normal mode)."""
    port = rnd.randint(1024, 65535)
    return [rnd.choice((
        f"Connection closed by {ip} port {port} [preauth]",
        f"Connection reset by {ip} port {port} [preauth]",
        "error: kex_exchange_identification: Connection closed by remote host",
        f"banner exchange: Connection from {ip} port {port}: invalid format",
        f"Unable to negotiate with {ip} port {port}: no matching key exchange method found. Their offer: "
        f"diffie-hellman-group14-sha1,diffie-hellman-group-exchange-sha1 [preauth]",
    ))]


def login(rnd: random.Random, session: int) -> tuple[list[str], list[str], list[str]]:
    """A legitimate login: (sshd lines, the logind/systemd lines at login, those at logout)."""
    ip = f"10.0.{rnd.randint(0, 3)}.{rnd.randint(2, 250)}"
    port = rnd.randint(1024, 65535)
    user, uid = rnd.choice((("deploy", 1000), ("alice", 1001), ("backup", 1002)))
    if rnd.random() < 0.8:
        accepted = f"Accepted publickey for {user} from {ip} port {port} ssh2: ED25519 {KEY}"
        head = [accepted]
    else:  # a password login after a typo: one failure, far from maxretry
        head = [f"Failed password for {user} from {ip} port {port} ssh2",
                f"Accepted password for {user} from {ip} port {port} ssh2"]
    sshd = [*head, f"pam_unix(sshd:session): session opened for user {user}(uid={uid}) by (uid=0)",
            f"Received disconnect from {ip} port {port}:11: disconnected by user",
            f"Disconnected from user {user} {ip} port {port}",
            f"pam_unix(sshd:session): session closed for user {user}"]
    at_login = [f"systemd-logind[512]: New session {session} of user {user}.",
                f"systemd[1]: Started session-{session}.scope - Session {session} of User {user}."]
    at_logout = [f"systemd-logind[512]: Session {session} logged out. Waiting for processes to exit.",
                 f"systemd-logind[512]: Removed session {session}."]
    return sshd, at_login, at_logout


def noise(rnd: random.Random, pid: int) -> list[str]:
    """Other daemons' lines of one event (with their program headers, without the timestamp and host)."""
    r = rnd.random()
    if r < 0.45:
        return [f"CRON[{pid}]: pam_unix(cron:session): session opened for user root(uid=0) by (uid=0)",
                f"CRON[{pid}]: pam_unix(cron:session): session closed for user root"]
    if r < 0.60:
        cmd = rnd.choice(("/usr/bin/systemctl status nginx", "/usr/bin/apt update", "/usr/bin/journalctl -f",
                          "/usr/sbin/nft list ruleset"))
        return [f"sudo:   deploy : TTY=pts/0 ; PWD=/home/deploy ; USER=root ; COMMAND={cmd}",
                "sudo: pam_unix(sudo:session): session opened for user root(uid=0) by deploy(uid=1000)",
                "sudo: pam_unix(sudo:session): session closed for user root"]
    if r < 0.75:
        src = f"{rnd.randint(1, 223)}.{rnd.randint(0, 255)}.{rnd.randint(0, 255)}.{rnd.randint(1, 254)}"
        return [f"kernel: [{rnd.uniform(1e5, 1e6):.6f}] [UFW BLOCK] IN=eth0 OUT= MAC=52:54:00:12:34:56:52:54:"
                f"00:65:43:21:08:00 SRC={src} DST=192.0.2.10 LEN=44 TOS=0x00 PREC=0x00 TTL={rnd.randint(30, 250)} "
                f"ID={rnd.randint(1, 65535)} PROTO=TCP SPT={rnd.randint(1024, 65535)} "
                f"DPT={rnd.choice((23, 3389, 445, 5900, 8080))} WINDOW=1024 RES=0x00 SYN URGP=0"]
    if r < 0.88:
        unit = rnd.choice(("apt-daily.service - Daily apt download activities",
                           "logrotate.service - Rotate log files",
                           "sysstat-collect.service - system activity accounting tool"))
        return [f"systemd[1]: Starting {unit}...", f"systemd[1]: Finished {unit}."]
    return [f"polkitd[633]: Registered Authentication Agent for unix-process:{pid}:{rnd.randint(1, 99999)} "
            f"(system bus name :1.{pid}, object path /org/freedesktop/PolicyKit1/AuthenticationAgent, locale "
            f"en_US.UTF-8)"]


# -- a long log --------------------------------------------------------------------------------------------

@dataclass(slots=True)
class LogStats:
    lines: int = 0
    sshd: int = 0
    noise: int = 0
    attempts: int = 0
    failures: int = 0  # failure lines (what fail2ban and nftblockd count)
    scanners: int = 0
    logins: int = 0
    ipv6_attempts: int = 0

    def summary(self) -> str:
        return (f"{self.lines:,} lines, {100 * self.noise / max(1, self.lines):.0f} % other daemons', "
                f"{self.attempts:,} brute-force connections ({self.ipv6_attempts:,} IPv6) with "
                f"{self.failures:,} failures, {self.scanners:,} scanners, {self.logins:,} logins")


def server_log(n: int, *, attack: float = 0.55, seed: int = 1, start: float = 1796205190.0 - 3 * 86400,
               ipv6_share: float = 0.10, stats: LogStats | None = None) -> Iterator[str]:
    """`n` lines of a server's auth.log, starting at `start` (UTC). `attack`: share of events that are
    brute-force connections (the rest: 10 % scanners, 7 % logins, other daemons)."""
    rnd = random.Random(seed)
    st = stats if stats is not None else LogStats()
    pool = [ipv4(rnd) for _ in range(40000)]
    pool6 = [ipv6(rnd) for _ in range(4000)]
    heavy = pool[:50]
    t = start
    pid = 20000
    session = 1000
    made = 0
    pending: list[tuple[float, str]] = []  # logout lines of open sessions: (when, text)
    while made < n:
        t += rnd.expovariate(3.0)  # about three events a second
        ts = syslog_stamp(t)
        pid += rnd.randint(1, 7)
        block: list[str] = []
        sshd = f"{ts} {HOST} sshd[{pid}]: "
        while pending and pending[0][0] <= t:
            block.append(f"{ts} {HOST} {pending.pop(0)[1]}")
        r = rnd.random()
        if r < attack:
            six = rnd.random() < ipv6_share
            ip = rnd.choice(pool6) if six else (rnd.choice(heavy) if rnd.random() < 0.3 else rnd.choice(pool))
            lines, failures = attempt(rnd, ip, rnd.choice((1, 1, 1, 2, 3)))
            block += [sshd + x for x in lines]
            st.attempts += 1
            st.ipv6_attempts += six
            st.failures += failures
        elif r < attack + 0.10:
            lines = scanner(rnd, rnd.choice(pool))
            block += [sshd + x for x in lines]
            st.scanners += 1
        elif r < attack + 0.17:
            session += 1
            lines, at_login, at_logout = login(rnd, session)
            block += [sshd + x for x in lines[:-3]] + [f"{ts} {HOST} {x}" for x in at_login]
            # the session ends minutes later: its disconnect and logind lines come then
            end = t + rnd.uniform(30, 900)
            rest = [f"sshd[{pid}]: {x}" for x in lines[-3:]] + at_logout
            pending.extend((end, x) for x in rest)
            pending.sort(key=lambda p: p[0])
            st.logins += 1
            st.failures += sum(1 for x in lines if x.startswith("Failed"))
        else:
            lines = noise(rnd, pid)
            block += [f"{ts} {HOST} {x}" for x in lines]
        for line in block:
            if made >= n:
                break
            made += 1
            if " sshd[" in line:
                st.sshd += 1
            else:
                st.noise += 1
            yield line
    st.lines = made


# -- a burst -----------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Burst:
    text: str  # the lines, newline-terminated
    lines: int
    banned: tuple[str, ...]  # addresses that reach maxretry
    near_misses: tuple[str, ...]  # addresses one failure short of it
    ipv6: int  # how many of `banned` are IPv6



# complexity exempt (C901): a benchmark's log generator: one branch per line an attack writes
def burst(attackers: int = 10000, near_misses: int = 1000, *, maxretry: int = 3, noise_share: float = 0.20,  # noqa: C901
          ipv6_share: float = 0.10, seed: int = 1, stamp: str | None = None, concurrency: int = 64) -> Burst:
    """A botnet's burst: `attackers` addresses with `maxretry` failures each and `near_misses` with one
    fewer, their connections interleaved (`concurrency` sshd processes writing at once), other daemons'
    lines making up `noise_share` of the lines, scanners and logins mixed in. All lines carry `stamp`
    (default: now, local time, as rsyslog writes it)."""
    rnd = random.Random(seed)
    ts = stamp if stamp is not None else time.strftime("%b %e %H:%M:%S")
    seen: set[str] = set()

    def fresh(six: bool) -> str:
        while True:
            a = ipv6(rnd) if six else ipv4(rnd)
            if a not in seen:
                seen.add(a)
                return a

    banned = [fresh(rnd.random() < ipv6_share) for _ in range(attackers)]
    near = [fresh(rnd.random() < ipv6_share) for _ in range(near_misses)]
    conns: list[list[str]] = []
    for ip in banned:
        conns += attempts_for(rnd, ip, maxretry)
    for ip in near:
        conns += attempts_for(rnd, ip, maxretry - 1)
    session = 5000
    for _ in range(max(1, attackers // 50)):
        conns.append(scanner(rnd, fresh(False)))
        if rnd.random() < 0.3:
            session += 1
            lines, _login, _logout = login(rnd, session)
            conns.append(lines)
    rnd.shuffle(conns)
    # concurrent connections: a pool of sshd processes, each writing its connection's lines in order
    pid = 30000
    active: list[tuple[int, list[str]]] = []
    sshd_lines: list[str] = []
    queue = iter(conns)
    exhausted = False
    while active or not exhausted:
        while not exhausted and len(active) < concurrency:
            c = next(queue, None)
            if c is None:
                exhausted = True
                break
            pid += rnd.randint(1, 5)
            active.append((pid, list(reversed(c))))
        if not active:
            break
        k = rnd.randrange(len(active))
        p, rest = active[k]
        sshd_lines.append(f"{ts} {HOST} sshd[{p}]: {rest.pop()}")
        if not rest:
            active[k] = active[-1]
            active.pop()
    # other daemons' lines, spread evenly: noise / (sshd + noise) == noise_share
    want = round(len(sshd_lines) * noise_share / (1 - noise_share))
    out: list[str] = []
    noise_lines: list[str] = []
    npid = 60000
    while len(noise_lines) < want:
        npid += rnd.randint(1, 9)
        noise_lines += [f"{ts} {HOST} {x}" for x in noise(rnd, npid)]
    noise_lines = noise_lines[:want]
    j = 0
    for i, line in enumerate(sshd_lines):
        out.append(line)
        while j < len(noise_lines) and j * len(sshd_lines) <= i * len(noise_lines):
            out.append(noise_lines[j])
            j += 1
    out += noise_lines[j:]
    return Burst("\n".join(out) + "\n", len(out), tuple(banned), tuple(near),
                 sum(1 for a in banned if ":" in a))


def main() -> None:
    import argparse
    import sys

    ap = argparse.ArgumentParser(description="write a realistic auth.log to stdout")
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--attack", type=float, default=0.55)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--burst", type=int, metavar="ATTACKERS", help="a burst instead of a long log")
    ap.add_argument("--near-misses", type=int, default=1000)
    args = ap.parse_args()
    if args.burst:
        b = burst(args.burst, args.near_misses, seed=args.seed)
        sys.stdout.write(b.text)
        print(f"{b.lines:,} lines, {len(b.banned):,} attackers ({b.ipv6:,} IPv6), "
              f"{len(b.near_misses):,} near-misses", file=sys.stderr)
        return
    st = LogStats()
    for line in server_log(args.lines, attack=args.attack, seed=args.seed, stats=st):
        sys.stdout.write(line + "\n")
    print(st.summary(), file=sys.stderr)


if __name__ == "__main__":
    main()
