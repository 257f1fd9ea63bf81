"""`import-fail2ban-config -o FILE --force` merges into the config FILE holds: nothing it held is lost.

The README's migration commands run against the example config the package installs (config/nftblockd.yaml):
its metrics, control, blocklists, feeds and fleet blocks stay, comments included, and the result passes
`--check-config`. The merge itself (migrate/merge.py) is pure: text in, text out, also property-tested.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.cli.main import main
from nftblockd.config.yamlsrc import load_yaml
from nftblockd.migrate.f2bjail import ActionPlan, JailPlan, Migration
from nftblockd.migrate.merge import MergeError, merge_config
from nftblockd.migrate.render import BEGIN
from tests.unit.test_f2bmigrate import _setup, _valid
from tests.unit.test_f2bmigrate import no_host_network as no_host_network  # autouse: the drop-in's host facts

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "nftblockd.yaml"
_WRITTEN = {"jails", "actions", "allowlist"}


def _import(tmp_path: Path, scenario: str | None, existing: str) -> tuple[int, str, str]:
    etc = tmp_path / "fail2ban"
    if scenario is not None:
        etc, _ = _setup(tmp_path, scenario)
    target = tmp_path / "nftblockd.yaml"
    target.write_text(existing)
    err = io.StringIO()
    code = main(["import-fail2ban-config", str(etc), "-o", str(target), "--force"], stdout=io.StringIO(), stderr=err)
    return code, target.read_text(), err.getvalue()


def test_the_readme_commands_keep_everything_the_installed_config_held(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before_text = EXAMPLE.read_text()
    code, text, err = _import(tmp_path, "actions", before_text)
    assert code == 0, err
    before, after = load_yaml(before_text, "x").value, load_yaml(text, "x").value
    for key in set(before) - _WRITTEN:
        assert after[key] == before[key], key  # metrics, control, blocklists, feeds, fleet, ...
    assert after["metrics"] == {"listen": "127.0.0.1:9789"}  # the Prometheus endpoint stays on
    assert after["allowlist"] == before["allowlist"]  # fail2ban's ignoreip adds nothing new here
    assert set(after["jails"]) == {"sshd", "nginx_http_auth", "postfix"}
    assert after["jails"]["sshd"]["filter"].endswith("filter.d/sshd.conf[mode=normal]")  # fail2ban's sshd
    assert set(after["actions"]) == {"sendmail_whois_lines", "sendmail_whois", "abuseipdb"}
    for line in before_text.splitlines():  # every line, comments included, is still there (the replaced
        assert line.strip() in text or line == "actions: {}", line  # jail's as a comment)
    assert "# the jail sshd this file had before the import, replaced by fail2ban's [sshd]:" in text
    assert "merged into" in err and "jails: sshd replaced by fail2ban's [sshd]" in err
    _valid(tmp_path / "nftblockd.yaml", capsys)
    # again: the same file (its notes replaced, the jails it imported replaced without a second copy)
    code, again, err = _import(tmp_path, None, text)
    assert code == 0 and load_yaml(again, "x").value == after and again.count(BEGIN) == 1
    assert again.count("# the jail sshd this file had before") == 1


def _plan(*jails: JailPlan, actions: tuple[ActionPlan, ...] = (), allowlist: tuple[str, ...] = (),
          allowlist_self: bool = True) -> Migration:
    return Migration("/etc/fail2ban", jails, actions, allowlist, allowlist_self, ())


SSHD = JailPlan("sshd", "sshd", "/etc/fail2ban/filter.d/sshd.conf", ("/var/log/auth.log",),
                actions=("mail", "abuseipdb"))
WEB = JailPlan("nginx_http_auth", "nginx-http-auth", "/etc/fail2ban/filter.d/nginx-http-auth.conf",
               ("/var/log/nginx/error.log",), actions=("mail",))
MAIL = ActionPlan("mail", "/etc/fail2ban/action.d/sendmail-whois.conf", (("dest", "ops@example.org"),))
ABUSE = ActionPlan("abuseipdb", "/etc/fail2ban/action.d/abuseipdb.conf", (("abuseipdb_apikey", "k"),))

EXISTING = """\
# my config
table: inet nftblock
allowlist:
  - 192.0.2.0/24   # office
allowlist_self: false
jails:
    # my own jail
    app:
        filter: /etc/nftblockd/app.yaml
        files: [/var/log/app.log]

    sshd:
        filter: sshd
        journal: {matches: {_SYSTEMD_UNIT: ssh.service}}
actions:
    mail:                      # a command of mine, not fail2ban's mail
        type: command
        argv: [/usr/local/bin/page, "{address}"]
    abuseipdb:
        type: fail2ban
        file: /etc/fail2ban/action.d/abuseipdb.conf
        options: {abuseipdb_apikey: k}
