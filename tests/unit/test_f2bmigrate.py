"""`nftblock import-fail2ban-config`: fail2ban's jails as an nftblockd config.

The scenarios are Debian's stock fail2ban files (tests/data/fail2ban/debian, a copy, so the host's fail2ban
does not matter) plus a typical jail.local each (tests/data/fail2ban/scenarios); every generated config must
pass the same checks as `nftblockd --check-config`. Pure parts are also tested with a fake Host.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nftblockd.cli.main import main
from nftblockd.config.yamlsrc import load_yaml
from nftblockd.daemon.main import check_config
from nftblockd.detect.f2b import F2bConfig, _parse_ini
from nftblockd.durations import PERMANENT
from nftblockd.migrate.f2bjail import Migration, f2b_seconds, our_jail, plan_migration, split_spec
from nftblockd.migrate.host import FsHost, read_jails
from nftblockd.migrate.render import BEGIN, render_config, yaml_scalar

DATA = Path(__file__).resolve().parents[1] / "data" / "fail2ban"


@pytest.fixture(autouse=True)
def no_host_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """The drop-in's host facts faked: no name is resolved, this host's resolv.conf and sendmail do not count."""
    from nftblockd.migrate import netfacts
    from nftblockd.migrate.dropin import MailFacts

    monkeypatch.setattr(netfacts, "resolve", lambda name: "not resolved in tests")
    monkeypatch.setattr(netfacts, "resolvers", lambda: ())
    monkeypatch.setattr(netfacts, "mail_facts", lambda: MailFacts("other"))


def _setup(tmp_path: Path, scenario: str | None) -> tuple[Path, FsHost]:
    etc = tmp_path / "fail2ban"
    shutil.copytree(DATA / "debian", etc)
    if scenario is not None:
        shutil.copytree(DATA / "scenarios" / scenario, etc, dirs_exist_ok=True)
    units = tmp_path / "units"
    units.mkdir()
    (units / "ssh.service").write_text("[Service]\n")
    (units / "sshd.service").symlink_to(units / "ssh.service")  # Debian's Alias=sshd.service
    return etc, FsHost(etc, unit_dirs=(str(units),))


def _migrate(tmp_path: Path, scenario: str | None) -> tuple[Migration, str, Path]:
    etc, host = _setup(tmp_path, scenario)
    m = plan_migration(read_jails(etc), str(etc), host)
    text = render_config(m)
    out = tmp_path / "nftblockd.yaml"
    out.write_text(text)
    return m, text, out


def _valid(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = check_config(str(path))
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err


def test_stock_debian_config_is_sshd_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m, text, out = _migrate(tmp_path, None)
    assert [j.name for j in m.jails] == ["sshd"]
    sshd = m.jails[0]
    assert sshd.filter == f"{tmp_path}/fail2ban/filter.d/sshd.conf[mode=normal]"
    assert sshd.files == ("/var/log/auth.log",)
    assert (sshd.maxretry, sshd.findtime, sshd.bantime, sshd.escalation) == (5, 600.0, 600.0, None)
    assert any("iptables-multiport: replaced by nftblockd's own ban" in n for n in sshd.notes)
    assert m.actions == () and m.dropped == ()
    doc = load_yaml(text, "x").value
    assert doc["jails"]["sshd"]["escalation"] == {"enabled": False}  # nftblockd's default would escalate
    _valid(out, capsys)


def test_sshd_only_from_the_journal_with_increment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m, text, out = _migrate(tmp_path, "sshd_only")
    (sshd,) = m.jails
    assert sshd.filter.endswith("sshd.conf[mode=aggressive]")
    assert sshd.files == ()
    assert sshd.journal == (("_SYSTEMD_UNIT", ("ssh.service",)),)  # the alias resolved: journald records ssh
    assert (sshd.maxretry, sshd.bantime, sshd.escalation) == (3, 3600.0, (2.0, 7 * 86400.0))
    # 127.0.0.1/8 is not widened to 127.0.0.0/8 as fail2ban does, and dropped without a word: fail2ban's own
    # default, and loopback is never banned, so nothing is lost
    assert m.allowlist == ("192.0.2.0/24", "::1")
    (d,) = m.dropped
    assert d.what == "journalmatch alternative _COMM=sshd" and "cannot OR" in d.reason
    assert "journalmatch alternative _COMM=sshd" in text  # the reason is in the file too
    _valid(out, capsys)


def test_sshd_nginx_postfix_recidive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m, text, out = _migrate(tmp_path, "web_mail")
    by = {j.name: j for j in m.jails}
    assert list(by) == ["sshd", "nginx_http_auth", "postfix", "recidive"]
    assert by["sshd"].journal == (("_SYSTEMD_UNIT", ("ssh.service",)),)  # paths-overrides.local's sshd_backend
    assert by["nginx_http_auth"].files == ("/var/log/nginx/error.log",)
    assert by["postfix"].filter.endswith("postfix.conf[mode=aggressive]")  # jail.local's mode beats jail.conf's
    assert by["postfix"].files == ("/var/log/mail.log",)  # %(postfix_log)s through paths-debian.conf
    assert all(j.findtime == 1800.0 and j.maxretry == 4 for j in m.jails if not j.recidive)
    rec = by["recidive"]
    assert rec.recidive and rec.filter == "" and rec.bantime == 7 * 86400.0 and rec.findtime == 86400.0
    assert rec.ignoreip == ("203.0.113.7",)  # only what recidive ignores beyond the common allowlist
    assert m.allowlist == ("10.0.0.0/8", "::1")  # 127.0.0.1/8 dropped: host bits set (never widened)
    assert all(any("nftables" in n for n in j.notes) for j in m.jails)  # jail.d's banaction, replaced
    assert "fail2ban jail [nginx-http-auth]" in text
    _valid(out, capsys)


def test_custom_filters_and_what_cannot_be_carried(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m, text, out = _migrate(tmp_path, "custom")
    by = {j.name: j for j in m.jails}
    assert list(by) == ["sshd", "myapp"]  # apache-auth is disabled
    assert by["myapp"].filter == f"{tmp_path}/fail2ban/filter.d/myapp.conf"
    assert by["myapp"].files == ("/var/log/myapp/*.log", "/srv/myapp/app.log")
    assert by["myapp"].bantime is PERMANENT
    dropped = {(d.jail, d.what) for d in m.dropped}
    assert ("myapp", "ignorecommand") in dropped
    assert ("DEFAULT", "usedns = yes") in dropped and ("DEFAULT", "ignoreip myhost.example.org") in dropped
    assert len(m.dropped) == 3  # each [DEFAULT] fact once, not once per jail
    assert "[DEFAULT] usedns = yes: " in text and "(jails sshd, myapp)" in text
    for d in m.dropped:
        assert str(d).split(":")[0] in text  # every one is in the file, with its reason
    _valid(out, capsys)


def test_per_jail_actions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m, text, out = _migrate(tmp_path, "actions")
    by = {j.name: j for j in m.jails}
    acts = {a.name: a for a in m.actions}
    assert by["sshd"].actions == ("sendmail_whois_lines",)
    assert by["nginx_http_auth"].actions == ("sendmail_whois",)
    assert by["postfix"].actions == ("abuseipdb",)
    assert dict(acts["sendmail_whois_lines"].options) == {
        "sender": "fail2ban@example.org", "dest": "ops@example.org", "logpath": "/var/log/auth.log"}
    assert dict(acts["sendmail_whois"].options) == {"name": "nginx", "dest": "web@example.org"}
    assert dict(acts["abuseipdb"].options) == {"abuseipdb_apikey": "0123456789abcdef",
                                               "abuseipdb_category": "11,18"}
    assert acts["abuseipdb"].file.endswith("action.d/abuseipdb.conf")
    assert "abuseipdb.abuseipdb_apikey" in text and "0600" in text  # the key: a warning in the header
    doc = load_yaml(text, "x").value
    assert doc["actions"]["abuseipdb"]["options"]["abuseipdb_category"] == "11,18"
    assert doc["actions"]["sendmail_whois"] == {"type": "fail2ban", "file": acts["sendmail_whois"].file,
                                                "options": {"name": "nginx", "dest": "web@example.org"}}
    _valid(out, capsys)


@pytest.mark.skipif(not Path("/etc/fail2ban/jail.conf").is_file(), reason="fail2ban is not installed")
def test_this_hosts_fail2ban(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = plan_migration(read_jails("/etc/fail2ban"), "/etc/fail2ban", FsHost("/etc/fail2ban"))
    out = tmp_path / "c.yaml"
    out.write_text(render_config(m))
    _valid(out, capsys)


# --- the CLI ---------------------------------------------------------------------------------------------


def test_cli_writes_0600_and_refuses_to_overwrite(tmp_path: Path) -> None:
    etc, _ = _setup(tmp_path, "custom")
    target = tmp_path / "out.yaml"
    out, err = io.StringIO(), io.StringIO()
    assert main(["import-fail2ban-config", str(etc), "-o", str(target)], stdout=out, stderr=err) == 0
    assert target.stat().st_mode & 0o777 == 0o600
    assert "not carried over: [myapp] ignorecommand" in err.getvalue()
    assert "2 jails and 0 actions" in err.getvalue()
    first = target.read_text()
    err = io.StringIO()
    assert main(["import-fail2ban-config", str(etc), "-o", str(target)], stdout=out, stderr=err) == 1
    assert "exists; give --force to merge" in err.getvalue()
    assert main(["import-fail2ban-config", str(etc), "-o", str(target), "--force"], stdout=out, stderr=err) == 0
    again = target.read_text()  # merged into its own output: the same config, its notes once
    assert load_yaml(again, "x").value == load_yaml(first, "x").value and again.count(BEGIN) == 1
    assert main(["import-fail2ban-config", str(etc), "-o", str(target), "--force"], stdout=out, stderr=err) == 0
    assert target.read_text() == again
    out = io.StringIO()
    assert main(["import-fail2ban-config", str(etc)], stdout=out, stderr=io.StringIO()) == 0
    assert out.getvalue() == first
    err = io.StringIO()
    assert main(["import-fail2ban-config", str(tmp_path / "nowhere")], stdout=out, stderr=err) == 1
    assert "jail.conf: cannot read it" in err.getvalue()


def test_a_relative_dir_gives_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _setup(tmp_path, "actions")
    monkeypatch.chdir(tmp_path)
    assert main(["import-fail2ban-config", "fail2ban", "-o", "out.yaml"], stdout=io.StringIO(),
                stderr=io.StringIO()) == 0
    doc = load_yaml((tmp_path / "out.yaml").read_text(), "x").value
    paths = [j["filter"].split("[")[0] for j in doc["jails"].values()] + [a["file"] for a in doc["actions"].values()]
    assert paths and all(p.startswith(f"{tmp_path}/fail2ban/") for p in paths), paths
    monkeypatch.chdir("/")
    _valid(tmp_path / "out.yaml", capsys)


def test_force_never_writes_through_a_symlink(tmp_path: Path) -> None:
    etc, _ = _setup(tmp_path, "custom")
    victim = tmp_path / "shadow"
    victim.write_text("root:x:0:0\n")
    link = tmp_path / "nftblockd.yaml"
    link.symlink_to(victim)
    err = io.StringIO()
    assert main(["import-fail2ban-config", str(etc), "-o", str(link), "--force"], stdout=io.StringIO(),
                stderr=err) == 1
    assert f"{link} is a symbolic link (to {victim}): not written through it" in err.getvalue()
    assert victim.read_text() == "root:x:0:0\n" and link.is_symlink()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_force_replaces_the_file_atomically_keeping_its_group_mode(tmp_path: Path) -> None:
    etc, _ = _setup(tmp_path, "custom")
    target = tmp_path / "nftblockd.yaml"
    target.write_text("log_level: info\n")
    target.chmod(0o644)
    before = target.stat().st_ino
    assert main(["import-fail2ban-config", str(etc), "-o", str(target), "--force"], stdout=io.StringIO(),
                stderr=io.StringIO()) == 0
    st = target.stat()
    assert st.st_ino != before  # a new file renamed into place, not the old one truncated
    assert st.st_mode & 0o777 == 0o640  # the group the daemon reads it with keeps its read access
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


# --- pure parts, with a fake host ------------------------------------------------------------------------


class FakeHost:
    def __init__(self, journalmatch: str = "", ban_actions: tuple[str, ...] = ("iptables-multiport",)) -> None:
        self.jm = journalmatch
        self.ban_actions = ban_actions

    def filter_file(self, name: str) -> str | None:
        return None if name == "missing" else f"/f/filter.d/{name}.conf"

    def journalmatch(self, filter_path: str, options: Mapping[str, str]) -> str | None:
        return self.jm or None

    def action_file(self, name: str) -> str | None:
        return f"/f/action.d/{name}.conf"

    def ban_action(self, path: str, options: Mapping[str, str]) -> str | None:
        return "runs iptables" if Path(path).stem in self.ban_actions else None

    def action_problems(self, path: str, options: Mapping[str, str]) -> list[str]:
        return ["no actionban"] if "broken" in path else []

    def action_events(self, path: str, options: Mapping[str, str]) -> tuple[str, ...]:
        return ("ban", "unban") if "unban" in path else ("ban",)

    def real_unit(self, unit: str) -> str:
        return unit

    def log_access(self, path: str) -> str | None:
        return "the service may not read it" if "shadow" in path else None


def _cfg(text: str) -> F2bConfig:
    cfg = F2bConfig()
    cfg.merge(_parse_ini(text, "jail.local"))
    return cfg


BASE = "[DEFAULT]\nfilter = %(__name__)s\nlogpath = /var/log/x.log\nenabled = true\n"


def test_journalmatch_same_field_alternatives_become_a_list() -> None:
    m = plan_migration(_cfg(BASE + "[a]\nbackend = systemd\n"), "/f",
                       FakeHost("_SYSTEMD_UNIT=a.service + _SYSTEMD_UNIT=b.service"))
    assert m.jails[0].journal == (("_SYSTEMD_UNIT", ("a.service", "b.service")),) and m.dropped == ()
    m = plan_migration(_cfg(BASE + "[a]\nbackend = systemd\njournalmatch = _COMM=x PRIORITY=3\n"), "/f", FakeHost())
    assert m.jails[0].journal == (("_COMM", ("x",)), ("PRIORITY", ("3",)))


def test_escalation_from_multipliers_and_factor() -> None:
    m = plan_migration(_cfg(BASE + "[a]\nbantime = 10m\nbantime.increment = true\n"
                            "bantime.multipliers = 1 3 9 27\n"), "/f", FakeHost())
    assert m.jails[0].escalation == (3.0, 27 * 600.0) and m.dropped == ()
    m = plan_migration(_cfg(BASE + "[a]\nbantime = 10m\nbantime.increment = true\nbantime.factor = 3\n"
                            "bantime.maxtime = 1d\nbantime.rndtime = 5m\n"), "/f", FakeHost())
    assert m.jails[0].escalation == (2.0, 86400.0)
    assert {d.what for d in m.dropped} == {"bantime.factor", "bantime.rndtime"}
    m = plan_migration(_cfg(BASE + "[a]\nbantime = 10m\nbantime.increment = true\n"
                            "bantime.multipliers = 1 5 30 60\n"), "/f", FakeHost())
    assert m.jails[0].escalation == (6.0, 60 * 600.0)
    assert [d.what for d in m.dropped] == ["bantime.multipliers", "bantime.multipliers"]


def test_ignoreip_splits_into_common_and_per_jail() -> None:
    m = plan_migration(_cfg(BASE + "ignoreip = 127.0.0.1/8 10.1.2.3\n[a]\n[b]\nignoreip = %(known/ignoreip)s "
                            "2001:db8::/32, 192.0.2.1\nignoreself = false\n"), "/f", FakeHost())
    a, b = m.jails
    assert m.allowlist == ("10.1.2.3",)
    assert (a.ignoreip, b.ignoreip) == ((), ("192.0.2.1", "2001:db8::/32"))
    assert m.allowlist_self and [d.what for d in m.dropped] == ["ignoreself"]  # 127.0.0.1/8: nothing lost


def test_ignoreip_with_host_bits_is_dropped_with_the_fix_never_widened() -> None:
    """Issue 33: fail2ban reads `10.1.2.3/8` as 10.0.0.0/8; nftblockd allows no wider range than written."""
    m = plan_migration(_cfg(BASE + "ignoreip = 10.1.2.3/8 2001:db8::5/32 192.0.2.0/24\n[a]\n"), "/f", FakeHost())
    assert m.allowlist == ("192.0.2.0/24",)
    reasons = {d.what: d.reason for d in m.dropped}
    assert "write 10.0.0.0/8 to allow the range" in reasons["ignoreip 10.1.2.3/8"]
    assert "host bits set" in reasons["ignoreip 2001:db8::5/32"]


def test_actions_shared_renamed_and_refused() -> None:
    text = BASE + ("[a]\naction = iptables-multiport[port=ssh]\n  mail-whois[dest=x@y, chain=\"<known/chain>\"]\n"
                   "  broken\n[b-c]\naction = mail-whois[dest=x@y]\n  mail-whois[dest=z@y]\n"
                   "[d]\nfilter = missing\n[e]\nenabled = false\nfilter = missing\n")
    m = plan_migration(_cfg(text), "/f", FakeHost())
    assert [j.name for j in m.jails] == ["a", "b_c"]
    assert [(a.name, a.options) for a in m.actions] == [
        ("mail_whois", (("dest", "x@y"),)), ("mail_whois_2", (("dest", "z@y"),))]
    assert m.jails[1].actions == ("mail_whois", "mail_whois_2")
    assert {(d.jail, d.what) for d in m.dropped} == {("a", "action broken"), ("d", "the whole jail")}


def test_default_facts_are_reported_once_and_fail2bans_own_defaults_not_at_all() -> None:
    text = ("[DEFAULT]\nfilter = %(__name__)s\nlogpath = /var/log/x.log\nenabled = true\nusedns = yes\n"
            "bantime.increment = true\nbantime.rndtime = 5m\nbantime.factor = 1\nbantime.overalljails = false\n"
            "bantime.formula = ban.Time * (1<<(ban.Count if ban.Count<20 else 20)) * banFactor\n"
            "ignoreip = 127.0.0.1/8 ::1 name.example.org\nlogtimezone = UTC\n"
            "[a]\n[b]\n[c]\nlogtimezone = UTC\n[d]\nlogtimezone = UTC\n[e]\nusedns = no\n")
    m = plan_migration(_cfg(text), "/f", FakeHost())
    lines = [str(d) for d in m.dropped]
    assert [(d.jail, d.what) for d in m.dropped] == [
        ("DEFAULT", "bantime.rndtime"), ("DEFAULT", "usedns = yes"), ("DEFAULT", "logtimezone"),
        ("c, d", "logtimezone"), ("DEFAULT", "ignoreip name.example.org")], lines
    assert lines[1].endswith("(jails a, b, c, d)")  # e sets usedns = no itself
    assert lines[2].endswith("(jails a, b, e)") and lines[4].endswith("(jails a, b, c, d, e)")
    m = plan_migration(_cfg(BASE + "bantime.increment = true\nbantime.formula = ban.Time * 3\n[a]\n"), "/f",
                       FakeHost())
    assert [(d.jail, d.what) for d in m.dropped] == [("DEFAULT", "bantime.formula")]  # not fail2ban's own


@pytest.mark.parametrize(("text", "seconds"), [
    ("600", 600.0), ("10m", 600.0), ("1h 30m", 5400.0), ("1w", 604800.0), ("-1", -1.0), ("2d", 172800.0),
    ("1.5h", 5400.0), ("30 seconds", 30.0), ("5 minutes", 300.0), ("1d3h", 97200.0)])
def test_f2b_seconds(text: str, seconds: float) -> None:
    assert f2b_seconds(text) == seconds


@given(st.lists(st.tuples(st.integers(0, 1000), st.sampled_from(["s", "m", "h", "d", "w"])), min_size=1,
                max_size=4))
def test_f2b_seconds_sums_its_parts(parts: list[tuple[int, str]]) -> None:
    size = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    assert f2b_seconds(" ".join(f"{n}{u}" for n, u in parts)) == sum(n * size[u] for n, u in parts)


@given(st.text(max_size=20))
def test_f2b_seconds_refuses_or_reads(text: str) -> None:
    try:
        v = f2b_seconds(text)
    except ValueError:
        return  # refused with a reason, never another exception
    assert isinstance(v, float) and v == v


def test_split_spec_reads_quoted_commas() -> None:
    assert split_spec('x[a=1, b="p, q", c=\'r\']') == ("x", {"a": "1", "b": "p, q", "c": "r"})
    assert split_spec("plain") == ("plain", {})
    with pytest.raises(ValueError):
        split_spec("x[=1]")


@given(st.text(max_size=30))
def test_yaml_scalar_reads_back_as_the_same_string(s: str) -> None:
    doc = load_yaml(f"k: {yaml_scalar(s)}\n", "x")
    assert doc.value["k"] == s


def test_every_option_it_cannot_carry_is_listed_with_a_reason() -> None:
    text = BASE + (
        "[a]\nmaxretry = 0\nlogtimezone = UTC\nlogencoding = latin-1\nfailregex = ^x <HOST>$\n"
        "logpath = /var/log/a.log head\n  /var/log/b.log odd words\nbantime = 1h\nbantime.increment = true\n"
        "bantime.overalljails = true\nbantime.formula = ban.Time * 3\nbantime.maxtime = 100y\n"
        "action = mail[dest=\"a@b\", logpath=\"/x\n  /y\"]\n"
        "[b]\nbackend = systemd[journalpath=/var/log/journal/remote, journalflags=1]\n"
        "journalmatch = _COMM=b _PID=1 + _SYSTEMD_UNIT=b.service\nfilter = b[mode=\"a b\", x=1]\n"
        "[c]\nbackend = gamin2\nbantime.increment = true\nbantime.multipliers = 1 x\n"
        "[d]\nfilter =\n[e]\nbackend = systemd\n[f]\nlogpath =\n[1x]\njournalmatch = bad\nbackend = systemd\n"
        "[g]\nbantime = -1\nbantime.increment = true\n[h]\nmaxretry = lots\n")
    m = plan_migration(_cfg(text), "/f", FakeHost())
    by = {j.f2b_name: j for j in m.jails}
    dropped = {(d.jail, d.what) for d in m.dropped}
    assert set(by) == {"a", "b", "c", "g"}
    a = by["a"]
    assert a.maxretry == 1 and a.files == ("/var/log/a.log", "/var/log/b.log")
    assert a.escalation == (2.0, 3650 * 86400.0)  # 100y capped at nftblockd's longest ban
    assert {("a", "maxretry"), ("a", "logtimezone"), ("a", "logencoding = latin-1"), ("a", "failregex"),
            ("a", "logpath /var/log/a.log head"), ("a", "logpath /var/log/b.log odd words"),
            ("a", "bantime.overalljails"), ("a", "bantime.formula")} <= dropped
    assert dict(m.actions[0].options) == {"dest": "a@b", "logpath": "/x /y"}  # lines joined: shell words
    b = by["b"]
    assert b.journal == (("_SYSTEMD_UNIT", ("b.service",)),) and b.journal_path == "/var/log/journal/remote"
    assert b.filter == '/f/filter.d/b.conf[mode="a b", x=1]'
    assert {("b", "backend option journalflags=1"), ("b", "journalmatch alternative _COMM=b _PID=1")} <= dropped
    assert ("c", "backend = gamin2") in dropped and ("c", "bantime.multipliers") in dropped
    assert by["c"].escalation == (2.0, 3650 * 86400.0)  # 10m x 2**20 is longer than nftblockd allows
    assert by["g"].escalation is None and by["g"].bantime is PERMANENT
    for jail in ("d", "e", "f", "1x", "h"):
        assert (jail, "the whole jail") in dropped, jail
    reasons = {d.jail: d.reason for d in m.dropped if d.what == "the whole jail"}
    assert "no filter" in reasons["d"] and "journalmatch" in reasons["e"] and "no logpath" in reasons["f"]
    assert "journalmatch term 'bad'" in reasons["1x"]
    text = render_config(m)
    assert all(line.startswith("#") or len(line) <= 120 for line in text.splitlines())
    assert load_yaml(text, "x").problems == []


def test_jail_names_that_nftblockd_cannot_take_are_renamed() -> None:
    m = plan_migration(_cfg(BASE + "[9lives]\n[a-b]\n[a_b]\n[" + "x" * 30 + "]\n"), "/f", FakeHost())
    assert [j.name for j in m.jails] == ["j_9lives", "a_b", "a_b_2", "x" * 24]
    assert split_spec("  name  ") == ("name", {})
    with pytest.raises(ValueError):
        split_spec("two words")


@given(st.text(alphabet="ab-_.9X", min_size=1, max_size=30))
def test_taken_over_bans_find_the_jail_their_fail2ban_jail_became(name: str) -> None:
    m = plan_migration(_cfg(BASE + f"[{name}]\n"), "/f", FakeHost())
    running = {j.name for j in m.jails} | {"other"}
    assert our_jail(name, running) == (m.jails[0].name if m.jails else None)
    assert our_jail("nginx-http-auth", {"nginx_http_auth"}) == "nginx_http_auth"
    assert our_jail("sshd", {"sshd", "sshd_2"}) == "sshd" and our_jail("gone", {"sshd"}) is None


def test_an_action_file_with_an_actionunban_is_imported_to_run_on_unban_too(tmp_path: Path) -> None:
    # fail2ban runs actionunban on every unban: an import that ran it only on bans lost every unban notice
    (tmp_path / "action.d").mkdir()
    (tmp_path / "action.d" / "both.conf").write_text(
        "[Definition]\nactionban = logger ban <ip>\nactionunban = logger unban <ip>\n")
    (tmp_path / "action.d" / "banonly.conf").write_text("[Definition]\nactionban = logger ban <ip>\nactionunban =\n")
    host = FsHost(tmp_path)
    assert host.action_events(str(tmp_path / "action.d" / "both.conf"), {}) == ("ban", "unban")
    assert host.action_events(str(tmp_path / "action.d" / "banonly.conf"), {}) == ("ban",)
    m = plan_migration(_cfg(BASE + "[a]\naction = unbanning[dest=x@y]\n  plain\n"), "/f", FakeHost())
    assert [(a.name, a.on) for a in m.actions] == [("unbanning", ("ban", "unban")), ("plain", ("ban",))]
    rendered = render_config(m)
    assert "    on: [ban, unban]" in rendered and rendered.count("    on: ") == 1
