"""A fail2ban action's life with a fake executor: actionstart once per jail before its bans, actionstop after
the queue drained, a reload's replacement started only after the old one stopped, failures counted and
audited without stopping bans, a stop bounded by its budget, and the `lifecycle: false` opt-out."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from pathlib import Path

import pytest

from nftblockd.actions.f2baction import F2bAction, load_action
from nftblockd.actions.hub import ActionHub, life_names
from nftblockd.actions.render import ActionEvent, CommandRun, Run, render_f2b_life
from nftblockd.actions.runner import ActionRunner, RunFailed
from nftblockd.config import ActionConfig, parse_config
from nftblockd.events import Ban
from nftblockd.service.logsetup import KeyValueFormatter
from tests.unit.test_actions_runner import until

ACTION = """[Definition]
actionstart = echo start <name> <fq-hostname> <ip>
actionstop = echo stop <name> <actname> <matches>
actionban = echo ban <ip> <name>
[Init]
name = default
"""


class Fake:
    """Records each run's script as its words; fails the runs whose script starts with one of `fail`;
    `gate` holds every run while cleared."""

    def __init__(self, *fail: str) -> None:
        self.runs: list[str] = []
        self.timeouts: list[float] = []
        self.fail = fail
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, run: Run) -> None:
        assert isinstance(run, CommandRun) and run.argv[:2] == ("/bin/sh", "-c")
        await self.gate.wait()
        script = run.argv[2]
        for var, value in run.env.items():  # what the shell would print (the values here are plain)
            script = script.replace(f'"${{{var}}}"', value)
        words = " ".join(script.split()[1:])  # without the `echo`
        self.runs.append(words)
        self.timeouts.append(run.timeout)
        if words.startswith(self.fail):
            raise RunFailed("boom", retry=False)


def action(tmp_path: Path, extra: str = "") -> F2bAction:
    p = tmp_path / "act.conf"
    p.write_text(ACTION.replace("[Init]", extra + "[Init]"))
    return load_action(p)


def ev(i: int, jail: str = "sshd") -> ActionEvent:
    return ActionEvent("ban", f"198.51.100.{i}", jail, "default", "jail", "r", 60.0, None, 0.0, 3)


def runner(tmp_path: Path, fake: Fake, names: tuple[str, ...] = ("sshd", "web"), extra: str = "",
           **kw: object) -> ActionRunner:
    cfg = ActionConfig("m", "fail2ban", file=str(tmp_path / "act.conf"), rate=1000.0, burst=1000, retries=0,
                       **kw)  # type: ignore[arg-type]
    return ActionRunner(cfg, {"m": action(tmp_path, extra)}, fake, names=names, host="h1.example.org")


async def test_start_once_per_jail_before_the_bans_and_stop_what_started(tmp_path: Path) -> None:
    fake = Fake()
    r = runner(tmp_path, fake)
    t = asyncio.create_task(r.run())
    r.submit(ev(1))  # queued while the starts run: never waited for
    await until(lambda: len(fake.runs) == 3)
    await r.idle()
    await r.start(("sshd", "web"))  # started already: nothing runs again
    t.cancel()
    await asyncio.gather(t, return_exceptions=True)
    await r.stop()
    await r.stop()  # stopped already: nothing
    # no event tag at start or stop (<ip>, <matches> empty); the jail's name and the host filled
    assert fake.runs == ["start sshd h1.example.org", "start web h1.example.org", "ban 198.51.100.1 sshd",
                         "stop sshd m", "stop web m"]
    assert (r.stats.runs, r.stats.failures) == (5, 0)


async def test_a_failing_actionstart_is_counted_and_audited_and_bans_still_run(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake = Fake("start")
    r = runner(tmp_path, fake)
    t = asyncio.create_task(r.run())
    with caplog.at_level(logging.INFO, "nftblockd.audit"):
        await until(lambda: len(fake.runs) == 2)
        r.submit(ev(1))
        await r.idle()
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        await r.stop()
    # fail2ban's marks: a jail whose start failed is stopped only if a ban ran for it (sshd, not web)
    assert fake.runs == ["start sshd h1.example.org", "start web h1.example.org", "ban 198.51.100.1 sshd",
                         "stop sshd m"]
    assert (r.stats.runs, r.stats.failures) == (4, 2)
    lines = [KeyValueFormatter("%(message)s").format(rec) for rec in caplog.records if rec.name == "nftblockd.audit"]
    assert lines == ["action failed action=m event=start jail=sshd attempts=1 error=boom",
                     "action failed action=m event=start jail=web attempts=1 error=boom"]  # no `address=""`


async def test_on_demand_the_start_comes_before_the_jails_first_ban(tmp_path: Path) -> None:
    fake = Fake()
    r = runner(tmp_path, fake, extra="actionstart_on_demand = true\n")
    t = asyncio.create_task(r.run())
    r.submit(ActionEvent("unban", "198.51.100.9", "sshd"))  # an unban starts nothing (as in fail2ban)
    for i in (1, 2):
        r.submit(ev(i, "web"))
    await until(lambda: len(fake.runs) == 3)
    await r.idle()
    t.cancel()
    await asyncio.gather(t, return_exceptions=True)
    await r.stop()
    assert fake.runs == ["start web h1.example.org", "ban 198.51.100.1 web", "ban 198.51.100.2 web", "stop web m"]


async def test_a_stop_is_bounded_by_its_budget(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake = Fake()
    r = runner(tmp_path, fake, concurrency=2)
    await r.start(r.names)
    fake.gate.clear()  # every actionstop hangs
    with caplog.at_level(logging.INFO, "nftblockd.audit"):
        await r.stop(budget=0.05)
    assert fake.runs == ["start sshd h1.example.org", "start web h1.example.org"]
    assert (r.stats.runs, r.stats.failures) == (4, 2)
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "nftblockd.audit"]
    assert lines == [f"action failed action=m event=stop jail={j} attempts=1 error=\"not done within the 0.05s "
                     "a stop gives actions\"" for j in ("sshd", "web")]
    fake.gate.set()
    await r.start(("sshd",))
    await r.stop(budget=0.5)
    assert fake.timeouts[-1] <= 0.5  # each run's own timeout is cut to what is left (30 s otherwise)


async def test_lifecycle_false_runs_only_the_bans(tmp_path: Path) -> None:
    fake = Fake()
    r = runner(tmp_path, fake, lifecycle=False)
    t = asyncio.create_task(r.run())
    r.submit(ev(1))
    await until(lambda: len(fake.runs) == 1)
    await r.idle()
    t.cancel()
    await asyncio.gather(t, return_exceptions=True)
    await r.stop()
    assert fake.runs == ["ban 198.51.100.1 sshd"]


def test_start_and_stop_keep_hostile_values_out_of_the_script(tmp_path: Path) -> None:
    host = "$(touch /tmp/x)`id`;'\""
    run = render_f2b_life(action(tmp_path), ActionConfig("m", "fail2ban"), "stop", "sshd", host, 1.0)
    assert run is not None
    assert host not in run.argv[2] and run.argv[2].startswith('echo stop sshd m "${NFTBLOCK_MATCHES}"')
    run = render_f2b_life(action(tmp_path), ActionConfig("m", "fail2ban"), "start", "sshd", host, 1.0)
    assert run is not None and host not in run.argv[2] and run.env["NFTBLOCK_FQ_HOSTNAME"] == host


# -- the hub: which names, and the order of starts and stops ---------------------------------------------

CFG = """
actions:
  m: {type: fail2ban, file: /x/act.conf, rate: 1000, burst: 1000, retries: 0}
  named: {type: fail2ban, file: /x/act.conf, options: {name: SSH}}
