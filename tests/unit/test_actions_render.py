"""Rendering action runs: templates, argv, webhook bodies, fail2ban scripts; hostile log text never becomes
shell text (the scripts are run by a real /bin/sh here, the oracle for quoting)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.actions.f2baction import TagRef, load_action, render_shell, split_script
from nftblockd.actions.render import ActionEvent, CommandRun, WebhookPost, render, render_command
from nftblockd.argtemplate import PLACEHOLDERS, TemplateError, parse_template
from nftblockd.config import ActionConfig

F2B = Path("/etc/fail2ban/action.d")
needs_f2b = pytest.mark.skipif(not (F2B / "sendmail-whois-matches.conf").is_file(),
                               reason="fail2ban's action files are not installed")

HOSTILE = [
    "$(touch {d}/a)", "`touch {d}/b`", "x; touch {d}/c;", "'; touch {d}/d; '", '"; touch {d}/e; "',
    "$(touch {d}/f)\ntouch {d}/g", "%(known/dest)s <ip> <name> <matches>", "${{IFS}}|touch {d}/h&",
    "\"'`$(touch {d}/i)`'\"", "a\x00b",
]
# text a log line can hold (no NUL: an environment value cannot, render replaces it)
log_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=40)


def event(**kw: object) -> ActionEvent:
    base: dict[str, object] = dict(event="ban", address="198.51.100.7", jail="sshd", blocklist="default",
                                   origin="jail", reason="5 failures in 10m (sshd)", duration=3600.0,
                                   until=1_700_003_600.0, time=1_700_000_000.0, failures=5,
                                   matches=("line one", "line two"), host="web1")
    base.update(kw)
    return ActionEvent(**base)  # type: ignore[arg-type]


# -- templates -------------------------------------------------------------------------------------------


@given(st.text(alphabet=st.characters(blacklist_characters="{}"), max_size=30), st.sampled_from(sorted(PLACEHOLDERS)),
       log_text)
def test_a_template_puts_the_value_in_whole(prefix: str, name: str, value: str) -> None:
    t = parse_template(prefix + "{" + name + "}{{}}")
    assert t.render({name: value}) == prefix + value + "{}"


@pytest.mark.parametrize("bad", ["{nope}", "{address.__class__}", "{address[0]}", "{address!r}", "{address:>9}",
                                 "{", "}", "a{b"])
def test_templates_refuse_anything_but_known_names(bad: str) -> None:
    with pytest.raises(TemplateError):
        parse_template(bad)


@given(log_text, log_text)
def test_a_command_gets_each_value_in_its_own_argument(matches: str, reason: str) -> None:
    cfg = ActionConfig("n", "command", argv=("/usr/bin/notify", "{address}", "--why={reason}", "{matches}"),
                       env=(("WHO", "{jail}:{address}"),))
    run = render_command(cfg, event(matches=(matches,), reason=reason), skipped=3)
    assert run.argv == ("/usr/bin/notify", "198.51.100.7", f"--why={reason}", matches)
    assert run.env["WHO"] == "sshd:198.51.100.7" and run.env["NFTBLOCK_MATCHES"] == matches
    assert run.env["NFTBLOCK_SKIPPED"] == "3" and run.env["PATH"].startswith("/usr/local/sbin")
    assert "HOME" not in run.env  # the daemon's environment is not passed on


def test_field_texts() -> None:
    cfg = ActionConfig("n", "command", argv=("/bin/x", "{event} {family} {duration} {until} {time} {failures}"))
    assert render_command(cfg, event(), 0).argv[1] == "ban inet4 3600 1700003600 1700000000 5"
    assert render_command(cfg, event(duration=None, until=None, address="2001:db8::/64"), 0).argv[1] == \
        "ban inet6 permanent  1700000000 5"


# -- webhooks --------------------------------------------------------------------------------------------


def test_a_webhook_body_is_the_event_or_a_batch() -> None:
    one = ActionConfig("h", "webhook", url="http://127.0.0.1:1/x", headers=(("X-Token", "t"),), timeout=3.0)
    (post,) = render(one, [event(fields=(("user", "root"),))], 2, {})
    assert isinstance(post, WebhookPost) and post.timeout == 3.0
    assert ("X-Token", "t") in post.headers and ("Content-Type", "application/json") in post.headers
    body = json.loads(post.body)
    assert body["address"] == "198.51.100.7" and body["matches"] == ["line one", "line two"]
    assert body["skipped"] == 2 and body["fields"] == {"user": "root"} and body["duration"] == 3600.0
    many = ActionConfig("h", "webhook", url="http://127.0.0.1:1/x", batch=10)
    (post,) = render(many, [event(), event(address="198.51.100.8")], 0, {})
    assert isinstance(post, WebhookPost)
    assert [e["address"] for e in json.loads(post.body)["events"]] == ["198.51.100.7", "198.51.100.8"]


# -- fail2ban scripts ------------------------------------------------------------------------------------


def test_split_script_knows_the_quoting_context_of_each_tag() -> None:
    t = split_script("""a <ip> "b <matches> `c <ip> "<F-USER>"` $(d '<matches>')" '<name>' # <ip>""")
    tags = [p for p in t.parts if isinstance(p, TagRef)]
    assert tags == [TagRef("ip", "n"), TagRef("matches", "d"), TagRef("ip", "n"), TagRef("F-USER", "d"),
                    TagRef("matches", "s"), TagRef("name", "s")]  # the comment's <ip> is not a tag
    assert split_script(r"echo \"<matches>").parts[1] == TagRef("matches", "n")


