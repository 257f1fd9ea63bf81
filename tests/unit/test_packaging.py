"""Packaging: the fail2ban actions (run by fail2ban's own classes), the .deb, and the Grafana dashboard.

The fail2ban tests load fail2ban from the Debian package (python3-fail2ban's files, imported into this
interpreter) and talk to a fake nftblockd control socket; the real fail2ban-server end to end is an
integration test. Bounds (BOUND) only stop a broken test from hanging.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ACTION_D = ROOT / "packaging" / "fail2ban" / "action.d"
ACTION_PY = ACTION_D / "nftblock.py"
BOUND = 30.0
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


# ==========================================================================================================
# fail2ban
# ==========================================================================================================

def _fail2ban_parent() -> Path | None:
    spec = importlib.util.find_spec("fail2ban")
    if spec is not None and spec.origin:
        return Path(spec.origin).parent.parent
    for d in ("/usr/lib/python3/dist-packages", "/usr/local/lib/python3/dist-packages"):
        if (Path(d) / "fail2ban" / "server" / "actions.py").exists():
            return Path(d)
    return None


class _LoggingSnapshot:
    """fail2ban patches the logging module on import (Logger._log, StreamHandler.flush, level names, a
    NOTICE level); this puts it back afterwards so no other test module sees fail2ban's logging."""

    def __init__(self) -> None:
        self.log = logging.Logger._log
        self.flush = logging.StreamHandler.flush
        self.level_to_name = dict(logging._levelToName)
        self.name_to_level = dict(logging._nameToLevel)
        self.module_attrs = set(vars(logging))
        self.logger_attrs = set(vars(logging.Logger))

    def restore(self) -> None:
        logging.Logger._log = self.log  # type: ignore[method-assign]
        logging.StreamHandler.flush = self.flush  # type: ignore[method-assign]
        logging._levelToName.clear()
        logging._levelToName.update(self.level_to_name)
        logging._nameToLevel.clear()
        logging._nameToLevel.update(self.name_to_level)
        for name in set(vars(logging)) - self.module_attrs:
            delattr(logging, name)
        for name in set(vars(logging.Logger)) - self.logger_attrs:
            delattr(logging.Logger, name)


@pytest.fixture(scope="module")
def f2b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """fail2ban's server classes, from the installed fail2ban (only it; not the rest of dist-packages)."""
    parent = _fail2ban_parent()
    if parent is None:
        pytest.skip("fail2ban is not installed")
    shim = None
    if importlib.util.find_spec("fail2ban") is None:
        shim = str(tmp_path_factory.mktemp("f2b"))
        (Path(shim) / "fail2ban").symlink_to(parent / "fail2ban")
        sys.path.append(shim)
    snapshot = _LoggingSnapshot()
    with warnings.catch_warnings():
        # fail2ban 1.0 imports sre_constants, deprecated since Python 3.11: its problem, not ours
        warnings.simplefilter("ignore", DeprecationWarning)
        import fail2ban.client.actionreader
        import fail2ban.server.action
        import fail2ban.server.actions
        import fail2ban.server.jail
        import fail2ban.server.ticket
    ns = ModuleType("f2b")
    ns.ActionReader = fail2ban.client.actionreader.ActionReader  # type: ignore[attr-defined]
    ns.ActionBase = fail2ban.server.action.ActionBase  # type: ignore[attr-defined]
    ns.Actions = fail2ban.server.actions.Actions  # type: ignore[attr-defined]
    ns.Jail = fail2ban.server.jail.Jail  # type: ignore[attr-defined]
    ns.FailTicket = fail2ban.server.ticket.FailTicket  # type: ignore[attr-defined]
    ns.BanTicket = fail2ban.server.ticket.BanTicket  # type: ignore[attr-defined]
    yield ns
    snapshot.restore()
    if shim is not None:
        sys.path.remove(shim)


def new_jail(f2b: Any, name: str = "sshd") -> Any:
    jail = f2b.Jail(name, backend="polling")
    jail.actions.setBanTime(600)
    return jail


# -- the command action: nftblock.conf ---------------------------------------------------------------------

FAKE_CLI = """#!{python}
# records its arguments, one JSON list per call
import json, os, sys
with open(os.environ["NFTBLOCK_RECORD"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
"""


