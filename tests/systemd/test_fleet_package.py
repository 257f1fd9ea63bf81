"""Fleet mode from distribution packages, on each Debian release: the .deb installed next to Debian's
`redis-server` and `python3-redis` (from the release's rootfs, no pip), two daemons sharing bans through it.

The daemons: the packaged nftblockd.service, and a second instance of the same unit file with its own config
(table, state directory, runtime directory and control socket, metrics port, fleet host_id), so both run
under the shipped sandbox. The server is Debian's redis-server binary, started by the test as a transient
unit (the packaged redis-server.service is stopped first) on another host as a real fleet's is: a network
namespace behind a veth pair (Container.peer_netns), so the unit reaches it only through the drop-in
docs/fleet.md gives (`IPAddressAllow=` the server's address), installed for both units.

Debian 13's python3-redis (6.1) serves, Debian 12's (4.3.4) does not (docs/fleet.md): on bookworm the test
first checks the refusal (one journal line naming the package and version, no traceback), then does what the
sentence says, a redis-py 6.1 under /usr/local (Debian 13's own files, copied in: the container is offline),
and checks the shared ban. On both, with no Redis client at all the service fails with the sentence.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers.container import SUITES, Container, copy_into_bind, rootfs, unavailable

pytestmark = pytest.mark.systemd

EXTRA = ("redis-server",)
PORT = 16379
REDIS_NS, REDIS_LOCAL, REDIS_HOST = "redis", "10.78.1.254", "10.78.1.1"
URL = f"redis://{REDIS_HOST}:{PORT}/0"
# docs/fleet.md, "Under the packaged service": the fleet server's address, and nothing else.
DROPIN = f"[Service]\nIPAddressAllow={REDIS_HOST}\n"
A, B = "nftblockd.service", "nftblockd-b.service"
NEED = "fleet mode needs"


def config(table: str, host: str, socket: str, state: str, metrics: str) -> str:
    return yaml.safe_dump({
        "table": f"inet {table}",
        "allowlist": ["127.0.0.0/8", "::1"],
        "control": {"socket": socket, "mode": "0600"},
        "state_dir": state,
        "metrics": {"listen": metrics},
        "blocklists": {"default": {"timeout": "1h", "size": 65536}},
        "jails": {},
        "fleet": {"name": "pkgtest", "host_id": host, "url": URL, "blocklist": "default"},
    }, sort_keys=False)


def second_unit(c: Container) -> str:
    """The packaged unit, pointed at its own config and directories."""
    text = c.run("cat", "/usr/lib/systemd/system/nftblockd.service").stdout
    out = []
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            line = "ExecStart=/usr/bin/nftblockd --config /etc/nftblockd/b.yaml"
        elif line.startswith("ExecReload="):
            line = "ExecReload=/usr/bin/nftblock --socket /run/nftblockd-b/control.sock reload"
        elif line.startswith(("StateDirectory=", "RuntimeDirectory=")):
            line = line + "-b"
        out.append(line)
    return "\n".join(out) + "\n"


def elements(c: Container, table: str) -> list[str]:
    proc = c.run("nft", "-j", "list", "set", "inet", table, "default_ip4", check=False)
    if proc.returncode != 0:
        return []
    return [e if isinstance(e, str) else str(e.get("elem", {}).get("val"))
            for obj in json.loads(proc.stdout)["nftables"] for e in obj.get("set", {}).get("elem", [])]


def start(c: Container, unit: str) -> int:
    return c.run("systemctl", "restart", unit, check=False, timeout=60).returncode


@pytest.fixture(scope="module", params=SUITES)
def box(request: pytest.FixtureRequest, built_deb: Path,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    suite: str = request.param
    rootfs(suite, EXTRA)
    bind = tmp_path_factory.mktemp(f"fleet-bind-{suite}")
    copy_into_bind(bind, built_deb)
    if suite == "bookworm":  # what the refusal tells a Debian 12 operator to install: Debian 13's redis-py
        tx = rootfs("trixie", EXTRA) / "usr/lib/python3/dist-packages"
        for p in [tx / "redis", *tx.glob("redis-*.dist-info")]:
            shutil.copytree(p, bind / "redis-py" / p.name, symlinks=True)
    c = Container(bind, suite, prefix="nbf", extra=EXTRA).boot()
    try:
        c.run("install", "-m", "0644", f"/srv/test/{built_deb.name}", f"/tmp/{built_deb.name}")
        c.run("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q", "--no-install-recommends",
              f"/tmp/{built_deb.name}")
        c.run("systemctl", "disable", "--now", "redis-server.service", check=False)
        c.peer_netns(REDIS_NS, REDIS_LOCAL, [REDIS_HOST])
        c.run("systemd-run", "--unit=fleet-redis", "--", "ip", "netns", "exec", REDIS_NS, "/usr/bin/redis-server",
              "--port", str(PORT), "--bind", REDIS_HOST, "--protected-mode", "no", "--save", "", "--appendonly",
              "no", "--daemonize", "no")
        c.wait_for(lambda: c.run("redis-cli", "-h", REDIS_HOST, "-p", str(PORT), "ping", check=False
                                 ).stdout.strip() == "PONG", "redis-server answering", bound=30)
        c.write("/etc/nftblockd/nftblockd.yaml",
                config("nftblock", "a", "/run/nftblockd/control.sock", "/var/lib/nftblockd", "127.0.0.1:9789"))
        c.write("/etc/nftblockd/b.yaml",
                config("nftblock_b", "b", "/run/nftblockd-b/control.sock", "/var/lib/nftblockd-b", "127.0.0.1:9790"))
        c.run("chmod", "0644", "/etc/nftblockd/nftblockd.yaml", "/etc/nftblockd/b.yaml")
        c.write(f"/etc/systemd/system/{B}", second_unit(c))
        for unit in (A, B):
            c.write(f"/etc/systemd/system/{unit}.d/fleet.conf", DROPIN)
        c.run("systemctl", "daemon-reload")
        yield c
    finally:
        c.stop()


def refused(c: Container, unit: str, found: str) -> None:
    """The unit fails to start, and its journal says what to install in one line, without a traceback."""
    # only this start's lines: the journal after its cursor now
    cursor = c.run("journalctl", "-n", "0", "--show-cursor").stdout.rsplit("cursor: ", 1)[-1].strip()
    assert start(c, unit) != 0
    c.run("systemctl", "stop", unit, check=False)  # no restart loop
    log = c.journal(unit, "-o", "cat", f"--after-cursor={cursor}")
    lines = [ln for ln in log.splitlines() if NEED in ln]
    assert lines and all(ln == lines[0] for ln in lines), log
    assert "python3-redis" in lines[0] and found in lines[0] and "Traceback" not in log, log


def arrives(c: Container, addr: str, table: str) -> None:
    try:
        c.wait_for(lambda: addr in elements(c, table), f"{addr} in {table}'s kernel set", bound=30)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{c.journal(A)}\n{c.journal(B)}\n"
                             f"{c.run('nftblock', 'status', check=False).stdout}") from None


def test_two_daemons_share_a_ban_through_debians_redis(box: Container) -> None:
    version = box.run("python3", "-c", "from importlib.metadata import version; print(version('redis'))").stdout
    if box.suite == "bookworm":
        assert version.startswith("4.3."), version
        refused(box, A, f"(found {version.strip()})")
        site = box.run("python3", "-c", "import sysconfig; print(sysconfig.get_path('purelib', 'posix_local'))"
                       ).stdout.strip()  # /usr/local/lib/python3.11/dist-packages, ahead of Debian's
        box.sh(f"mkdir -p {site} && cp -a /srv/test/redis-py/. {site}/")
    assert box.run("nftblockd", "--check-config", "/etc/nftblockd/b.yaml", check=False).returncode == 0
    assert start(box, A) == 0, box.journal(A)
    assert start(box, B) == 0, box.journal(B)
    box.run("nftblock", "ban", "203.0.113.10", "--timeout", "1h")
    arrives(box, "203.0.113.10", "nftblock_b")
    box.run("nftblock", "--socket", "/run/nftblockd-b/control.sock", "ban", "203.0.113.20", "--timeout", "1h")
    arrives(box, "203.0.113.20", "nftblock")
    for unit in (A, B):
        assert "Traceback" not in box.journal(unit)


def test_without_a_redis_client_the_service_names_the_package(box: Container) -> None:
    box.run("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "remove", "-y", "-q", "python3-redis")
    box.run("rm", "-rf", *[f"/usr/local/lib/python3.{v}/dist-packages/redis" for v in (11, 13)],
            check=False)
    box.sh("rm -rf /usr/local/lib/python3*/dist-packages/redis-*.dist-info")
    assert box.run("dpkg-query", "-W", "-f=${Status}", "nftblockd").stdout == "install ok installed"
    refused(box, A, "not installed")
