"""`nftblock` end to end: main() (in a worker thread) and the console script against a real ControlServer
whose handler is the daemon's real ControlAPI, on a real Enforcer over the in-memory kernel
(tests/helpers/apirig.py). Exit codes: 0 ok, 1 failed, 2 bad usage; failures are one stderr line.
"""

from __future__ import annotations

import asyncio
import binascii
import errno as E
import io
import ipaddress
import json
import re
import shutil
import sys
import tempfile
import types
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nftblockd import __version__
from nftblockd.addr import AddressError, format_target, parse_target
from nftblockd.cli.main import main
from nftblockd.cli.targets import canonical_target
from nftblockd.control.protocol import encode_error
from nftblockd.control.server import ControlServer, Peer
from nftblockd.durations import PERMANENT, Permanent
from nftblockd.state.f2bimport import refusal
from tests.helpers.apirig import ApiRig, FakeFeeds, api_rig, serve

NOW = 1_700_000_000.0
CONFIG = """
blocklists:
  default: {timeout: 1h}
  web: {timeout: 10m}
allowlist: [10.0.0.0/8]
allowlist_self: false
"""
SCRIPT = Path(sys.executable).with_name("nftblock")
FEEDS = [{"name": "spamhaus", "entries": 1234, "last_success": 1.0, "next_refresh": None, "error": None}]
JAILS = [{"name": "sshd", "bans": 2, "failures": 10}]  # the daemon's part of `status` (its jail runners)


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="nbcli-", dir="/tmp"))  # short: UNIX socket paths stop at 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def rig() -> AsyncIterator[ApiRig]:
    async with api_rig(CONFIG, feeds=FakeFeeds(FEEDS), status_extra=lambda: {"jails": JAILS}, now=NOW) as r:
        yield r


@pytest.fixture
async def sock(sock_dir: Path, rig: ApiRig) -> AsyncIterator[Path]:
    async with serve(rig, sock_dir / "control.sock") as path:
        yield path


async def nftblock(*argv: str, sock: Path | None = None, stdin: str = "", env: dict[str, str] | None = None,
                   ) -> Result:
    out, err = io.StringIO(), io.StringIO()
    args = ["--socket", str(sock), *argv] if sock else list(argv)
    code = await asyncio.to_thread(main, args, stdin=io.StringIO(stdin), stdout=out, stderr=err,
                                   environ=env or {})
    return Result(code, out.getvalue(), err.getvalue())


def one_line(text: str) -> str:
    assert text.count("\n") == 1 and text.endswith("\n"), f"expected one line: {text!r}"
    return text.rstrip("\n")


# --- ban -----------------------------------------------------------------------------------------------


async def test_ban_one_address(sock: Path, rig: ApiRig) -> None:
    r = await nftblock("ban", "192.0.2.1", "--timeout", "1h", sock=sock)
    assert (r.code, r.out, r.err) == (0, "banned 192.0.2.1 (for 1h)\n", "")
    assert rig.calls == [("ban", {"targets": ["192.0.2.1"], "timeout": 3600.0, "set": None,
                                  "comment": ""})]


async def test_ban_several_permanently_in_a_set_with_a_comment(sock: Path, rig: ApiRig) -> None:
    r = await nftblock("ban", "192.0.2.1", "2001:DB8::1", "198.51.100.0/24", "192.0.2.1", "--timeout",
                       "permanent", "--set", "web", "--comment", "scanner", sock=sock)
    assert r.code == 0
    assert r.out == ("banned 3 targets: 192.0.2.1, 2001:db8::1, 198.51.100.0/24 in blocklist web "
                     "(permanently)\n")
    assert rig.calls[0][1] == {"targets": ["192.0.2.1", "2001:db8::1", "198.51.100.0/24"],
                               "timeout": "permanent", "set": "web", "comment": "scanner"}


async def test_ban_invalid_address_is_usage_error_and_sends_nothing(sock: Path, rig: ApiRig) -> None:
    r = await nftblock("ban", "192.0.2.1", "192.0.2.300", sock=sock)
    assert r.code == 2 and r.out == ""
    assert one_line(r.err).startswith("nftblock: not an IP address or CIDR: '192.0.2.300'")
    r = await nftblock("ban", "10.0.0.5/8", sock=sock)  # host bits set: say so rather than widen it
    assert r.code == 2 and "has host bits set" in one_line(r.err)
    assert rig.calls == []


async def test_ban_with_a_huge_comment_is_usage_error_and_sends_nothing(sock: Path, rig: ApiRig) -> None:
    r = await nftblock("ban", "192.0.2.1", "--comment", "x" * 5000, sock=sock)
    assert r.code == 2 and one_line(r.err) == "nftblock: --comment: at most 256 characters, got 5000"
    assert rig.calls == []


async def test_ban_allowlisted_address_fails_with_one_line(sock: Path, rig: ApiRig) -> None:
    r = await nftblock("ban", "10.1.2.3", "192.0.2.7", sock=sock)
    assert r.code == 1
    assert r.out == "banned 192.0.2.7\n"
    assert one_line(r.err) == "nftblock: refused 10.1.2.3: 10.1.2.3 is allowlisted (10.0.0.0/8); never banned"


async def test_ban_unknown_set(sock: Path) -> None:
    r = await nftblock("ban", "192.0.2.1", "--set", "nope", sock=sock)
    assert (r.code, r.out) == (1, "")
    assert one_line(r.err) == "nftblock: unknown set 'nope' (blocklists: default, web)"


async def test_bad_timeout_is_usage_error(sock: Path, rig: ApiRig) -> None:
    for value in ("soon", "0", "-5m"):
        r = await nftblock("ban", "192.0.2.1", f"--timeout={value}", sock=sock)
        assert r.code == 2 and one_line(r.err).startswith("nftblock: --timeout: ")
    assert rig.calls == []