@pytest.fixture
def conf_action(f2b: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[Any, Any]]:
    """nftblock.conf read by fail2ban's ActionReader and applied to a CommandAction, with a fake `nftblock`
    on PATH that records how it is called."""
    (tmp_path / "etc" / "action.d").mkdir(parents=True)
    shutil.copy(ACTION_D / "nftblock.conf", tmp_path / "etc" / "action.d")
    (tmp_path / "bin").mkdir()
    cli = tmp_path / "bin" / "nftblock"
    cli.write_text(FAKE_CLI.format(python=sys.executable))
    cli.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("NFTBLOCK_RECORD", str(tmp_path / "calls"))

    def make(jail_opts: dict[str, str] | None = None) -> tuple[Any, Any]:
        reader = f2b.ActionReader("nftblock", "sshd", dict(jail_opts or {}), basedir=str(tmp_path / "etc"))
        assert reader.read()
        reader.getOptions({})
        jail = new_jail(f2b)
        jail.actions.add("nftblock")
        action = jail.actions["nftblock"]
        for cmd in reader.convert()[1:]:  # what fail2ban-client sends, applied as the server does
            assert cmd[0] in ("multi-set", "set")
            pairs = cmd[4] if cmd[0] == "multi-set" else [cmd[4:6]]
            for opt, value in pairs:
                setattr(action, opt, value)
        return jail, action

    return make


