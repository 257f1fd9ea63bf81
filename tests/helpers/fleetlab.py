"""A fleet of real daemons for kernel-level tests and benchmarks: one redis-server in a "server" namespace and
one daemon per host, each in its own namespace, joined to the server's namespace by its own veth pair.

Host i (1-based) has 10.210.i.2/24 on its `fleet0`; the server's end `to<host>` has 10.210.i.1/24 and the
server listens on every address there, so each host reaches it at redis://10.210.i.1:PORT/0. Every host
tails its own auth.log with an sshd jail. The server is killed by PID, the namespaces deleted, at `close()`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from tests.helpers.daemon import DaemonProc
from tests.helpers.netns import NetNS, wait_for
from tests.helpers.redis import RedisServer


def host_addr(i: int) -> str:
    return f"10.210.{i}.2"


class FleetLab:
    def __init__(self, tmp: Path, hosts: tuple[str, ...] = ("a", "b", "c"), *, fleet: str = "lab",
                 maxretry: int = 2, allowlist: str = "[192.0.2.0/24]", fleet_extra: str = "",
                 jail_extra: str = "", set_size: int | None = None, blocklists: str | None = None) -> None:
        self.tmp = tmp
        self.hosts = hosts
        self.name = fleet
        self.events_key = self.key(hosts[0], "events")  # the first host's stream (schema 2: one per host)
        self.maxretry = maxretry
        self.allowlist = allowlist
        self.fleet_extra = fleet_extra
        self.jail_extra = jail_extra
        # `blocklists:` of every host's config; `set_size` sets blocklists.default.size alone (the default holds
        # 262,144 per family)
        self.blocklists = blocklists or f"{{default: {{timeout: 1h{f', size: {set_size}' if set_size else ''}}}}}"
        self.server_ns: NetNS | None = None
        self.server: RedisServer | None = None
        self.nss: dict[str, NetNS] = {}
        self.daemons: dict[str, DaemonProc] = {}
        self.logs: dict[str, Path] = {}

    def config(self, host: str, i: int) -> str:
        assert self.server is not None
        return f"""
allowlist: {self.allowlist}
reconcile: {{interval: 1h}}
blocklists: {self.blocklists}
jails:
  sshd:
    files: ["{self.logs[host]}"]
    filter: sshd
    maxretry: {self.maxretry}
    findtime: 10m
    bantime: 1h
    {self.jail_extra}
fleet:
  name: {self.name}
  host_id: {host}
  url: redis://10.210.{i}.1:{self.server.port}/0
  {self.fleet_extra}
"""

    def start(self) -> FleetLab:
        try:
            self.server_ns = NetNS("nbs")
            for i, h in enumerate(self.hosts, start=1):
                ns = self.nss[h] = NetNS(f"nbf{h}")
                self.server_ns.run("ip", "link", "add", f"to{h}", "type", "veth", "peer", "name", "fleet0", "netns",
                                   ns.name)
                self.server_ns.run("ip", "addr", "add", f"10.210.{i}.1/24", "dev", f"to{h}")
                self.server_ns.run("ip", "link", "set", f"to{h}", "up")
                ns.run("ip", "addr", "add", f"{host_addr(i)}/24", "dev", "fleet0")
                ns.run("ip", "link", "set", "fleet0", "up")
            self.server = RedisServer(self.tmp / "redis", ns=self.server_ns, bind="0.0.0.0").start()
            for i, h in enumerate(self.hosts, start=1):
                self.logs[h] = self.tmp / f"{h}-auth.log"
                self.logs[h].write_text("")
                self.daemons[h] = DaemonProc(self.nss[h], self.tmp / h, self.config(h, i))
            for d in self.daemons.values():
                d.start()
            for h in self.hosts:
                wait_for(lambda h=h: self.fleet(h)["connected"], 15, 0.05, f"{h} connected")  # type: ignore[misc]
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for d in self.daemons.values():
            with contextlib.suppress(Exception):
                d.close()
        if self.server is not None:
            self.server.kill()
        for ns in self.nss.values():
            ns.delete()
        if self.server_ns is not None:
            self.server_ns.delete()

    # -- looking -------------------------------------------------------------------------------------------

    def banned(self, host: str, set_name: str = "default_ip4") -> set[str]:
        return set(self.nss[host].set_elements("nftblock", set_name))

    def count(self, host: str, set_name: str = "default_ip4") -> int:
        """Elements the kernel reports for a set (NFTA_SET_COUNT through `status`: cheap for 10k elements)."""
        st = self.daemons[host].cli_json("status")
        return int(next(s["elements"] for s in st["sets"] if s["name"] == set_name))

    def fleet(self, host: str) -> dict[str, Any]:
        out: dict[str, Any] = self.daemons[host].cli_json("fleet")["fleet"]
        return out

    def redis_cli(self, *args: str) -> str:
        assert self.server_ns is not None and self.server is not None
        r = self.server_ns.run("redis-cli", "-p", str(self.server.port), *args)
        assert r.returncode == 0 and not r.stdout.startswith("ERR"), r.stdout + r.stderr
        return r.stdout

    def key(self, host: str, what: str) -> str:
        """A host's own key (`events`, `active`, `unbanned`, `epoch`)."""
        return f"nftblock:{{{self.name}}}:h:{host}:{what}"

    def xadd(self, fields: dict[str, str], host: str = "evil") -> None:
        """An entry in `host`'s stream (a member the daemons follow once their discovery finds it)."""
        self.redis_cli("XADD", self.key(host, "events"), "*", *[x for kv in fields.items() for x in kv])
