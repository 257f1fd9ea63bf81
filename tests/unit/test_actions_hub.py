"""Which actions ban and unban events reach, with the offender's lines; a flood is counted, not built."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from nftblockd.actions.f2baction import F2bAction, load_action
from nftblockd.actions.hub import ActionHub
from nftblockd.actions.render import Run
from nftblockd.addr import format_target
from nftblockd.config import Config, parse_config
from nftblockd.detect.filterload import load_filter
from nftblockd.detect.jails import JailRunner
from nftblockd.detect.matchmemory import MatchMemory
from nftblockd.detect.tracker import BanRecord, JailPolicy, Tracker
from nftblockd.events import Ban, LogLine
from nftblockd.sources.base import LineBatch, MemoryPositionStore

CFG = """
actions:
  a: {type: command, argv: [/bin/a, "{address}"], on: [ban, unban], burst: 5, rate: 1}
  b: {type: command, argv: [/bin/b], burst: 1000, rate: 1000}
  fleetwide: {type: webhook, url: "http://127.0.0.1:1/", batch: 50}
jails:
  sshd: {filter: sshd, journal: {matches: {_SYSTEMD_UNIT: ssh.service}}, actions: [a, b]}
  web: {filter: sshd, journal: {matches: {_SYSTEMD_UNIT: nginx.service}}}
fleet: {name: f, host_id: h1, url: "redis://127.0.0.1:7001", actions: [fleetwide]}
"""
N = ipaddress.ip_network
A = ipaddress.ip_address


async def nothing(run: Run) -> None:
    return None


def hub() -> ActionHub:
    return ActionHub(parse_config(CFG), {}, nothing)


def ban(addr: str, jail: str = "sshd") -> Ban:
    return Ban(N(addr), "default", 1000.0 + 3600, "jail", "5 failures", jail)


def queued(h: ActionHub, name: str) -> list[str]:
    q = h.runners[name]._queue
    return [q._queue[i].address for i in range(q.qsize())]  # type: ignore[attr-defined]


def test_jail_bans_reach_the_jails_actions_with_their_lines() -> None:
    h = hub()
    mem = h.memory("sshd")
    assert isinstance(mem, MatchMemory) and h.memory("web") is None
    mem.add(A("192.0.2.1"), "line 1", {"user": "x"})
    mem.add(A("192.0.2.1"), "line 2", {"user": "root"})
    mem.decided(A("192.0.2.1"), N("192.0.2.1/32"))
    h.jail_bans([ban("192.0.2.1/32"), ban("192.0.2.9/32", "web")], 1000.0)
    assert queued(h, "a") == queued(h, "b") == ["192.0.2.1"]
    ev_a = h.runners["a"]._queue._queue[0]  # type: ignore[attr-defined]
    assert ev_a is h.runners["b"]._queue._queue[0]  # type: ignore[attr-defined]  # built once
    assert (ev_a.matches, ev_a.failures, ev_a.fields, ev_a.duration, ev_a.host) == (
        ("line 1", "line 2"), 2, (("user", "root"),), 3600.0, "h1")
    assert len(mem) == 0  # taken


def test_unbans_go_to_actions_that_asked_for_them() -> None:
    h = hub()
    h.unbanned([("sshd", N("192.0.2.1/32"), "default", "cli", "operator")], 1000.0)
    assert queued(h, "a") == ["192.0.2.1"] and queued(h, "b") == []


def test_a_flood_is_counted_without_building_what_is_skipped() -> None:
    h = hub()
    built: list[int] = []

    def nth(i: int) -> tuple[str, float | None, str]:
        built.append(i)
        return f"10.0.{i // 256}.{i % 256}", None, "fleet:h2"

    h.fleet_bans(100_000, nth, "default", 1000.0)
    r = h.runners["fleetwide"]
    assert len(built) == r.cfg.queue == 1000  # the queue's worth; the rest only counted
    assert r.stats.skipped == {"queue_full": 99_000}
    h.jail_bans([ban(f"192.0.2.{i}/32") for i in range(10)], 1000.0)
    assert len(queued(h, "a")) == 5 and h.runners["a"].stats.skipped == {"rate": 5}
    assert len(queued(h, "b")) == 10


def test_match_memory_is_bounded() -> None:
    m = MatchMemory(max_hosts=2, max_lines=3)
    for i in range(5):
        m.add(A("192.0.2.1"), f"l{i}", {})
    m.add(A("192.0.2.2"), "x", {})
    m.add(A("192.0.2.3"), "y", {})  # forgets .1, seen longest ago
    m.decided(A("192.0.2.1"), N("192.0.2.1/32"))
    assert m.take(N("192.0.2.1/32")) is None
    m.add(A("2001:db8::1"), "v6", {})
    m.decided(A("2001:db8::2"), N("2001:db8::/64"))  # counted per /64 like the jail
    got = m.take(N("2001:db8::/64"))
    assert got is not None and got.lines == ("v6",) and got.failures == 1
    for i in range(5):
        m.add(A("192.0.2.9"), f"l{i}", {})
    m.decided(A("192.0.2.9"), N("192.0.2.9/32"))
    got = m.take(N("192.0.2.9/32"))
    assert got is not None and got.lines == ("l2", "l3", "l4") and got.failures == 5


async def test_a_reload_replaces_changed_actions_and_stops_removed_ones() -> None:
    import asyncio

    h = hub()
    task = asyncio.create_task(h.run())
    for _ in range(50):  # the runners' tasks start
        await asyncio.sleep(0)
    old_a, old_b = h.runners["a"], h.runners["b"]
    tasks = dict(h._tasks)
    assert set(tasks) == {"a", "b", "fleetwide"}
    changed = h.configure(parse_config(CFG.replace("burst: 5", "burst: 7").replace(
        "  fleetwide: {type: webhook, url: \"http://127.0.0.1:1/\", batch: 50}\n", "").replace(
        "actions: [fleetwide]", "")), {})
    assert sorted(changed) == ["a", "fleetwide"]
    assert h.runners["b"] is old_b and h.runners["a"] is not old_a and h.runners["a"].cfg.burst == 7
    assert h.runners["a"].stats is old_a.stats  # counters do not restart
    for _ in range(50):
        await asyncio.sleep(0)
    assert tasks["a"].cancelled() and tasks["fleetwide"].cancelled() and not tasks["b"].done()
    assert set(h._tasks) == {"a", "b"} and not h._tasks["a"].done()
    assert h.fleet_actions == []
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert all(t.done() for t in h._tasks.values())


# -- which jails keep their offenders' lines -------------------------------------------------------------

F2B_CFG = """
actions:
  quiet: {{type: fail2ban, file: {d}/quiet.conf}}
  lines: {{type: fail2ban, file: {d}/lines.conf}}
  user: {{type: fail2ban, file: {d}/user.conf}}
  count: {{type: fail2ban, file: {d}/count.conf}}
  fixed: {{type: fail2ban, file: {d}/count.conf, options: {{failures: "3"}}}}
  gone: {{type: fail2ban, file: {d}/lines.conf, on: [unban]}}
  cmd: {{type: command, argv: [/bin/a, "{{address}}"]}}
