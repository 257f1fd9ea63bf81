"""Fleet counting, the pure part: failures every host saw add up on the server; one ban per crossing.

A jail with `fleet_maxretry` publishes each failure it counts (after its own allowlist, never-ban and time
checks) to the fleet server; when the fleet-wide number of failures of one offender within `fleet_findtime`
reaches `fleet_maxretry`, exactly one ban is decided, on the server, by the host whose failures crossed the
line, and it travels to every other host as an ordinary fleet ban (the trust gate, the allowlist, never-ban,
the audit line). This module holds what is sent and what comes back: the offender of a failure, the batch of
one call, the Lua script that runs on the server, and the parsing of its reply. No IO, no clock, no redis.

Keys (all under the fleet's hash tag, so one script may touch them on a cluster too):

    nftblock:{F}:fc:<jail>:<offender>   ZSET  one member per counted failure, "<host>|<seq>", score = server
                                              time in ms; trimmed to the window, PEXPIRE fleet_findtime
    nftblock:{F}:fd:<jail>:<offender>   STRING the decision: "<hosts>;<decider>;<count>", SET NX PX bantime:
                                              while it exists the offender is banned and nothing is counted
    nftblock:{F}:fcrate                 HASH  per host: "<tokens>:<ms>" (its token bucket) and "<host>#seq"

The script, per call (one host, one batch; Redis runs it atomically, so concurrent hosts are serialised):
1. the server's own clock (`TIME`): a host's wrong clock cannot stretch or shrink a window;
2. the host's token bucket (`count_rate` failures/s, `count_burst`) is refilled; failures beyond it are
   refused (`limited`): a compromised host cannot push offenders over the line faster than that, whichever
   hosts' failures the counts already hold;
3. per offender: already decided -> skipped (`decided`); else its failures are added, those older than the
   window dropped; at `fleet_maxretry` the members are checked (a member not of the form above -- written
   around the script -- is removed and counted `malformed`, and cannot make a crossing), and if the count
   still reaches the limit: `SET NX` of the decision key; the one call that wins it deletes the count,
   appends the ban to the fleet's event stream (origin = this host, src = "count:<jail>", `seen` = the
   hosts) and to the `active` set, in the same atomic step, and returns it. A second host crossing at the same
   moment finds the decision and is skipped: one crossing, one ban.
Bounded: each count key holds fewer than fleet_maxretry members and expires after fleet_findtime; decision
keys expire with the ban; the rate hash has two fields per host. A batch folds repeated failures of one
offender into one (offender, k) item, with k capped at fleet_maxretry.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from nftblockd.addr import IPAddr, IPNet, format_target, normalise_address

_HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


@dataclass(frozen=True, slots=True)
class CountPolicy:
    """A jail's fleet counting: `maxretry` failures fleet-wide within `findtime` ban for `bantime` seconds."""

    maxretry: int
    findtime: float
    bantime: float
    ipv6_prefix: int = 64


class Decided(NamedTuple):
    """A ban this host's call decided: `hosts` saw the `failures` that crossed the line."""

    jail: str
    net: IPNet
    until: float
    hosts: tuple[str, ...]
    failures: int

    def reason(self) -> str:
        shown = ", ".join(self.hosts[:10]) + (", ..." if len(self.hosts) > 10 else "")
        return f"fleet count: {self.failures} failures seen by {shown}"


class Reply(NamedTuple):
    decided: list[Decided]
    accepted: int  # failures counted
    limited: int  # refused by this host's token bucket
    skipped: int  # of offenders already decided (banned fleet-wide)
    malformed: int  # members found in a count key that no host of ours wrote; removed
    bad_reply: int  # decisions in the reply that do not parse (never applied)


def offender(host: IPAddr, ipv6_prefix: int) -> str:
    """What a failure counts against: an IPv4 address, or the IPv6 /`ipv6_prefix` (the jail's setting)."""
    a = normalise_address(host)
    if a.version == 4 or ipv6_prefix >= 128:
        return str(a)
    return format_target(ipaddress.IPv6Network((int(a) >> (128 - ipv6_prefix) << (128 - ipv6_prefix),
                                                ipv6_prefix)))


def keys_of(fleet: str) -> tuple[str, str, str, str]:
    """(rate hash, events stream, active set, unbanned set) of fleet `fleet`."""
    base = f"nftblock:{{{fleet}}}"
    return f"{base}:fcrate", f"{base}:events", f"{base}:active", f"{base}:unbanned"


def count_key(fleet: str, jail: str, target: str) -> str:
    return f"nftblock:{{{fleet}}}:fc:{jail}:{target}"


def decision_key(fleet: str, jail: str, target: str) -> str:
    return f"nftblock:{{{fleet}}}:fd:{jail}:{target}"


