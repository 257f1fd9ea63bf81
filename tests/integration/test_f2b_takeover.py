"""`nftblock import-fail2ban` against the real daemon: fail2ban's bans of `nginx-http-auth` become the
bans of the jail `import-fail2ban-config` made of it, `nginx_http_auth`: listed with it, lifted by
`unban --all --jail nginx_http_auth`, and one ban in its history (escalation, recidive) that a restart keeps."""

from __future__ import annotations

import time
from pathlib import Path

from nftblockd.state.store import Store
from tests.helpers.daemon import DaemonProc
from tests.helpers.netns import NetNS
from tests.unit.test_f2bimport import make_v4


def test_taken_over_bans_are_the_renamed_jails(netns: NetNS, tmp_path: Path) -> None:
    log = tmp_path / "error.log"
    log.write_text("")
    config = f"""
blocklists: {{default: {{timeout: 1h}}}}
allowlist_self: false
reconcile: {{interval: 1h}}
jails:
  nginx_http_auth:
    filter: nginx-http-auth
    files: [{log}]
    maxretry: 1
    bantime: 1h
    escalation: {{factor: 2, max: 8h}}
  recidive: {{recidive: true, maxretry: 2, findtime: 1d, bantime: 1w}}
"""
    d = DaemonProc(netns, tmp_path / "d", config).start()
    try:
        now = int(time.time())
        db = make_v4(tmp_path / "f2b.sqlite3", [("nginx-http-auth", "192.0.2.7", now - 10, 600, 1),
                                                ("sshd", "192.0.2.8", now - 10, 600, 1)])
        r = d.cli("import-fail2ban", str(db))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "fail2ban jail sshd has no nftblockd jail" in r.stderr
        jails = {e["target"]: e.get("jail") for e in d.cli_json("list", "--json")["bans"]}
        assert jails == {"192.0.2.7": "nginx_http_auth", "192.0.2.8": "sshd"}, jails
    finally:
        assert d.stop() == 0
    store = Store.open(Path(d.state_dir) / "state.db", verify=False)
    try:
        history = store.load_history(0)
    finally:
        store.close()
    assert [(j, t) for j, t, _at, _u in history] == [("nginx_http_auth", "192.0.2.7")]
    d.start()  # the history is read back: the next ban there would be the second (escalated to 2h)
    try:
        r = d.cli("unban", "--all", "--jail", "nginx_http_auth")
        assert r.returncode == 0, r.stdout + r.stderr
        left = {e["target"] for e in d.cli_json("list", "--json")["bans"]}
        assert left == {"192.0.2.8"}
    finally:
        d.stop()
        d.close()
