"""What this host needs to work, and must therefore never ban: the fleet server and its Sentinels, the feed
servers, and the resolvers of /etc/resolv.conf (issue #34 item 1: one ban of the fleet server's address, from
any member or from a log line naming it, cut every host off the fleet until a local unban).

Pure: no IO, no clock. `names(cfg)` lists the hosts to resolve (the daemon resolves them, bounded, and again
every `REFRESH` seconds: a name that moves is followed, one that fails to resolve keeps its last addresses);
`nameservers(text)` reads resolv.conf's text; `networks` makes the allowlist entries. The daemon adds them to
the global allowlist, which every path a ban can come from asks (jails, the CLI, fleet events, feeds) and the
enforcer asks again before the kernel: a refusal is counted (`nftblock_bans_refused_total{reason=
"allowlisted"}`) and logged like any allowlisted address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from nftblockd.addr import IPAddr, IPNet
from nftblockd.config import Config

REFRESH = 300.0  # seconds between two resolutions of the names
RESOLV_CONF = "/etc/resolv.conf"
RESOLV_MAX = 64 * 1024  # bytes of resolv.conf read at most

__all__ = ["REFRESH", "RESOLV_CONF", "RESOLV_MAX", "names", "nameservers", "networks"]


def _url_host(url: str) -> str | None:
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return None
    return host or None


def names(cfg: Config) -> list[tuple[str, str]]:
    """(what, host name or literal) of everything this host talks to and needs: the fleet server or its
    Sentinels, and every feed fetched over the network."""
    out: list[tuple[str, str]] = []
    fc = cfg.fleet
    if fc is not None:
        if fc.url is not None and (h := _url_host(fc.url)) is not None:
            out.append(("the fleet server", h))
        out += [("a fleet Sentinel", h) for h, _port in fc.sentinel_hosts]
    for feed in cfg.feeds:
        if feed.url is not None and (h := _url_host(feed.url)) is not None:
            out.append((f"feed {feed.name}'s server", h))
    return out


def nameservers(text: str) -> list[IPAddr]:
    """The `nameserver` addresses of a resolv.conf (a zone index `%eth0` dropped; anything else skipped)."""
    out: list[IPAddr] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                out.append(ipaddress.ip_address(parts[1].split("%", 1)[0]))
            except ValueError:
                continue
    return out


def networks(resolved: Mapping[str, Iterable[IPAddr]]) -> list[IPNet]:
    """The allowlist entries for resolved addresses (each a /32 or /128; IPv4-mapped IPv6 as its IPv4)."""
    out: set[IPNet] = set()
    for addrs in resolved.values():
        for a in addrs:
            if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
                a = a.ipv4_mapped
            out.add(ipaddress.ip_network(a))
    return sorted(out, key=lambda n: (n.version, int(n.network_address)))
