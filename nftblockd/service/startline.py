"""The start's one line for the operator: which jails are live and how to keep one's own network unbanned.

A fresh install starts the shipped sshd jail at once; an admin who locks themselves out by mistyping a
password three times from the office deserves to have been told, in the journal of that very start, what
runs and where the allowlist is. Pure: it formats a Config, it reads nothing.
"""

from __future__ import annotations

from nftblockd.addr import format_target
from nftblockd.config.model import Config, JailConfig
from nftblockd.durations import format_duration


def _jail(j: JailConfig) -> str:
    if j.recidive:
        what = f"bans of {', '.join(j.watch) if j.watch else 'every jail'}"
    elif j.journal_matches:
        what = "journal " + " ".join(f"{k}={v}" for k, v in j.journal_matches)
    else:
        what = ", ".join(j.files) or "no source"
    rule = f"{j.maxretry} in {format_duration(j.findtime)} ban for {format_duration(j.bantime)}"
    if j.escalation.enabled:
        rule += f", escalating up to {format_duration(j.escalation.max)}"
    return f"{j.name} ({what}: {rule})"


def start_line(cfg: Config, config_path: str) -> str:
    jails = [j for j in cfg.jails if j.enabled]
    live = "; ".join(_jail(j) for j in jails) if jails else "none"
    allowed = ", ".join(map(format_target, cfg.allowlist)) or "nothing"
    own = " and this host's own addresses" if cfg.allowlist_self else ""
    return (f"jails live: {live}. Never banned: {allowed}{own}. To keep your own network from being banned, "
            f"add it under allowlist: in {config_path} and run `systemctl reload nftblockd`")


__all__ = ["start_line"]
