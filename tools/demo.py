"""`make demo`: the daemon on the example config, in a private network namespace, showing real kernel bans.

Steps: make a namespace; start nftblockd there on config/nftblockd.yaml (socket and state moved into a
temporary directory, the sshd jail reading a file there instead of the journal); ban a few addresses through
the CLI; replay a sample auth.log with attackers into that file; print the kernel's view of the sets (with
remaining timeouts), the daemon's status, its ban list and a metrics scrape; stop it and remove the
namespace. Touches nothing outside the namespace.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
NS = f"nftblockd-demo-{os.getpid()}"


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def run(*cmd: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, text=True, capture_output=True, input=input)


def show(*cmd: str, input: str | None = None) -> None:
    print("$ " + " ".join(cmd), flush=True)
    r = run(*cmd, check=False, input=input)
    sys.stdout.write(r.stdout)
    if r.stderr:
        sys.stdout.write(r.stderr)
    sys.stdout.flush()


def sample_log(now: float) -> str:
    """Three sshd failures from each of a few attackers (one IPv6), plus noise and one allowlisted host."""
    stamp = time.strftime("%b %e %H:%M:%S", time.localtime(now))
    lines = []
    attackers = ["198.51.100.23", "198.51.100.24", "2001:db8:bad::66"]
    pid = 4100
    for i in range(3):
        for a in attackers:
            pid += 1  # one connection per attempt, as sshd logs it
            lines.append(f"{stamp} demo sshd[{pid}]: Failed password for invalid user admin from {a} "
                         f"port {40000 + i} ssh2")
        lines.append(f"{stamp} demo sshd[4200]: Accepted publickey for ops from 192.0.2.10 port 50000 ssh2")
        lines.append(f"{stamp} demo sshd-session[4300]: Failed password for root from 127.0.0.1 port 2222 ssh2")
    return "\n".join(lines) + "\n"


SHOWN_METRICS = ("nftblock_set_elements{", "nftblock_bans_total{", "nftblock_ban_latency_seconds_count{",
                 "nftblock_netlink_batch_elements_bucket{", "nftblock_netlink_batch_elements_count",
                 "nftblock_netlink_batch_elements_sum", "nftblock_tracker_addresses{")


def show_metrics(listen: str) -> None:
    """GET /metrics inside the namespace (the endpoint listens on its loopback), filtered to a few families."""
    url = f"http://{listen}/metrics"
    print(f"$ curl -s {url} | grep -E '^nftblock_(set_elements|bans_total|ban_latency_seconds_count|"
          "netlink_batch_elements|tracker_addresses)'", flush=True)
    fetch = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode())"
    r = run("ip", "netns", "exec", NS, sys.executable, "-c", fetch, check=False)
    lines = [line for line in r.stdout.splitlines() if line.startswith(SHOWN_METRICS)]
    sys.stdout.write("\n".join(lines) + "\n" if lines else r.stderr)
    sys.stdout.flush()


def main() -> int:
    if os.geteuid() != 0:
        print("make demo needs root (it creates a network namespace)", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="nftblockd-demo-"))
    cfg = yaml.safe_load((REPO / "config" / "nftblockd.yaml").read_text())
    auth_log = work / "auth.log"
    auth_log.write_text("")
    cfg["control"]["socket"] = str(work / "control.sock")
    cfg["state_dir"] = str(work / "state")
    cfg["metrics"] = {"listen": "127.0.0.1:9789"}
    for jail in (cfg.get("jails") or {}).values():
        # The example config reads the journal (ssh.service); the demo replays its sample into a file instead,
        # so that it needs no journald and touches no journal of this machine.
        jail.pop("journal", None)
        jail["files"] = [str(auth_log)]
    cfg_path = work / "nftblockd.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    notify_path = str(work / "notify.sock")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    env = dict(os.environ, NOTIFY_SOCKET=notify_path)
    cli = [sys.executable, "-m", "nftblockd.cli.main", "--socket", cfg["control"]["socket"]]
    daemon: subprocess.Popen[bytes] | None = None
    log_file = open(work / "daemon.log", "wb")  # noqa: SIM115 (the daemon writes to it until the finally)
    try:
        say(f"network namespace {NS} (nothing here touches this machine's own ruleset)")
        run("ip", "netns", "add", NS)
        run("ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up")
        say("starting nftblockd on the example config")
        daemon = subprocess.Popen(["ip", "netns", "exec", NS, sys.executable, "-m", "nftblockd.daemon.main",
                                   "--config", str(cfg_path)], stdout=log_file, stderr=subprocess.STDOUT, env=env)
        notify.settimeout(30)
        t0 = time.monotonic()
        while True:
            msg = notify.recv(4096).decode()
            if "READY=1" in msg.split("\n"):
                break
        print(f"READY=1 after {time.monotonic() - t0:.2f}s: {msg.replace(chr(10), ' ')}")
        say("the ruleset nftblockd created (its own table only)")
        show("ip", "netns", "exec", NS, "nft", "list", "chain", "inet", "nftblock", "prerouting")
        say("bans through the CLI")
        show(*cli, "ban", "203.0.113.7", "--timeout", "10m", "--comment", "demo: manual ban")
        show(*cli, "ban", "198.18.0.0/15", "2001:db8:dead::/48", "--timeout", "1h")
        show(*cli, "ban", "127.0.0.1")
        show(*cli, "ban", "--timeout", "30m", "-", input="203.0.113.8\n203.0.113.9\n::ffff:203.0.113.10\n")
        say("replaying a sample auth.log into the tailed file (3 failures each from 3 attackers)")
        with auth_log.open("a") as f:
            f.write(sample_log(time.time()))
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            listing = run(*cli, "list", check=False).stdout
            if "198.51.100.24" in listing and "2001:db8:bad::/64" in listing:
                break
            time.sleep(0.1)
        say("the kernel's view: sets with remaining timeouts")
        for s in ("default_ip4", "default_ip6", "default_net4", "default_net6"):
            show("ip", "netns", "exec", NS, "nft", "list", "set", "inet", "nftblock", s)
        say("nftblock list")
        show(*cli, "list")
        say("nftblock check 198.51.100.23")
        show(*cli, "check", "198.51.100.23")
        say("nftblock status")
        show(*cli, "status")
        say("a metrics scrape: kernel set sizes (read at the scrape), bans, per-ban latency, batch sizes")
        show_metrics(cfg["metrics"]["listen"])
        say("a firewall reload does not unprotect the host")
        show("ip", "netns", "exec", NS, "nft", "flush", "ruleset")
        show("ip", "netns", "exec", NS, "nft", "list", "set", "inet", "nftblock", "default_ip4")
        say("stopping nftblockd (bans stay in the kernel and expire there)")
        daemon.terminate()
        daemon.wait(30)
        daemon = None
        show("ip", "netns", "exec", NS, "nft", "list", "set", "inet", "nftblock", "default_ip4")
        print("\ndaemon log:\n" + (work / "daemon.log").read_text())
        return 0
    except Exception as exc:
        print(f"demo failed: {exc}\ndaemon log:\n{(work / 'daemon.log').read_text()}", file=sys.stderr)
        return 1
    finally:
        if daemon is not None:
            daemon.kill()
            daemon.wait()
        log_file.close()
        notify.close()
        run("ip", "netns", "del", NS, check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
