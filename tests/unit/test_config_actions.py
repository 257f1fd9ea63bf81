"""The `actions:` schema (docs/actions.md): every mistake is refused with its file, line and reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from nftblockd.config import ActionConfig, ConfigError, examine_text, parse_config
from nftblockd.daemon.build import compile_actions

F2B = Path("/etc/fail2ban/action.d")
needs_f2b = pytest.mark.skipif(not (F2B / "sendmail-whois-matches.conf").is_file(),
                               reason="fail2ban's action files are not installed")

JAIL = """
jails:
  sshd:
    filter: sshd
    journal: {matches: {_SYSTEMD_UNIT: ssh.service}}
    actions: [notify, hook]
"""


def test_the_three_types_are_read_with_their_bounds() -> None:
    cfg = parse_config("""
actions:
  notify:
    type: command
    argv: [/usr/bin/logger, -t, nftblock, "banned {address} ({jail}): {reason}"]
    env: {JAIL: "{jail}"}
    on: [ban, unban]
    timeout: 5s
  hook:
    type: webhook
    url: http://127.0.0.1:8080/ban
    headers: {Authorization: Bearer x}
    retries: 4
    rate: 5
    burst: 50
    queue: 100
    batch: 20
""" + JAIL)
    notify, hook = cfg.actions
    assert notify == ActionConfig("notify", "command", on=("ban", "unban"), timeout=5.0, env=(("JAIL", "{jail}"),),
                                  argv=("/usr/bin/logger", "-t", "nftblock", "banned {address} ({jail}): {reason}"))
    assert (hook.url, hook.headers, hook.retries, hook.rate, hook.burst, hook.queue, hook.batch) == (
        "http://127.0.0.1:8080/ban", (("Authorization", "Bearer x"),), 4, 5.0, 50, 100, 20)
    assert hook.on == ("ban",) and hook.concurrency == 1
    assert cfg.jails[0].actions == ("notify", "hook")


@needs_f2b
def test_a_fail2ban_action_file_with_options() -> None:
    cfg = parse_config(f"""
actions:
  mail:
    type: fail2ban
    file: {F2B}/sendmail-whois-matches.conf
    options: {{dest: ops@example.org, sender: fail2ban}}
fleet:
  name: f
  host_id: h1
  url: redis://127.0.0.1:7000
  actions: [mail]
feeds:
  drop:
    url: https://example.org/drop.txt
    blocklist: feedlist
    actions: [mail]
blocklists: {{default: {{}}, feedlist: {{}}}}
""")
    (mail,) = cfg.actions
    assert mail.file.endswith("sendmail-whois-matches.conf")
    assert dict(mail.options) == {"dest": "ops@example.org", "sender": "fail2ban"}
    assert cfg.fleet is not None and cfg.fleet.actions == ("mail",)
    assert cfg.feeds[0].actions == ("mail",)


def problems(text: str) -> list[str]:
    _cfg, found = examine_text(text, "c.yaml")
    return [str(p) for p in found if not p.warning]


def problems_built(text: str) -> list[str]:
    """Problems of the file and of its build step (the action files read), as --check-config reports them."""
    cfg, found = examine_text(text, "c.yaml")
    assert cfg is not None
    return [str(p) for p in sorted(found + compile_actions(cfg)[1], key=lambda p: p.line) if not p.warning]


def test_unknown_names_types_keys_and_bad_templates_are_refused_each_at_its_line() -> None:
    text = """actions:
  notify:
    type: command
    argv: [/usr/bin/logger, "{address} {bogus}", "{"]
    env: {"bad name": x, OK: "{address.__class__}"}
  rel:
    type: command
    argv: [logger, x]
  hook:
    type: webhook
    url: ftp://x
    on: [ban, start]
    argv: [x]
  what:
    type: mail
jails:
  sshd:
    filter: sshd
    journal: {matches: {_SYSTEMD_UNIT: ssh.service}}
    actions: [notify, nope, notify]
