"""Render the manual pages from what the programs and the example config really are.

    python3 packaging/manpages.py OUT_DIR [--example config/nftblockd.yaml] [--version V] [--date YYYY-MM-DD]

writes OUT_DIR/nftblockd.8 (from nftblockd.daemon.main.build_parser), OUT_DIR/nftblock.8 (from
nftblockd.cli.main.build_parser, every command and sub-command) and OUT_DIR/nftblockd.yaml.5 (from the commented
example config: each top-level key with the comment above it and its example). packaging/build-deb.sh runs
it at build time, so a new option, command or config section reaches the pages without anyone editing them
(and KEY_REFERENCE below lists every config key: a key the reader learns without an entry fails the test);
tests/unit/test_manpages.py checks that they do.

This is a build tool, not part of the package: it imports the parsers and writes files, nothing else.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Text around the generated parts: what a parser cannot know.
NFTBLOCKD_DESCRIPTION = """\
nftblockd reads log files, the systemd journal and threat feeds, decides which addresses to ban
(fail2ban-style: maxretry failures within findtime give a ban for bantime, longer for repeat offenders) and
enforces the bans in named nftables sets in a table of its own, over netlink, in batched transactions and
with a timeout on every element, so that the kernel expires bans itself.

It runs in the foreground and speaks the systemd notify protocol: READY=1 is sent once the table, the sets
and the saved bans are in the kernel, the watchdog is pinged from the event loop, SIGHUP reloads the
configuration (a configuration that does not validate is refused and the running one stays) and SIGTERM
stops it. Bans stay in the kernel when it stops and expire there.

The nftblock(8) command talks to a running daemon over its control socket."""

NFTBLOCKD_SECTIONS = {
    "EXIT STATUS": "0 after a clean stop, or for a valid configuration with --check-config; 1 when the "
                   "configuration is invalid or the daemon cannot run (the reason is logged and printed).",
    "SIGNALS": "SIGTERM and SIGINT stop the daemon: the control socket closes, pending bans are flushed to "
               "the kernel, bans stay there. SIGHUP reloads the configuration file.",
    "FILES": "/etc/nftblockd/nftblockd.yaml: the configuration, see nftblockd.yaml(5).\n"
             "/var/lib/nftblockd/: saved bans (SQLite) and cached feed copies.\n"
             "/run/nftblockd/control.sock: the control socket.\n"
             "/usr/lib/systemd/system/nftblockd.service: the hardened systemd unit.",
}

NFTBLOCK_DESCRIPTION = """\
nftblock controls a running nftblockd(8) over its control socket: ban and unban addresses and CIDR ranges,
list and check bans, show the daemon's state, its feeds and its fleet mode (nftblock fleet). Two commands need no daemon: test-filter runs a
filter over a log file, and import-fail2ban reads fail2ban's database (the bans are then sent to the daemon).

ban and unban return once the kernel has acknowledged the transaction carrying them, so a script can rely on
the sets' state afterwards. Addresses are checked before anything is sent: one invalid address (with its
line number when read from standard input) and nothing is banned.

--json prints the daemon's answer unchanged, for scripts; it may also follow the command."""

NFTBLOCK_SECTIONS = {
    "EXIT STATUS": "0 success; 1 failure (the daemon refused or reported an error, a target was refused or "
                   "not found, the daemon is not running, permission denied); 2 bad usage (arguments, an "
                   "invalid address). Every failure is one line on standard error starting with \"nftblock: \".",
    "ENVIRONMENT": "NFTBLOCK_SOCKET: the control socket when --socket is not given "
                   "(default /run/nftblockd/control.sock).",
    "EXAMPLES": ".nf\n"
                "nftblock ban 203.0.113.7 --timeout 1h --comment \"ssh scanner\"\n"
                "nftblock ban --timeout 30m - < addresses.txt\n"
                "nftblock unban 203.0.113.7\n"
                "nftblock check 198.51.100.23\n"
                "nftblock list --set default --json\n"
                ".fi",
}