def cli_calls(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "calls"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def ban_info(f2b: Any, jail: Any, ip: str, bantime: int | None = None, age: float = 0.0) -> Any:
    ticket = f2b.BanTicket(ip, time.time() - age)
    if bantime is not None:
        ticket.setBanTime(bantime)
    return f2b.Actions.ActionInfo(ticket, jail)


SOCK = ["--socket", "/run/nftblockd/control.sock"]
AUDIT = ["--jail", "sshd", "--origin", "fail2ban"]


def test_conf_action_commands(f2b: Any, conf_action: Callable[..., tuple[Any, Any]], tmp_path: Path) -> None:
    jail, action = conf_action({"port": "ssh", "protocol": "tcp"})  # as jail.conf's action_ passes them
    action.start()
    action.ban(ban_info(f2b, jail, "192.0.2.1"))
    action.ban(ban_info(f2b, jail, "2001:db8::1", bantime=-1))
    action.unban(ban_info(f2b, jail, "192.0.2.1"))
    assert cli_calls(tmp_path) == [
        [*SOCK, "status"],
        [*SOCK, "ban", "192.0.2.1", "--timeout", "600s", "--set", "default", "--comment", "f2b sshd", *AUDIT],
        [*SOCK, "ban", "2001:db8::1", "--timeout", "permanent", "--set", "default", "--comment", "f2b sshd",
         *AUDIT],
        [*SOCK, "unban", "192.0.2.1", "--set", "default", *AUDIT],
    ]


def test_conf_action_blocklist_socket_and_prolong(f2b: Any, conf_action: Callable[..., tuple[Any, Any]],
                                                  tmp_path: Path) -> None:
    jail, action = conf_action({"nftblock_set": "fail2ban", "nftblock_socket": "/tmp/nb.sock"})
    action.start()
    assert action._prolongable
    action.ban(ban_info(f2b, jail, "192.0.2.7"))
    action.prolong(ban_info(f2b, jail, "192.0.2.7", bantime=7200))  # bantime.increment lengthened it
    action.unban(ban_info(f2b, jail, "192.0.2.7"))
    sock = ["--socket", "/tmp/nb.sock"]
    assert cli_calls(tmp_path)[1:] == [
        [*sock, "ban", "192.0.2.7", "--timeout", "600s", "--set", "fail2ban", "--comment", "f2b sshd", *AUDIT],
        [*sock, "ban", "192.0.2.7", "--timeout", "7200s", "--set", "fail2ban", "--comment", "f2b sshd", *AUDIT],
        [*sock, "unban", "192.0.2.7", "--set", "fail2ban", *AUDIT],
    ]


@pytest.mark.parametrize(("on_stop", "calls"), [
    ({}, []),  # keep (the default): the bans stay in nftblockd and expire in the kernel
    ({"nftblock_on_stop": "flush"}, [[*SOCK, "unban", "--all", "--set", "default", *AUDIT]]),
])
def test_conf_action_stop_is_one_call(f2b: Any, conf_action: Callable[..., tuple[Any, Any]], tmp_path: Path,
                                      on_stop: dict[str, str], calls: list[list[str]]) -> None:
    jail, action = conf_action(on_stop)
    action.start()
    for i in range(5):
        jail.actions.addBannedIP(f"192.0.2.{i + 1}")
    assert len(cli_calls(tmp_path)) == 1 + 5
    # What fail2ban's actions thread does when the jail stops, before actionstop: flush, or else one unban
    # per ticket (1000 processes for 1000 bans).
    jail.actions._Actions__flushBan(stop=True)
    action.stop()
    assert cli_calls(tmp_path)[6:] == calls


def test_conf_action_says_when_nftblock_is_not_on_path(f2b: Any, conf_action: Callable[..., tuple[Any, Any]],
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _jail, action = conf_action()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    seen: list[str] = []

    class Record(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Record(logging.ERROR)
    logger = logging.getLogger("fail2ban.utils")  # logs a failed command's stderr
    logger.addHandler(handler)
    try:
        with pytest.raises(RuntimeError):
            action.start()
    finally:
        logger.removeHandler(handler)
    assert any("'nftblock' is not on fail2ban's PATH" in e for e in seen), seen
    assert cli_calls(tmp_path) == []


# -- the Python action: nftblock.py ------------------------------------------------------------------------

Reply = dict[str, Any] | None  # None: drop the connection without answering


class FakeNftblockd:
    """A control socket that records requests and answers with `respond(request)` (default: success)."""

    def __init__(self, path: str, respond: Callable[[dict[str, Any]], Reply] | None = None) -> None:
        self.path = path
        self.respond = respond or self.ok
        self.requests: list[dict[str, Any]] = []
        self.connections = 0
        self.cond = threading.Condition()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @staticmethod
    def ok(req: dict[str, Any]) -> Reply:
        targets = [t["target"] if isinstance(t, dict) else t for t in req["args"].get("targets", [])]
        result = {"applied": targets, "refused": []} if req["cmd"] == "ban" else {"removed": targets,
                                                                                     "not_found": []}
        return {"v": 1, "id": req["id"], "ok": True, "result": result}

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.cond:
                self.connections += 1
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as f:
            for line in f:
                req = json.loads(line)
                reply = self.respond(req)
                with self.cond:
                    self.requests.append(req)
                    self.cond.notify_all()
                if reply is None:
                    return
                f.write(json.dumps(reply).encode() + b"\n")
                f.flush()

    def until(self, predicate: Callable[[], bool]) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, BOUND), self.requests

    def targets(self, cmd: str) -> list[str]:
        with self.cond:
            return [t["target"] if isinstance(t, dict) else t
                    for r in self.requests if r["cmd"] == cmd for t in r["args"]["targets"]]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def sock_path() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="nbd")  # short: sun_path holds 108 bytes
    yield os.path.join(d, "control.sock")
    shutil.rmtree(d)


@pytest.fixture
def server(sock_path: str) -> Iterator[FakeNftblockd]:
    s = FakeNftblockd(sock_path)
    yield s
    s.close()


def load_action(f2b: Any, jail: Any, **options: str) -> Any:
    with warnings.catch_warnings():  # fail2ban 1.0 loads modules with the deprecated load_module()
        warnings.simplefilter("ignore", DeprecationWarning)
        jail.actions.add("nftblock", str(ACTION_PY), options)
    return jail.actions["nftblock"]


def info(ip: str, bantime: int = 600, age: float = 0.0) -> dict[str, Any]:
    """The three keys of fail2ban's ActionInfo the action reads."""
    return {"ip": ip, "bantime": bantime, "time": time.time() - age}


def test_loads_through_fail2ban_with_jail_conf_options(f2b: Any, server: FakeNftblockd,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    jail = new_jail(f2b)
    with caplog.at_level(logging.WARNING):
        action = load_action(f2b, jail, socket=server.path, port="ssh", protocol="tcp", chain="INPUT",
                             sett="typo")
    assert isinstance(action, f2b.ActionBase)
    assert type(action).__name__ == "NftblockAction"
    assert "ignoring unknown options sett" in caplog.text
    assert (action.set, action.comment, action.socket_path) == ("default", "f2b sshd", server.path)


def test_thousands_of_restored_tickets_are_a_few_requests(f2b: Any, server: FakeNftblockd) -> None:
    jail = new_jail(f2b)
    action = load_action(f2b, jail, socket=server.path)
    # fail2ban queues restored tickets before its actions thread runs; start() comes with that thread.
    ips = [f"198.51.{i // 250}.{i % 250 + 1}" for i in range(2500)]
    now = time.time()
    jail.actions._Actions__checkBan([f2b.FailTicket(ip, now - 30) for ip in ips])
    action.start()
    server.until(lambda: len(server.targets("ban")) >= 2500)
    action.stop()
    assert [len(r["args"]["targets"]) for r in server.requests] == [1000, 1000, 500]
    assert server.targets("ban") == ips
    first = server.requests[0]["args"]
    assert {k: first[k] for k in ("set", "comment", "origin")} == {"set": "default", "comment": "f2b sshd",
                                                                   "origin": "fail2ban"}
    assert first["targets"][0]["jail"] == "sshd"
    assert all(569 <= t["timeout"] <= 571 for r in server.requests for t in r["args"]["targets"])
    assert server.connections == 1


def test_live_bans_are_batched_and_each_arrives_once(f2b: Any, server: FakeNftblockd) -> None:
    jail = new_jail(f2b)
    action = load_action(f2b, jail, socket=server.path)
    action.start()
    ips = [f"203.0.113.{i}" for i in range(1, 201)]
    for ip in ips:
        action.ban(info(ip))
    server.until(lambda: len(server.targets("ban")) >= 200)
    action.stop()
    assert sorted(server.targets("ban")) == sorted(ips)
    assert len(server.requests) < len(ips)


def test_ban_times(f2b: Any, server: FakeNftblockd) -> None:
    jail = new_jail(f2b)
    action = load_action(f2b, jail, socket=server.path)
    action.ban(info("192.0.2.1", bantime=-1))
    action.ban(info("192.0.2.2", bantime=600, age=500))  # restored: fail2ban unbans it in 100 s
    action.ban(info("192.0.2.3", bantime=600, age=700))  # already due: the kernel keeps it a second
    action.start()
    server.until(lambda: len(server.targets("ban")) == 3)
    action.stop()
    timeouts = {t["target"]: t["timeout"] for t in server.requests[0]["args"]["targets"]}
    assert timeouts["192.0.2.1"] == "permanent"
    assert 99 <= timeouts["192.0.2.2"] <= 101
    assert timeouts["192.0.2.3"] == 1


def test_one_address_is_never_reordered(f2b: Any, server: FakeNftblockd) -> None:
    jail = new_jail(f2b)
    action = load_action(f2b, jail, socket=server.path)
    a, b, c = "192.0.2.1", "192.0.2.2", "192.0.2.3"
    action.ban(info(a))
    action.ban(info(b))
    action.unban(info(a))
    action.ban(info(c))  # unrelated: may join the first request
    action.ban(info(a))  # must come after the unban of a
    action.start()
    server.until(lambda: len(server.requests) == 3)
    action.stop()
    got = [(r["cmd"], [t["target"] if isinstance(t, dict) else t for t in r["args"]["targets"]])
           for r in server.requests]
    assert got == [("ban", [a, b, c]), ("unban", [a]), ("ban", [a])]
    assert server.requests[1]["args"] == {"targets": [a], "set": "default", "origin": "fail2ban", "jail": "sshd"}


def test_a_dropped_connection_is_reopened_and_the_request_sent_again(
        f2b: Any, sock_path: str, caplog: pytest.LogCaptureFixture) -> None:
    dropped: list[int] = []

    def flaky(req: dict[str, Any]) -> Reply:
        if not dropped:
            dropped.append(req["id"])
            return None
        return FakeNftblockd.ok(req)

    server = FakeNftblockd(sock_path, flaky)
    try:
        jail = new_jail(f2b)
        action = load_action(f2b, jail, socket=sock_path)
        with caplog.at_level(logging.INFO):
            action.start()
            action.ban(info("192.0.2.9"))
            server.until(lambda: len(server.requests) == 2)
            action.ban(info("192.0.2.10"))
            server.until(lambda: len(server.requests) == 3)
            action.stop()
        assert server.targets("ban") == ["192.0.2.9", "192.0.2.9", "192.0.2.10"]
        assert server.connections == 2
        assert caplog.text.count("cannot reach nftblockd") == 1
        assert caplog.text.count("answers again") == 1
    finally:
        server.close()


def test_bans_wait_for_nftblockd_to_start(f2b: Any, sock_path: str, caplog: pytest.LogCaptureFixture) -> None:
    jail = new_jail(f2b)
    action = load_action(f2b, jail, socket=sock_path)
    logged = threading.Event()

    class Flag(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "cannot reach nftblockd" in record.getMessage():
                logged.set()

    flag = Flag()
    logging.getLogger().addHandler(flag)
    try:
        action.start()
        action.ban(info("192.0.2.20"))
        assert logged.wait(BOUND)
        server = FakeNftblockd(sock_path)  # nftblockd comes up
        try:
            server.until(lambda: server.targets("ban") == ["192.0.2.20"])
            action.stop()
        finally:
            server.close()
    finally:
        logging.getLogger().removeHandler(flag)


def test_unavailable_is_retried_and_final_errors_are_not(f2b: Any, sock_path: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    answers = iter(["unavailable", "ok", "unknown_set"])

    def respond(req: dict[str, Any]) -> Reply:
        kind = next(answers, "ok")
        if kind == "ok":
            return FakeNftblockd.ok(req)
        return {"v": 1, "id": req["id"], "ok": False, "error": {"code": kind, "message": f"{kind} (test)"}}

    server = FakeNftblockd(sock_path, respond)
    try:
        jail = new_jail(f2b)
        action = load_action(f2b, jail, socket=sock_path)
        action.start()
        with caplog.at_level(logging.ERROR):
            action.ban(info("192.0.2.30"))
            server.until(lambda: len(server.requests) == 2)  # unavailable, then accepted
            action.ban(info("192.0.2.31"))
            server.until(lambda: len(server.requests) == 3)  # unknown_set: logged, not sent again
            action.stop()
        assert server.targets("ban") == ["192.0.2.30", "192.0.2.30", "192.0.2.31"]
        assert "refused to ban 1 addresses: unknown_set: unknown_set (test)" in caplog.text
        assert "unavailable" not in caplog.text
    finally:
        server.close()


def test_refused_addresses_are_logged(f2b: Any, sock_path: str, caplog: pytest.LogCaptureFixture) -> None:
    def respond(req: dict[str, Any]) -> Reply:
        t = req["args"]["targets"][0]["target"]
        return {"v": 1, "id": req["id"], "ok": True, "result": {"applied": [], "refused": [
            {"target": t, "code": "allowlisted", "message": f"{t} is inside the allowlist entry 10/8"}]}}

    server = FakeNftblockd(sock_path, respond)
    try:
        jail = new_jail(f2b)
        action = load_action(f2b, jail, socket=sock_path)
        action.start()
        with caplog.at_level(logging.WARNING):
            action.ban(info("10.1.2.3"))
            server.until(lambda: len(server.requests) == 1)
            action.stop()
        assert "nftblockd refused to ban 10.1.2.3 (allowlisted: 10.1.2.3 is inside" in caplog.text
    finally:
        server.close()


def test_sync_mode_waits_for_the_answer_and_raises_on_refusal(f2b: Any, sock_path: str) -> None:
    def respond(req: dict[str, Any]) -> Reply:
        t = req["args"]["targets"][0]["target"]
        refused = [{"target": t, "code": "allowlisted", "message": "allowlisted"}] * t.startswith("10.")
        return {"v": 1, "id": req["id"], "ok": True, "result": {"applied": [], "refused": refused}}

    server = FakeNftblockd(sock_path, respond)
    try:
        jail = new_jail(f2b)
        action = load_action(f2b, jail, socket=sock_path, sync="yes")
        action.start()
        action.ban(info("192.0.2.40"))
        assert server.targets("ban") == ["192.0.2.40"]  # already answered when ban() returned
        with pytest.raises(RuntimeError, match=r"ban 10\.0\.0\.1: allowlisted"):
            action.ban(info("10.0.0.1"))
        action.stop()
    finally:
        server.close()


@pytest.mark.parametrize(("keep", "active", "unbanned"), [
    ("true", False, []),  # fail2ban stops: bans stay in nftblockd and expire in the kernel
    ("false", False, ["192.0.2.51", "192.0.2.52"]),  # fail2ban's usual stop: all unbanned, one request
    ("true", True, ["192.0.2.51", "192.0.2.52"]),  # `fail2ban-client unban --all` while running
])
def test_flush(f2b: Any, server: FakeNftblockd, keep: str, active: bool, unbanned: list[str]) -> None:
    jail = new_jail(f2b)
    action = load_action(f2b, jail, socket=server.path, keep_on_stop=keep)
    action.start()
    for ip in ("192.0.2.50", "192.0.2.51", "192.0.2.52"):
        action.ban(info(ip))
    action.unban(info("192.0.2.50"))
    server.until(lambda: len(server.targets("unban")) == 1)
    jail.actions.active = active
    assert action.flush() is True  # fail2ban skips its one-by-one unbans
    action.stop()
    assert server.targets("unban") == ["192.0.2.50", *unbanned]
    assert len(server.requests) == (3 if unbanned else 2)


def test_stop_is_bounded_when_nftblockd_is_gone(f2b: Any, sock_path: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    jail = new_jail(f2b)
    action = load_action(f2b, jail, socket=sock_path, stop_timeout="0.2")
    action.start()
    action.ban(info("192.0.2.60"))
    with caplog.at_level(logging.ERROR):
        action.stop()
    assert "cannot reach nftblockd" in caplog.text
    assert "stopped with 1 bans/unbans not delivered to nftblockd" in caplog.text


def test_a_full_queue_pushes_back(f2b: Any, sock_path: str) -> None:
    jail = new_jail(f2b)
    action = load_action(f2b, jail, socket=sock_path, queue_max="2", request_timeout="0.05")
    action.ban(info("192.0.2.70"))
    action.ban(info("192.0.2.71"))
    with pytest.raises(RuntimeError, match="2 requests wait for nftblockd"):
        action.ban(info("192.0.2.72"))


def test_fail2ban_reload_keeps_the_action_and_applies_new_options(f2b: Any, server: FakeNftblockd) -> None:
    jail = new_jail(f2b)
    action = load_action(f2b, jail, socket=server.path)
    action.start()
    jail.actions.reload(begin=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        jail.actions.add("nftblock", str(ACTION_PY), {"socket": server.path, "set": "fail2ban"}, reload=True)
    jail.actions.reload(begin=False)
    assert jail.actions["nftblock"] is action
    action.ban(info("192.0.2.80"))
    server.until(lambda: len(server.requests) == 1)
    action.stop()
    assert server.requests[0]["args"]["set"] == "fail2ban"


def test_ban_timeout_rounding(f2b: Any, server: FakeNftblockd) -> None:
    action = load_action(f2b, new_jail(f2b), socket=server.path)
    ban_timeout = sys.modules[type(action).__module__].ban_timeout
    assert ban_timeout(-1, 0, 100) == "permanent"
    assert ban_timeout("600", 1000.0, 1000.0) == 600
    assert ban_timeout(600, 1000.0, 1000.5) == 600  # rounded up: never shorter than fail2ban's
    assert ban_timeout(600, 1000.0, 1700.0) == 1


# ==========================================================================================================
# the .deb
# ==========================================================================================================

dpkg_deb = shutil.which("dpkg-deb")
needs_dpkg = pytest.mark.skipif(dpkg_deb is None, reason="dpkg-deb is not installed")
DEBIAN_PYTHON = Path("/usr/bin/python3")
ARCH = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                      check=False).stdout.strip() if shutil.which("dpkg") else ""
CORE = "/usr/lib/nftblockd/nftblockd/detect/_scan.abi3.so"


@pytest.fixture(scope="module")
def deb(built_deb: Path) -> Path:
    assert built_deb.name == f"nftblockd_{PROJECT['version']}_{ARCH}.deb"  # architecture-specific: native core
    return built_deb


@pytest.fixture(scope="module")
def contents(deb: Path) -> dict[str, tuple[str, str]]:
    """Path in the package → (mode string, owner/group)."""
    assert dpkg_deb
    listing = subprocess.run([dpkg_deb, "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    out = {}
    for line in listing.splitlines():
        mode, owner, _size, _date, _time, name = line.split(None, 5)
        out["/" + name.removeprefix("./").split(" -> ")[0].rstrip("/")] = (mode, owner)
    return out


@pytest.fixture(scope="module")
def extracted(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert dpkg_deb
    root = tmp_path_factory.mktemp("root")
    subprocess.run([dpkg_deb, "-x", str(deb), str(root)], check=True)
    subprocess.run([dpkg_deb, "-e", str(deb), str(root / "DEBIAN")], check=True)
    return root


def control_fields(deb: Path) -> dict[str, str]:
    assert dpkg_deb
    text = subprocess.run([dpkg_deb, "-f", str(deb)], capture_output=True, text=True, check=True).stdout
    return {k: v.strip() for k, v in re.findall(r"^(\S+):(.*)$", text, re.M)}


def unit_service(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


@needs_dpkg
def test_control_fields(deb: Path) -> None:
    f = control_fields(deb)
    assert (f["Package"], f["Version"], f["Architecture"]) == ("nftblockd", PROJECT["version"], ARCH)
    depends = [d.strip() for d in f["Depends"].split(",")]
    assert "python3 (>= 3.11)" in depends
    assert {"python3-systemd", "python3-yaml", "adduser"} <= set(depends)
    # what the native core links, with the versions dpkg-shlibdeps derives from the symbols it uses
    assert any(re.fullmatch(r"libpcre2-8-0 \(>= [\d.]+\)", d) for d in depends), depends
    assert any(d.startswith("libc6 (>= ") for d in depends), depends
    assert int(f["Installed-Size"]) > 0


@needs_dpkg
def test_files_land_where_the_unit_and_fail2ban_expect_them(contents: dict[str, tuple[str, str]]) -> None:
    for path in ("/usr/bin/nftblockd", "/usr/bin/nftblock"):
        assert contents[path][0] == "-rwxr-xr-x", path
    for path in ("/usr/lib/systemd/system/nftblockd.service", "/usr/lib/sysusers.d/nftblockd.conf",
                 "/etc/nftblockd/nftblockd.yaml", "/etc/fail2ban/action.d/nftblock.conf",
                 "/etc/fail2ban/action.d/nftblock.py", "/usr/lib/nftblockd/nftblockd/__init__.py",
                 "/usr/lib/nftblockd/nftblockd/py.typed", "/usr/share/doc/nftblockd/copyright",
                 "/usr/share/doc/nftblockd/examples/feeds.conf",
                 "/usr/share/doc/nftblockd/examples/grafana-dashboard.json", CORE):
        assert contents[path][0] == "-rw-r--r--", path
    assert {owner for _mode, owner in contents.values()} == {"root/root"}
    assert not [p for p in contents if "__pycache__" in p or p.endswith(".pyc")]  # postinst compiles
    assert not [p for p in contents if p.startswith("/usr/lib/nftblockd/bin")]
    ours = {str(p.relative_to(ROOT)) for p in (ROOT / "nftblockd").rglob("*.py")
            if "__pycache__" not in p.parts}
    lib = "/usr/lib/nftblockd/"
    shipped = {p.removeprefix(lib) for p in contents if p.startswith(lib + "nftblockd/")}
    assert ours <= shipped


@needs_dpkg
def test_the_unit_finds_its_binary_and_config(extracted: Path) -> None:
    shipped = (extracted / "usr/lib/systemd/system/nftblockd.service").read_text()
    assert shipped == (ROOT / "systemd" / "nftblockd.service").read_text()
    service = unit_service(shipped)
    for line in service["ExecStart"] + service["ExecReload"]:
        binary = line.split()[0].lstrip("-@:+!")
        if binary.startswith("/usr/bin/nftblock"):
            assert (extracted / binary.lstrip("/")).is_file(), binary
        for arg in line.split()[1:]:
            if arg.startswith("/etc/"):
                assert (extracted / arg.lstrip("/")).is_file(), arg
    sysusers = (extracted / "usr/lib/sysusers.d/nftblockd.conf").read_text()
    assert re.search(rf"^u {service['User'][0]} ", sysusers, re.M)


@needs_dpkg
def test_conffiles_are_exactly_the_files_under_etc(extracted: Path,
                                                   contents: dict[str, tuple[str, str]]) -> None:
    conffiles = set((extracted / "DEBIAN" / "conffiles").read_text().split())
    etc_files = {p for p, (mode, _) in contents.items() if p.startswith("/etc/") and mode.startswith("-")}
    assert conffiles == etc_files


@needs_dpkg
def test_the_example_config_is_shipped_and_valid(extracted: Path) -> None:
    source = ROOT / "config" / "nftblockd.yaml"
    if not source.exists():
        pytest.skip("config/nftblockd.yaml is not written yet (the package was built with a placeholder)")
    shipped = extracted / "etc/nftblockd/nftblockd.yaml"
    assert shipped.read_bytes() == source.read_bytes()
    from nftblockd.config import load_config
    cfg = load_config(shipped)
    assert cfg.control.socket.startswith("/run/nftblockd/")
    assert cfg.state_dir == "/var/lib/nftblockd"


@needs_dpkg
def test_maintainer_scripts(extracted: Path) -> None:
    for name in ("postinst", "prerm", "postrm"):
        script = extracted / "DEBIAN" / name
        assert script.stat().st_mode & stat.S_IXUSR, name
        subprocess.run(["sh", "-n", str(script)], check=True)
        text = script.read_text()
        # deb-systemd-helper/-invoke are optional (containers, chroots without init-system-helpers)
        for call in re.findall(r"^\s*(deb-systemd-(?:helper|invoke)) ", text, re.M):
            assert f"command -v {call}" in text, (name, call)


def debian_python_or_skip() -> Path:
    if not DEBIAN_PYTHON.exists():
        pytest.skip("/usr/bin/python3 is missing")
    version = subprocess.run([str(DEBIAN_PYTHON), "-c", "import sys; print(sys.version_info >= (3, 11))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    if version != "True":
        pytest.skip("/usr/bin/python3 is older than 3.11")
    return DEBIAN_PYTHON


@needs_dpkg
def test_bundled_and_debian_dependencies_import_with_the_system_python(extracted: Path) -> None:
    python = debian_python_or_skip()
    lib = extracted / "usr/lib/nftblockd"
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import asyncinotify, prometheus_client, yaml, systemd.journal, systemd.daemon\n"
        "import nftblockd, nftblockd.service.logsetup, nftblockd.service.sdnotify, nftblockd.config\n"
        "from nftblockd.detect import _scan, native\n"
        "assert native.available(), native.describe()  # the native core loads in the system's python\n"
        "for m in (asyncinotify, prometheus_client, nftblockd, _scan):\n"
        "    assert m.__file__.startswith(sys.argv[1]), m.__file__  # ours, not another copy\n"
        "print('ok')\n"
    )
    proc = subprocess.run([str(python), "-I", "-c", probe, str(lib)], capture_output=True, text=True,
                          check=False)
    if "No module named 'systemd'" in proc.stderr or "No module named 'yaml'" in proc.stderr:
        pytest.skip("python3-systemd / python3-yaml (the package's Depends) are not installed here")
    assert proc.stdout == "ok\n", proc.stderr


@needs_dpkg
def test_the_native_core_loads_with_the_system_python(extracted: Path) -> None:
    python = debian_python_or_skip()
    lib = extracted / "usr/lib/nftblockd"
    probe = ("import sys; sys.path.insert(0, sys.argv[1])\n"
             "from nftblockd.detect import _scan, native\n"
             "assert _scan.__file__.startswith(sys.argv[1]), _scan.__file__\n"
             "print(native.describe())\n")
    proc = subprocess.run([str(python), "-I", "-B", "-c", probe, str(lib)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0 and proc.stdout.startswith("native core, PCRE2"), proc.stdout + proc.stderr


@needs_dpkg
def test_entry_scripts_run(extracted: Path) -> None:
    debian_python_or_skip()
    for name, target in PROJECT["scripts"].items():
        script = extracted / "usr/bin" / name
        text = script.read_text()
        module, func = target.split(":")
        assert text.startswith("#!/usr/bin/python3 -IS\n" if name == "nftblock" else "#!/usr/bin/python3 -I\n")
        assert f"from {module} import {func}\n" in text
        if not (ROOT / (module.replace(".", "/") + ".py")).exists():
            pytest.skip(f"{module} is not written yet")
        # Point the script at the extracted tree instead of /usr/lib/nftblockd, then run it as installed.
        script.write_text(text.replace('"/usr/lib/nftblockd"', repr(str(extracted / "usr/lib/nftblockd"))))
        proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=False)
        if "No module named 'systemd'" in proc.stderr or "No module named 'yaml'" in proc.stderr:
            pytest.skip("python3-systemd / python3-yaml are not installed here")
        assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stdout + proc.stderr
    config = extracted / "etc/nftblockd/nftblockd.yaml"
    if (ROOT / "config" / "nftblockd.yaml").exists():
        proc = subprocess.run([str(extracted / "usr/bin/nftblockd"), "--check-config", str(config)],
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_dpkg
def test_the_package_carries_the_docs_and_pages_it_names(extracted: Path) -> None:
    # Every docs/*.md file the shipped config, the README and the unit name is in /usr/share/doc/nftblockd/docs,
    # and every man: and file: page of the unit's Documentation= is in the package.
    doc = extracted / "usr/share/doc/nftblockd"
    named = set()
    for text in ((extracted / "etc/nftblockd/nftblockd.yaml").read_text(), (doc / "README.md").read_text(),
                 (extracted / "usr/lib/systemd/system/nftblockd.service").read_text()):
        named |= set(re.findall(r"\bdocs/([a-z0-9-]+\.md)", text))
    assert {"actions.md", "fleet.md", "packaging.md"} <= named
    missing = sorted(n for n in named if not (doc / "docs" / n).is_file())
    assert missing == [], missing
    unit = (extracted / "usr/lib/systemd/system/nftblockd.service").read_text()
    pages = [p for line in unit.splitlines() if line.startswith("Documentation=")
             for p in line.split("=", 1)[1].split()]
    assert any(p.startswith("man:") for p in pages), pages
    for p in pages:
        if p.startswith("man:"):
            name, section = re.fullmatch(r"man:([\w.-]+)\((\d)\)", p).groups()  # type: ignore[union-attr]
            assert (extracted / f"usr/share/man/man{section}/{name}.{section}.gz").is_file(), p
        else:
            assert p.startswith("file:/") and (extracted / p.removeprefix("file:/")).is_file(), p