"""
    found = problems(text)
    expect = [
        "c.yaml:4: actions.notify.argv.1: unknown placeholder {bogus}",
        "c.yaml:4: actions.notify.argv.2: unmatched '{'",
        "c.yaml:5: actions.notify.env.bad name: 'bad name' is not a valid environment variable name",
        "c.yaml:5: actions.notify.env.OK: unknown placeholder {address.__class__}",
        "c.yaml:8: actions.rel.argv.0: the program must be an absolute path",
        "c.yaml:11: actions.hook.url: a webhook needs url:",
        "c.yaml:12: actions.hook.on.1: unknown event 'start'",
        "c.yaml:13: actions.hook.argv: unknown key 'argv'",
        "c.yaml:15: actions.what.type: an action needs type: command, webhook, fail2ban; got 'mail'",
        "c.yaml:20: jails.sshd.actions.1: unknown action 'nope'",
        "c.yaml:20: jails.sshd.actions.2: action 'notify' is listed twice",
    ]
    for e in expect:
        assert any(f.startswith(e) for f in found), (e, found)
    assert len(found) == len(expect), found


@needs_f2b
def test_fail2ban_files_that_cannot_serve_are_refused() -> None:
    found = problems_built(f"""actions:
  ipt:
    type: fail2ban
    file: {F2B}/iptables.conf
  mail:
    type: fail2ban
    file: {F2B}/sendmail-whois.conf
    on: [ban, unban]
  gone:
    type: fail2ban
    file: {F2B}/no-such-action.conf
  relative:
    type: fail2ban
    file: mail.conf
""")
    assert [f.split(": ", 2)[:2] for f in found] == [["c.yaml:4", "actions.ipt.file"],
                                                      ["c.yaml:7", "actions.mail.file"],
                                                      ["c.yaml:11", "actions.gone.file"],
                                                      ["c.yaml:14", "actions.relative.file"]]
    assert "is a ban action" in found[0] and "has no actionunban" in found[1]


def test_a_bad_config_raises_with_every_problem() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config("actions:\n  a:\n    type: webhook\n")
    assert "a webhook needs url:" in str(exc.value)


def test_values_spanning_lines_only_where_fail2ban_has_them() -> None:
    cfg, found = examine_text(r"""actions:
  m: {type: fail2ban, file: /etc/fail2ban/action.d/mail-whois-lines.conf, options: {logpath: "/a\n/b"}}
  w: {type: webhook, url: "http://127.0.0.1:1/", headers: {X-A: "x\r\nInjected: 1"}}
  c: {type: command, argv: [/bin/true], env: {A: "x\ny", B: "\0"}}
""", "c.yaml")
    assert [str(p) for p in found] == [
        "c.yaml:3: actions.w.headers.X-A: the value of 'X-A' must be one line (no CR, LF or NUL)",
        "c.yaml:4: actions.c.env.A: the value of 'A' must be one line (no CR, LF or NUL)",
        "c.yaml:4: actions.c.env.B: the value of 'B' must be one line (no CR, LF or NUL)"]
    assert cfg is not None and dict(cfg.actions[0].options) == {"logpath": "/a\n/b"}


def test_lifecycle_is_a_fail2ban_actions_true_or_false() -> None:
    text = """actions:
  quiet: {type: fail2ban, file: /x/mail-buffered.conf, lifecycle: false}
  loud: {type: fail2ban, file: /x/mail-buffered.conf}
  bad:
    type: fail2ban
    file: /x/mail-buffered.conf
    lifecycle: "no"
  cmd: {type: command, argv: [/bin/true], lifecycle: false}
"""
    cfg, found = examine_text(text, "c.yaml")
    assert cfg is not None and [a.lifecycle for a in cfg.actions] == [False, True, True, True]
    bad, cmd = (str(p) for p in found)
    assert bad == ("c.yaml:7: actions.bad.lifecycle: lifecycle is true or false (whether the file's actionstart "
                   "and actionstop run), got 'no'")
    assert cmd.startswith("c.yaml:8: actions.cmd.lifecycle: unknown key 'lifecycle'")