CONFIG_DESCRIPTION = """\
The configuration of nftblockd(8), in YAML. Check a file with nftblockd --check-config FILE: every problem is
reported with its file and line. An address or CIDR with host bits set (10.0.0.1/8) is refused, never widened
to its network, in the allowlist, a jail's ignoreip, a feed and every request. Durations are written 500ms, 30s, 10m, 1h, 2d, 1w or as plain seconds; ban
timeouts also accept "permanent". The daemon rereads the file on SIGHUP (systemctl reload nftblockd); the
table, the blocklists and the chain can only change with a restart.

The sections below are the commented example configuration shipped as /etc/nftblockd/nftblockd.yaml, one
top-level key at a time."""


# Every key the config reader knows, with its default: tests/unit/test_manpages.py checks that none is missing
# (it reads the keys from nftblockd/config/load.py and config/sections.py). NAME stands for a name of the operator's.
KEY_REFERENCE: tuple[tuple[str, str], ...] = (
    ('table',
     'The nftables table nftblockd owns, "inet NAME" or a mapping (default inet nftblock). Only a restart '
     'moves it.'),
    ('table.family', "The table's family: inet only (it covers IPv4 and IPv6)."),
    ('table.name', "The table's name (default nftblock)."),
    ('table.protect',
     'Make the table owned by the daemon (flags owner,persist), so that others cannot flush or delete it '
     '(default true).'),
    ('chain', 'The base chain the drop rules live in.'),
    ('chain.hook', 'prerouting (default), input or forward.'),
    ('chain.priority', 'A number or a named priority such as raw (default raw).'),
    ('chain.ingress', 'Interfaces that also get an ingress chain, which drops even earlier (default none).'),
    ('control', 'The control socket the nftblock(8) CLI talks to.'),
    ('control.socket', 'Its path (default /run/nftblockd/control.sock).'),
    ('control.mode', 'Its mode, octal, owner and group bits only (default 0600: root only).'),
    ('control.group', "A group let in with the mode's group bits; the daemon must belong to it."),
    ('state_dir', 'Where saved bans (SQLite) and cached feed copies live (default /var/lib/nftblockd).'),
    ('batch', 'How bans are grouped into netlink transactions.'),
    ('batch.max_ops', 'Element operations per transaction at most (default 10000).'),
    ('batch.delay', 'How long a batch waits for more operations (default 2ms).'),
    ('reconcile', "The periodic comparison of the kernel's sets with the daemon's state."),
    ('reconcile.interval', 'How often (default 30s).'),
    ('allowlist', 'Addresses and ranges never banned by anything; also kernel allow sets looked up before a drop.'),
    ('allowlist_self', "Also never ban this machine's own addresses (default true)."),
    ('blocklists', 'Named blocklists, each four kernel sets NAME_ip4, NAME_ip6, NAME_net4, NAME_net6.'),
    ('blocklists.NAME.timeout', 'The default ban duration, or permanent (default 1h).'),
    ('blocklists.NAME.size', 'The most elements each of its sets holds (default 262144).'),
    ('blocklists.NAME.subnet_escalation',
     'Ban a whole prefix when enough of its addresses are banned; never a prefix holding an allowlisted '
     'address.'),
    ('blocklists.NAME.subnet_escalation.enabled', 'false turns it off (default true when the mapping is given).'),
    ('blocklists.NAME.subnet_escalation.ipv4_prefix', 'The IPv4 prefix length counted and banned (default 24).'),
    ('blocklists.NAME.subnet_escalation.ipv6_prefix', 'The IPv6 prefix length (default 48).'),
    ('blocklists.NAME.subnet_escalation.threshold', 'Bans in one prefix that ban the prefix (default 5).'),
    ('blocklists.NAME.subnet_escalation.window', 'Within this time (default 10m).'),
    ('blocklists.NAME.subnet_escalation.bantime', 'How long the prefix is banned (default 1d).'),
    ('blocklists.NAME.subnet_escalation.max_prefixes', 'Prefixes tracked at most (default 100000).'),
    ('metrics', 'The Prometheus endpoint; absent: none.'),
    ('metrics.listen', 'ADDRESS:PORT, e.g. 127.0.0.1:9789.'),
    ('jails', 'Named jails: log files or journal entries matched by a filter, failures counted per address.'),
    ('jails.NAME.enabled', 'false keeps the jail in the file but does not run it (default true).'),
    ('jails.NAME.files', 'Log files (globs allowed) the jail tails.'),
    ('jails.NAME.journal', 'Read the systemd journal instead of files.'),
    ('jails.NAME.journal.matches',
     'Journal fields and values: values of one field are ORed, fields ANDed (e.g. _SYSTEMD_UNIT: '
     'ssh.service).'),
    ('jails.NAME.journal.path', 'A directory of journal files instead of the local journal.'),
    ('jails.NAME.filter', 'A built-in filter name, a YAML filter file or a fail2ban filter.d file, with [options].'),
    ('jails.NAME.maxretry', 'Failures that give a ban (default 5).'),
    ('jails.NAME.findtime', 'Within this time (default 10m).'),
    ('jails.NAME.bantime', "The ban's duration, or permanent (default 1h)."),
    ('jails.NAME.escalation', 'Longer bans for repeat offenders: bantime times factor per earlier ban, up to max.'),
    ('jails.NAME.escalation.factor', 'The factor (default 2).'),
    ('jails.NAME.escalation.max', 'The longest ban it gives (default 7d).'),
    ('jails.NAME.escalation.enabled', 'false turns it off (default true).'),
    ('jails.NAME.blocklist', 'The blocklist its bans go to (default default).'),
    ('jails.NAME.ignoreip', 'Addresses and ranges this jail never bans (the allowlist applies as well).'),
    ('jails.NAME.ipv6_prefix', 'IPv6 offenders are counted and banned by this prefix (default 64).'),
    ('jails.NAME.recidive', 'Count the bans of other jails instead of log lines (default false).'),
    ('jails.NAME.watch', 'With recidive: the jails whose bans count (default all).'),
    ('jails.NAME.actions', "Names of actions (see actions) run on this jail's bans and unbans."),
    ('jails.NAME.fleet_maxretry',
     "With fleet mode: failures of all hosts that give a ban, counted on the fleet's server."),
    ('jails.NAME.fleet_findtime', "Within this time (default the jail's findtime)."),
    ('feeds', 'Named threat feeds, fetched over HTTP(S) or read from a file, applied to a blocklist.'),
    ('feeds.NAME.url', "The feed's URL (http or https)."),
    ('feeds.NAME.path', 'A local file instead of a URL.'),
    ('feeds.NAME.format', 'plain (default), csv or json.'),
    ('feeds.NAME.column', 'With csv or json: the column (number) or field (name) holding the address.'),
    ('feeds.NAME.blocklist', 'The blocklist it fills (a blocklist filled by feeds takes no jail bans).'),
    ('feeds.NAME.refresh', 'How often it is fetched (default 1h).'),
    ('feeds.NAME.jitter', 'A random share of refresh added, so that hosts do not fetch at once (default 0.1).'),
    ('feeds.NAME.timeout', "A fetch's bound (default 30s)."),
    ('feeds.NAME.allow_empty', 'An answer with no entries is a real, empty list, applied at once (default false).'),
    ('feeds.NAME.max_size', 'The largest body accepted, in bytes (default 64 MiB).'),
    ('feeds.NAME.max_shrink',
     'A refresh that removes more than this share of the entries is held for review (default 0.5).'),
    ('feeds.NAME.max_stale', 'Withdraw the entries after this long without a successful fetch (default: never).'),
    ('feeds.NAME.max_retry_after',
     "A server's Retry-After is honoured up to this (default: up to refresh; 0: ignored)."),
    ('feeds.NAME.defer_removals', 'An entry that leaves the list stays blocked one more refresh (default false).'),
    ('feeds.NAME.ban_timeout', "Each entry's timeout in the kernel (default permanent)."),
    ('feeds.NAME.min_prefix_v4', 'The broadest IPv4 range accepted (default /8).'),
    ('feeds.NAME.min_prefix_v6', 'The broadest IPv6 range accepted (default /16).'),
    ('feeds.NAME.allow_special', 'Accept private, loopback and other special-purpose ranges (default false).'),
    ('feeds.NAME.actions', 'Actions run on entries a refresh adds (ban) and removes (unban).'),
    ('leave_bans_on_stop', 'Leave the bans in the kernel at a stop, where they expire (default true).'),
    ('log_level', 'debug, info (default), warning or error.'),
    ('fleet', 'Share bans with other nftblockd hosts through a Redis/Valkey server (docs/fleet.md).'),
    ('fleet.name', "The fleet's name: hosts with the same name share bans."),
    ('fleet.host_id', "This host's name in the fleet (default the host name)."),
    ('fleet.url',
     'The server, redis:// or rediss:// (under the packaged unit its address needs an IPAddressAllow= '
     'drop-in).'),
    ('fleet.sentinel', 'Find the server through Redis Sentinel instead of url.'),
    ('fleet.sentinel.hosts', 'The Sentinels, HOST:PORT each.'),
    ('fleet.sentinel.service', 'The service (master) name the Sentinels watch.'),
    ('fleet.username', 'The ACL user.'),
    ('fleet.password_file', 'A file holding the password (readable by the daemon only).'),
    ('fleet.tls', 'Mutual TLS to the server.'),
    ('fleet.tls.ca', 'The CA certificate file.'),
    ('fleet.tls.cert', "This host's certificate file."),
    ('fleet.tls.key', "This host's key file."),
    ('fleet.share', 'What this host publishes.'),
    ('fleet.share.jails', 'The jails whose bans are shared (default all).'),
    ('fleet.share.cli', 'Share bans made with nftblock ban (default true).'),
    ('fleet.blocklist', "The blocklist other hosts' bans go to (default default)."),
    ('fleet.trust', "Bounds on what other hosts' bans may do here."),
    ('fleet.trust.min_prefix_v4', 'The broadest IPv4 range taken from the fleet (default /16).'),
    ('fleet.trust.min_prefix_v6', 'The broadest IPv6 range taken.'),
    ('fleet.trust.max_ban', 'The longest ban taken (default 7d).'),
    ('fleet.trust.allow_permanent', 'Take permanent bans (default false).'),
    ('fleet.trust.rate', 'Bans per second taken from the fleet at most (default 2000).'),
    ('fleet.trust.burst', 'The burst above that rate.'),
    ('fleet.history', 'How far back a host that connects catches up (default 7d).'),
    ('fleet.actions', 'Actions run on bans and unbans received from other hosts.'),
    ('fleet.count', 'Bounds on fleet-wide failure counting (fleet_maxretry).'),
    ('fleet.count.rate', 'Counted failures per second this host sends at most (default 100).'),
    ('fleet.count.burst', 'The burst above that rate (default 1000).'),
    ('actions', 'Named actions run after a ban (or unban) is in the kernel, never delaying it (docs/actions.md).'),
    ('actions.NAME.type', 'command, webhook or fail2ban.'),
    ('actions.NAME.on', 'The events that run it: ban, unban (default [ban]).'),
    ('actions.NAME.timeout', "A run's bound (default 30s)."),
    ('actions.NAME.retries', 'Retries of a failed run (default 2).'),
    ('actions.NAME.retry_delay', "The first retry's delay, doubling (default 1s)."),
    ('actions.NAME.queue', 'Events queued at most; more are skipped and counted (default 1000).'),
    ('actions.NAME.concurrency', 'Runs at once (default 1).'),
    ('actions.NAME.rate', 'Runs per second at most (default 1).'),
    ('actions.NAME.burst', 'The burst above that rate (default 20).'),
    ('actions.NAME.argv', 'command: the program (an absolute path) and its arguments, each one template.'),
    ('actions.NAME.env', 'command: environment variables, each a template.'),
    ('actions.NAME.url',
     'webhook: the URL POSTed to (under the packaged unit its host needs an IPAddressAllow= drop-in).'),
    ('actions.NAME.headers', 'webhook: HTTP headers.'),
    ('actions.NAME.batch', 'webhook: events sent in one request at most (default 1).'),
    ('actions.NAME.file', 'fail2ban: the action.d file.'),
    ('actions.NAME.options', "fail2ban: the action's options, as action = X[tag=value] in a jail."),
    ('actions.NAME.lifecycle', 'fail2ban: run actionstart and actionstop (default true).'),
)


