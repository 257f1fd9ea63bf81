"""Actions end to end: the real daemon in a namespace bans from a log full of hostile user names, and runs a
command (writing its argv to a file), a webhook served by this test (which fails once: retried), and
Debian's fail2ban `sendmail-whois-matches` action whose sendmail is a local stub capturing the message
(with `lifecycle: false`: no start or stop mail). Debian's `sendmail-buffered` mails at start, buffers the
bans, and mails what its buffer holds at the daemon's stop, as it did under fail2ban.

Every hostile name would create a file if any action let it reach a shell as code; none may exist after."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.helpers.daemon import DaemonProc, scrape
from tests.helpers.netns import NetNS, http_server, wait_for

F2B_MAIL = Path("/etc/fail2ban/action.d/sendmail-whois-matches.conf")
pytestmark = pytest.mark.skipif(not F2B_MAIL.is_file(), reason="fail2ban's action files are not installed")
METRICS_PORT = 9791
ADDR = "198.51.100.5"

# writes a file and renames it into place: the test never reads one half written
RECORDER = """import json, os, sys
out = sys.argv[1]
n = len(os.listdir(out))
tmp = os.path.join(out, f".{n:03d}.tmp")
with open(tmp, "w") as f:
    json.dump({"argv": sys.argv[2:], "matches_env": os.environ.get("NFTBLOCK_MATCHES"),
               "path": os.environ.get("PATH"), "home": os.environ.get("HOME")}, f)
os.rename(tmp, os.path.join(out, f"{n:03d}.json"))
"""


def hostile_users(d: Path) -> list[str]:
    return [f"$(touch {d}/a)", f"`touch {d}/b`", f"x;touch {d}/c;", f"';touch {d}/d;'", f'";touch {d}/e;"',
            f"%(known/dest)s<ip><name><matches>{d}", f"${{IFS}}|touch {d}/f&", f"\"'`$(touch {d}/g)`'\""]


class Hooks:
    """POSTs received (path, headers, body); the first `fail` answers are 503."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, str], bytes]] = []
        self.fail = 1
        self.lock = threading.Lock()


@pytest.fixture
def hooks(netns: NetNS) -> Iterator[tuple[Hooks, int]]:
    hooks = Hooks()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with hooks.lock:
                status = 503 if hooks.fail > 0 else 200
                hooks.fail -= 1
                hooks.posts.append((self.path, dict(self.headers), body))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with http_server(netns, Handler) as port:  # the daemon's loopback is the namespace's
        yield hooks, port


def config(log: Path, out: Path, port: int, stub: Path) -> str:
    recorder = out.parent / "recorder.py"
    return f"""
reconcile: {{interval: 1h}}
metrics: {{listen: '127.0.0.1:{METRICS_PORT}'}}
actions:
  record:
    type: command
    on: [ban, unban]
    argv: [{sys.executable}, {recorder}, {out}, "{{event}}", "{{address}}", "{{jail}}", "{{duration}}",
           "{{failures}}", "{{reason}}", "{{matches}}"]
  hook:
    type: webhook
    url: http://127.0.0.1:{port}/nftblock
    headers: {{X-Token: secret}}
    retry_delay: 100ms
    timeout: 5s
  mail:
    type: fail2ban
    file: {F2B_MAIL}
    options: {{dest: ops@example.org, sender: nftblock@example.org, mailcmd: "{stub} -f <sender> <dest>",
               _whois_command: "echo whois-disabled-in-tests"}}
    lifecycle: false
jails:
  sshd:
    files: ["{log}"]
    filter: sshd
    maxretry: 8
    findtime: 10m
    bantime: 1h
    actions: [record, hook, mail]
"""


def sendmail_stub(tmp_path: Path) -> tuple[Path, Path]:
    """A sendmail that writes each message (after its argv) into mails/, renamed into place once whole."""
    mails = tmp_path / "mails"
    mails.mkdir()
    stub = tmp_path / "sendmail"
    tmp = f"{mails}/.tmp-$$"
    stub.write_text(f'#!/bin/sh\n{{ echo "ARGS: $*"; cat; }} > {tmp} && mv {tmp} {mails}/mail-$$.txt\n')
    stub.chmod(0o755)
    return stub, mails


