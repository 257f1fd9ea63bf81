"""What each imported action needs from the packaged unit's sandbox, as a systemd drop-in.

The unit (systemd/nftblockd.service) denies IP traffic but loopback (`IPAddressDeny=any`,
`IPAddressAllow=localhost`), keeps the file system read-only but for nftblockd's own directories, and
runs with `NoNewPrivileges=yes`. A fail2ban action that worked under fail2ban (root, no sandbox) then fails
at its first ban. So the import reads each action's scripts, as they will run, and says what they need:

- every host a URL in them names (`curl https://api.abuseipdb.com/...`, a webhook): `IPAddressAllow=` for
  its addresses (an address as written; a name as it resolves when imported, said in a comment, since
  a name's addresses change), and for a name also the resolvers of /etc/resolv.conf that are not loopback;
  loopback needs nothing;
- mail through `sendmail`: what this host's sendmail is (facts the caller found): msmtp needs its relay
  (`IPAddressAllow=`, as a host above); Postfix's and Exim's hand mail to a set-group-id or set-user-id
  helper, which `NoNewPrivileges=yes` refuses: no setting is written for that (the unit's protection
  stays), a comment and a line on stderr say it, and what to use (docs/actions.md);
- a file a script writes (`>> /var/run/fail2ban/tmp-mail.txt`, `rm -f`/`touch` of one, the buffered mail
  actions' `tmpfile`) outside the writable places (nftblockd's own directories, the private /tmp):
  `ReadWritePaths=-DIR` (the `-`: a directory that does not exist does not stop the unit).

The drop-in's format is the one docs/actions.md ("Actions that reach the network") documents.

Pure: this module must NOT read files, resolve names or look at the clock; the caller (cli/main.py, through
migrate/host.py) hands it the action scripts and what it found on this host.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["MARKER", "SYSTEM_DROPIN", "ActionNeeds", "DropIn", "MailFacts", "default_path", "needs_of",
           "render_dropin", "url_hosts"]

MARKER = "# nftblockd.service drop-in written by `nftblock import-fail2ban-config`"
SYSTEM_DROPIN = "/etc/systemd/system/nftblockd.service.d/fail2ban-actions.conf"
_PACKAGED_CONFIG_DIR = "/etc/nftblockd/"  # the unit's ConfigurationDirectory: ExecStart reads its config there
_URL = re.compile(r"\b(?:https?|ftps?)://(?:[^\s/@\"']*@)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)")
# a mail program where a command starts (`| mail -s`, `/usr/sbin/sendmail -f`), not the word in a text
_MAIL = re.compile(r"(?:^|[|;&(`]\s*|/)(?:sendmail|mailx?)(?=\s|$)", re.MULTILINE)
_WRITE = re.compile(r"(?:>>?|\b(?:touch|rm(?:\s+-[a-zA-Z]+)*))\s*[\"']?(/[^\s\"';|&)<>]+)")
_SAFE_PATH = re.compile(r"/[A-Za-z0-9._/+@:,=-]*")
# Where the unit lets the service write (StateDirectory, RuntimeDirectory, PrivateTmp) or what needs nothing
_WRITABLE = ("/var/lib/nftblockd", "/run/nftblockd", "/var/run/nftblockd", "/tmp", "/var/tmp", "/dev/null",
             "/dev/stdout", "/dev/stderr")


@dataclass(frozen=True, slots=True)
class ActionNeeds:
    """What one imported action's scripts reach past the sandbox."""

    name: str  # the nftblockd action's name
    hosts: tuple[str, ...] = ()  # hosts of URLs (names or addresses), loopback left out
    mail: bool = False  # it pipes into sendmail / mail
    writes: tuple[str, ...] = ()  # directories it writes into, outside the writable places


@dataclass(frozen=True, slots=True)
class MailFacts:
    """What this host's /usr/sbin/sendmail is, as the caller found it."""

    kind: str  # "msmtp", "postfix", "exim", "missing", "other"
    relays: tuple[str, ...] = ()  # msmtp's `host` settings


@dataclass(frozen=True, slots=True)
class DropIn:
    text: str | None  # None: nothing is needed
    said: tuple[str, ...]  # one sentence per need (or the one line saying why none is needed)


def url_hosts(script: str) -> list[str]:
    """The hosts that URLs in a shell script name, in order, each once (brackets of IPv6 taken off)."""
    out: dict[str, None] = {}
    for m in _URL.finditer(script):
        out[m.group(1).strip("[]").lower()] = None
    return list(out)


def _loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def needs_of(name: str, scripts: Sequence[str]) -> ActionNeeds:
    """What the action `name` needs, from the text of its scripts (tags filled as they will run)."""
    hosts: dict[str, None] = {}
    writes: dict[str, None] = {}
    mail = False
    for s in scripts:
        for h in url_hosts(s):
            if not _loopback(h):
                hosts[h] = None
        mail = mail or _MAIL.search(s) is not None
        for m in _WRITE.finditer(s):
            path = posixpath.normpath(m.group(1))
            if any(path == w or path.startswith(w + "/") for w in _WRITABLE):
                continue
            writes[posixpath.dirname(path) or "/"] = None
    return ActionNeeds(name, tuple(hosts), mail, tuple(writes))