async def test_ban_from_stdin_is_one_request(sock: Path, rig: ApiRig) -> None:
    addrs = [f"198.18.{i >> 8}.{i & 255}" for i in range(20_000)]
    text = "# bulk list\n\n" + "\n".join(f"{a}  # from the honeypot" if i % 7 == 0 else a
                                         for i, a in enumerate(addrs)) + "\n2001:db8::/32\n"
    r = await nftblock("ban", "--timeout", "2d", "-", sock=sock, stdin=text)
    assert (r.code, r.out, r.err) == (0, "banned 20001 targets (for 2d)\n", "")
    assert len(rig.calls) == 1
    cmd, args = rig.calls[0]
    assert cmd == "ban" and args["targets"] == [*addrs, "2001:db8::/32"] and args["timeout"] == 172800.0
    assert len(rig.fake.elements("default_ip4")) == 20_000 and len(rig.fake.elements("default_net6")) == 1


async def test_ban_from_stdin_reports_the_first_bad_line(sock: Path, rig: ApiRig) -> None:
    r = await nftblock("ban", "-", sock=sock, stdin="192.0.2.1\n\n# x\nbogus\n192.0.2.2\nalso bad\n")
    assert r.code == 2
    msg = one_line(r.err)
    assert msg.startswith("nftblock: stdin line 4: not an IP address or CIDR: 'bogus'")
    assert msg.endswith("(and 1 more invalid lines); nothing was sent")
    assert rig.calls == []


async def test_dash_cannot_be_mixed_with_addresses(sock: Path) -> None:
    r = await nftblock("ban", "-", "192.0.2.1", sock=sock, stdin="192.0.2.2\n")
    assert r.code == 2 and "'-'" in one_line(r.err)


async def test_empty_stdin_bans_nothing(sock: Path, rig: ApiRig) -> None:
    r = await nftblock("ban", "-", sock=sock, stdin="# nothing today\n\n")
    assert r.code == 0 and "nothing to ban" in one_line(r.err)
    assert rig.calls == []


async def test_ban_json_prints_the_result(sock: Path) -> None:
    r = await nftblock("--json", "ban", "192.0.2.1", "10.9.9.9", sock=sock)
    assert r.code == 1  # still a failure: one target was refused
    refusal = {"target": "10.9.9.9", "code": "allowlisted",
               "message": "10.9.9.9 is allowlisted (10.0.0.0/8); never banned"}
    assert json.loads(r.out) == {"applied": ["192.0.2.1"], "refused": [refusal]}
    r = await nftblock("ban", "192.0.2.2", "--json", sock=sock)  # --json after the command works too
    assert r.code == 0 and json.loads(r.out) == {"applied": ["192.0.2.2"], "refused": []}


# --- unban, list, check --------------------------------------------------------------------------------


async def test_unban(sock: Path, rig: ApiRig) -> None:
    await rig.seed("192.0.2.1", until=NOW + 3600)
    await rig.seed("192.0.2.2", "web", until=NOW + 3600)
    r = await nftblock("unban", "192.0.2.1", "192.0.2.9", sock=sock)
    assert r.code == 1
    assert r.out == "unbanned 192.0.2.1\n"
    assert one_line(r.err) == "nftblock: 192.0.2.9 is not banned"
    r = await nftblock("unban", "-", sock=sock, stdin="192.0.2.2\n")
    assert (r.code, r.out, r.err) == (0, "unbanned 192.0.2.2\n", "")
    assert rig.bans() == {}
    assert rig.in_kernel("default_ip4") == rig.in_kernel("web_ip4") == set()


async def test_list_human_and_json(sock: Path, rig: ApiRig) -> None:
    await rig.seed("192.0.2.1", until=NOW + 3725, origin="jail", reason="5 failures in 10m", jail="sshd")
    await rig.seed("198.18.0.0/15", "web", until=None, origin="feed")
    r = await nftblock("list", sock=sock)
    assert r.code == 0 and r.err == ""
    lines = r.out.splitlines()
    assert lines[0].split() == ["TARGET", "BLOCKLIST", "SET", "REMAINING", "ORIGIN", "JAIL", "REASON"]
    assert lines[1].split() == ["192.0.2.1", "default", "default_ip4", "1h2m5s", "jail", "sshd", "5",
                                "failures", "in", "10m"]
    assert lines[2].split() == ["198.18.0.0/15", "web", "web_net4", "permanent", "feed", "-"]
    assert lines[3] == "2 bans"
    r = await nftblock("list", "--set", "web", "--json", sock=sock)
    assert [b["target"] for b in json.loads(r.out)["bans"]] == ["198.18.0.0/15"]
    r = await nftblock("list", "--set", "nope", sock=sock)
    assert r.code == 1 and "unknown set 'nope'" in one_line(r.err)


async def test_list_when_empty(sock: Path) -> None:
    r = await nftblock("list", sock=sock)
    assert (r.code, r.out) == (0, "no active bans\n")


async def test_check(sock: Path, rig: ApiRig) -> None:
    await rig.seed("192.0.2.0/24", until=NOW + 600, origin="jail", reason="scan", jail="portscan")
    r = await nftblock("check", "192.0.2.9", sock=sock)
    assert r.code == 0
    assert r.out == ("192.0.2.9 is banned (by 192.0.2.0/24) in blocklist default (set default_net4) "
                     "for 10m more; reason: scan, jail portscan, origin jail\n")
    r = await nftblock("check", "10.1.1.1", sock=sock)
    assert r.out == "10.1.1.1 is allowlisted (entry 10.0.0.0/8): it is never banned\n"
    r = await nftblock("check", "198.51.100.1", sock=sock)
    assert r.out == "198.51.100.1 is not banned\n"
    r = await nftblock("check", "198.51.100.1", "--json", sock=sock)
    assert json.loads(r.out) == {"target": "198.51.100.1", "allowlisted": None, "bans": []}
    r = await nftblock("check", "nope", sock=sock)
    assert r.code == 2 and one_line(r.err).startswith("nftblock: not an IP address")