def test_command_webhook_and_fail2ban_mail_run_on_ban_and_log_text_never_runs(
        netns: NetNS, tmp_path: Path, hooks: tuple[Hooks, int]) -> None:
    srv, port = hooks
    pwn = tmp_path / "pwn"
    pwn.mkdir()
    out = tmp_path / "record"
    out.mkdir()
    (tmp_path / "recorder.py").write_text(RECORDER)
    stub, mails = sendmail_stub(tmp_path)
    log = tmp_path / "auth.log"
    log.write_text("")
    d = DaemonProc(netns, tmp_path / "d", config(log, out, port, stub)).start()
    try:
        stamp = time.strftime("%b %e %H:%M:%S")
        lines = [f"{stamp} host sshd[{1000 + i}]: Failed password for invalid user {u} from {ADDR} port "
                 f"{40000 + i} ssh2" for i, u in enumerate(hostile_users(pwn))]
        with log.open("a") as f:
            f.write("".join(line + "\n" for line in lines))
        wait_for(lambda: ADDR in netns.set_elements("nftblock", "default_ip4"), what="the ban")

        # the command: each value one argument, the matches as logged
        (rec,) = wait_for(lambda: [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))],
                          what="the command")
        event, address, jail, duration, failures, reason, matches = rec["argv"]
        assert (event, address, jail, failures) == ("ban", ADDR, "sshd", "8")
        assert 3590 <= int(duration) <= 3600 and reason.startswith("8 failures in 10m")
        assert matches.split("\n") == lines and rec["matches_env"] == matches
        assert rec["home"] is None and rec["path"].startswith("/usr/local/sbin")

        # the webhook: 503 once, then retried; the JSON body carries the same event
        wait_for(lambda: len(srv.posts) == 2, what="the webhook and its retry")
        (p1, h1, b1), (p2, _h2, b2) = srv.posts
        assert p1 == p2 == "/nftblock" and b1 == b2 and h1["X-Token"] == "secret"
        body = json.loads(b2)
        assert (body["event"], body["address"], body["jail"], body["failures"]) == ("ban", ADDR, "sshd", 8)
        assert body["matches"] == lines and body["fields"]["user"] == hostile_users(pwn)[-1]

        # the fail2ban mail action, through its own shell script, to the sendmail stub
        mail = wait_for(lambda: [p.read_text() for p in mails.glob("mail-*.txt")], what="the mail")[0]
        assert mail.startswith("ARGS: -f nftblock@example.org ops@example.org\n")
        assert f"Subject: [Fail2Ban] sshd: banned {ADDR} from " in mail
        assert "whois-disabled-in-tests" in mail and "after\n8 attempts against sshd" in mail
        for line in lines:
            assert line in mail

        # unban: the command runs again (on: [ban, unban]); the others are for bans only
        r = d.cli("unban", ADDR)
        assert r.returncode == 0, r.stderr
        wait_for(lambda: len(list(out.glob("*.json"))) == 2, what="the unban command")
        unban = json.loads(sorted(out.glob("*.json"))[1].read_text())["argv"]
        assert unban[:3] == ["unban", ADDR, "sshd"]

        # the unban's file is in place a moment before its process has exited and been counted
        samples = ('nftblock_action_runs_total{action="hook",result="ok"} 1.0',
                   'nftblock_action_retries_total{action="hook"} 1.0',
                   'nftblock_action_runs_total{action="record",result="ok"} 2.0',
                   'nftblock_action_runs_total{action="mail",result="ok"} 1.0',
                   'nftblock_action_runs_total{action="mail",result="failed"} 0.0')
        wait_for(lambda: all(x in scrape(netns, METRICS_PORT) for x in samples), what=f"metrics {samples}")
        status = {a["name"]: a for a in d.cli_json("status")["actions"]}
        assert (status["hook"]["runs"], status["hook"]["retries"], status["hook"]["failures"]) == (1, 1, 0)
        assert "503" in status["hook"]["last_error"] and status["record"]["queued"] == 0
        assert len(srv.posts) == 2 and len(list(mails.glob("mail-*.txt"))) == 1
    finally:
        d.close()
    assert list(pwn.iterdir()) == []  # no hostile name ran in any action
    assert "Traceback" not in d.log()
    assert len(list(mails.glob("mail-*.txt"))) == 1  # lifecycle: false: no stop mail either


