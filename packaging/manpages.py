"""Render the manual pages from what the programs and the example config really are.

    python3 packaging/manpages.py OUT_DIR [--example config/nftblockd.yaml] [--version V] [--date YYYY-MM-DD]

writes OUT_DIR/nftblockd.8 (from nftblockd.daemon_main.build_parser), OUT_DIR/nftblock.8 (from
nftblockd.cli.build_parser, every command and sub-command) and OUT_DIR/nftblockd.yaml.5 (from the commented
example config: each top-level key with the comment above it and its example). packaging/build-deb.sh runs
it at build time, so a new option, command or config section reaches the pages without anyone editing them;
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
    lines += [".SH FILES", "/etc/nftblockd/nftblockd.yaml",
              ".SH SEE ALSO", esc("nftblockd(8), nftblock(8), nft(8)")]
    return "\n".join(lines) + "\n"


# --- main ----------------------------------------------------------------------------------------------


def render(out_dir: Path, example: Path, version: str, date: str) -> list[Path]:
    os.environ["COLUMNS"] = "100"  # argparse wraps usage lines to the terminal; pages must not depend on it
    sys.path.insert(0, str(ROOT))
    from nftblockd.cli import build_parser as cli_parser
    from nftblockd.daemon_main import build_parser as daemon_parser

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
