"""fail2ban's jail files are outside input: any text in gives a plan (with what it drops, and why) or a
refusal with a reason (FilterError, file:line), never another exception; and what is rendered from a plan
loads back as YAML. The reader is detect/f2b.py's (`_parse_ini`, interpolation), the plan migrate/f2bjail.py's.
"""

from __future__ import annotations

from hypothesis import event, given, settings
from hypothesis import strategies as st

from nftblockd.config.yamlsrc import load_yaml
from nftblockd.detect.f2b import F2bConfig, _parse_ini
from nftblockd.detect.matcher import FilterError
from nftblockd.migrate.f2bjail import plan_migration
from nftblockd.migrate.merge import MergeError, merge_config
from nftblockd.migrate.render import render_config
from tests.unit.test_f2bmigrate import FakeHost

_OPTIONS = ["enabled", "filter", "logpath", "backend", "journalmatch", "maxretry", "findtime", "bantime",
            "bantime.increment", "bantime.multipliers", "bantime.factor", "bantime.formula", "bantime.maxtime",
            "ignoreip", "ignoreself", "action", "usedns", "logencoding", "failregex", "port", "mode"]
_VALUES = st.one_of(
    st.sampled_from(["true", "false", "sshd", "/var/log/x.log", "systemd", "_SYSTEMD_UNIT=a.service + _COMM=a",
                     "3", "-1", "10m", "1h 30m", "1 2 4 8", "2", "127.0.0.1/8 ::1 host.example", "mail[dest=a@b]",
                     "%(__name__)s", "%(known/bantime)s", "%(missing)s", "x[a=\"b, c\"]", "ban.Time * 2", "yes"]),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20))
_KV = st.builds(lambda k, v: f"{k} = {v}", st.sampled_from(_OPTIONS), _VALUES)
_LINE = st.one_of(
    _KV, _KV, _KV,  # weighted: mostly options, so that plans are made as often as refusals
    st.builds(lambda s: f"[{s}]",
              st.sampled_from(["DEFAULT", "sshd", "nginx-http-auth", "a b", "9x", "INCLUDES", "x\x1b"])),
    st.sampled_from(["  continued line", "# comment", "", "before = paths-debian.conf"]))
_JUNK = st.one_of(st.sampled_from(["=", "[", "x", " = y"]),
                  st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=30))


@settings(max_examples=150, deadline=None)
@given(st.lists(_LINE, max_size=14), st.booleans(), st.none() | st.tuples(st.integers(0, 14), _JUNK))
def test_any_jail_file_gives_a_plan_or_a_reason(lines: list[str], base: bool,
                                                junk: tuple[int, str] | None) -> None:
    if junk is not None:
        lines.insert(junk[0], junk[1])
    head = "[DEFAULT]\nenabled = true\nfilter = sshd\nlogpath = /var/log/x.log\n[sshd]\n" if base else "[x]\n"
    text = head + "\n".join(lines) + "\n"
    try:
        cfg = F2bConfig()
        cfg.merge(_parse_ini(text, "jail.local"))
        m = plan_migration(cfg, "/etc/fail2ban", FakeHost())
    except FilterError as exc:
        assert str(exc)  # refused, with file:line and why
        event("refused")
        return
    event("with jails" if m.jails else "no jail")
    for d in m.dropped:
        assert d.what and d.reason
    out = render_config(m)
    assert load_yaml(out, "x").problems == []
    try:
        merged = merge_config("table: inet nftblock\nmetrics: {listen: 127.0.0.1:9789}\n", "c.yaml", m)
    except MergeError as exc:  # never for a config this plain
        raise AssertionError(exc) from None
    assert load_yaml(merged.text, "x").value["metrics"] == {"listen": "127.0.0.1:9789"}