# Debian's actionban with the offender's user name in the buffered line (log text: it reaches the buffer, and
# the actionstop's `cat <tmpfile>`, as data)
BUFFERED_LOCAL = """[Definition]
actionban = printf %%b "`date`: <ip> (<failures> failures) user <F-USER>\\n" >> <tmpfile>
            LINE=$( wc -l <tmpfile> | awk '{ print $1 }' )
            if [ $LINE -ge <lines> ]; then
                printf %%b "Subject: [Fail2Ban] <name>: summary from <fq-hostname>
                From: <sendername> <<sender>>
                To: <dest>\\n
                `cat <tmpfile>`
                Fail2Ban" | <mailcmd>
                rm <tmpfile>
            fi
"""


def test_a_buffered_mail_action_mails_its_remainder_at_the_daemons_stop(netns: NetNS, tmp_path: Path) -> None:
    pwn = tmp_path / "pwn"
    pwn.mkdir()
    action_d = tmp_path / "action.d"
    action_d.mkdir()
    for name in ("sendmail-buffered.conf", "sendmail-common.conf"):
        shutil.copy(F2B_MAIL.parent / name, action_d / name)
    (action_d / "sendmail-buffered.local").write_text(BUFFERED_LOCAL)
    stub, mails = sendmail_stub(tmp_path)
    buffer = tmp_path / "buffer.txt"
    log = tmp_path / "auth.log"
    log.write_text("")
    d = DaemonProc(netns, tmp_path / "d", f"""
reconcile: {{interval: 1h}}
actions:
  mail:
    type: fail2ban
    file: {action_d}/sendmail-buffered.conf
    options: {{dest: ops@example.org, sender: nftblock@example.org, mailcmd: "{stub} -f <sender> <dest>",
               tmpfile: "{buffer}", lines: "5"}}
jails:
  sshd: {{files: ["{log}"], filter: sshd, maxretry: 1, findtime: 10m, bantime: 1h, actions: [mail]}}
""").start()

    def subjects() -> dict[str, str]:
        texts = [p.read_text() for p in mails.glob("mail-*.txt")]
        return {t.split("Subject: ", 1)[1].split("\n", 1)[0]: t for t in texts if "Subject: " in t}

    def subjects_only() -> list[str]:  # Debian's file writes "stopped  on", two spaces
        return sorted(" ".join(s.split()) for s in subjects())

    users = hostile_users(pwn)[:3]
    addrs = [f"198.51.100.{20 + i}" for i in range(len(users))]
    try:
        started = wait_for(lambda: [s for s in subjects() if s.startswith("[Fail2Ban] sshd: started on ")],
                           what="the start mail")
        host = started[0].rsplit(" ", 1)[1]
        stamp = time.strftime("%b %e %H:%M:%S")
        with log.open("a") as f:
            f.write("".join(f"{stamp} host sshd[{1000 + i}]: Failed password for invalid user {u} from {a} port "
                            f"{40000 + i} ssh2\n" for i, (u, a) in enumerate(zip(users, addrs, strict=True))))
        wait_for(lambda: buffer.is_file() and len(buffer.read_text().splitlines()) == len(addrs),
                 what="the buffered bans")
        assert len(subjects()) == 1  # fewer bans than `lines`: nothing mailed yet
        assert d.stop() == 0
        assert subjects_only() == [f"[Fail2Ban] sshd: started on {host}", f"[Fail2Ban] sshd: stopped on {host}",
                                   f"[Fail2Ban] sshd: summary from {host}"]
        (text,) = [t for s, t in subjects().items() if s.startswith("[Fail2Ban] sshd: summary from ")]
        for u, a in zip(users, addrs, strict=True):  # each ban's line, its user name as logged
            assert f": {a} (1 failures) user {u}\n" in text
        assert not buffer.exists()  # the actionstop emptied the buffer, as under fail2ban

        # a restart: the saved bans come back without an actionban (fail2ban's norestored), so the next stop
        # has nothing to mail but its "stopped"
        for m in mails.glob("mail-*.txt"):
            m.unlink()
        d.start()
        assert {b["target"] for b in d.cli_json("list")["bans"]} == set(addrs)
        assert d.stop() == 0
        assert subjects_only() == [f"[Fail2Ban] sshd: started on {host}", f"[Fail2Ban] sshd: stopped on {host}"]
        assert not buffer.exists()
    finally:
        d.close()
    assert list(pwn.iterdir()) == []
    assert "Traceback" not in d.log() and "action failed" not in d.log()