async def test_daemon_explanations_are_shown(sock_dir: Path) -> None:
    async def explain(cmd: str, args: dict[str, Any], peer: Peer) -> dict[str, Any]:
        if cmd == "ban":
            return {"applied": ["192.0.2.1"], "refused": [],
                    "notes": [{"target": "192.0.2.1", "message": "192.0.2.1 stays banned for longer (2h)"}]}
        return {"removed": [], "not_found": ["192.0.2.5"],
                "messages": {"192.0.2.5": "192.0.2.5 is not banned itself; it lies inside 192.0.2.0/24"}}

    srv = ControlServer(sock_dir / "e.sock", explain)
    await srv.start()
    try:
        r = await nftblock("ban", "192.0.2.1", sock=srv.path)
        assert (r.code, r.out) == (0, "banned 192.0.2.1\nnote: 192.0.2.1 stays banned for longer (2h)\n")
        r = await nftblock("unban", "192.0.2.5", sock=srv.path)
        assert r.code == 1
        assert one_line(r.err) == "nftblock: 192.0.2.5 is not banned itself; it lies inside 192.0.2.0/24"
    finally:
        await srv.close()


# --- status, feeds -------------------------------------------------------------------------------------


async def test_status(sock: Path, rig: ApiRig) -> None:
    await rig.seed("192.0.2.1")
    rig.fake.fail[("default_ip4", int(ipaddress.ip_address("192.0.2.2")))] = E.ENOMEM
    r = await nftblock("ban", "192.0.2.2", sock=sock)
    assert r.code == 1
    rig.clock.advance(3725)
    r = await nftblock("status", sock=sock)
    assert r.code == 0 and r.err == ""
    out = r.out
    assert out.startswith(f"nftblockd {__version__}, up 1h2m5s, table inet nftblock\n")
    assert ("kernel: release=6.18 table_owner=True table_persist=True destroy_setelem=True "
            "timeout_update=True\n") in out
    assert re.search(r"^  default_ip4 +default +ipv4 +hash +1 +262144$", out, re.M), out
    assert re.search(r"^batches: flushes=2 ops=2 pending=0 failures=1 last_seconds=\S+ max_ops=10000 "
                     r"delay=0.002$", out, re.M), out
    assert ("errors: kernel.12=1 set_full=0 refused=1 allowlisted=0 rebuilds=0 drift_repaired=0 "
            "adopted=0 unbannable_removed=0\n") in out
    assert "  sshd: bans=2 failures=10\n" in out
    assert "spamhaus" in out and "1234" in out
    r = await nftblock("status", "--json", sock=sock)
    assert json.loads(r.out) == await rig.api.status()


async def test_feeds(sock: Path, rig: ApiRig) -> None:
    r = await nftblock("feeds", sock=sock)
    assert r.code == 0
    header, row = r.out.splitlines()
    assert header.split() == ["FEED", "ENTRIES", "LAST", "SUCCESS", "NEXT", "REFRESH", "ERROR"]
    assert row.split()[:2] == ["spamhaus", "1234"] and row.split()[-2:] == ["-", "-"]
    r = await nftblock("feeds", "refresh", "spamhaus", sock=sock)
    assert (r.code, r.out) == (0, "refreshed feed spamhaus: 1234 entries\n")
    assert rig.calls[-1] == ("feeds_refresh", {"name": "spamhaus"})
    r = await nftblock("feeds", "refresh", "nope", sock=sock)
    assert r.code == 1 and one_line(r.err) == "nftblock: no feed named 'nope' (feeds: spamhaus)"
    r = await nftblock("--json", "feeds", sock=sock)
    assert json.loads(r.out) == {"feeds": FEEDS}


# --- the daemon is not there, or will not talk to us ---------------------------------------------------


async def test_daemon_not_running(sock_dir: Path) -> None:
    path = sock_dir / "absent.sock"
    r = await nftblock("list", sock=path)
    assert (r.code, r.out) == (1, "")
    assert one_line(r.err) == f"nftblock: nftblockd is not running (no socket at {path})"


async def test_socket_from_environment_and_default(sock: Path) -> None:
    r = await nftblock("list", env={"NFTBLOCK_SOCKET": str(sock)})
    assert (r.code, r.out) == (0, "no active bans\n")
    r = await nftblock("list", env={"NFTBLOCK_SOCKET": "/nonexistent/x.sock"})
    assert one_line(r.err) == "nftblock: nftblockd is not running (no socket at /nonexistent/x.sock)"


async def test_forbidden_is_a_one_line_failure(sock_dir: Path) -> None:
    path = sock_dir / "strict.sock"

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(encode_error(None, "forbidden", "run as root or as a member of group 'nftblock'"))
        writer.write_eof()
        await reader.read()
        writer.close()

    srv = await asyncio.start_unix_server(refuse, str(path))
    r = await nftblock("status", sock=path)
    srv.close()
    await srv.wait_closed()
    assert r.code == 1
    assert one_line(r.err) == (f"nftblock: permission denied on {path}: "
                               "run as root or as a member of group 'nftblock'")


# --- usage ---------------------------------------------------------------------------------------------


async def test_usage_errors_exit_2() -> None:
    r = await nftblock()
    assert r.code == 2 and r.err.splitlines()[-1].startswith("nftblock: the following arguments are required")
    r = await nftblock("frobnicate")
    assert r.code == 2 and "invalid choice" in r.err.splitlines()[-1]
    r = await nftblock("ban")
    assert r.code == 2 and r.err.splitlines()[0].startswith("usage: nftblock ban")


async def test_help_exits_0() -> None:
    r = await nftblock("--help")
    assert r.code == 0 and "import-fail2ban" in r.out and r.err == ""


def test_canonical_target_fast_path_agrees_with_parse_target() -> None:
    for text in ("0.0.0.0", "255.255.255.255", "192.0.2.1", " 198.51.100.7 ", "9.9.9.9"):
        assert canonical_target(text) == str(parse_target(text).network_address)
    for bad in ("01.2.3.4", "256.1.1.1", "1.2.3", "1.2.3.4.5", "", "fe80::1%eth0"):
        with pytest.raises(AddressError):
            canonical_target(bad)
    assert canonical_target("::ffff:192.0.2.1") == "192.0.2.1"
    assert canonical_target("2001:DB8:0:0::1") == "2001:db8::1"


@given(st.from_regex(r"[0-9.]{7,15}", fullmatch=True) | st.integers(0, 2**32 - 1).map(
    lambda n: str(ipaddress.IPv4Address(n))))
