"""Bans taken over from fail2ban (`nftblock import-fail2ban`) are the jails' own: the offender counts as
banned in its jail, its next ban there escalates, and recidive counts the taken-over ban (Tracker.adopt,
the control API's `adopted` hook that the daemon wires to it)."""

from __future__ import annotations

import ipaddress

from nftblockd.config import Escalation
from nftblockd.detect.tracker import BanRecord, JailPolicy, Kind, Tracker
from nftblockd.events import Ban, Hit
from tests.helpers.apirig import api_rig
from tests.unit.test_cli import CONFIG, NOW

T0 = 1_700_000_000.0
H = 3600.0
N = ipaddress.ip_network


def _tracker() -> Tracker:
    return Tracker([JailPolicy("nginx_http_auth", maxretry=1, bantime=H, blocklist="default",
                               escalation=Escalation(factor=2.0, max=8 * H)),
                    JailPolicy("recidive", recidive=True, maxretry=2, findtime=86400.0, bantime=7 * 86400.0,
                               blocklist="default")])


def _taken(host: str, until: float | None) -> Ban:
    return Ban(N(f"{host}/32"), "default", until, origin="fail2ban",
               reason="imported from fail2ban jail nginx-http-auth", jail="nginx_http_auth")


def test_a_taken_over_ban_is_the_jails_own() -> None:
    tr = _tracker()
    records = tr.adopt([_taken("192.0.2.1", T0 + 600), _taken("192.0.2.2", T0 - 1),
                        Ban(N("192.0.2.3/32"), "default", None, "fail2ban", "x", "gone")], T0)
    assert records == [BanRecord("nginx_http_auth", N("192.0.2.1/32"), T0, T0 + 600)]  # ended, unknown: not
    hit = Hit(jail="nginx_http_auth", host=ipaddress.ip_address("192.0.2.1"), time=T0 + 60)
    assert tr.observe(hit, T0 + 60).kind is Kind.ALREADY_BANNED  # banned in its jail: no second ban
    later = T0 + 700
    out = tr.observe(Hit(jail="nginx_http_auth", host=ipaddress.ip_address("192.0.2.1"), time=later), later)
    assert out.kind is Kind.BANNED and out.ban is not None
    assert out.ban.until == later + 2 * H  # escalated: the taken-over ban was its first
    (rec,) = tr.observe_ban(out.ban, later)  # and recidive counted it: this second ban crosses maxretry 2
    assert rec.kind is Kind.BANNED and rec.ban is not None and rec.ban.jail == "recidive"


async def test_the_api_hands_applied_fail2ban_bans_to_the_hook() -> None:
    got: list[tuple[list[Ban], float]] = []
    async with api_rig(CONFIG, now=NOW) as rig:
        rig.api.adopted = lambda bans, now: got.append((bans, now))
        await rig.api("ban", {"targets": [
            {"target": "192.0.2.1", "timeout": 60, "jail": "sshd", "reason": "r"},
            {"target": "10.1.2.3", "timeout": 60, "jail": "sshd", "reason": "r"},  # allowlisted: refused
            {"target": "192.0.2.2", "timeout": 90}], "origin": "fail2ban"}, None)  # type: ignore[arg-type]
        await rig.api("ban", {"targets": ["192.0.2.9"], "jail": "sshd"}, None)  # type: ignore[arg-type]
        bulk = [f"198.51.100.{i}" for i in range(100)]
        await rig.api("ban", {"targets": bulk, "jail": "sshd", "timeout": 60, "origin": "fail2ban"},
                      None)  # type: ignore[arg-type]
    (one, at), (many, _) = got  # the CLI's ban (origin cli) is not handed over
    assert [(str(b.target), b.jail, b.origin) for b in one] == [("192.0.2.1/32", "sshd", "fail2ban")]
    assert at == NOW and len(many) == 100 and {b.jail for b in many} == {"sshd"}