SCRIPTS = [
    "printf '%s' <matches>",
    'printf "%s" "<matches>"',
    "printf '%s' '<matches>'",
    'printf "%s" "x`printf \'%s\' <matches>`"',
    'printf "%s" "$(printf "%s" "<matches>")"',
    "v=<matches>; printf '%s' \"$v\"",
]


@settings(max_examples=30, deadline=None)
@given(value=st.one_of(st.sampled_from(HOSTILE), log_text), script=st.sampled_from(SCRIPTS))
def test_no_log_text_becomes_shell_text(tmp_path_factory: pytest.TempPathFactory, value: str, script: str) -> None:
    """Whatever the value, the shell prints it back (one word, unchanged) and runs nothing of it."""
    d = tmp_path_factory.mktemp("pwn")
    value = value.format(d=d).replace("\x00", "") if "{d}" in value else value.replace("\x00", "")
    text, env = render_shell(split_script(script), {"matches": value, "ip": "198.51.100.7"})
    assert text == render_shell(split_script(script), {"matches": "other", "ip": "198.51.100.7"})[0]  # no trace
    out = subprocess.run(["/bin/sh", "-c", text], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True,
                         check=True).stdout.decode()
    expect = "x" + value if "`" in script else value
    if "$(" in script or "`" in script:
        expect = expect.rstrip("\n")  # command substitution drops trailing newlines
    assert out == expect
    assert list(d.iterdir()) == []


def test_trusted_tags_are_literal_only_when_plain() -> None:
    t = split_script("echo <ip> <name> <failures>")
    assert render_shell(t, {"ip": "2001:db8::1", "name": "sshd", "failures": "3"}) == (
        "echo 2001:db8::1 sshd 3", {})
    text, env = render_shell(t, {"ip": "1.2.3.4", "name": "x;y", "failures": "3"})
    assert text == 'echo 1.2.3.4 "${NFTBLOCK_NAME}" 3' and env == {"NFTBLOCK_NAME": "x;y"}