def build_call(fleet: str, host: str, rate: float, burst: int, history: float,
               items: Mapping[tuple[str, str], int], policies: Mapping[str, CountPolicy]
               ) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of one script call counting `items` ((jail, offender) -> failures) for `host`."""
    keys = list(keys_of(fleet))
    argv = [host, repr(float(rate)), str(int(burst)), str(int(history * 1000))]
    for (jail, target), k in items.items():
        p = policies[jail]
        keys += [count_key(fleet, jail, target), decision_key(fleet, jail, target)]
        argv += [target, str(max(1, min(k, p.maxretry))), str(p.maxretry), str(max(1, int(p.findtime * 1000))),
                 str(max(1000, int(p.bantime * 1000))), f"count:{jail}"]
    return keys, argv


def _text(v: Any) -> str:
    return v.decode("ascii", "replace") if isinstance(v, bytes) else str(v)


def _int(v: Any) -> int:
    try:
        return max(0, int(_text(v)))
    except ValueError:
        return 0


def parse_reply(reply: Any, jails_by_src: Mapping[str, str]) -> Reply:
    """The script's reply: [[[offender, until, hosts, count, src], ...], accepted, limited, skipped, malformed].
    A decision that does not parse is counted in `bad_reply` and dropped, never applied."""
    if not isinstance(reply, list | tuple) or len(reply) != 5:
        return Reply([], 0, 0, 0, 0, 1)
    out: list[Decided] = []
    bad = 0
    for d in reply[0] if isinstance(reply[0], list | tuple) else ():
        try:
            target, until, hosts, count, src = (_text(x) for x in d)
            jail = jails_by_src[src]
            net = ipaddress.ip_network(target, strict=True)
            end = float(until)
            if not math.isfinite(end):
                raise ValueError(until)
            names = tuple(h for h in hosts.split(",") if _HOST_RE.fullmatch(h))
            out.append(Decided(jail, net, end, names, int(count)))
        except (ValueError, TypeError, KeyError):
            bad += 1
    return Reply(out, _int(reply[1]), _int(reply[2]), _int(reply[3]), _int(reply[4]), bad)


def parse_seen(decision: Any, members: Sequence[Any]) -> dict[str, Any]:
    """What `nftblock check` shows of one jail's fleet count: the decision key's value (or None) and the count
    key's members."""
    out: dict[str, Any] = {}
    hosts: list[str] = []
    for m in members:
        h = _text(m).rpartition("|")[0]
        if _HOST_RE.fullmatch(h) and h not in hosts:
            hosts.append(h)
    out["counting"] = len(members)
    out["seen_by"] = hosts
    if decision is not None:
        seen, _, rest = _text(decision).partition(";")
        decider, _, count = rest.partition(";")
        out["decided"] = {"by": decider, "seen_by": [h for h in seen.split(",") if _HOST_RE.fullmatch(h)],
                          "count": _int(count)}
    return out


SCRIPT = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local host, rate, burst, history = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local n = (#ARGV - 4) / 6
local total = 0
for i = 0, n - 1 do total = total + tonumber(ARGV[4 + i * 6 + 2]) end
local tokens, at = burst, now
local b = redis.call('HGET', KEYS[1], host)
if b then
  local sep = string.find(b, ':', 1, true)
  if sep then
    tokens = tonumber(string.sub(b, 1, sep - 1)) or burst
    at = tonumber(string.sub(b, sep + 1)) or now
  end
end
if now > at then tokens = math.min(burst, tokens + (now - at) * rate / 1000) end
local seq = redis.call('HINCRBY', KEYS[1], host .. '#seq', total) - total
local out = {}
local accepted, limited, skipped, malformed = 0, 0, 0, 0
for i = 0, n - 1 do
  local a = 4 + i * 6
  local target, k = ARGV[a + 1], tonumber(ARGV[a + 2])
  local maxretry, findtime = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local bantime, src = tonumber(ARGV[a + 5]), ARGV[a + 6]
  local fc, fd = KEYS[5 + i * 2], KEYS[6 + i * 2]
  if redis.call('EXISTS', fd) == 1 then
    skipped = skipped + k
  else
    local take = math.min(k, math.floor(tokens))
    tokens = tokens - take
    limited = limited + k - take
    if take > 0 then
      accepted = accepted + take
      local args = {}
      for j = 1, take do
        seq = seq + 1
        args[#args + 1] = now
        args[#args + 1] = host .. '|' .. string.format('%d', seq)
      end
      redis.call('ZADD', fc, unpack(args))
      redis.call('ZREMRANGEBYSCORE', fc, '-inf', '(' .. string.format('%d', now - findtime))
      local c = redis.call('ZCARD', fc)
      if c >= maxretry then
        local hosts, seen, bad = {}, {}, {}
        for _, m in ipairs(redis.call('ZRANGE', fc, 0, -1)) do
          local h = string.match(m, '^([%w][%w%._:%-]*)|%d+$')
          if h and #h <= 64 then
            if not seen[h] then seen[h] = true; hosts[#hosts + 1] = h end
          else
            bad[#bad + 1] = m
          end
        end
        if #bad > 0 then
          malformed = malformed + #bad
          redis.call('ZREM', fc, unpack(bad))
          c = c - #bad
        end
        if c >= maxretry and redis.call('SET', fd, table.concat(hosts, ',') .. ';' .. host .. ';' .. c,
                                        'NX', 'PX', bantime) then
          redis.call('DEL', fc)
          local untils = string.format('%.3f', (now + bantime) / 1000)
          local shown = table.concat(hosts, ',', 1, math.min(#hosts, 16))
          redis.call('XADD', KEYS[2], 'MINID', '~', string.format('%d', now - history), '*', 'v', '1', 'op', 'ban',
                     'net', target, 'until', untils, 'origin', host, 'oseq', '0', 'src', src,
                     'ts', string.format('%d', now), 'seen', shown)
          redis.call('ZADD', KEYS[3], 'GT', untils, target)
          redis.call('ZREM', KEYS[4], target)
          out[#out + 1] = {target, untils, table.concat(hosts, ','), c, src}
        else
          redis.call('PEXPIRE', fc, findtime)
        end
      else
        redis.call('PEXPIRE', fc, findtime)
      end
    end
  end
end
redis.call('HSET', KEYS[1], host, string.format('%.3f', tokens) .. ':' .. string.format('%d', now))
return {out, accepted, limited, skipped, malformed}
"""

__all__ = ["SCRIPT", "CountPolicy", "Decided", "Reply", "build_call", "count_key", "decision_key", "keys_of",
           "offender", "parse_reply", "parse_seen"]
