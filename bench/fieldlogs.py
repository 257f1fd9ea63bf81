"""Log shapes for the matcher's "as shipped" rows (issue #38), written apart from bench/authlog.py and never
tuned against: the matcher's speed work was measured on authlog's shapes, so these are the check that it
holds on logs it was not shaped on. Deterministic for a seed; writes nothing itself.

What differs from authlog on purpose (each from real servers' logs):
- timestamps: Debian 12's rsyslog writes RFC 3339 stamps with microseconds and an offset
  (`2026-12-04T09:53:10.123456+00:00 host ...`), not the traditional `Dec  4 09:53:10`: `mixed` and
  `quiet` use them, `brute` the traditional form of an older rsyslog config;
- sshd as several OpenSSH versions write it: OpenSSH 7.4 (CentOS 7) and 8.x `error: PAM:` lines, 9.x
  `Disconnecting authenticating user`, `maximum authentication attempts exceeded`, the `Unable to negotiate`,
  `banner exchange`, `Bad protocol version identification`, `Did not receive identification string` and
  `ssh_dispatch_run_fatal` preauth noise, `drop connection #N ... past MaxStartups`, OpenSSH 9.8's
  `srclimit_penalise` lines and `sshd-session[PID]` processes (about a fifth of the mixed log's sshd lines);
- addresses: IPv6 in full, compressed and IPv4-mapped (`::ffff:a.b.c.d`) forms, about 15 % of attackers;
- other daemons: postfix (smtpd, submission, anvil), dovecot, named, chronyd, dhclient, the kernel's
  nftables log lines, CRON, sudo, systemd: a mail and web server's auth.log + syslog in one file.

Shapes (`shape(name, n, seed)` -> lines):
- `mixed`: a mail/web server's combined log, ~30 % sshd lines, of which about half from attacks;
- `brute`: 300 attackers guessing about 200 passwords each, interleaved, with a little other noise;
- `quiet`: the mixed server on a quiet day: ~2 % sshd lines;
- `journal`: `mixed`'s lines as a journal jail sees them (`host ident[pid]: message`, no date).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

START = 1796205190.0 - 3 * 86400
HOST = "mx2"
USERS = ("root", "admin", "user1", "test", "oracle", "postgres", "ubnt", "support", "guest", "git", "kafka",
         "es", "centos", "ec2-user", "vagrant", "docker", "nginx", "apache", "zabbix", "redis", "sysadmin",
         "Administrator", "a", "0", "", "user name", "ftp_user")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def iso_stamp(t: float) -> str:
    tm = time.gmtime(t)
    return time.strftime("%Y-%m-%dT%H:%M:%S", tm) + f".{int((t % 1) * 1e6):06d}+00:00"


def bsd_stamp(t: float) -> str:
    tm = time.gmtime(t)
    return f"{MONTHS[tm.tm_mon - 1]} {tm.tm_mday:2d} {tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}"


def address(rnd: random.Random) -> str:
    r = rnd.random()
    if r < 0.85:
        return f"{rnd.randint(1, 223)}.{rnd.randint(0, 255)}.{rnd.randint(0, 255)}.{rnd.randint(1, 254)}"
    if r < 0.90:
        return f"::ffff:{rnd.randint(1, 223)}.{rnd.randint(0, 255)}.{rnd.randint(0, 255)}.{rnd.randint(1, 254)}"
    if r < 0.95:
        return ":".join(f"{rnd.randint(0, 0xffff):x}" for _ in range(8))
    return f"2a0{rnd.randint(1, 9)}:{rnd.randint(0, 0xffff):x}:{rnd.randint(0, 0xffff):x}::{rnd.randint(1, 0xfff):x}"


def connection(rnd: random.Random, ip: str, tries: int) -> list[str]:
    """One attacking connection's sshd messages, in one of the versions' wordings."""
    port = rnd.randint(1024, 65535)
    user = rnd.choice(USERS)
    invalid = user != "root" and rnd.random() < 0.8
    who = f"invalid user {user}" if invalid else f"authenticating user {user}"
    out: list[str] = []
    if invalid:
        out.append(f"Invalid user {user} from {ip} port {port}")
    style = rnd.random()
    for _ in range(tries):
        if style < 0.15:  # OpenSSH 7.4 with PAM (CentOS 7)
            out.append(f"error: PAM: Authentication failure for {'illegal user ' if invalid else ''}{user} from {ip}")
            out.append(f"Failed keyboard-interactive/pam for {'invalid user ' if invalid else ''}{user} from {ip} "
                       f"port {port} ssh2")
        elif style < 0.25:
            out.append(f"Failed none for {'invalid user ' if invalid else ''}{user} from {ip} port {port} ssh2")
        else:
            out.append(f"Failed password for {'invalid user ' if invalid else ''}{user} from {ip} port {port} ssh2")
    end = rnd.random()
    if tries >= 6 or end < 0.1:
        out.append(f"error: maximum authentication attempts exceeded for {who} from {ip} port {port} ssh2 [preauth]")
        out.append(f"Disconnecting {who} {ip} port {port}: Too many authentication failures [preauth]")
    elif end < 0.5:
        out.append(f"Connection closed by {who} {ip} port {port} [preauth]")
    else:
        out.append(f"Received disconnect from {ip} port {port}:11: Normal Shutdown, Thank you for playing [preauth]")
        out.append(f"Disconnected from {who} {ip} port {port} [preauth]")
    if rnd.random() < 0.2:
        out.append(f"srclimit_penalise: ipv4: new {ip.rsplit('.', 1)[0]}.0/24 deferred penalty of 10 seconds for "
                   f"penalty: failed authentication")
    return out


def preauth_noise(rnd: random.Random, ip: str) -> str:
    port = rnd.randint(1024, 65535)
    return rnd.choice((
        f"Unable to negotiate with {ip} port {port}: no matching host key type found. Their offer: ssh-rsa,ssh-dss "
        f"[preauth]",
        f"banner exchange: Connection from {ip} port {port}: invalid format",
        f"Bad protocol version identification '\\003' from {ip} port {port}",
        f"Did not receive identification string from {ip} port {port}",
        f"ssh_dispatch_run_fatal: Connection from {ip} port {port}: Connection corrupted [preauth]",
        f"drop connection #{rnd.randint(10, 99)} from [{ip}]:{port} on [192.0.2.25]:22 past MaxStartups",
        f"Connection reset by {ip} port {port} [preauth]",
        "error: kex_exchange_identification: read: Connection reset by peer",
        f"Timeout before authentication for {ip} port {port}",
        f"Protocol major versions differ for {ip} port {port}: SSH-2.0-OpenSSH_9.2p1 vs. SSH-1.5-NmapNSE_1.0",
    ))


def login(rnd: random.Random, t: int) -> list[str]:
    ip = f"198.51.100.{rnd.randint(2, 250)}"
    port = rnd.randint(1024, 65535)
    user = rnd.choice(("ops", "mail", "deploy"))
    return [f"Accepted publickey for {user} from {ip} port {port} ssh2: RSA SHA256:k3Xq{t % 9973:04d}Wm+8pLx3Yc0",
            f"pam_unix(sshd:session): session opened for user {user}(uid=1000) by (uid=0)",
            f"Received disconnect from {ip} port {port}:11: disconnected by user",
            f"Disconnected from user {user} {ip} port {port}",
            f"pam_unix(sshd:session): session closed for user {user}"]


def other(rnd: random.Random, pid: int) -> str:
    """One line of another daemon, with its program header."""
    ip = f"{rnd.randint(1, 223)}.{rnd.randint(0, 255)}.{rnd.randint(0, 255)}.{rnd.randint(1, 254)}"
    qid = f"{rnd.getrandbits(40):010X}"
    return rnd.choice((
        f"postfix/smtpd[{pid}]: connect from unknown[{ip}]",
        f"postfix/smtpd[{pid}]: lost connection after AUTH from unknown[{ip}]",
        f"postfix/smtpd[{pid}]: warning: unknown[{ip}]: SASL LOGIN authentication failed: "
        f"UGFzc3dvcmQ6",
        f"postfix/smtpd[{pid}]: disconnect from unknown[{ip}] ehlo=1 auth=0/1 quit=1 commands=2/3",
        f"postfix/submission/smtpd[{pid}]: {qid}: client=mail.example.net[{ip}], sasl_method=PLAIN",
        f"postfix/qmgr[1123]: {qid}: from=<bounce@example.org>, size={rnd.randint(900, 90000)}, nrcpt=1 (queue active)",
        f"postfix/anvil[1150]: statistics: max connection rate 3/60s for (smtp:{ip}) at Dec  4 09:00:01",
        f"dovecot: imap-login: Disconnected (auth failed, 1 attempts in 2 secs): user=<info>, method=PLAIN, "
        f"rip={ip}, lip=192.0.2.25, TLS, session=<{qid}>",
        f"dovecot: imap({rnd.choice(('anna', 'bob'))})<{pid}><{qid}>: Logged out in=72 out=1043",
        f"named[801]: client @0x7f3a2c0{pid % 1000:03d} {ip}#53211 (example.com): query (cache) 'example.com/ANY/IN'"
        f" denied",
        "chronyd[655]: Selected source 192.0.2.123 (2.debian.pool.ntp.org)",
        "dhclient[702]: DHCPREQUEST for 192.0.2.25 on eth0 to 192.0.2.1 port 67",
        f"kernel: [{rnd.uniform(1e5, 9e5):.6f}] nft drop IN=eth0 OUT= SRC={ip} DST=192.0.2.25 LEN=40 TTL=241 "
        f"PROTO=TCP SPT={rnd.randint(1024, 65535)} DPT={rnd.choice((23, 445, 3389, 8291))} SYN",
        f"CRON[{pid}]: (root) CMD (command -v debian-sa1 > /dev/null && debian-sa1 1 1)",
        f"CRON[{pid}]: pam_unix(cron:session): session opened for user root(uid=0) by (uid=0)",
        "sudo:      ops : TTY=pts/1 ; PWD=/srv ; USER=root ; COMMAND=/usr/sbin/postqueue -p",
        "systemd[1]: Starting certbot.service - Certbot...",
        "systemd[1]: certbot.service: Deactivated successfully.",
        f"systemd-logind[488]: Session {pid % 5000} logged out. Waiting for processes to exit.",
    ))


def _server(n: int, seed: int, sshd_share: float, stamp: Callable[[float], str]) -> Iterator[str]:
    rnd = random.Random(seed)
    t, pid, out = START, 4000, 0
    attackers = [address(rnd) for _ in range(5000)]
    pending: list[str] = []
    while out < n:
        t += rnd.expovariate(5.0)
        if not pending:
            pid += rnd.randint(1, 9)
            daemon = "sshd-session" if rnd.random() < 0.2 else "sshd"
            r = rnd.random()
            if r < sshd_share * 0.45:
                msgs = connection(rnd, rnd.choice(attackers), rnd.randint(1, 4))
            elif r < sshd_share * 0.75:
                msgs = [preauth_noise(rnd, rnd.choice(attackers))]
            elif r < sshd_share:
                msgs = login(rnd, pid)
            else:
                pending = [other(rnd, pid)]
                msgs = []
            pending += [f"{daemon}[{pid}]: {m}" for m in msgs]
        yield f"{stamp(t)} {HOST} {pending.pop(0)}"
        out += 1


def mixed(n: int, seed: int = 7) -> Iterator[str]:
    """A mail and web server's auth.log + syslog, RFC 3339 stamps (Debian 12's rsyslog)."""
    # the sshd share is of events; a connection writes ~4 lines, so about 30 % of lines are sshd's
    return _server(n, seed, 0.12, iso_stamp)


def quiet(n: int, seed: int = 8) -> Iterator[str]:
    """The same server on a quiet day: about 2 % of lines from sshd."""
    return _server(n, seed, 0.007, iso_stamp)


def brute(n: int, seed: int = 9) -> Iterator[str]:
    """300 attackers at about 200 guesses each, their connections interleaved, traditional stamps."""
    rnd = random.Random(seed)
    attackers = [address(rnd) for _ in range(300)]
    left = {a: rnd.randint(150, 250) for a in attackers}
    live: list[list[str]] = []
    t, pid, out = START, 30000, 0
    while out < n:
        t += rnd.expovariate(40.0)
        if len(live) < 12 and left:
            ip = rnd.choice(list(left))
            tries = min(left[ip], rnd.randint(1, 6))
            left[ip] -= tries
            if left[ip] <= 0:
                del left[ip]
            pid += rnd.randint(1, 5)
            live.append([f"sshd[{pid}]: {m}" for m in connection(rnd, ip, tries)])
        if rnd.random() < 0.06 or not live:
            line = other(rnd, pid)
        else:
            conn = rnd.choice(live)
            line = conn.pop(0)
            if not conn:
                live.remove(conn)
        yield f"{bsd_stamp(t)} {HOST} {line}"
        out += 1
        if not left and not live:  # every attacker done: a new wave
            left = {a: rnd.randint(150, 250) for a in attackers}


def journal(n: int, seed: int = 7) -> Iterator[str]:
    """`mixed`'s lines as a journal source hands them over: no date."""
    for line in mixed(n, seed):
        yield line.split(" ", 1)[1]


SHAPES: dict[str, Callable[[int], Iterator[str]]] = {"mixed": mixed, "brute": brute, "quiet": quiet,
                                                     "journal": journal}