@needs_f2b
def test_a_mail_action_is_filled_like_fail2ban_and_hostile_matches_stay_data(tmp_path: Path) -> None:
    out = tmp_path / "mail.txt"
    stub = tmp_path / "sendmail"
    stub.write_text(f"#!/bin/sh\ncat > {out}\n")
    stub.chmod(0o755)
    action = load_action(F2B / "sendmail-whois-matches.conf",
                         {"mailcmd": str(stub), "dest": "ops@example.org", "_whois_command": "echo no-whois"})
    assert [k for k, _t in action.commands] == ["actionstart", "actionstop", "actionban"]
    hostile = tuple(h.format(d=tmp_path) for h in HOSTILE[:-1])
    cfg = ActionConfig("mail", "fail2ban", file=str(F2B / "sendmail-whois-matches.conf"))
    (run,) = render(cfg, [event(matches=hostile)], 0, {"mail": action})
    assert isinstance(run, CommandRun) and run.argv[:2] == ("/bin/sh", "-c")
    assert "touch" not in run.argv[2] and "${NFTBLOCK_MATCHES}" in run.argv[2]
    subprocess.run(run.argv, env=run.env, check=True, timeout=10)
    mail = out.read_text()
    assert "Subject: [Fail2Ban] sshd: banned 198.51.100.7 from web1" in mail
    assert "To: ops@example.org" in mail and "after\n5 attempts against sshd" in mail
    assert "no-whois" in mail
    for h in hostile:
        assert h in mail  # the lines as logged, %(...)s and <ip> included: never interpolated
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mail.txt", "sendmail"]


@needs_f2b
def test_name_and_init_options_follow_fail2ban(tmp_path: Path) -> None:
    action = load_action(F2B / "mail.conf", {"dest": "a@b", "name": "SSH"})
    ban = action.command("actionban")
    assert ban is not None
    text, _env = render_shell(ban, {"ip": "1.2.3.4", "name": "sshd", "failures": "2"})
    assert "[Fail2Ban] SSH: banned 1.2.3.4" in text and text.rstrip().endswith("a@b")
    plain = load_action(F2B / "mail.conf").command("actionban")
    assert plain is not None
    assert "[Fail2Ban] sshd: banned" in render_shell(plain, {"ip": "1.2.3.4", "name": "sshd"})[0]
    assert render_shell(plain, {"ip": "1.2.3.4", "name": "sshd"})[0].rstrip().endswith("root")


def shipped_actions() -> list[Path]:
    return sorted(F2B.glob("*.conf")) if F2B.is_dir() else []


@needs_f2b
@pytest.mark.parametrize("path", shipped_actions(), ids=lambda p: p.stem)
def test_every_shipped_action_is_refused_or_keeps_log_text_out_of_its_script(path: Path) -> None:
    """Each action.d file fail2ban ships either is refused (a firewall ban action, or no actionban) or renders
    a script in which no event value from a log line leaves a trace."""
    from nftblockd.actions.f2baction import check_action
    from nftblockd.actions.render import f2b_values

    if check_action(str(path), {}, ["ban"]):
        return
    action = load_action(path)
    ban = action.command("actionban")
    assert ban is not None
    cfg = ActionConfig("x", "fail2ban", file=str(path))
    scripts = set()
    for hostile in ("$(touch /tmp/x)", "`id`;'\"<ip>%(x)s"):
        values = f2b_values(action, cfg, event(matches=(hostile,), fields=(("user", hostile),)), 0)
        text, _env = render_shell(ban, values)
        scripts.add(text)
        assert hostile not in text
    assert len(scripts) == 1


def test_a_jail_option_naming_its_known_default_is_the_files_own_value(tmp_path: Path) -> None:
    # jail.conf's action_ passes `chain="<known/chain>"` to every action: "the action's own default". It used
    # to be read with the jail's option in place, so the file's value referred to itself (a refusal).
    path = tmp_path / "notify.conf"
    path.write_text("[Definition]\nactionban = echo <chain> <ip> <dest>\n\n[Init]\nchain = INPUT\ndest = root\n")
    action = load_action(path, {"chain": "<known/chain>", "dest": "<known/dest>@example.org"})
    ban = action.command("actionban")
    assert ban is not None
    assert render_shell(ban, {"ip": "192.0.2.7"})[0].strip() == "echo INPUT 192.0.2.7 root@example.org"