def test_canonical_target_agrees_with_parse_target_on_dotted_quads(text: str) -> None:
    try:
        expected: str | None = format_target(parse_target(text))
    except AddressError:
        expected = None
    try:
        got: str | None = canonical_target(text)
    except AddressError:
        got = None
    assert got == expected


# --- commands that need no daemon ----------------------------------------------------------------------


async def test_test_filter_runs_without_a_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, ...]] = []

    def run(filter_spec: str, logfile: str, *, json_output: bool, out: Any, err: Any) -> int:
        seen.append((filter_spec, logfile, json_output))
        out.write("3 matches\n")
        return 0

    monkeypatch.setitem(sys.modules, "nftblockd.detect.testfilter", types.SimpleNamespace(run=run))
    r = await nftblock("test-filter", "sshd", "/var/log/auth.log", env={"NFTBLOCK_SOCKET": "/nonexistent"})
    assert (r.code, r.out, r.err) == (0, "3 matches\n", "")
    r = await nftblock("--json", "test-filter", "sshd", "/var/log/auth.log")
    assert seen == [("sshd", "/var/log/auth.log", False), ("sshd", "/var/log/auth.log", True)]


async def test_test_filter_reads_the_journal_with_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, ...]] = []

    def run(filter_spec: str, logfile: str | None, *, json_output: bool, out: Any, err: Any,
            journal: list[tuple[str, str]], journal_dir: str | None) -> int:
        seen.append((filter_spec, logfile, journal, journal_dir))
        return 0

    monkeypatch.setitem(sys.modules, "nftblockd.detect.testfilter", types.SimpleNamespace(run=run))
    r = await nftblock("test-filter", "sshd", "--journal", "_SYSTEMD_UNIT=ssh.service", "--journal",
                       "_SYSTEMD_UNIT=sshd.service", "--journal-dir", "/x")
    assert r.code == 0
    assert seen == [("sshd", None, [("_SYSTEMD_UNIT", "ssh.service"), ("_SYSTEMD_UNIT", "sshd.service")], "/x")]
    for args, why in ((("sshd",), "--journal FIELD=VALUE to read lines from"),
                      (("sshd", "/var/log/auth.log", "--journal", "A=b"), "not both"),
                      (("sshd", "/var/log/auth.log", "--journal-dir", "/x"), "--journal-dir needs --journal"),
                      (("sshd", "--journal", "_SYSTEMD_UNIT"), "expected FIELD=VALUE")):
        r = await nftblock("test-filter", *args)
        assert r.code == 1 and why in one_line(r.err), args
        assert ("not both" in r.err) == ("--journal" in args and "/var/log/auth.log" in args)
    assert len(seen) == 1


async def test_test_filter_reports_a_missing_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nftblockd.detect.testfilter", None)  # import fails as if it did not exist
    r = await nftblock("test-filter", "sshd", "/var/log/auth.log")
    assert r.code == 1 and one_line(r.err) == "nftblock: test-filter is not available in this build"


@dataclass(frozen=True)
class F2bBan:
    jail: str
    ip: str
    remaining: float | Permanent
    time_of_ban: float = 0.0