jails:
  sshd: {filter: sshd, journal: {matches: {_SYSTEMD_UNIT: ssh.service}}, actions: [m, named]}
  web: {filter: sshd, journal: {matches: {_SYSTEMD_UNIT: nginx.service}}, actions: [m, named]}
  off: {enabled: false, filter: sshd, journal: {matches: {_SYSTEMD_UNIT: x.service}}, actions: [m]}
"""


def f2b(tmp_path: Path) -> dict[str, F2bAction]:
    a = action(tmp_path)
    p = tmp_path / "act.conf"
    return {"m": a, "named": load_action(p, {"name": "SSH"})}


def test_an_action_lives_once_per_name_its_bans_carry(tmp_path: Path) -> None:
    cfg = parse_config(CFG)
    assert life_names(cfg, f2b(tmp_path)) == {"m": ("sshd", "web"), "named": ("SSH",)}


async def test_the_hub_starts_stops_and_replaces_in_fail2bans_order(tmp_path: Path) -> None:
    fake = Fake()
    acts = f2b(tmp_path)
    h = ActionHub(parse_config(CFG.replace(", named]", "]")), acts, fake)
    task = asyncio.create_task(h.run())
    await until(lambda: len(fake.runs) == 2)
    assert fake.runs == [f"start sshd {h.host}", f"start web {h.host}"]
    fake.runs.clear()

    # a reload that changes m: the old runner stops for both jails before the new one starts
    h.configure(parse_config(CFG.replace(", named]", "]").replace("retries: 0", "retries: 1")), acts)
    await until(lambda: len(fake.runs) == 4)
    assert fake.runs == ["stop sshd m", "stop web m", f"start sshd {h.host}", f"start web {h.host}"]
    fake.runs.clear()

    # a reload that takes m away from web: web's stop only; `named` is new: started (once, as SSH)
    new = CFG.replace("retries: 0", "retries: 1").replace("nginx.service}}, actions: [m, named]",
                                                          "nginx.service}}, actions: [named]")
    h.configure(parse_config(new), acts)
    await until(lambda: len(fake.runs) == 2)
    assert sorted(fake.runs) == sorted(["stop web m", f"start SSH {h.host}"])
    fake.runs.clear()

    # the daemon's stop: what is queued runs first, then every actionstop
    fake.gate.clear()
    h.jail_bans([Ban(ipaddress.ip_network(f"198.51.100.{i}/32"), "default", None, "jail", "r", "sshd")
                 for i in (1, 2)], 1000.0)
    stopping = asyncio.create_task(h.shutdown(5.0, 5.0))
    await until(lambda: h.runners["m"].queued() == 2)
    fake.gate.set()
    await stopping
    assert sorted(fake.runs[:4]) == ["ban 198.51.100.1 SSH", "ban 198.51.100.1 sshd", "ban 198.51.100.2 SSH",
                                     "ban 198.51.100.2 sshd"]
    assert sorted(fake.runs[4:]) == ["stop SSH named", "stop sshd m"]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def reload_with_three_queued(tmp_path: Path) -> tuple[Fake, ActionHub, asyncio.Task[None], ActionRunner]:
    """A running hub whose action m holds three bans (one running, held by the fake's gate), then a reload
    that changes m; returns the fake, the hub, its task and m's old runner."""
    fake = Fake()
    acts = f2b(tmp_path)
    cfg = CFG.replace(", named]", "]")
    h = ActionHub(parse_config(cfg), acts, fake)
    task = asyncio.create_task(h.run())
    await until(lambda: len(fake.runs) == 2)
    fake.runs.clear()
    fake.gate.clear()
    old = h.runners["m"]
    h.jail_bans([Ban(ipaddress.ip_network(f"198.51.100.{i}/32"), "default", None, "jail", "r", "sshd")
                 for i in (1, 2, 3)], 1000.0)
    await until(lambda: old.queued() == 3)
    h.configure(parse_config(cfg.replace("retries: 0", "retries: 1")), acts)  # m changed: a new runner
    return fake, h, task, old


async def test_a_reload_runs_what_the_old_runner_had_queued_before_its_stop(tmp_path: Path) -> None:
    fake, h, task, old = await reload_with_three_queued(tmp_path)
    for _ in range(50):  # the old runner's task would be cancelled by now, were it not draining
        await asyncio.sleep(0)
    fake.gate.set()
    await until(lambda: len(fake.runs) == 7)
    # the bans decided before the reload ran (with the old config), then the old stop, then the new start
    assert fake.runs == [f"ban 198.51.100.{i} sshd" for i in (1, 2, 3)] + [
        "stop sshd m", "stop web m", f"start sshd {h.host}", f"start web {h.host}"]
    assert h.runners["m"] is not old and "stopping" not in old.stats.skipped
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_reloads_drain_is_bounded_and_what_is_left_is_counted(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import nftblockd.actions.hub as hub_module

    monkeypatch.setattr(hub_module, "RELOAD_DRAIN", 0.0)  # no time to drain at all
    fake, h, task, old = await reload_with_three_queued(tmp_path)  # the action hangs: nothing can drain
    await until(lambda: old.stats.skipped.get("stopping", 0) == 2)  # one was running: cancelled, not queued
    fake.gate.set()
    await until(lambda: len(fake.runs) == 4)
    assert fake.runs == ["stop sshd m", "stop web m", f"start sshd {h.host}", f"start web {h.host}"]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_stop_cuts_a_reloads_drain_short_and_never_stops_what_never_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nftblockd.actions.hub as hub_module

    monkeypatch.setattr(hub_module, "RELOAD_DRAIN", 3600.0)  # were the drain not cut, the stop would wait it out
    fake, h, task, old = await reload_with_three_queued(tmp_path)  # the action hangs: nothing can drain
    stopping = asyncio.create_task(h.shutdown(0.0, 5.0))
    # the grace is over at once: the old runner's queue is counted as at a stop (one was running: cancelled)
    await until(lambda: old.stats.skipped.get("stopping", 0) == 2)
    fake.gate.set()
    await stopping
    # the old runner's actionstop ran; its replacement, cancelled while waiting for it, never started: no stop
    assert fake.runs == ["stop sshd m", "stop web m"]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
