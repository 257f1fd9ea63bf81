"""The host edge of the drop-in (migrate/dropin.py): an action's scripts as they will run, this host's
resolvers and sendmail, and the addresses of the names the scripts reach.

Reads action files (through actions/f2baction.py), /etc/resolv.conf and /etc/msmtprc (each bounded), looks
at /usr/sbin/sendmail, and resolves names (getaddrinfo, bounded by the resolver's own timeouts). Never
writes, never runs anything, never opens a connection.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

from nftblockd.actions.f2baction import load_action
from nftblockd.detect.matcher import FilterError
from nftblockd.migrate.dropin import MailFacts

__all__ = ["action_scripts", "mail_facts", "resolve", "resolvers"]

_MAX_READ = 64 << 10  # resolv.conf and msmtprc are a few lines
SENDMAIL = "/usr/sbin/sendmail"


def action_scripts(path: str, options: Mapping[str, str]) -> list[str]:
    """The text of each command the action runs, its static tags filled (event tags left as `<tag>`)."""
    try:
        action = load_action(path, options)
    except FilterError:
        return []  # the config check refuses it with the reason; nothing to allow for it
    return ["".join(p if isinstance(p, str) else f"<{p.tag}>" for p in t.parts) for _, t in action.commands]


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_READ).decode("utf-8", "replace")
    except OSError:
        return ""


def resolvers(path: str = "/etc/resolv.conf") -> tuple[str, ...]:
    out = []
    for line in _read(path).splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            out.append(words[1].split("%", 1)[0])
    return tuple(dict.fromkeys(out))


def mail_facts(sendmail: str = SENDMAIL, msmtprc: str = "/etc/msmtprc") -> MailFacts:
    if not os.path.lexists(sendmail):
        return MailFacts("missing")
    real = os.path.basename(os.path.realpath(sendmail))
    if "msmtp" in real:
        relays = [w[1] for line in _read(msmtprc).splitlines() if len(w := line.split()) >= 2 and w[0] == "host"]
        return MailFacts("msmtp", tuple(dict.fromkeys(relays)))
    if "exim" in real:
        return MailFacts("exim")
    if Path(sendmail).parent.joinpath("postdrop").exists():
        return MailFacts("postfix")
    return MailFacts("other")


def resolve(name: str) -> tuple[str, ...] | str:
    """`name`'s addresses, sorted, or why it has none."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        return str(exc)
    addrs = {str(i[4][0]) for i in infos}
    return tuple(sorted(addrs, key=lambda a: (":" in a, a)))