# --- roff ----------------------------------------------------------------------------------------------


def esc(text: str) -> str:
    """Plain text → roff: backslashes, hyphens as minus signs (options), no control characters at line start."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line[:1] in (".", "'") else line for line in text.split("\n"))


def paragraphs(text: str) -> str:
    """Blank-line separated paragraphs; a paragraph starting with .nf is kept as roff."""
    out = []
    for para in text.strip().split("\n\n"):
        if para.startswith(".nf"):
            body = para.split("\n")
            out.append("\n".join([".nf", *(esc(line) for line in body[1:-1]), ".fi"]))
        else:
            out.append(esc(" ".join(line.strip() for line in para.splitlines())))
    return "\n.PP\n".join(out)


def header(name: str, section: int, version: str, date: str, title: str) -> list[str]:
    return [
        f'.\\" Generated by packaging/manpages.py from the sources of nftblockd {version}; do not edit.',
        f'.TH {name.upper()} {section} "{date}" "nftblockd {version}" "{title}"',
        ".SH NAME",
        f"{esc(name)} \\- ",
    ]


# --- argparse ------------------------------------------------------------------------------------------
# argparse has no public way to walk a parser: _actions, _choices_actions and _expand_help are what its own
# help formatter reads (stable since Python 3.2).


@dataclass(frozen=True)
class Option:
    names: str  # "--timeout DURATION" or "ADDR|CIDR"
    help: str


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = action.help or ""
    if "%(" in text:
        text = parser._get_formatter()._expand_help(action)
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        text = (text + " " if text else "") + "One of: " + ", ".join(map(str, action.choices)) + "."
    return text


def options(parser: argparse.ArgumentParser) -> Iterator[Option]:
    for a in parser._actions:
        if a.help == argparse.SUPPRESS or isinstance(a, argparse._SubParsersAction):
            continue
        if a.option_strings:
            takes = a.nargs != 0
            metavar = a.metavar or a.dest.upper()
            names = ", ".join(f"{o} {metavar}" if takes else o for o in a.option_strings)
        elif not a.help:
            continue  # a positional without a help text says nothing the synopsis does not
        else:
            names = str(a.metavar or a.dest)
        yield Option(names, _help(parser, a))


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) for every sub-command, depth first."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            helps = {c.dest: c.help or "" for c in a._choices_actions}
            for name, sub in a.choices.items():
                yield name, helps.get(name, ""), sub
                for sname, shelp, ssub in subcommands(sub):
                    yield f"{name} {sname}", shelp, ssub


def usage(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_usage().removeprefix("usage: ").split())


def option_list(opts: Iterable[Option]) -> list[str]:
    out = []
    for o in opts:
        out += [".TP", f"\\fB{esc(o.names)}\\fR", esc(o.help) if o.help else ""]
    return [line for line in out if line != ""]


def program_page(parser: argparse.ArgumentParser, section: int, version: str, date: str, summary: str,
                 description: str, extra: dict[str, str], see_also: str) -> str:
    name = parser.prog
    lines = header(name, section, version, date, "System Administration")
    lines[-1] += esc(summary)
    lines += [".SH SYNOPSIS", f"\\fB{esc(name)}\\fR {esc(usage(parser).removeprefix(name).strip())}",
              ".SH DESCRIPTION", paragraphs(description), ".SH OPTIONS", *option_list(options(parser))]
    subs = list(subcommands(parser))
    if subs:
        lines.append(".SH COMMANDS")
        for sname, shelp, sub in subs:
            lines += [".SS " + esc(sname), f"\\fB{esc(name)}\\fR {esc(usage(sub).removeprefix(name).strip())}"]
            text = sub.description or shelp
            if text:
                lines += [".PP", esc(text[:1].upper() + text[1:])]
            own = [o for o in options(sub) if o.names not in ("-h, --help",)]
            lines += option_list(own)
    for title, text in extra.items():
        lines += [f".SH {title}", paragraphs(text)]
    lines += [".SH SEE ALSO", esc(see_also)]
    return "\n".join(lines) + "\n"


# --- the example config --------------------------------------------------------------------------------

_TOP_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):")


@dataclass(frozen=True)
class ConfigSection:
    key: str
    comment: str  # the comment block right above the key, '#' removed
    example: str  # the key's lines as written, up to the next section


def config_sections(text: str) -> tuple[str, list[ConfigSection]]:
    """(file header comment, sections). A section is a top-level key with the comment block above it and
    everything up to the next block of comments or top-level key."""
    lines = text.splitlines()
    i = 0
    head: list[str] = []
    while i < len(lines) and lines[i].startswith("#"):
        head.append(lines[i].lstrip("#").strip())
        i += 1
    sections: list[ConfigSection] = []
    comment: list[str] = []
    while i < len(lines):
        line = lines[i]
        m = _TOP_KEY.match(line)
        if m:
            body = [line]
            i += 1
            # The value: indented lines, commented-out indented lines, blank lines between them.
            while i < len(lines) and (lines[i].startswith((" ", "#  ")) or not lines[i].strip()):
                if not lines[i].strip() and (i + 1 >= len(lines) or not lines[i + 1].startswith(" ")):
                    break
                body.append(lines[i])
                i += 1
            sections.append(ConfigSection(m.group(1), " ".join(comment).strip(), "\n".join(body).rstrip()))
            comment = []
            continue
        if line.startswith("#"):
            comment.append(line.lstrip("#").strip())
        elif not line.strip():
            comment = []  # a comment describes the key right below it
        i += 1
    return " ".join(head), sections


def config_page(example: Path, version: str, date: str) -> str:
    _, sections = config_sections(example.read_text())
    lines = header("nftblockd.yaml", 5, version, date, "File Formats")
    lines[-1] += "configuration file of nftblockd"
    lines += [".SH SYNOPSIS", "/etc/nftblockd/nftblockd.yaml", ".SH DESCRIPTION", paragraphs(CONFIG_DESCRIPTION),
              ".SH KEYS"]
    for s in sections:
        lines += [".SS " + esc(s.key)]
        if s.comment:
            lines += [esc(s.comment), ".PP"]
        lines += [".nf", ".RS 4", *(esc(x) for x in s.example.splitlines()), ".RE", ".fi"]
    lines += [".SH KEY REFERENCE", esc("Every key, written as its path in the file; NAME is a name of yours.")]
    for key, text in KEY_REFERENCE:
        lines += [".TP", f"\\fB{esc(key)}\\fR", esc(text)]
    lines += [".SH FILES", "/etc/nftblockd/nftblockd.yaml",
              ".SH SEE ALSO", esc("nftblockd(8), nftblock(8), nft(8)")]
    return "\n".join(lines) + "\n"


# --- main ----------------------------------------------------------------------------------------------


def render(out_dir: Path, example: Path, version: str, date: str) -> list[Path]:
    os.environ["COLUMNS"] = "100"  # argparse wraps usage lines to the terminal; pages must not depend on it
    sys.path.insert(0, str(ROOT))
    from nftblockd.cli.main import build_parser as cli_parser
    from nftblockd.daemon.main import build_parser as daemon_parser

    out_dir.mkdir(parents=True, exist_ok=True)
    pages = {
        "nftblockd.8": program_page(daemon_parser(), 8, version, date, "dynamic blocklists in nftables sets",
                                    NFTBLOCKD_DESCRIPTION, NFTBLOCKD_SECTIONS,
                                    "nftblock(8), nftblockd.yaml(5), nft(8), systemd.service(5)"),
        "nftblock.8": program_page(cli_parser(), 8, version, date, "control a running nftblockd",
                                   NFTBLOCK_DESCRIPTION, NFTBLOCK_SECTIONS,
                                   "nftblockd(8), nftblockd.yaml(5), fail2ban-client(1)"),
        "nftblockd.yaml.5": config_page(example, version, date),
    }
    written = []
    for name, text in pages.items():
        path = out_dir / name
        path.write_text(text)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Render nftblockd's manual pages.")
    p.add_argument("out_dir", type=Path)
    p.add_argument("--example", type=Path, default=ROOT / "config" / "nftblockd.yaml")
    p.add_argument("--version")
    p.add_argument("--date", help="YYYY-MM-DD (default: from SOURCE_DATE_EPOCH, else today)")
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import nftblockd

    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = dt.datetime.fromtimestamp(int(epoch), dt.UTC) if epoch else dt.datetime.now(dt.UTC)
    render(a.out_dir, a.example, a.version or nftblockd.__version__, a.date or when.strftime("%Y-%m-%d"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