jails:
{jails}
"""
SCRIPTS = {"quiet": "echo <ip> banned by <name> for <bantime>", "lines": "printf %%s <matches> | mail -s <ip> ops",
           "user": "echo <ip> <F-USER>", "count": "echo <ip> after <failures> attempts"}


def f2b_hub(tmp_path: Path, jails: dict[str, list[str]]) -> tuple[Config, dict[str, F2bAction], ActionHub]:
    for name, script in SCRIPTS.items():
        (tmp_path / f"{name}.conf").write_text(f"[Definition]\nactionban = {script}\nactionunban = echo <ip>\n")
    text = "\n".join(f"  {j}: {{filter: sshd, journal: {{matches: {{_SYSTEMD_UNIT: {j}.service}}}}, "
                     f"actions: [{', '.join(a)}]}}" for j, a in jails.items())
    cfg = parse_config(F2B_CFG.format(d=tmp_path, jails=text))
    f2b = {a.name: load_action(a.file, dict(a.options)) for a in cfg.actions if a.type == "fail2ban"}
    return cfg, f2b, ActionHub(cfg, f2b, nothing)


def test_only_jails_whose_actions_show_lines_keep_them(tmp_path: Path) -> None:
    jails = {"j_quiet": ["quiet"], "j_lines": ["quiet", "lines"], "j_user": ["user"], "j_count": ["count"],
             "j_fixed": ["fixed"], "j_gone": ["gone"], "j_cmd": ["cmd"]}
    _, _, h = f2b_hub(tmp_path, jails)
    keep = {j: h.memories[j].keep for j in jails}
    assert keep == {"j_quiet": False, "j_lines": True, "j_user": True, "j_count": True, "j_fixed": False,
                    "j_gone": False, "j_cmd": True}


def test_a_reload_that_changes_what_the_actions_show_changes_what_is_kept(tmp_path: Path) -> None:
    cfg, f2b, h = f2b_hub(tmp_path, {"sshd": ["quiet"]})
    mem = h.memories["sshd"]
    assert not mem.keep
    (tmp_path / "quiet.conf").write_text("[Definition]\nactionban = echo <ip> <matches>\n")
    h.configure(cfg, {"quiet": load_action(tmp_path / "quiet.conf")})
    assert h.memories["sshd"] is mem and mem.keep
    mem.add(A("192.0.2.1"), "line 1", {})
    h.configure(cfg, f2b)  # back to the quiet file: what was kept is let go
    assert not mem.keep and len(mem) == 0


def jail_runner(cfg: Config, hub: ActionHub, jail: str) -> tuple[JailRunner, list[Ban]]:
    j = next(x for x in cfg.jails if x.name == jail)
    flt = load_filter(j.filter)
    tracker = Tracker([JailPolicy.from_config(j)])
    bans: list[Ban] = []

    class Sink:
        async def submit(self, b: list[Ban], records: list[BanRecord], arrival: float) -> None:
            bans.extend(b)

        def submit_nowait(self, b: list[Ban], records: list[BanRecord], arrival: float) -> bool:
            bans.extend(b)
            return True

    runner = JailRunner(j, flt, tracker, Sink(), MemoryPositionStore(), sources=[], memory=hub.memory(jail))
    return runner, bans


def brute_lines(n: int) -> list[LogLine]:
    return [LogLine("t", f"Dec  2 09:53:{10 + i:02d} web1 sshd[{100 + i}]: Failed password for invalid user u{i} "
                         f"from 192.0.2.7 port {2000 + i} ssh2") for i in range(n)]


def test_a_jail_whose_action_shows_matches_still_gets_them(tmp_path: Path) -> None:
    cfg, _, h = f2b_hub(tmp_path, {"sshd": ["quiet", "lines"]})
    runner, _ = jail_runner(cfg, h, "sshd")
    lines = brute_lines(5)  # the jail's default maxretry: the fifth failure bans
    found, _records = runner.process(LineBatch.of(lines), 1796205190.0, True, 0.0)
    assert [format_target(b.target) for b in found] == ["192.0.2.7"]
    h.jail_bans(found, 1796205190.0)
    ev = h.runners["lines"]._queue._queue[0]  # type: ignore[attr-defined]
    assert ev.matches == tuple(x.text for x in lines) and ev.failures == 5 and ev.fields == (("user", "u4"),)
    assert h.runners["quiet"]._queue._queue[0] is ev  # type: ignore[attr-defined]  # one event for both


def test_a_jail_whose_actions_show_no_lines_keeps_none(tmp_path: Path) -> None:
    cfg, _, h = f2b_hub(tmp_path, {"sshd": ["quiet"]})
    runner, _ = jail_runner(cfg, h, "sshd")
    lines = brute_lines(5)
    found, _records = runner.process(LineBatch.of(lines[:4]), 1796205190.0, True, 0.0)
    assert found == [] and len(h.memories["sshd"]) == 0  # four failures counted, no line kept
    found, _records = runner.process(LineBatch.of(lines[4:]), 1796205190.0, True, 0.0)
    h.jail_bans(found, 1796205190.0)
    ev = h.runners["quiet"]._queue._queue[0]  # type: ignore[attr-defined]
    assert ev.address == "192.0.2.7" and ev.matches == () and runner.stats.bans == 1


def test_match_memory_forgets_the_oldest_offenders_in_chunks_like_one_at_a_time() -> None:
    # against the plain version (the oldest one forgotten per new offender): the same newest offenders
    # are kept, only up to a sixteenth fewer of them
    m = MatchMemory(max_hosts=32)
    plain: dict[int, str] = {}
    for i in range(500):
        host = A(f"10.0.{i >> 8}.{i & 255}")
        m.add(host, f"line {i}", {})
        if len(plain) >= 32:
            del plain[next(iter(plain))]
        plain[int(host)] = f"line {i}"
        kept = list(m._lines)
        assert 30 <= len(kept) <= 32 or i < 30
        assert kept == list(plain)[len(plain) - len(kept):]
    for i in range(40):  # the decided bans waiting for their actions are bounded the same way
        m.add(A(f"10.1.0.{i}"), "x", {})
        m.decided(A(f"10.1.0.{i}"), N(f"10.1.0.{i}/32"))
    assert 30 <= len(m._decided) <= 32 and m.take(N("10.1.0.39/32")) is not None
