"""Each imported action says what the packaged unit's sandbox needs: the import writes the drop-in
(`IPAddressAllow=` for the hosts its scripts reach and the resolver, `ReadWritePaths=` for what they write)
or says in one line why none is needed. Host facts (name resolution, /etc/resolv.conf, sendmail) are faked.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nftblockd.cli.main import main
from nftblockd.config.yamlsrc import load_yaml
from nftblockd.migrate import netfacts
from nftblockd.migrate.dropin import (
    MARKER,
    SYSTEM_DROPIN,
    ActionNeeds,
    MailFacts,
    default_path,
    needs_of,
    render_dropin,
    url_hosts,
)
from tests.unit.test_f2bmigrate import _setup, _valid

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "nftblockd.yaml"

WEBHOOK = """[Definition]
actionstart =
actionban = curl -fsS -m 5 -X POST "http://<host>:8080/hook" --data-urlencode "ip=<ip>" --data-urlencode "jail=<name>"
actionunban = curl -fsS -m 5 -X DELETE "http://<host>:8080/hook/<ip>"
[Init]
host = 192.0.2.10
"""
BUFFERED = """[Definition]
actionban = printf %%b "<ip>\\n" >> <tmpfile>
actionstop = if [ -f <tmpfile> ]; then cat <tmpfile> | /usr/sbin/sendmail -f "<sender>" "<dest>"; rm -f <tmpfile>; fi
[Init]
tmpfile = /var/run/fail2ban/tmp-mail.txt
sender = fail2ban
dest = root
"""
JAILS = """[DEFAULT]
mta = sendmail
[sshd]
enabled = true
logpath = /var/log/auth.log
action = webhook
         buffered
         abuseipdb[abuseipdb_apikey="k"]
