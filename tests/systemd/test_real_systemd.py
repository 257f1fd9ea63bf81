"""The installed package under a real systemd, on each Debian release it supports: `make deb`'s .deb,
installed with `apt-get install ./nftblockd_*.deb` into a container of Debian 13 (trixie, the current stable)
and of Debian 12 (bookworm, oldstable) booted with systemd as PID 1, then what an operator does to it.

One container per release (the module fixture is parametrized, trixie first); within it the tests run in
file order and each leaves the service as the next expects (active, bans from sshd and from the CLI). What is
checked is what only a real system shows: Type=notify READY, a quiet journal on a stock start, a real ban from
sshd's journal lines on a stock install (journald only, no rsyslog: failed logins from a network namespace of
the test's own, so the source is not the container's address), the metrics endpoint scraped and parsed, the
watchdog pinged and enforced, ExecReload's verdict, a clean stop, the unit's sandbox (users, capabilities,
IPAddressDeny= through the cgroup BPF filter) around the real daemon, Debian 13's lintian on the .deb (12's
is the build host's, tests/unit), and a purge that leaves nothing behind. The only change to the shipped unit
is a drop-in shortening the watchdog (and the restart delay) so the watchdog tests take seconds. The
container's Python packages are the release's (the package's Depends), not the development venv's: a call
that only newer library versions accept fails here, and so does one that the newer release dropped.

Each release's install time, its start-to-READY time and the unit's journal of the stock start are recorded
(tests/systemd/conftest.py prints them at the end of the run and writes systemd-tier.json in pytest's base
temporary directory).

Waits poll a condition with a bound; the bounds only stop a broken test from hanging. The watchdog test
waits 2.5 watchdog periods by design: surviving them is what it checks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.container import SUITES, Container, copy_into_bind, records, rootfs_all, unavailable

pytestmark = pytest.mark.systemd

UNIT = "nftblockd.service"
CONFIG = "/etc/nftblockd/nftblockd.yaml"
WATCHDOG_S = 3
DROPIN = f"""\
# tests/systemd: a short watchdog so surviving and enforcing it takes seconds; no core files from its SIGABRT.
[Service]
WatchdogSec={WATCHDOG_S}s
RestartSec=100ms
LimitCORE=0
"""
BANNED = "203.0.113.7"
COMMENT = "real systemd test"
FEED_ENTRY = "198.51.100.0/24"
REMOTE = "192.0.2.1"  # an address on the container's lo that is not `localhost` for IPAddressAllow=
FEED_PORT = 8099
# The sshd check's attacker: a network namespace inside the container behind a veth pair, so failed logins
# come from an address that is not the container's own (allowlist_self would spare those).
SSH_SERVER, SSH_ATTACKER = "10.77.0.1", "10.77.0.2"
ATTACKER_NS = "attacker"
METRICS_URL = "http://127.0.0.1:9789/metrics"  # the shipped config's metrics.listen


@pytest.fixture(scope="module")
def rootfs_built() -> None:
    """Every release's rootfs, built side by side (or found in the cache) before the clock of any boot
    starts."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    rootfs_all(SUITES)