metrics: {listen: "127.0.0.1:9789"}   # scraped
"""


def test_jails_and_actions_are_merged_by_name() -> None:
    m = _plan(SSHD, WEB, actions=(MAIL, ABUSE), allowlist=("127.0.0.0/8", "192.0.2.0/24"), allowlist_self=True)
    r = merge_config(EXISTING, "/etc/nftblockd/nftblockd.yaml", m)
    doc = load_yaml(r.text, "x")
    v = doc.value
    assert doc.problems == []
    assert v["metrics"] == {"listen": "127.0.0.1:9789"} and "# scraped" in r.text and "# my config" in r.text
    assert v["allowlist"] == ["192.0.2.0/24", "127.0.0.0/8"]  # the office kept, fail2ban's loopback added
    assert v["allowlist_self"] is False  # the file's own choice, said
    assert list(v["jails"]) == ["app", "sshd", "nginx_http_auth"]  # app kept where it was, sshd in place
    assert v["jails"]["app"] == {"filter": "/etc/nftblockd/app.yaml", "files": ["/var/log/app.log"]}
    assert v["jails"]["sshd"]["filter"] == SSHD.filter and "    # my own jail" in r.text
    # fail2ban's mail is renamed (the file's mail is another action); its abuseipdb is the file's own
    assert v["actions"]["mail"]["type"] == "command" and v["actions"]["mail_2"]["file"] == MAIL.file
    assert set(v["actions"]) == {"mail", "abuseipdb", "mail_2"}
    assert v["jails"]["sshd"]["actions"] == ["mail_2", "abuseipdb"] and v["jails"]["nginx_http_auth"]["actions"] \
        == ["mail_2"]
    assert any("allowlist_self: kept" in n for n in r.notes)
    assert any("fail2ban's mail is named mail_2" in n for n in r.notes)
    assert r.kept == ("table", "allowlist", "allowlist_self", "jails", "actions", "metrics")


def test_flow_style_blocks_are_written_again_from_their_values() -> None:
    text = ("allowlist: [192.0.2.1]\njails: {app: {filter: x, files: [/var/log/a]}, sshd: {filter: sshd}}\n"
            "actions: {}\nfeeds: {f: {url: 'https://x/y'}}\n")
    r = merge_config(text, "c.yaml", _plan(SSHD, actions=(MAIL, ABUSE), allowlist=("::1",)))
    v = load_yaml(r.text, "x").value
    assert v["allowlist"] == ["192.0.2.1", "::1"] and v["feeds"] == {"f": {"url": "https://x/y"}}
    assert list(v["jails"]) == ["app", "sshd"] and v["jails"]["app"] == {"filter": "x", "files": ["/var/log/a"]}
    assert v["jails"]["sshd"]["filter"] == SSHD.filter and set(v["actions"]) == {"mail", "abuseipdb"}
    assert "jails: sshd replaced by fail2ban's [sshd]" in r.notes


def test_what_the_file_lacks_is_added_and_an_empty_file_takes_the_import_alone() -> None:
    r = merge_config("table: inet x  # mine\n", "c.yaml", _plan(SSHD, actions=(MAIL, ABUSE), allowlist=("::1",)))
    v = load_yaml(r.text, "x").value
    assert v["table"] == "inet x" and v["allowlist"] == ["::1"] and v["allowlist_self"] is True
    assert set(v["jails"]) == {"sshd"} and set(v["actions"]) == {"mail", "abuseipdb"}
    r = merge_config("# nothing yet\n\n", "c.yaml", _plan(SSHD))
    assert r.kept == () and set(load_yaml(r.text, "x").value["jails"]) == {"sshd"}


@pytest.mark.parametrize(("text", "why"), [
    ("jails: [a\n", "c.yaml:2: "), ("- a\n- b\n", "c.yaml:1: not an nftblockd config"),
    ("a: 1\na: 2\n", "c.yaml:2: "), ("jails: {a: &x {filter: y}}\nb: *x\n", "would not load"),
])
def test_a_file_it_cannot_merge_into_is_refused_and_left_alone(text: str, why: str) -> None:
    with pytest.raises(MergeError, match="not merged") as exc:
        merge_config(text, "c.yaml", _plan(JailPlan("a", "a", "/f")))
    assert why in str(exc.value)


def test_the_cli_leaves_a_file_it_cannot_merge_into_as_it_was(tmp_path: Path) -> None:
    code, text, err = _import(tmp_path, "custom", "jails: [oops\n")
    assert (code, text) == (1, "jails: [oops\n") and "not merged" in err


_SCALARS = st.one_of(st.integers(-5, 10**6), st.booleans(), st.none(),
                     st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=8))
_VALUES = st.recursive(_SCALARS, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
    st.text("abcxyz_", min_size=1, max_size=5), kids, max_size=3), max_leaves=8)
_JAILS = st.dictionaries(st.sampled_from(["sshd", "app", "web", "nginx_http_auth"]),
                         st.dictionaries(st.sampled_from(["filter", "files", "maxretry"]), _VALUES, min_size=1,
                                         max_size=3), max_size=3)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["metrics", "control", "feeds", "fleet", "table", "batch"]), _VALUES,
                       max_size=4), _JAILS, st.booleans(), st.booleans())
def test_merging_keeps_every_key_and_jail_it_does_not_replace(other: dict[str, Any], jails: dict[str, Any],
                                                             flow: bool, with_allow: bool) -> None:
    doc: dict[str, Any] = {**other, "jails": jails}
    if with_allow:
        doc["allowlist"] = ["192.0.2.0/24"]
    text = yaml.safe_dump(doc, default_flow_style=flow, allow_unicode=True, sort_keys=False)
    r = merge_config(text, "c.yaml", _plan(SSHD, WEB, actions=(MAIL,), allowlist=("::1",)))
    v = load_yaml(r.text, "x").value
    for k, x in other.items():
        assert v[k] == x, k
    for name, j in jails.items():
        if name not in ("sshd", "nginx_http_auth"):
            assert v["jails"][name] == j
    assert v["jails"]["sshd"]["filter"] == SSHD.filter and v["jails"]["nginx_http_auth"]["filter"] == WEB.filter
    assert v["allowlist"] == (["192.0.2.0/24", "::1"] if with_allow else ["::1"])