[nginx-http-auth]
enabled = true
logpath = /var/log/nginx/error.log
action = webhook[host=127.0.0.1]
"""


@pytest.fixture(autouse=True)
def host_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    names = {"api.abuseipdb.com": ("104.26.12.38", "2606:4700:20::681a:c26")}
    monkeypatch.setattr(netfacts, "resolve", lambda name: names.get(name, "Name or service not known"))
    monkeypatch.setattr(netfacts, "resolvers", lambda: ("127.0.0.53", "192.0.2.53"))
    monkeypatch.setattr(netfacts, "mail_facts", lambda: MailFacts("postfix"))


def _run(tmp_path: Path, jails: str, *extra: str) -> tuple[int, str, Path]:
    etc, _ = _setup(tmp_path, None)
    (etc / "action.d" / "webhook.conf").write_text(WEBHOOK)
    (etc / "action.d" / "buffered.conf").write_text(BUFFERED)
    (etc / "jail.local").write_text(jails)
    err = io.StringIO()
    code = main(["import-fail2ban-config", str(etc), "-o", str(tmp_path / "nftblockd.yaml"), *extra],
                stdout=io.StringIO(), stderr=err)
    return code, err.getvalue(), tmp_path / "nftblockd.service.d" / "fail2ban-actions.conf"


def test_the_drop_in_allows_what_the_actions_reach(tmp_path: Path) -> None:
    code, err, dropin = _run(tmp_path, JAILS)
    assert code == 0, err
    text = dropin.read_text()
    lines = text.splitlines()
    assert lines[0] == MARKER and "[Service]" in lines
    settings = [ln for ln in lines if ln and not ln.startswith(("#", "["))]
    assert settings == ["IPAddressAllow=192.0.2.10", "ReadWritePaths=-/var/run/fail2ban",
                        "IPAddressAllow=104.26.12.38 2606:4700:20::681a:c26",
                        "IPAddressAllow=192.0.2.53"]  # the resolver off loopback; 127.0.0.53 is allowed already
    assert "webhook: 192.0.2.10" in text and "webhook_2" not in text.replace("# ", "")  # 127.0.0.1: nothing
    assert "postfix's sendmail hands mail to a set-group-id helper" in text  # said, not "fixed"
    assert f"wrote the unit's drop-in for the imported actions to {dropin}" in err
    assert "systemctl daemon-reload && systemctl restart nftblockd" in err
    assert "action abuseipdb reaches api.abuseipdb.com" in err


def test_no_drop_in_when_none_is_needed_and_an_old_one_is_removed(tmp_path: Path) -> None:
    code, err, dropin = _run(tmp_path, JAILS)
    assert code == 0 and dropin.exists()
    code, err, _ = _run(tmp_path / "again", "[sshd]\nenabled = true\nlogpath = /var/log/auth.log\n"
                        "action = webhook[host=127.0.0.1]\n", "--force", "--dropin", str(dropin))
    assert code == 0, err
    assert "no drop-in needed: the imported actions reach no address but loopback" in err
    assert not dropin.exists() and f"removed {dropin}" in err
    code, err, _ = _run(tmp_path / "third", "[sshd]\nenabled = true\nlogpath = /var/log/auth.log\n",
                        "--dropin", str(dropin))
    assert "nftblock: no drop-in needed: no action was imported\n" in err


def test_without_a_file_the_needs_are_said(tmp_path: Path) -> None:
    etc, _ = _setup(tmp_path, None)
    (etc / "action.d" / "webhook.conf").write_text(WEBHOOK)
    (etc / "jail.local").write_text("[sshd]\nenabled = true\nlogpath = /var/log/auth.log\naction = webhook\n")
    err = io.StringIO()
    assert main(["import-fail2ban-config", str(etc)], stdout=io.StringIO(), stderr=err) == 0
    assert "need a drop-in for the packaged unit; give -o or --dropin FILE" in err.getvalue()
    assert "IPAddressAllow=192.0.2.10" in err.getvalue()


def test_a_symlinked_drop_in_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("x\n")
    link = tmp_path / "link.conf"
    link.symlink_to(victim)
    code, err, _ = _run(tmp_path, JAILS, "--dropin", str(link))
    assert code == 1 and "is a symbolic link" in err and victim.read_text() == "x\n"


# --- pure ---------------------------------------------------------------------------------------------------


def test_needs_of_reads_urls_mail_and_writes() -> None:
    n = needs_of("a", ['curl "https://user:pw@Hooks.Example.net:8443/x?y" http://[2001:db8::5]/z',
                       "wget -q http://localhost/ok http://127.0.0.2/ok; echo x >> /run/nftblockd/ok 2>/dev/null",
                       "printf 'mail me' | mail -s subject root; touch /var/lib/app/stamp; rm -f /tmp/x"])
    assert n == ActionNeeds("a", ("hooks.example.net", "2001:db8::5"), True, ("/var/lib/app",))
    assert needs_of("b", ['printf "a mail for you" > /dev/null']) == ActionNeeds("b")
    d = render_dropin([needs_of("c", ["echo >> /var/lib/x%n/f"])], "/c", {}, (), MailFacts("other"))
    assert d.text is not None and "ReadWritePaths=" not in d.text.replace("give it ReadWritePaths=", "")


def test_render_dropin_for_msmtp_exim_and_names_that_do_not_resolve() -> None:
    needs = [ActionNeeds("m", mail=True), ActionNeeds("w", ("hooks.example.net",))]
    d = render_dropin(needs, "/c.yaml", {"relay.example.net": ("198.51.100.25",)}, ("192.0.2.53",),
                      MailFacts("msmtp", ("relay.example.net", "127.0.0.1")))
    assert d.text is not None
    settings = [ln for ln in d.text.splitlines() if ln.startswith("IPAddressAllow")]
    assert settings == ["IPAddressAllow=198.51.100.25", "IPAddressAllow=192.0.2.53"]
    assert "#IPAddressAllow=ADDRESSES-OF-hooks.example.net" in d.text
    assert any("did not resolve" in s for s in d.said)
    d = render_dropin([ActionNeeds("m", mail=True)], "/c.yaml", {}, (), MailFacts("exim"))
    assert d.text is not None and "Nothing to allow here" in d.text and "set-user-id" in d.text
    d = render_dropin([ActionNeeds("m", mail=True)], "/c.yaml", {}, (), MailFacts("missing"))
    assert d.text is not None and "no /usr/sbin/sendmail" in d.text
    assert render_dropin([ActionNeeds("m", mail=True)], "/c", {}, (), MailFacts("other")).text is None


@given(st.text(max_size=200))
def test_url_hosts_reads_any_text(text: str) -> None:
    for h in url_hosts(text):
        assert h and h in text.lower() and not any(c.isspace() for c in h)


@given(st.lists(st.text(max_size=80), max_size=4))
def test_needs_of_any_scripts_renders(scripts: list[str]) -> None:
    n = needs_of("a", scripts)
    d = render_dropin([n], "/c", {h: ("192.0.2.1",) for h in n.hosts}, ("192.0.2.53",), MailFacts("msmtp"))
    assert d.said
    if d.text is not None:
        for ln in d.text.splitlines():
            assert ln.startswith("#") or ln == "[Service]" or re.fullmatch(
                r"IPAddressAllow=[0-9a-f.: ]+|ReadWritePaths=-/[A-Za-z0-9._/+@:,=-]*", ln), ln


def test_the_journey_setup_into_the_installed_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """tests/data/fail2ban/scenarios/journey (sshd from the journal, nginx with a webhook, postfix, a
    prefregex filter, recidive, the sendmail mail action everywhere) by the README's first command into the
    example config: everything kept, each [DEFAULT] fact once, and the drop-in for the webhook."""
    etc, _ = _setup(tmp_path, "journey")
    target = tmp_path / "nftblockd.yaml"
    target.write_text(EXAMPLE.read_text())
    err = io.StringIO()
    assert main(["import-fail2ban-config", str(etc), "-o", str(target), "--force"], stdout=io.StringIO(),
                stderr=err) == 0, err.getvalue()
    lines = err.getvalue().splitlines()
    dropped = [ln for ln in lines if "not carried over:" in ln]
    assert len(dropped) == 3 and not any("bantime.formula" in ln for ln in dropped), dropped
    assert sum("[DEFAULT] usedns = yes" in ln for ln in dropped) == 1
    v = load_yaml(target.read_text(), "x").value
    assert v["metrics"] == {"listen": "127.0.0.1:9789"} and set(v["blocklists"]) == {"default", "feeds"}
    assert set(v["jails"]) == {"sshd", "nginx_http_auth", "postfix", "myapp", "recidive"}
    assert v["jails"]["myapp"]["filter"] == f"{etc}/filter.d/myapp-pref.conf"
    assert v["jails"]["sshd"]["escalation"] == {"factor": 2, "max": "7d"}
    dropin = (tmp_path / "nftblockd.service.d" / "fail2ban-actions.conf").read_text()
    assert [ln for ln in dropin.splitlines() if ln.startswith("IPAddressAllow")] == ["IPAddressAllow=192.0.2.10"]
    assert sum("set-group-id helper" in ln for ln in lines) == 1  # the mail fact once, for all five
    _valid(target, capsys)


def test_the_drop_in_goes_where_the_packaged_unit_reads_it() -> None:
    assert default_path("/etc/nftblockd/nftblockd.yaml") == SYSTEM_DROPIN
    assert SYSTEM_DROPIN.startswith("/etc/systemd/system/nftblockd.service.d/")
    assert default_path("/srv/x/c.yaml") == "/srv/x/nftblockd.service.d/fail2ban-actions.conf"