async def test_import_fail2ban(sock: Path, rig: ApiRig, monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[tuple[str, float]] = []

    def read_fail2ban_bans(db_path: str, now: float) -> list[F2bBan]:
        read.append((db_path, now))
        return [
            F2bBan("sshd", "192.0.2.1", 120.4),
            F2bBan("recidive", "192.0.2.1", 86000.0),  # the same address: the longer ban wins
            F2bBan("sshd", "192.0.2.2", PERMANENT),
            F2bBan("sshd", "192.0.2.3", 0.0),  # expired meanwhile
            F2bBan("nginx", "10.1.2.3", 50.0),  # allowlisted here
            F2bBan("sshd", "0.0.0.0", 300.0),  # never-ban space (issue 13): skipped with the reason
            F2bBan("sshd", "192.0.2.9", 300.0, now + 1000 * 86400),  # a ban 1000 days ahead: skipped
            F2bBan("sshd", "198.51.100.7/24", 300.0),  # host bits set (issue 33): skipped, never widened
        ]

    monkeypatch.setitem(sys.modules, "nftblockd.state.f2bimport",
                        types.SimpleNamespace(read_fail2ban_bans=read_fail2ban_bans, refusal=refusal))
    r = await nftblock("import-fail2ban", "/tmp/f2b.sqlite3", "--set", "web", sock=sock)
    assert r.code == 1
    assert r.out == "imported 2 bans from /tmp/f2b.sqlite3 (1 refused)\n"
    err = r.err.splitlines()
    assert err[:2] == ["nftblock: fail2ban jail nginx has no nftblockd jail: its bans keep the name nginx",
                       "nftblock: fail2ban jail recidive has no nftblockd jail: its bans keep the name recidive"]
    err = err[2:]
    assert err[0] == "nftblock: skipped fail2ban entry: 0.0.0.0 (fail2ban jail sshd) is never banned: " \
        "the unspecified address (RFC 1122)"
    assert err[1].startswith("nftblock: skipped fail2ban entry: 192.0.2.9 (fail2ban jail sshd) has a time of ")
    assert "in the future" in err[1]
    assert err[2].startswith("nftblock: skipped fail2ban entry (jail sshd): '198.51.100.7/24' has host bits set")
    assert err[3:] == ["nftblock: refused 10.1.2.3: 10.1.2.3 is allowlisted (10.0.0.0/8); never banned"]
    assert read[0][0] == "/tmp/f2b.sqlite3"
    why = "imported from fail2ban jail "
    assert rig.calls[0] == ("status", {})  # which jails run here (sshd alone: the others keep their names)
    assert rig.calls[1:] == [("ban", {"set": "web", "origin": "fail2ban", "targets": [
        {"target": "192.0.2.1", "timeout": 86000, "jail": "recidive", "reason": why + "recidive"},
        {"target": "192.0.2.2", "timeout": "permanent", "jail": "sshd", "reason": why + "sshd"},
        {"target": "10.1.2.3", "timeout": 50, "jail": "nginx", "reason": why + "nginx"},
    ]})]
    ban = rig.bans()["192.0.2.2", "web"]
    assert (ban.until, ban.origin, ban.jail) == (None, "fail2ban", "sshd")


async def test_import_fail2ban_gives_the_bans_to_the_renamed_jails(sock_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def read_fail2ban_bans(db_path: str, now: float) -> list[F2bBan]:
        return [F2bBan("nginx-http-auth", "192.0.2.1", 600.0), F2bBan("sshd", "192.0.2.2", 600.0),
                F2bBan("my.app", "192.0.2.3", 600.0)]

    monkeypatch.setitem(sys.modules, "nftblockd.state.f2bimport",
                        types.SimpleNamespace(read_fail2ban_bans=read_fail2ban_bans, refusal=refusal))
    running = [{"name": n} for n in ("sshd", "nginx_http_auth", "my_app")]  # as import-fail2ban-config names them
    async with api_rig(CONFIG, status_extra=lambda: {"jails": running}, now=NOW) as rig, \
            serve(rig, sock_dir / "control.sock") as sock:
        r = await nftblock("import-fail2ban", "/tmp/f2b.sqlite3", sock=sock)
        assert (r.code, r.err) == (0, "")
        jails = {b.jail for b in rig.bans().values()}
    assert jails == {"nginx_http_auth", "sshd", "my_app"}  # so `unban --all --jail nginx_http_auth` finds it


async def test_import_fail2ban_reports_an_unreadable_database(monkeypatch: pytest.MonkeyPatch) -> None:
    def read_fail2ban_bans(db_path: str, now: float) -> list[F2bBan]:
        raise OSError(2, "No such file or directory", db_path)

    monkeypatch.setitem(sys.modules, "nftblockd.state.f2bimport",
                        types.SimpleNamespace(read_fail2ban_bans=read_fail2ban_bans, refusal=refusal))
    r = await nftblock("import-fail2ban", "/nonexistent.sqlite3")
    assert r.code == 1
    assert one_line(r.err).startswith("nftblock: cannot read fail2ban bans from /nonexistent.sqlite3: ")


# --- the console script --------------------------------------------------------------------------------


async def test_a_bulk_ipv6_ban_is_sent_packed_and_an_older_daemon_gets_it_as_text(sock: Path, rig: ApiRig,
                                                                                   sock_dir: Path) -> None:
    hosts6 = [f"2001:DB8:1::{i:x}" for i in range(12)] + ["::ffff:198.18.1.1", "2001:db8:1:0:0:0:0:1"]
    hosts4 = [f"198.18.0.{i}" for i in range(12)]
    hosts4 += ["198.18.2.1", "198.18.2.2"]
    lines = [x for pair in zip(hosts6, hosts4, strict=True) for x in pair]
    canonical = [canonical_target(t) for t in lines]
    r = await nftblock("ban", "-", sock=sock, stdin="\n".join(lines) + "\n")
    assert (r.code, r.out, r.err) == (0, f"banned {len(set(canonical))} targets\n", "")
    args = rig.calls[-1][1]
    assert "targets" not in args and args["reply"] == "counts"
    assert binascii.a2b_base64(args["hosts6"]) == b"".join(ipaddress.IPv6Address(a).packed for a in hosts6)
    assert rig.in_kernel("default_ip6") | rig.in_kernel("default_ip4") == set(canonical)

    seen: list[dict[str, Any]] = []

    async def before_hosts6(cmd: str, args: dict[str, Any], peer: Peer) -> dict[str, Any]:
        seen.append(args)
        if "hosts6" in args:
            from nftblockd.control.protocol import ControlError
            raise ControlError("bad_request", "ban: unknown argument 'hosts6' (allowed: targets, hosts4)")
        return {"applied_count": len(args["targets"]) + len(binascii.a2b_base64(args["hosts4"])) // 4,
                "refused": []}

    srv = ControlServer(sock_dir / "old6.sock", before_hosts6)
    await srv.start()
    try:
        r = await nftblock("ban", "-", sock=sock_dir / "old6.sock", stdin="\n".join(lines) + "\n")
    finally:
        await srv.close()
    assert (r.code, r.out, r.err) == (0, f"banned {len(set(canonical))} targets\n", "")
    assert len(seen) == 2 and "hosts6" not in seen[1]
    assert sorted(seen[1]["targets"]) == sorted({canonical_target(t) for t in hosts6})
    assert binascii.a2b_base64(seen[1]["hosts4"]) == b"".join(ipaddress.IPv4Address(a).packed for a in hosts4)


@pytest.mark.skipif(not SCRIPT.exists(), reason="the nftblock console script is not installed")
async def test_console_script_bans_a_million_addresses_from_stdin(sock_dir: Path) -> None:
    received: list[tuple[str, dict[str, Any]]] = []

    async def accept_all(cmd: str, args: dict[str, Any], peer: Peer) -> dict[str, Any]:
        received.append((cmd, args))  # the fake daemon's per-target parsing would dominate: not under test
        return {"applied_count": len(args["hosts4"]) * 3 // 16, "refused": []}  # base64: 4 chars per 3 bytes

    addrs = [f"{100 + (i >> 16)}.{(i >> 8) & 255}.{i & 255}.1" for i in range(1_000_000)]
    srv = ControlServer(sock_dir / "big.sock", accept_all)
    await srv.start()
    try:
        proc = await asyncio.create_subprocess_exec(
            str(SCRIPT), "ban", "--timeout", "permanent", "-", env={"NFTBLOCK_SOCKET": str(srv.path)},
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate("\n".join(addrs).encode())
    finally:
        await srv.close()
    assert (proc.returncode, out, err) == (0, b"banned 1000000 targets (permanently)\n", b"")
    assert len(received) == 1
    args = received[0][1]  # the addresses packed as the CLI's check left them, in order: no text to parse
    assert "targets" not in args and args["timeout"] == "permanent" and args["reply"] == "counts"
    import binascii
    import socket

    assert binascii.a2b_base64(args["hosts4"]) == b"".join(socket.inet_aton(a) for a in addrs)


@pytest.mark.skipif(not SCRIPT.exists(), reason="the nftblock console script is not installed")
async def test_console_script_exit_codes(sock_dir: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        str(SCRIPT), "--socket", str(sock_dir / "x.sock"), "status",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert (proc.returncode, out) == (1, b"")
    assert err.decode() == f"nftblock: nftblockd is not running (no socket at {sock_dir / 'x.sock'})\n"
    proc = await asyncio.create_subprocess_exec(str(SCRIPT), "ban", "not-an-ip",
                                                stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert proc.returncode == 2 and err.decode().count("\n") == 1


# --- the quick path: `ban`/`unban` without argparse ----------------------------------------------------

_TOKENS = ["ban", "unban", "list", "--socket", "--socket=/s", "/s", "--json", "--json=1", "--timeout",
           "--timeout=1h", "1h", "--set", "--set=", "web", "--comment", "f2b sshd", "--jail", "--jail=sshd",
           "sshd", "--origin", "--origin=fail2ban", "fail2ban", "cli", "bogus", "192.0.2.1", "2001:db8::1",
           "::ffff:192.0.2.9", "198.51.100.0/24", "01.2.3.4", "-", "--", "-h", "--help", "--time", "--j", "",
           "-1", "x y", "-x y"]


@given(st.lists(st.sampled_from(_TOKENS), max_size=9)
       | st.lists(st.sampled_from(_TOKENS), max_size=7).map(lambda t: ["ban", "192.0.2.1", *t])
       | st.lists(st.sampled_from(_TOKENS), max_size=7).map(lambda t: ["unban", *t, "2001:db8::1"]))
def test_quick_parse_agrees_with_argparse(argv: list[str]) -> None:
    from nftblockd.cli.main import _ArgumentError, _ParserExit, _quick_parse, build_parser

    quick = _quick_parse(argv)
    if quick is None:
        return  # argparse decides
    try:
        ns = build_parser(io.StringIO()).parse_args(argv)
    except (_ArgumentError, _ParserExit) as exc:
        raise AssertionError(f"quick path accepted {argv} which argparse refuses: {exc}") from None
    assert vars(quick) == vars(ns), argv


def test_quick_parse_takes_the_shapes_scripts_use() -> None:
    from nftblockd.cli.main import _quick_parse

    for argv in (["ban", "192.0.2.1", "--timeout", "600s", "--set", "default", "--comment", "f2b sshd",
                  "--jail", "sshd", "--origin", "fail2ban"],
                 ["--socket", "/run/x.sock", "unban", "2001:db8::1", "--set=default", "--jail=sshd"],
                 ["--json", "ban", "192.0.2.1", "192.0.2.2", "--json"], ["ban", "--timeout", "1h", "-"],
                 ["--socket", "/run/x.sock", "unban", "-"]):
        assert _quick_parse(argv) is not None, argv
    for argv in (["ban", "198.51.100.0/24"], ["ban", "--help"], ["list"],
                 ["ban", "1.2.3.4", "--time", "1h"], ["unban", "--all", "--jail", "sshd"]):
        assert _quick_parse(argv) is None, argv


_ZEROISH = st.lists(st.sampled_from([0, 0, 0, 1, 0xFFFF, 0xABC]), min_size=8, max_size=8).map(
    lambda h: ipaddress.IPv6Address(sum(x << (112 - 16 * i) for i, x in enumerate(h))))


@given(st.ip_addresses(v=6).map(str) | st.ip_addresses(v=6).map(lambda a: a.exploded.upper())
       | _ZEROISH.map(str) | _ZEROISH.map(lambda a: a.exploded)
       | st.ip_addresses(v=4).map(lambda a: f"::ffff:{a}") | st.ip_addresses(v=4).map(lambda a: f"::{a}")
       | st.text(alphabet="0123456789abcdefABCDEF:.%/ ", max_size=45))
def test_quick_canonical_agrees_with_parse_target(text: str) -> None:
    from nftblockd.cli.targets import quick_canonical

    quick = quick_canonical(text)
    if quick is None:
        return
    assert quick == format_target(parse_target(text))


async def test_jail_and_origin_are_sent_only_when_given(sock: Path, rig: ApiRig) -> None:
    r = await nftblock("ban", "192.0.2.1", "--jail", "sshd", "--origin", "fail2ban", "--comment", "f2b", sock=sock)
    assert r.code == 0
    r = await nftblock("unban", "192.0.2.1", "--set", "default", "--jail", "sshd", "--origin", "fail2ban",
                       sock=sock)
    assert r.code == 0
    r = await nftblock("unban", "192.0.2.1", sock=sock)
    assert [c for c in rig.calls] == [
        ("ban", {"targets": ["192.0.2.1"], "timeout": None, "set": None, "comment": "f2b", "jail": "sshd",
                 "origin": "fail2ban"}),
        ("unban", {"targets": ["192.0.2.1"], "set": "default", "jail": "sshd", "origin": "fail2ban"}),
        ("unban", {"targets": ["192.0.2.1"], "set": None}),
    ]
    r = await nftblock("ban", "192.0.2.1", "--origin", "jail", sock=sock)
    assert r.code == 2 and "invalid choice" in r.err


def test_a_ban_process_imports_only_what_it_needs(tmp_path: Path) -> None:
    # What fail2ban's shell action runs once per ban: no argparse, no dataclasses or typing, nothing from the
    # daemon's side (start-up time, see bench/bench_cli.py). The daemon is absent: the path up to connect()
    # is the whole client path.
    root = str(Path(__file__).resolve().parents[2])
    code = (f"import sys\nsys.path.insert(0, {root!r})\nfrom nftblockd.cli.main import main\n"
            f"rc = main(['--socket', {str(tmp_path / 'none.sock')!r}, 'ban', '192.0.2.1', '2001:db8::1', "
            "'--timeout', '600s', '--comment', 'f2b sshd', '--jail', 'sshd', '--origin', 'fail2ban'])\n"
            "print(rc, ' '.join(sorted(sys.modules)))\n")
    import subprocess

    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=False)
    rc, modules = proc.stdout.split(" ", 1)
    assert rc == "1" and "nftblockd is not running" in proc.stderr, proc.stderr
    loaded = set(modules.split())
    heavy = {"argparse", "dataclasses", "typing", "socket", "inspect", "os", "json", "re", "ipaddress",
             "nftblockd.events", "nftblockd.control.protocol", "nftblockd.config"}
    assert not heavy & loaded, heavy & loaded
    assert not {m for m in loaded if m.split(".")[1:2] and m.split(".")[1] in {"detect", "kernel", "state",
                                                                               "feeds", "sources", "service"}
                and m.startswith("nftblockd.")}


async def test_unban_all_of_a_jail_is_one_list_and_one_unban(sock: Path, rig: ApiRig) -> None:
    await rig.seed("192.0.2.1", jail="sshd", origin="fail2ban")
    await rig.seed("192.0.2.2", jail="sshd", origin="fail2ban")
    await rig.seed("192.0.2.3", jail="postfix", origin="fail2ban")
    await rig.seed("192.0.2.4", jail="sshd", origin="cli")
    r = await nftblock("unban", "--all", "--jail", "sshd", "--origin", "fail2ban", "--set", "default", sock=sock)
    assert (r.code, r.out, r.err) == (0, "unbanned 2 targets: 192.0.2.1, 192.0.2.2\n", "")
    assert rig.calls[1] == ("unban", {"targets": ["192.0.2.1", "192.0.2.2"], "set": "default", "jail": "sshd",
                                         "origin": "fail2ban"})
    r = await nftblock("unban", "--all", "--jail", "sshd", "--origin", "fail2ban", sock=sock)
    assert (r.code, r.out) == (0, "no active bans of jail sshd\n")
    for argv in (["unban", "--all"], ["unban", "--all", "--jail", "sshd", "192.0.2.4"], ["unban"]):
        r = await nftblock(*argv, sock=sock)
        assert r.code == 2 and one_line(r.err).startswith("nftblock: "), argv


def test_the_installed_script_flushes_its_output_and_keeps_the_exit_code(tmp_path: Path) -> None:
    # entry() ends with os._exit: what was written must still reach a pipe, and the code must be main()'s.
    import subprocess

    from tests.helpers.package import write_entry_script

    script = write_entry_script(tmp_path, "nftblock")
    if not Path("/usr/bin/python3").exists():
        pytest.skip("Debian's /usr/bin/python3 is not installed")
    for argv, code, stream, text in ((["--help"], 0, "stdout", "import-fail2ban"),
                                     (["ban", "999.1.1.1"], 2, "stderr", "nftblock: not an IP address"),
                                     (["--socket", str(tmp_path / "no.sock"), "ban", "192.0.2.1"], 1, "stderr",
                                      "nftblockd is not running")):
        proc = subprocess.run([str(script), *argv], capture_output=True, text=True, check=False)
        assert proc.returncode == code and text in getattr(proc, stream), (argv, proc)


def test_environ_reads_as_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from nftblockd.cli.main import _Environ

    for value in ("/run/x.sock", "/tmp/ünï.sock", os.fsdecode(b"/tmp/\xff.sock")):
        monkeypatch.setenv("NFTBLOCK_SOCKET", value)
        assert _Environ().get("NFTBLOCK_SOCKET") == os.environ.get("NFTBLOCK_SOCKET") == value
    monkeypatch.delenv("NFTBLOCK_SOCKET")
    assert _Environ().get("NFTBLOCK_SOCKET") is None


def test_the_cli_comment_limit_is_the_protocols() -> None:
    import nftblockd.cli.main as cli
    from nftblockd import events

    assert cli.MAX_REASON == events.MAX_REASON


# --- `ban -`: stdin read by blocks, counts instead of an echo --------------------------------------------

_LINE = st.one_of(st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str), st.just(""), st.just("# note"),
                  st.ip_addresses(v=4).map(lambda a: f" {a}  # why"), st.just("bogus"), st.just("10.0.0.0/8"),
                  st.just("01.2.3.4"), st.text(alphabet="0123456789.:abf /#\t", max_size=12),
                  # IPv6 spelled other ways (packed by the block check, `hosts6`): mapped IPv4, long, upper case
                  st.ip_addresses(v=4).map(lambda a: f"::ffff:{a}"), st.ip_addresses(v=6).map(lambda a: a.exploded),
                  st.ip_addresses(v=6).map(lambda a: str(a).upper()), st.just("fe80::1%eth0"), st.just("::1.2.3.4"))


@given(st.lists(st.tuples(_LINE, st.sampled_from(["\n", "\r\n", "\r"])), max_size=40), st.integers(1, 64))
def test_stdin_read_by_blocks_gives_what_the_line_reader_gives(lines: list[tuple[str, str]], block: int) -> None:
    # targets_from_stream (blocks of whole lines, a C-level check of plain IPv4 blocks) against the plain
    # per-line reader over the text layer, for the bytes under sys.stdin and for a text-only stream
    from nftblockd.cli.targets import UsageError, targets_from_lines, targets_from_stream

    text = "".join(line + end for line, end in lines)

    def outcome(read: Any) -> Any:
        try:
            return read()
        except UsageError as exc:
            return str(exc)

    want = outcome(lambda: targets_from_lines(io.TextIOWrapper(io.BytesIO(text.encode()))))
    got = outcome(lambda: targets_from_stream(io.TextIOWrapper(io.BytesIO(text.encode())), block))
    assert got == want
    assert outcome(lambda: targets_from_stream(io.StringIO(text), block)) == want
    if not isinstance(got, str):  # what is sent (packed addresses and text) is every target, nothing else
        import socket

        def v6(packed: bytes) -> str:  # as the daemon reads it: an IPv4-mapped address is the IPv4 address
            a = ipaddress.IPv6Address(packed)
            return str(a.ipv4_mapped or a)

        sent = [socket.inet_ntoa(got.hosts4[i:i + 4]) for i in range(0, len(got.hosts4), 4)] + got.slow + \
            [v6(got.hosts6[i:i + 16]) for i in range(0, len(got.hosts6), 16)]
        assert sorted(set(sent)) == sorted(got.strings()) and len(got.slow) == len(set(got.slow))


def test_stdin_that_is_not_text_is_refused_with_its_line_number() -> None:
    from nftblockd.cli.targets import UsageError, targets_from_stream

    data = b"192.0.2.1\r\n192.0.2.2\n\n198.51.100.\xff\n192.0.2.3\n"
    for block in (3, 1 << 20):
        with pytest.raises(UsageError) as exc:
            targets_from_stream(io.TextIOWrapper(io.BytesIO(data)), block)
        assert str(exc.value) == "stdin line 4: not text (invalid start byte); nothing was sent"


async def test_stdin_repeating_a_few_addresses_is_a_few_targets(sock: Path, rig: ApiRig) -> None:
    r = await nftblock("ban", "-", sock=sock, stdin="198.18.0.1\n198.18.0.2\n" * 8)
    assert (r.code, r.out, r.err) == (0, "banned 2 targets: 198.18.0.1, 198.18.0.2\n", "")
    assert rig.calls[-1][1]["targets"] == ["198.18.0.1", "198.18.0.2"] and "hosts4" not in rig.calls[-1][1]


async def test_a_bulk_ban_asks_for_counts_and_an_older_daemon_is_asked_again(sock: Path, rig: ApiRig,
                                                                           sock_dir: Path) -> None:
    hosts = [f"198.18.0.{i}" for i in range(20)]
    r = await nftblock("ban", "-", sock=sock, stdin="\n".join(hosts) + "\n")
    assert (r.code, r.out, r.err) == (0, "banned 20 targets\n", "")
    assert rig.calls[-1][1]["reply"] == "counts"
    r = await nftblock("unban", "-", sock=sock, stdin="\n".join(hosts[:15]) + "\n198.18.9.9\n")
    assert (r.code, r.out, one_line(r.err)) == (1, "unbanned 15 targets\n", "nftblock: 198.18.9.9 is not banned")
    r = await nftblock("--json", "ban", "-", sock=sock, stdin="\n".join(hosts) + "\n")
    assert r.code == 0 and sorted(json.loads(r.out)["applied"]) == sorted(hosts)  # --json: the full reply
    assert "reply" not in rig.calls[-1][1]

    seen: list[dict[str, Any]] = []
    known = {"targets", "timeout", "set", "comment", "origin", "jail"}

    async def older(cmd: str, args: dict[str, Any], peer: Peer) -> dict[str, Any]:
        seen.append(args)
        unknown = sorted(k for k in args if k not in known)  # as protocol._check_keys names them: the first
        if unknown:
            from nftblockd.control.protocol import ControlError
            raise ControlError("bad_request", f"{cmd}: unknown argument {unknown[0]!r} (allowed: targets, timeout)")
        return {"applied": args["targets"], "refused": []} if cmd == "ban" else \
            {"removed": args["targets"], "not_found": []}

    srv = ControlServer(sock_dir / "old.sock", older)
    await srv.start()
    try:
        # before `reply` and `hosts4`: asked three times, the last time as every daemon understands
        r = await nftblock("ban", "-", sock=sock_dir / "old.sock", stdin="\n".join(hosts) + "\n")
        assert (r.code, r.out, r.err) == (0, "banned 20 targets\n", "")
        assert [sorted(set(a) - known) for a in seen] == [["hosts4", "reply"], ["reply"], []]
        assert seen[1]["targets"] == seen[2]["targets"] == hosts
        r = await nftblock("unban", "-", sock=sock_dir / "old.sock", stdin="\n".join(hosts) + "\n")
        assert (r.code, r.out, r.err) == (0, "unbanned 20 targets\n", "")
        # with `reply` but before `hosts4`: twice
        seen.clear()
        known.add("reply")
        r = await nftblock("ban", "-", sock=sock_dir / "old.sock", stdin="\n".join(hosts) + "\n")
        assert (r.code, r.out, r.err) == (0, "banned 20 targets\n", "")
        assert [sorted(set(a) - known) for a in seen] == [["hosts4"], []]
    finally:
        await srv.close()


# --- fleet ---------------------------------------------------------------------------------------------

FLEET = {"fleet": "prod", "host_id": "web-01", "connected": True, "server": "10.0.0.5:6379", "role": "master",
         "cursor": "1900000000000-0", "outbox": 3, "published": 12, "publish_failures": 1,
         "received": {"ban": {"applied": 40, "own": 12, "allowlisted": 2}, "unban": {"applied": 1}},
         "rejected": {"allowlisted": 2}, "replays": 1, "snapshots": 0, "reasserted": 0, "connects": 1,
         "lag_last": 0.0042, "last_error": "", "last_error_at": 0.0, "deferred": 3, "deferred_total": 30}


async def test_fleet_and_the_fleet_part_of_status(sock: Path, rig: ApiRig) -> None:
    r = await nftblock("fleet", sock=sock)
    assert (r.code, r.out) == (0, "fleet mode is off (no fleet: block in the config)\n")
    rig.api.set_fleet(lambda: dict(FLEET), lambda bans, now: None, lambda nets, src: None)
    r = await nftblock("fleet", sock=sock)
    assert r.code == 0
    assert r.out.startswith("fleet prod, host web-01: connected to 10.0.0.5:6379 (master)\n"), r.out
    assert "cursor 1900000000000-0, last propagation lag 4.2 ms, outbox 3, published 12" in r.out
    assert "received ban: allowlisted 2, applied 40, own 12\n" in r.out and "refused: allowlisted 2\n" in r.out
    assert "over the rate cap: 3 waiting, 30 deferred in all (applied as the cap refills)\n" in r.out
    r = await nftblock("fleet", "--json", sock=sock)
    assert json.loads(r.out) == {"fleet": FLEET}


async def test_check_names_the_fleet_host_a_ban_came_from(sock: Path, rig: ApiRig) -> None:
    await rig.seed("203.0.113.7", origin="remote", reason="fleet:web-02", until=NOW + 60)
    r = await nftblock("check", "203.0.113.7", sock=sock)
    assert "origin remote, from fleet host web-02" in r.out, r.out
    r = await nftblock("check", "--json", "203.0.113.7", sock=sock)
    assert json.loads(r.out)["bans"][0]["origin_host"] == "web-02"