@pytest.fixture(scope="module", params=SUITES)
def box(request: pytest.FixtureRequest, rootfs_built: None, built_deb: Path,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    suite: str = request.param
    bind = tmp_path_factory.mktemp(f"systemd-bind-{suite}")
    copy_into_bind(bind, built_deb)
    (bind / "feed").mkdir()
    (bind / "feed" / "list.txt").write_text(f"{FEED_ENTRY}\n")
    c = Container(bind, suite).boot()
    try:
        c.write(f"/etc/systemd/system/{UNIT}.d/test.conf", DROPIN)
        # As an operator installs a downloaded .deb: apt resolves its Depends from the release (all in the
        # rootfs, the container is offline); postinst enables and starts the unit, and deb-systemd-invoke
        # returns once the Type=notify unit is READY. apt's download sandbox user must read the file.
        c.run("install", "-m", "0644", f"/srv/test/{built_deb.name}", f"/tmp/{built_deb.name}")
        t0 = time.monotonic()
        c.run("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q",
              "--no-install-recommends", f"/tmp/{built_deb.name}")
        install_s = time.monotonic() - t0
        p = unit(c, "InactiveExitTimestampMonotonic", "ActiveEnterTimestampMonotonic")
        records(request.config)[suite] = {
            "release": c.run("sh", "-c", ". /etc/os-release && echo $PRETTY_NAME").stdout.strip(),
            "python": c.run("python3", "-V").stdout.strip(),
            "apt_install_seconds": round(install_s, 2),
            # systemd's own clock: leaving `inactive` (ExecStart) to READY=1 (`active`)
            "start_to_ready_seconds": round((int(p["ActiveEnterTimestampMonotonic"])
                                             - int(p["InactiveExitTimestampMonotonic"])) / 1e6, 3),
            "stock_start_journal": c.journal(UNIT, "-o", "short-iso-precise").splitlines(),
        }
        yield c
    finally:
        c.stop()


def unit(c: Container, *props: str) -> dict[str, str]:
    return c.show(UNIT, *props)


def active_pid(c: Container) -> int:
    p = unit(c, "ActiveState", "SubState", "MainPID")
    assert (p["ActiveState"], p["SubState"]) == ("active", "running"), p
    return int(p["MainPID"])


def journal_json(c: Container) -> list[dict[str, Any]]:
    return [json.loads(line) for line in c.journal(UNIT, "-o", "json").splitlines() if line.startswith("{")]


def kernel_elements(c: Container, set_name: str) -> list[str]:
    out = json.loads(c.run("nft", "-j", "list", "set", "inet", "nftblock", set_name).stdout)
    elems: list[str] = []
    for obj in out["nftables"]:
        for e in obj.get("set", {}).get("elem", []):
            v = e["elem"]["val"] if isinstance(e, dict) and "elem" in e else e
            if isinstance(v, dict) and "prefix" in v:
                v = f"{v['prefix']['addr']}/{v['prefix']['len']}"
            elems.append(str(v))
    return elems


def shipped_config(c: Container) -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load(c.run("cat", CONFIG).stdout)
    return cfg


def write_config(c: Container, cfg: dict[str, Any]) -> None:
    c.write(CONFIG, yaml.safe_dump(cfg, sort_keys=False))


def reload(c: Container) -> int:
    return c.run("systemctl", "reload", UNIT, check=False).returncode


# --- start ---------------------------------------------------------------------------------------------


def test_the_package_starts_the_service_and_it_reports_ready(box: Container) -> None:
    # Type=notify: `active` means systemd received READY=1, sent once the table, sets and saved bans are in
    # place; the status line is the daemon's own.
    p = cast(dict[str, str], box.wait_for(
        lambda: (q := unit(box, "ActiveState", "SubState", "StatusText", "NRestarts", "UnitFileState",
                           "User"))["ActiveState"] != "activating" and q, "the first start to finish"))
    assert p["ActiveState"] == "active" and p["SubState"] == "running", box.journal(UNIT)
    assert p["StatusText"].startswith("enforcing"), p
    assert p["NRestarts"] == "0" and p["UnitFileState"] == "enabled" and p["User"] == "nftblockd"
    assert box.run("nft", "list", "table", "inet", "nftblock").returncode == 0


def test_a_clean_start_logs_nothing_at_warning_level(box: Container) -> None:
    # The stock install on stock Debian 12: every warning here is one an operator would see on day one.
    assert box.journal(UNIT, "-p", "warning", "-o", "cat") == ""


def test_the_sandbox_is_what_the_unit_says(box: Container) -> None:
    pid = active_pid(box)
    status = dict(line.split(":\t", 1) for line in box.run("cat", f"/proc/{pid}/status").stdout.splitlines()
                  if ":\t" in line)
    # One capability, CAP_NET_ADMIN (bit 12), effective and nothing else, for a non-root user.
    assert int(status["CapEff"], 16) == 1 << 12 and int(status["CapBnd"], 16) == 1 << 12, status
    uid = box.run("id", "-u", "nftblockd").stdout.strip()
    assert status["Uid"].split()[0] == uid != "0"
    assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2"


def test_the_byte_code_is_the_releases_python_s(box: Container) -> None:
    # The unit cannot write __pycache__ (ProtectSystem=strict): postinst compiles for the release's python3,
    # and the runtime.d hook compiles again when the default python3 changes (Debian 12 -> 13).
    probe = ("import importlib.util, os; print(os.path.isfile(importlib.util.cache_from_source("
             "'/usr/lib/nftblockd/nftblockd/daemon/root.py')))")
    assert box.run("python3", "-c", probe).stdout.strip() == "True"
    box.run("find", "/usr/lib/nftblockd", "-name", "__pycache__", "-prune", "-exec", "rm", "-r", "{}", "+")
    assert box.run("python3", "-c", probe).stdout.strip() == "False"
    box.run("/usr/share/python3/runtime.d/nftblockd.rtupdate", "rtupdate", "python3.11", "python3.13")
    assert box.run("python3", "-c", probe).stdout.strip() == "True"


# --- the CLI -------------------------------------------------------------------------------------------


def test_a_ban_through_the_cli_reaches_the_kernel_and_the_audit_log(box: Container) -> None:
    out = box.run("nftblock", "ban", BANNED, "--timeout", "1h", "--comment", COMMENT).stdout
    assert f"banned {BANNED}" in out
    assert BANNED in kernel_elements(box, "default_ip4")
    audit = [e for e in journal_json(box) if e.get("ADDRESS") == BANNED]
    assert audit and audit[0].get("ORIGIN") == "cli", audit
    check = box.run("nftblock", "check", BANNED).stdout
    assert f"{BANNED} is banned" in check and COMMENT in check


def test_failed_ssh_logins_are_banned_from_the_journal(box: Container) -> None:
    # The shipped sshd jail on a stock install: journald only (no rsyslog, no /var/log/auth.log), matched by
    # _SYSTEMD_UNIT=ssh.service. Debian 12 runs OpenSSH 9.2 (lines from `sshd`), Debian 13 OpenSSH 10
    # (lines from `sshd-session`), both in ssh.service: ssh.socket is disabled on both.
    assert box.run("systemctl", "is-enabled", "ssh.service").stdout.strip() == "enabled"
    assert box.run("test", "-e", "/var/log/auth.log", check=False).returncode != 0  # no syslog daemon
    assert box.run("systemctl", "is-enabled", "ssh.socket", check=False).stdout.strip() == "disabled"
    box.sh(f"""
        ip netns add {ATTACKER_NS}
        ip link add nbt-srv type veth peer name nbt-att netns {ATTACKER_NS}
        ip address add {SSH_SERVER}/24 dev nbt-srv && ip link set nbt-srv up
        ip -n {ATTACKER_NS} address add {SSH_ATTACKER}/24 dev nbt-att
        ip -n {ATTACKER_NS} link set nbt-att up && ip -n {ATTACKER_NS} link set lo up
    """)

    def login(timeout: int = 10) -> str:
        proc = box.run("ip", "netns", "exec", ATTACKER_NS, "ssh", "-o", "BatchMode=yes", "-o",
                       "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o",
                       f"ConnectTimeout={timeout}", f"nosuchuser@{SSH_SERVER}", "true", check=False)
        return proc.stderr

    maxretry = int(shipped_config(box)["jails"]["sshd"]["maxretry"])
    for _ in range(maxretry):
        # sshd answered and refused: one "Invalid user nosuchuser from 10.77.0.2" line each
        assert "Permission denied" in login(), "sshd did not answer from the attacker's namespace"
    box.wait_for(lambda: SSH_ATTACKER in kernel_elements(box, "default_ip4"), "the attacker's ban in the kernel")
    audit = [e for e in journal_json(box) if e.get("ADDRESS") == SSH_ATTACKER]
    assert audit and audit[0].get("JAIL") == "sshd", audit
    # The ban is enforced: the next connection's SYN is dropped, so ssh times out instead of being refused.
    assert "timed out" in login(timeout=2)


def scrape(c: Container) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The metrics endpoint as Prometheus reads it (from inside the container, outside the unit's sandbox):
    sample name and sorted labels to value."""
    text = c.run("python3", "-c", f"import urllib.request; print(urllib.request.urlopen('{METRICS_URL}', "
                 "timeout=10).read().decode())").stdout
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_the_metrics_endpoint_reports_what_the_kernel_holds(box: Container) -> None:
    m = scrape(box)
    kernel = kernel_elements(box, "default_ip4")
    assert {SSH_ATTACKER, BANNED} <= set(kernel)
    sizes = {dict(labels)["set"]: v for (name, labels), v in m.items() if name == "nftblock_set_elements"}
    assert sizes["default_ip4"] == len(kernel), sizes
    assert m[("nftblock_up", ())] == 1
    assert m[("nftblock_bans_total", (("jail", "sshd"), ("origin", "jail")))] == 1, \
        {k: v for k, v in m.items() if k[0] == "nftblock_bans_total"}
    assert m[("nftblock_failures_total", (("jail", "sshd"),))] >= int(
        shipped_config(box)["jails"]["sshd"]["maxretry"])


# --- the watchdog --------------------------------------------------------------------------------------


def test_the_watchdog_is_kept_alive(box: Container) -> None:
    p = unit(box, "WatchdogUSec", "ExecMainStartTimestampMonotonic", "MainPID", "NRestarts")
    assert p["WatchdogUSec"] == f"{WATCHDOG_S}s", "the test drop-in did not apply"
    start, pid = int(p["ExecMainStartTimestampMonotonic"]), p["MainPID"]
    goal = start + int(2.5 * WATCHDOG_S * 1_000_000)
    # WatchdogTimestampMonotonic is the last WATCHDOG=1 systemd accepted: past 2.5 periods after the start,
    # the daemon pinged on time throughout, or it would have been killed.
    box.wait_for(lambda: int(unit(box, "WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"]) >= goal,
                 "a watchdog ping 2.5 periods after the start", bound=2.5 * WATCHDOG_S + 30)
    after = unit(box, "MainPID", "NRestarts", "ActiveState")
    assert after == {"MainPID": pid, "NRestarts": p["NRestarts"], "ActiveState": "active"}


def test_a_frozen_daemon_is_restarted_by_the_watchdog_with_its_bans(box: Container) -> None:
    pid = active_pid(box)
    restarts = int(unit(box, "NRestarts")["NRestarts"])
    box.run("kill", "-STOP", str(pid))

    def restarted() -> bool:
        p = unit(box, "ActiveState", "SubState", "MainPID", "NRestarts")
        return (int(p["NRestarts"]) == restarts + 1 and p["ActiveState"] == "active"
                and p["SubState"] == "running" and p["MainPID"] not in ("0", str(pid)))

    box.wait_for(restarted, "a restart by the watchdog", bound=WATCHDOG_S + 60)
    assert "Watchdog timeout" in box.journal(UNIT, "-o", "cat")
    # The new process knows the ban with its reason: restored from its database, not only left in the kernel.
    check = box.run("nftblock", "check", BANNED).stdout
    assert f"{BANNED} is banned" in check and COMMENT in check
    assert BANNED in kernel_elements(box, "default_ip4")


# --- reload --------------------------------------------------------------------------------------------


def status_text(c: Container) -> str:
    return unit(c, "StatusText")["StatusText"]


def reload_verdicts(c: Container) -> list[str]:
    """The lines ending a reload in the unit's journal (the daemon's, and ExecReload's echo of it), oldest
    first."""
    return [line.split(" from ")[0].split(":")[0] for line in c.journal(UNIT, "-o", "cat").splitlines()
            if line.startswith(("configuration reloaded", "reload refused"))]


def test_reload_applies_a_valid_config(box: Container) -> None:
    # The allowlist moved to the end of the file, so that adding to it moves no other key's line (positions
    # alone are the next test), then a restart to run that file.
    cfg = shipped_config(box)
    allow = cfg.pop("allowlist", [])
    write_config(box, {**cfg, "allowlist": allow})
    box.run("systemctl", "restart", UNIT)
    pid = active_pid(box)
    write_config(box, {**cfg, "allowlist": [*allow, "192.0.2.0/24"]})
    assert reload(box) == 0
    # ExecReload (`nftblock reload`) waits for the daemon's verdict: in effect when systemctl returns.
    assert "192.0.2.0/24" in box.run("nftblock", "check", "192.0.2.5").stdout
    assert active_pid(box) == pid and status_text(box).startswith("configuration reloaded")


def test_reload_after_a_comment_line_is_not_refused(box: Container) -> None:
    good = box.run("cat", CONFIG).stdout
    verdicts = reload_verdicts(box)
    box.write(CONFIG, "# a comment an operator added\n" + good)
    try:
        assert reload(box) == 0
        new = reload_verdicts(box)[len(verdicts):]
        assert "configuration reloaded" in new and "reload refused" not in new, new
    finally:
        box.write(CONFIG, good)


def test_reload_of_a_broken_config_fails_and_keeps_the_daemon(box: Container) -> None:
    pid = active_pid(box)
    good = box.run("cat", CONFIG).stdout
    box.write(CONFIG, good + "\nnot_a_key: [\n")
    try:
        assert reload(box) != 0
        assert active_pid(box) == pid
    finally:
        box.write(CONFIG, good)


def test_a_refused_reload_fails(box: Container) -> None:
    pid = active_pid(box)
    good = box.run("cat", CONFIG).stdout
    cfg = yaml.safe_load(good)
    cfg["table"] = "inet nftblock_other"  # valid, but only a restart can move the table
    write_config(box, cfg)
    try:
        code = reload(box)
        assert active_pid(box) == pid
        assert code != 0, "systemctl reload reported success for a reload the daemon refused"
    finally:
        box.write(CONFIG, good)
        reload(box)


# --- the sandbox's IPAddressDeny=, and stop ------------------------------------------------------------


def feeds(c: Container) -> dict[str, dict[str, Any]]:
    proc = c.run("nftblock", "--json", "feeds", check=False)
    if proc.returncode != 0:
        return {}
    return {f["name"]: f for f in json.loads(proc.stdout)["feeds"]}


def test_ip_address_deny_keeps_the_daemon_on_loopback(box: Container) -> None:
    # A feed server inside the container, reachable on loopback and on a second, non-loopback address.
    box.run("ip", "address", "add", f"{REMOTE}/32", "dev", "lo")
    box.run("systemd-run", "--unit=feed-server", "--", "python3", "-m", "http.server", "--bind", "0.0.0.0",
            "--directory", "/srv/test/feed", str(FEED_PORT))
    probe = (f"import urllib.request; print(urllib.request.urlopen('http://{REMOTE}:{FEED_PORT}/list.txt', "
             "timeout=10).read().decode())")
    box.wait_for(lambda: box.run("python3", "-c", probe, check=False).stdout.strip() == FEED_ENTRY,
                 "the feed server to answer outside the unit's sandbox")
    cfg = shipped_config(box)
    cfg.setdefault("blocklists", {}).setdefault("feeds", {"timeout": "permanent"})
    common = {"blocklist": "feeds", "allow_special": True}
    cfg["feeds"] = {
        "local": {"url": f"http://127.0.0.1:{FEED_PORT}/list.txt", **common},
        # Denied: the SYN is dropped by the cgroup's egress filter, so the fetch times out.
        "remote": {"url": f"http://{REMOTE}:{FEED_PORT}/list.txt", "timeout": "2s", **common},
        # The same, with a timeout longer than the test: always in flight when the service stops below.
        "stuck": {"url": f"http://{REMOTE}:{FEED_PORT}/list.txt", "timeout": "1h", **common},
    }
    write_config(box, cfg)
    box.run("systemctl", "restart", UNIT)
    f = box.wait_for(lambda: (f := feeds(box)) and f["remote"]["error"] and f, "the remote feed to fail")
    assert f["local"]["entries"] == 1 and f["local"]["error"] is None, f
    assert f["remote"]["entries"] == 0 and "no complete answer" in f["remote"]["error"], f
    assert FEED_ENTRY in kernel_elements(box, "feeds_net4")


def test_stop_is_prompt_and_leaves_the_bans_in_the_kernel(box: Container) -> None:
    assert feeds(box)["stuck"]["last_success"] is None  # a fetch is in flight
    box.run("systemctl", "stop", UNIT)
    p = unit(box, "ActiveState", "Result")
    # Result=success: the daemon exited on SIGTERM by itself, systemd did not have to kill it.
    assert p == {"ActiveState": "inactive", "Result": "success"}, box.journal(UNIT, "-o", "cat")
    assert BANNED in kernel_elements(box, "default_ip4")
    assert FEED_ENTRY in kernel_elements(box, "feeds_net4")


def test_the_documented_feeds_drop_in_lets_feeds_out(box: Container) -> None:
    # /usr/share/doc/nftblockd/examples/feeds.conf, installed the way its header says.
    box.sh(f"install -D -m 0644 /usr/share/doc/nftblockd/examples/feeds.conf "
           f"/etc/systemd/system/{UNIT}.d/feeds.conf && systemctl daemon-reload && systemctl start {UNIT}")
    f = box.wait_for(lambda: (f := feeds(box)) and f["remote"]["entries"] == 1 and f, "the remote feed to load")
    assert f["remote"]["error"] is None, f
    box.run("rm", f"/etc/systemd/system/{UNIT}.d/feeds.conf")
    box.run("systemctl", "daemon-reload")


def test_no_unit_failed(box: Container) -> None:
    failed = box.run("systemctl", "list-units", "--failed", "--no-legend", "--plain").stdout
    assert failed.strip() == "", failed


def test_the_releases_lintian_finds_no_errors_or_warnings(box: Container, built_deb: Path) -> None:
    # tests/unit/test_lintian.py runs the build host's lintian (Debian 12's); this is Debian 13's, whose
    # checks differ (it refuses files under /lib, an alias of /usr/lib since the /usr merge). Only the
    # trixie tree has lintian (harness.sh).
    if box.run("sh", "-c", "command -v lintian", check=False).returncode != 0:
        pytest.skip(f"no lintian in the {box.suite} tree: Debian 12's runs on the build host (tests/unit)")
    proc = box.run("lintian", "--tag-display-limit", "0", "--no-cfg", f"/tmp/{built_deb.name}", check=False)
    assert proc.returncode in (0, 1), proc.stderr
    bad = [line for line in proc.stdout.splitlines() if line.startswith(("E: ", "W: "))]
    assert bad == [], "\n".join(bad)


# What a purge must leave behind: nothing of the package. Its files, its conffiles and their directories,
# the state (saved bans) and runtime directories, the unit's enablement and deb-systemd-helper's records,
# and its nftables table (prerm deletes it: nothing would manage or expire-check those bans any more).
# What stays, as Debian practice has it: the system user and group (a UID must not be reused for
# another user while files of it may survive in backups), owning nothing, without a login shell; and
# the journal, which is the administrator's record.
PURGED_PATHS = ("/etc/nftblockd", "/var/lib/nftblockd", "/var/lib/private/nftblockd", "/run/nftblockd",
                "/usr/lib/nftblockd", "/usr/lib/systemd/system/nftblockd.service",
                "/lib/systemd/system/nftblockd.service",
                "/usr/lib/sysusers.d/nftblockd.conf", "/etc/fail2ban/action.d/nftblock.conf",
                "/etc/fail2ban/action.d/nftblock.py", "/usr/bin/nftblockd", "/usr/bin/nftblock",
                "/etc/systemd/system/multi-user.target.wants/nftblockd.service",
                f"/etc/systemd/system/{UNIT}.d", "/usr/share/doc/nftblockd",
                "/var/lib/systemd/deb-systemd-helper-enabled/nftblockd.service.dsh-also",
                "/var/lib/systemd/deb-systemd-helper-enabled/multi-user.target.wants/nftblockd.service",
                "/var/lib/systemd/deb-systemd-helper-masked/nftblockd.service")


def test_purge_leaves_nothing_behind(box: Container) -> None:
    box.run("systemctl", "start", UNIT)  # purge a running service, as an operator would
    active_pid(box)
    # The test's own drop-in is the administrator's file, not the package's: dpkg would rightly keep it.
    box.run("rm", "-r", f"/etc/systemd/system/{UNIT}.d")
    box.run("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "purge", "-y", "-q", "nftblockd")
    status = box.run("dpkg-query", "-W", "-f", "${db:Status-Abbrev}", "nftblockd", check=False)
    assert status.returncode != 0 or status.stdout.strip() in ("", "un"), status.stdout
    left = box.run("sh", "-c", " ".join(f"test ! -e {p} || echo {p};" for p in PURGED_PATHS)).stdout.split()
    assert left == []
    assert box.run("nft", "list", "table", "inet", "nftblock", check=False).returncode != 0
    assert "nftblockd" not in box.run("systemctl", "list-units", "--all", "--no-legend", "--plain").stdout
    assert "nftblockd" not in box.run("systemctl", "list-unit-files", "--no-legend", "--plain").stdout
    user = box.run("getent", "passwd", "nftblockd").stdout.strip().split(":")
    assert user[6] == "/usr/sbin/nologin", user
    owned = box.run("find", "/", "-xdev", "(", "-user", "nftblockd", "-o", "-group", "nftblockd", ")",
                    "-print", check=False).stdout
    assert owned == "", owned