def default_path(config: str) -> str:
    """Where the drop-in for the (absolute) config path `config` goes: systemd's directory for the unit
    when the packaged unit runs that config, else beside the config (that unit does not run it)."""
    if config.startswith(_PACKAGED_CONFIG_DIR):
        return SYSTEM_DROPIN
    return posixpath.join(posixpath.dirname(config), "nftblockd.service.d", "fail2ban-actions.conf")


def render_dropin(needs: Sequence[ActionNeeds], config: str, resolved: Mapping[str, tuple[str, ...] | str],
                  resolvers: Sequence[str], mail: MailFacts) -> DropIn:
    """The drop-in text for `needs` (None when nothing is needed), and one sentence per need for stderr.

    `resolved` maps each host name to its addresses or to why it did not resolve; `resolvers` are
    /etc/resolv.conf's nameservers; `mail` says what this host's sendmail is."""
    lines: list[str] = []
    said: list[str] = []
    names = False
    for a in needs:
        hosts = list(a.hosts)
        if a.mail and mail.kind == "msmtp":
            hosts += [h for h in mail.relays if not _loopback(h) and h not in hosts]
        for h in hosts:
            via = "its mail relay (msmtp)" if h in mail.relays and h not in a.hosts else "a URL in its scripts"
            if _is_address(h):
                lines += [f"# {a.name}: {h}, {via}", f"IPAddressAllow={h}"]
                said.append(f"action {a.name} reaches {h} ({via}): IPAddressAllow={h}")
                continue
            names = True
            got = resolved.get(h, "not looked up")
            if isinstance(got, str) or not got:
                why = got if isinstance(got, str) else "no address"
                lines += [f"# {a.name}: {h}, {via}, did not resolve when imported ({why}): list its addresses",
                          f"#IPAddressAllow=ADDRESSES-OF-{h}"]
                said.append(f"action {a.name} reaches {h} ({via}), which did not resolve ({why}): its "
                            "addresses must be added to the drop-in by hand")
                continue
            addrs = " ".join(got)
            lines += [f"# {a.name}: {h}, {via}; its addresses when imported (a name's addresses change:",
                      "# import again, or write the provider's ranges)", f"IPAddressAllow={addrs}"]
            said.append(f"action {a.name} reaches {h} ({via}): IPAddressAllow={addrs}")
        for d in a.writes:
            if not _SAFE_PATH.fullmatch(d):  # systemd would read % as a specifier, \\ as an escape
                lines += [f"# {a.name}: writes into {d!r}: give it ReadWritePaths= by hand (systemd.unit(5) escapes)"]
                said.append(f"action {a.name} writes into {d!r}, which needs ReadWritePaths= written by hand")
                continue
            lines += [f"# {a.name}: writes into {d}", f"ReadWritePaths=-{d}"]
            said.append(f"action {a.name} writes into {d}: ReadWritePaths=-{d}")
    mailers = [a.name for a in needs if a.mail]
    if mailers and mail.kind in ("postfix", "exim"):  # one fact, said once for all the mail actions
        why = (f"{mail.kind}'s sendmail hands mail to a set-{'group' if mail.kind == 'postfix' else 'user'}-id "
               "helper, which the unit's NoNewPrivileges=yes refuses: install msmtp-mta (a sendmail that "
               "speaks SMTP to a relay itself) and import again, see docs/actions.md")
        lines += [f"# {', '.join(mailers)}: mail through sendmail; {why}"]
        said.append(f"action{'s' if len(mailers) > 1 else ''} {', '.join(mailers)}: {why}")
    elif mailers and mail.kind == "missing":
        lines += [f"# {', '.join(mailers)}: mail through sendmail, and this host has no /usr/sbin/sendmail"]
        said.append(f"action{'s' if len(mailers) > 1 else ''} {', '.join(mailers)} mail through sendmail, and "
                    "this host has no /usr/sbin/sendmail")
    far = [r for r in resolvers if not _loopback(r)]
    if names and far:
        lines += ["# the resolvers the names above are looked up through (/etc/resolv.conf)",
                  f"IPAddressAllow={' '.join(far)}"]
        said.append(f"the names are looked up through {', '.join(far)}: IPAddressAllow={' '.join(far)}")
    settings = [ln for ln in lines if not ln.startswith("#")]
    if not needs:
        return DropIn(None, ("no drop-in needed: no action was imported",))
    if not lines:
        return DropIn(None, ("no drop-in needed: the imported actions reach no address but loopback and write "
                             "only where the unit lets them",))
    head = [MARKER,
            f"# for the fail2ban actions imported into {config}: what their scripts need past the unit's sandbox",
            "# (docs/actions.md, \"Actions that reach the network\"). Apply it with",
            "#   systemctl daemon-reload && systemctl restart nftblockd"]
    if not settings:
        head.append("# Nothing to allow here: each comment below says what to change instead.")
    return DropIn("\n".join([*head, "[Service]", *lines]) + "\n", tuple(said))
