"""`nftblock`: the operator's command line for a running nftblockd (plus two commands that need no daemon).

This is the only place that turns errors into exit codes and messages: 0 ok; 1 failed (the daemon refused or
reported an error, a target was refused, the daemon is not running); 2 bad usage (arguments, an invalid
address); 3 from `status` only: the daemon runs but is degraded. Every failure is one line on stderr
starting with `nftblock: `. Human output by default; `--json` prints the daemon's result object unchanged,
for scripts.

Addresses are validated here, before anything is sent, so that a typo on line 70,000 of a bulk list is
reported with its line number and nothing is banned.

Start-up is part of the interface: fail2ban's shell action runs one `nftblock ban` process per ban, so this
module imports only what every command needs (the client, whose codec is the C half of `json`), and each
command imports the rest itself. `ban` and `unban` in the shapes scripts use are parsed by `_quick_parse`
without argparse; any other command line, and any doubt, goes to argparse. Both give the same result
(tests/unit/test_cli.py checks it on generated command lines). bench/bench_cli.py measures the process
against `nft add element`. Never import from the daemon's side here (detect/, kernel/, state/, feeds/): they
are for the two daemon-less commands, imported inside them.
"""

from __future__ import annotations

import _socket  # not socket: see control/client.py
import math
import posix  # not os: importing os (posixpath, stat, ...) is 1 ms of a 15 ms `nftblock ban`
import sys
import time

from nftblockd.cli.targets import (
    Targets,
    UsageError,
    canonical_plain,
    canonical_target,
    quick_canonical,
    targets_from_stream,
)
from nftblockd.control.client import ClientError, ControlClient, RemoteError
from nftblockd.durations import Permanent, format_duration, parse_timeout

# events.MAX_REASON, repeated so that `ban` does not import events (ipaddress); test_cli holds them equal
MAX_REASON = 256

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see above); mypy reads it the same way
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any, NoReturn, TextIO

    from nftblockd.migrate.f2bjail import Migration

DEFAULT_SOCKET = "/run/nftblockd/control.sock"
DEFAULT_F2B_DB = "/var/lib/fail2ban/fail2ban.sqlite3"
DEFAULT_F2B_DIR = "/etc/fail2ban"
SOCKET_ENV = "NFTBLOCK_SOCKET"
CLIENT_TIMEOUT = 120.0  # seconds to wait for the daemon; a bulk ban waits for the kernel's acknowledgement

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_DEGRADED = 3  # `status`: the daemon runs but is degraded (a dead source, bans not saved, failing batches)
_MAX_ERROR_LINES = 20  # per-target failures printed before "... and N more"


class Failed(Exception):
    """The operation did not succeed (exit 1); the message has already been worded for the operator."""


class _ArgumentError(UsageError):
    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.usage = usage


class _ParserExit(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


_PARSER_CLASS: list[type[argparse.ArgumentParser]] = []  # made once, on first use


def _parser_class() -> type[argparse.ArgumentParser]:
    """argparse that writes to our streams and raises instead of calling sys.exit (argparse imported here)."""
    if _PARSER_CLASS:
        return _PARSER_CLASS[0]
    import argparse

    class _Parser(argparse.ArgumentParser):
        _out: TextIO | None = None  # set on a per-call subclass (subparsers are built with type(self))

        def _print_message(self, message: str, file: Any = None) -> None:
            if message:
                (self._out or sys.stdout).write(message)

        def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
            raise _ParserExit(status)

        def error(self, message: str) -> NoReturn:
            raise _ArgumentError(message, self.format_usage())

    _PARSER_CLASS.append(_Parser)
    return _Parser


class _Context:
    __slots__ = ("client_factory", "err", "json", "out", "socket", "stdin")

    def __init__(self, out: TextIO, err: TextIO, stdin: TextIO, socket: str, json: bool,
                 client_factory: Callable[[str], ControlClient]) -> None:
        self.out = out
        self.err = err
        self.stdin = stdin
        self.socket = socket
        self.json = json
        self.client_factory = client_factory

    def call(self, cmd: str, args: dict[str, Any]) -> dict[str, Any]:
        with self.client_factory(self.socket) as client:
            return client.call(cmd, args)

    def print(self, text: str = "") -> None:
        self.out.write(text + "\n")

    def warn(self, text: str) -> None:
        self.err.write(f"nftblock: {text}\n")

    def print_json(self, result: Mapping[str, Any]) -> None:
        import json  # only for --json: see the module docstring

        self.out.write(json.dumps(result, indent=2, ensure_ascii=False) + "\n")


# --- entry point ---------------------------------------------------------------------------------------


def main(
    argv: Sequence[str] | None = None,
    *,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
    client_factory: Callable[[str], ControlClient] | None = None,
) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    env = _Environ() if environ is None else environ
    args = list(sys.argv[1:] if argv is None else argv)
    ns = _quick_parse(args)
    if ns is None:
        try:
            ns = build_parser(out).parse_args(args)
        except _ArgumentError as exc:
            err.write(f"{exc.usage}nftblock: {exc}\n")  # usage first, so the last line is the reason
            return EXIT_USAGE
        except _ParserExit as exc:  # --help
            return exc.status
    ctx = _Context(
        out=out,
        err=err,
        stdin=stdin or sys.stdin,
        socket=ns.socket or env.get(SOCKET_ENV) or DEFAULT_SOCKET,
        json=bool(ns.json),
        client_factory=client_factory or (lambda path: ControlClient(path, timeout=CLIENT_TIMEOUT)),
    )
    try:
        code: int = ns.func(ctx, ns)
        return code
    except UsageError as exc:
        ctx.warn(str(exc))
        return EXIT_USAGE
    except (ClientError, Failed) as exc:
        ctx.warn(str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `nftblock list | head`: the reader has gone, nothing left to say
        if out is sys.__stdout__ and sys.__stdout__ is not None:
            # Python flushes stdout again at exit and would print a traceback about the same broken pipe.
            devnull = posix.open("/dev/null", posix.O_WRONLY)
            posix.dup2(devnull, sys.__stdout__.fileno())
            posix.close(devnull)
        return EXIT_FAILED


class _Environ:
    """os.environ.get without importing os: the process environment, decoded as os.environ decodes it."""

    def get(self, name: str, default: str | None = None) -> str | None:
        value = posix.environ.get(name.encode("utf-8", "surrogateescape"))
        return default if value is None else value.decode("utf-8", "surrogateescape")


def entry() -> NoReturn:
    """The console script `nftblock`: main(), then exit without the interpreter's teardown, which nothing here
    needs once the output is flushed (2 ms of a 20 ms `nftblock ban` process, bench/bench_cli.py)."""
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # the reader has gone (`nftblock list | head`), or main closed it
        pass
    posix._exit(code)


def build_parser(out: TextIO | None = None) -> argparse.ArgumentParser:
    import argparse

    parser_class = type("_Parser", (_parser_class(),), {"_out": out})
    p: argparse.ArgumentParser = parser_class(prog="nftblock", description="Control a running nftblockd.")
    p.add_argument("--socket", metavar="PATH",
                   help=f"control socket (default: ${SOCKET_ENV} or {DEFAULT_SOCKET})")
    p.add_argument("--json", action="store_true", help="print the daemon's result as JSON")
    cmds = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, func: Callable[[_Context, argparse.Namespace], int], help: str) -> Any:
        sp = cmds.add_parser(name, help=help, description=help)
        # --json is accepted after the command too; SUPPRESS keeps a global --json from being reset.
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        sp.set_defaults(func=func)
        return sp

    sp = add("ban", _cmd_ban, "ban addresses or CIDR ranges ('-' reads them from stdin, one per line)")
    sp.add_argument("targets", nargs="+", metavar="ADDR|CIDR")
    sp.add_argument("--timeout", metavar="DURATION", help="e.g. 10m, 1h, 2d or 'permanent' "
                    "(default: the blocklist's)")
    sp.add_argument("--set", metavar="NAME", help="blocklist (default: the default blocklist)")
    sp.add_argument("--comment", metavar="TEXT", default="", help="reason recorded with the ban")
    _add_audit_options(sp)

    sp = add("unban", _cmd_unban, "remove bans ('-' reads the targets from stdin)")
    sp.add_argument("targets", nargs="*", metavar="ADDR|CIDR")
    sp.add_argument("--set", metavar="NAME", help="only this blocklist (default: all)")
    sp.add_argument("--all", action="store_true", help="instead of targets: every active ban recorded with "
                    "--jail NAME (and --origin, if given), in one request; fail2ban's action flushes a jail so")
    _add_audit_options(sp)

    sp = add("list", _cmd_list, "list active bans")
    sp.add_argument("--set", metavar="NAME", help="only this blocklist")

    add("status", _cmd_status, "show the daemon's state: sets, batches, errors, jails, feeds")

    add("reload", _cmd_reload, "reload the daemon's config and wait for its verdict (exit 1 if refused); "
        "systemd's ExecReload runs this")

    sp = add("check", _cmd_check, "is this address banned (where, why, for how long) or allowlisted?")
    sp.add_argument("target", metavar="ADDR")

    sp = add("feeds", _cmd_feeds, "show feeds; 'feeds refresh NAME' refreshes one now")
    feed_cmds = sp.add_subparsers(dest="feeds_action", metavar="ACTION")
    rp = feed_cmds.add_parser("refresh", help="refresh a feed now and wait for the result")
    rp.add_argument("name", metavar="NAME")
    rp.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    ap = feed_cmds.add_parser("accept", help="accept a copy the shrink guard held back (it becomes the list)")
    ap.add_argument("name", metavar="NAME")
    ap.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    add("fleet", _cmd_fleet, "show fleet mode: server and role, connected or not, cursor and lag, outbox, "
        "events received, applied and refused (per reason), last error")

    sp = add("test-filter", _cmd_test_filter, "run a filter over a log file or the journal (no daemon needed)")
    sp.add_argument("filter", metavar="FILTER")
    sp.add_argument("logfile", metavar="LOGFILE", nargs="?", help="the log file (not with --journal)")
    sp.add_argument("--journal", action="append", default=[], metavar="FIELD=VALUE",
                    help="read the journal's entries that match instead, from its head, as a journal jail reads "
                         "them (repeat it: the same field ORs, different fields AND, as a jail's journal matches)")
    sp.add_argument("--journal-dir", metavar="DIR", help="the journal files in DIR (journalctl -D) instead of "
                    "the local journal")

    sp = add("import-fail2ban", _cmd_import_fail2ban,
             "ban what fail2ban currently bans, for the time it has left")
    sp.add_argument("db", nargs="?", default=DEFAULT_F2B_DB, metavar="PATH",
                    help=f"fail2ban's database (default: {DEFAULT_F2B_DB})")
    sp.add_argument("--set", metavar="NAME", help="blocklist (default: the default blocklist)")

    sp = add("import-fail2ban-config", _cmd_import_fail2ban_config,
             "write an nftblockd config with fail2ban's enabled jails (no daemon needed)")
    sp.add_argument("confdir", nargs="?", default=DEFAULT_F2B_DIR, metavar="DIR",
                    help=f"fail2ban's configuration directory (default: {DEFAULT_F2B_DIR})")
    sp.add_argument("-o", "--output", metavar="FILE", help="write the config to FILE instead of stdout (a new "
                    "file mode 0600; never through a symbolic link)")
    sp.add_argument("--dropin", metavar="FILE", help="write the systemd drop-in the imported actions need "
                    "(IPAddressAllow= for the hosts they reach, ...) to FILE (default with -o: fail2ban-actions.conf "
                    "in /etc/systemd/system/nftblockd.service.d for a config in /etc/nftblockd, else in a "
                    "nftblockd.service.d directory beside the config)")
    sp.add_argument("--force", action="store_true", help="FILE exists: merge the import into it (all it holds "
                    "is kept; a jail of the same name is replaced, its old text kept as a comment)")
    return p


def _add_audit_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--jail", metavar="NAME", help="the jail recorded with the ban or unban in the audit log "
                    "and `list` (for scripts such as fail2ban's action)")
    sp.add_argument("--origin", choices=ORIGINS, help="who decided it, for the audit log (default: cli)")


# --- the quick parser ----------------------------------------------------------------------------------

ORIGINS = ("cli", "fail2ban")  # as control/protocol.py's ORIGINS (which this module must not import)
_QUICK_OPTIONS = {
    "ban": frozenset({"--timeout", "--set", "--comment", "--jail", "--origin"}),
    "unban": frozenset({"--set", "--jail", "--origin"}),
}


class _Namespace:
    """What argparse.Namespace is to the commands: attributes, compared by value in the tests."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)

    def __eq__(self, other: object) -> bool:
        return vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]



def _quick_parse(argv: list[str]) -> Any:  # noqa: C901
    """`ban`/`unban` command lines as scripts write them, parsed as argparse would, or None.

    Accepted: `[--socket PATH] [--json] ban|unban TARGET... ` with the command's options (`--opt VALUE` or
    `--opt=VALUE`, before or after the targets, `--json` anywhere after the command), every target a single
    address `quick_canonical` knows. None for everything else (help, abbreviations, a value or target that
    starts with '-', targets on both sides of an option, CIDRs, ...): argparse decides those. `-` (stdin) is a
    target here as in argparse: `ban -` of 100,000 lines skips argparse's import and parser (~10 ms).
    """
    i, n = 0, len(argv)
    found: dict[str, Any] = {"socket": None, "json": False}
    while i < n and argv[i].startswith("-"):
        name, eq, value = argv[i].partition("=")
        if argv[i] == "--json":
            found["json"] = True
            i += 1
        elif name == "--socket":
            if not eq:
                if i + 1 >= n or argv[i + 1].startswith("-"):
                    return None
                value = argv[i + 1]
                i += 1
            found["socket"] = value
            i += 1
        else:
            return None
    if i >= n or argv[i] not in _QUICK_OPTIONS:
        return None
    cmd = argv[i]
    options = _QUICK_OPTIONS[cmd]
    found.update(command=cmd, targets=[], set=None, jail=None, origin=None,
                 func=_cmd_ban if cmd == "ban" else _cmd_unban)
    if cmd == "ban":
        found.update(timeout=None, comment="")
    else:
        found["all"] = False
    i += 1
    targets_ended = False
    while i < n:
        tok = argv[i]
        if not tok.startswith("-") or tok == "-":  # argparse reads a lone "-" as a positional: stdin
            if targets_ended or (tok != "-" and quick_canonical(tok) is None):
                return None
            found["targets"].append(tok)
            i += 1
            continue
        if tok == "--json":
            found["json"] = True
            targets_ended = bool(found["targets"])  # any option ends argparse's run of positionals
            i += 1
            continue
        name, eq, value = tok.partition("=")
        if name not in options:
            return None
        if not eq:
            if i + 1 >= n or argv[i + 1].startswith("-"):
                return None
            value = argv[i + 1]
            i += 1
        if name == "--origin" and value not in ORIGINS:
            return None
        found[name[2:]] = value
        targets_ended = bool(found["targets"])
        i += 1
    return _Namespace(**found) if found["targets"] else None


# --- targets (nftblockd/cli/targets.py) -------------------------------------------------------------


def _targets_from_args(ctx: _Context, targets: list[str]) -> Targets:
    if "-" in targets:
        if len(targets) != 1:
            raise UsageError("'-' (read targets from stdin) cannot be combined with other targets")
        return targets_from_stream(ctx.stdin)
    out: list[str] = []
    bad: list[str] = []
    for t in targets:
        try:
            out.append(canonical_target(t))
        except ValueError as exc:  # addr.AddressError
            bad.append(str(exc))
    if bad:
        more = f" (and {len(bad) - 1} more invalid)" if len(bad) > 1 else ""
        raise UsageError(f"{bad[0]}{more}")
    out = list(dict.fromkeys(out))
    return Targets([out], out)


def _wire_timeout(text: str | None) -> float | str | None:
    """--timeout as the protocol's `timeout`: seconds, "permanent", or None (`null`: the blocklist's default,
    which every daemon understands; the explicit "default" is newer)."""
    if text is None:
        return None
    try:
        seconds = parse_timeout(text)
    except ValueError as exc:
        raise UsageError(f"--timeout: {exc}") from None
    return "permanent" if isinstance(seconds, Permanent) else seconds


def _describe(targets: list[str], verb: str) -> str:
    if len(targets) == 1:
        return f"{verb} {targets[0]}"
    if len(targets) <= 10:
        return f"{verb} {len(targets)} targets: {', '.join(targets)}"
    return f"{verb} {len(targets)} targets"


def _report_each(ctx: _Context, lines: list[str]) -> None:
    for line in lines[:_MAX_ERROR_LINES]:
        ctx.warn(line)
    if len(lines) > _MAX_ERROR_LINES:
        ctx.warn(f"... and {len(lines) - _MAX_ERROR_LINES} more")


def _refusals(result: Mapping[str, Any]) -> list[str]:
    refused = result.get("refused") or []
    return [f"refused {r.get('target')}: {r.get('message') or r.get('code')}" for r in refused]


# --- commands ------------------------------------------------------------------------------------------


def _cmd_ban(ctx: _Context, ns: Any) -> int:
    timeout = _wire_timeout(ns.timeout)
    if len(ns.comment) > MAX_REASON:
        raise UsageError(f"--comment: at most {MAX_REASON} characters, got {len(ns.comment)}")
    targets = _targets_from_args(ctx, ns.targets)
    if not targets:
        ctx.warn("no targets on stdin; nothing to ban")
        return EXIT_OK
    result = _call_bulk(ctx, "ban", targets, {"timeout": timeout, "set": ns.set, "comment": ns.comment,
                                              **_audit_args(ns)})
    applied = result.get("applied") or []
    count = len(applied) if "applied_count" not in result else int(result["applied_count"])
    refused = _refusals(result)
    if ctx.json:
        ctx.print_json(result)
    elif count:
        how = "permanently" if timeout == "permanent" else "" if timeout is None else \
            f"for {format_duration(float(timeout))}"
        where = f" in blocklist {ns.set}" if ns.set else ""
        done = _describe(applied, "banned") if applied else f"banned {count} targets"
        ctx.print(f"{done}{where}" + (f" ({how})" if how else ""))
        for note in (result.get("notes") or [])[:_MAX_ERROR_LINES]:
            ctx.print(f"note: {note.get('message') or note.get('target')}")
    _report_each(ctx, refused)
    return EXIT_FAILED if refused else EXIT_OK


_COUNTS_FROM = 11  # _describe lists up to 10 targets; from 11 on the human output shows a count only


def _call_bulk(ctx: _Context, cmd: str, targets: Targets, args: dict[str, Any]) -> dict[str, Any]:
    """`ban`/`unban`: with many targets and human output, ask for counts instead of every target echoed back
    (`reply: counts`), and send a ban's plain addresses packed (`hosts4`, `hosts6`). A daemon older than
    those arguments refuses them by name: ask again without them."""
    # few targets, as the operator sees them (lines repeating an address count once; a long input is not
    # counted exactly: it cannot be few)
    few = len(targets) < _COUNTS_FROM or (len(targets) < 1000 and len(targets.strings()) < _COUNTS_FROM)
    if ctx.json or few:
        return ctx.call(cmd, {"targets": targets.strings(), **args})
    if cmd == "ban" and (targets.hosts4 or targets.hosts6):
        import binascii  # built into the interpreter: no start-up cost worth deferring, but only bulk needs it

        packed = {name: binascii.b2a_base64(blob, newline=False).decode("ascii")
                  for name, blob in (("hosts4", targets.hosts4), ("hosts6", targets.hosts6)) if blob}
        slow = targets.slow
        while packed:
            try:
                return ctx.call(cmd, {**({"targets": slow} if slow else {}), **packed, **args, "reply": "counts"})
            except RemoteError as exc:
                if _refused_argument(exc, "hosts6") and "hosts6" in packed:
                    # a daemon with `hosts4` but older than `hosts6`: the IPv6 addresses go as text
                    del packed["hosts6"]
                    slow = list(dict.fromkeys(slow + _v6_strings(targets.hosts6)))
                elif _refused_argument(exc, "hosts4"):
                    break
                else:
                    raise
    strings = targets.strings()
    try:
        return ctx.call(cmd, {"targets": strings, **args, "reply": "counts"})
    except RemoteError as exc:
        if not _refused_argument(exc, "reply"):
            raise
    return ctx.call(cmd, {"targets": strings, **args})


def _v6_strings(blob: bytes) -> list[str]:
    """Packed IPv6 addresses (Targets.hosts6) as canonical text, for a daemon older than `hosts6`."""
    return [canonical_plain(_socket.inet_ntop(_socket.AF_INET6, blob[i:i + 16])) for i in range(0, len(blob), 16)]


def _refused_argument(exc: RemoteError, name: str) -> bool:
    """The daemon is older than argument `name` (it names the first unknown argument it finds)."""
    return exc.code == "bad_request" and f"'{name}'" in exc.message and "unknown argument" in exc.message


def _audit_args(ns: Any) -> dict[str, str]:
    """`jail` and `origin` only when given: a daemon older than these arguments refuses unknown ones."""
    return {k: v for k in ("jail", "origin") if (v := getattr(ns, k, None))}


def _jail_targets(ctx: _Context, ns: Any) -> Targets:
    """`unban --all --jail NAME`: the targets of the jail's active bans, read with `list`."""
    if ns.targets or not ns.jail:
        raise UsageError("--all takes no targets and needs --jail NAME")
    bans = ctx.call("list", {"set": ns.set}).get("bans") or []
    out = list(dict.fromkeys(str(b.get("target")) for b in bans if b.get("jail") == ns.jail
                             and (not ns.origin or b.get("origin") == ns.origin)))
    return Targets([out], out)


def _cmd_unban(ctx: _Context, ns: Any) -> int:
    if getattr(ns, "all", False):
        targets = _jail_targets(ctx, ns)
        if not targets:
            if not ctx.json:
                ctx.print(f"no active bans of jail {ns.jail}")
            else:
                ctx.print_json({"removed": [], "not_found": []})
            return EXIT_OK
    elif not ns.targets:
        raise UsageError("give the targets to unban ('-' reads them from stdin), or --all with --jail NAME")
    else:
        targets = _targets_from_args(ctx, ns.targets)
    if not targets:
        ctx.warn("no targets on stdin; nothing to unban")
        return EXIT_OK
    result = _call_bulk(ctx, "unban", targets, {"set": ns.set, **_audit_args(ns)})
    removed = result.get("removed") or []
    count = len(removed) if "removed_count" not in result else int(result["removed_count"])
    not_found = list(result.get("not_found") or [])
    if ctx.json:
        ctx.print_json(result)
    elif count:
        ctx.print(_describe(removed, "unbanned") if removed else f"unbanned {count} targets")
    where = f" in blocklist {ns.set}" if ns.set else ""
    messages = result.get("messages") or {}  # why, when the daemon knows more ("it lies inside ...")
    failures = [messages.get(t) or f"{t} is not banned{where}" for t in not_found] + _refusals(result)
    if getattr(ns, "all", False):
        failures = _refusals(result)  # a ban that expired since `list` is gone, as asked
    _report_each(ctx, failures)
    return EXIT_FAILED if failures else EXIT_OK


def _remaining(ban: Mapping[str, Any]) -> str:
    left = ban.get("expires_in")
    if left is None:
        return "permanent" if ban.get("until") is None else "?"
    return format_duration(float(left))


def _cmd_list(ctx: _Context, ns: Any) -> int:
    result = ctx.call("list", {"set": ns.set})
    if ctx.json:
        ctx.print_json(result)
        return EXIT_OK
    bans = result.get("bans") or []
    if not bans:
        ctx.print("no active bans" + (f" in blocklist {ns.set}" if ns.set else ""))
        return EXIT_OK
    rows = [[str(b.get("target", "")), str(b.get("blocklist", "")), str(b.get("set", "")), _remaining(b),
             str(b.get("origin", "")), str(b.get("jail") or "-"), str(b.get("reason") or "")] for b in bans]
    _table(ctx, ["TARGET", "BLOCKLIST", "SET", "REMAINING", "ORIGIN", "JAIL", "REASON"], rows)
    ctx.print(f"{len(bans)} ban{'s' if len(bans) != 1 else ''}")
    return EXIT_OK


def _cmd_check(ctx: _Context, ns: Any) -> int:
    try:
        target = canonical_target(ns.target)
    except ValueError as exc:  # addr.AddressError
        raise UsageError(str(exc)) from None
    result = ctx.call("check", {"target": target})
    if ctx.json:
        ctx.print_json(result)
        return EXIT_OK
    shown = result.get("target") or target
    allow = result.get("allowlisted")
    if allow:
        ctx.print(f"{shown} is allowlisted (entry {allow}): it is never banned")
    bans = result.get("bans") or []
    for b in bans:
        left = _remaining(b)
        span = "permanently" if left == "permanent" else f"for {left} more"
        why = ", ".join(x for x in (
            f"reason: {b['reason']}" if b.get("reason") else "",
            f"jail {b['jail']}" if b.get("jail") else "",
            f"origin {b['origin']}" if b.get("origin") else "",
            f"from fleet host {b['origin_host']}" if b.get("origin_host") else "",
        ) if x)
        covered = f" (by {b['target']})" if b.get("target") and b.get("target") != shown else ""
        ctx.print(f"{shown} is banned{covered} in blocklist {b.get('blocklist')} (set {b.get('set')}) {span}"
                  + (f"; {why}" if why else ""))
    if not bans and not allow:
        ctx.print(f"{shown} is not banned")
    _print_fleet_count(ctx, shown, result.get("fleet_count"))
    return EXIT_OK


def _ago(t: Any, now: float) -> str:
    if not isinstance(t, int | float) or isinstance(t, bool):
        return "never" if t is None else str(t)
    d = now - float(t)
    return f"{format_duration(d)} ago" if d >= 0 else f"in {format_duration(-d)}"


def _until(t: Any, now: float) -> str:
    if not isinstance(t, int | float) or isinstance(t, bool):
        return "-" if t is None else str(t)
    d = float(t) - now
    return f"in {format_duration(d)}" if d > 0 else "now"


def _feed_rows(feeds: Iterable[Mapping[str, Any]], now: float) -> list[list[str]]:
    return [[_cell(f.get("name")), _cell(f.get("entries")), _ago(f.get("last_success"), now),
             _until(f.get("next_refresh"), now), _cell(f.get("error"))] for f in feeds]


_FEED_HEADER = ["FEED", "ENTRIES", "LAST SUCCESS", "NEXT REFRESH", "ERROR"]


def _cmd_feeds(ctx: _Context, ns: Any) -> int:
    if getattr(ns, "feeds_action", None) in ("refresh", "accept"):
        result = ctx.call(f"feeds_{ns.feeds_action}", {"name": ns.name})
        if ctx.json:
            ctx.print_json(result)
            return EXIT_OK
        feed = result.get("feed") or {}
        if feed.get("error"):
            ctx.warn(f"feed {ns.name}: {feed['error']}")
            return EXIT_FAILED
        done = "accepted" if ns.feeds_action == "accept" else "refreshed"
        ctx.print(f"{done} feed {ns.name}: {feed.get('entries', '?')} entries")
        return EXIT_OK
    result = ctx.call("feeds", {})
    if ctx.json:
        ctx.print_json(result)
        return EXIT_OK
    feeds = result.get("feeds") or []
    if not feeds:
        ctx.print("no feeds configured")
        return EXIT_OK
    _table(ctx, _FEED_HEADER, _feed_rows(feeds, time.time()))
    return EXIT_OK


def _cmd_reload(ctx: _Context, ns: Any) -> int:
    result = ctx.call("reload", {})  # a refusal is a RemoteError: its message, exit 1
    if ctx.json:
        ctx.print_json(result)
    else:
        ctx.print(str(result.get("message") or "configuration reloaded"))
    return EXIT_OK


def _status_head(result: Mapping[str, Any], degraded: list[dict[str, Any]]) -> str:
    """The first line of `status`: version, uptime, table; it starts with DEGRADED (and the reasons) if so."""
    up = result.get("uptime")
    head = f"nftblockd {result.get('version', '?')}"
    if isinstance(up, int | float):
        head += f", up {format_duration(float(up))}"
    if result.get("table"):
        head += f", table {result['table']}"
    if degraded:
        head = f"DEGRADED ({', '.join(dict.fromkeys(str(d.get('reason')) for d in degraded))}): {head}"
    return head


def _cmd_status(ctx: _Context, ns: Any) -> int:
    """Exit 0 healthy, 3 degraded (the first line says DEGRADED and why), 1 when the daemon cannot answer."""
    result = ctx.call("status", {})
    degraded = [d for d in result.get("degraded") or () if isinstance(d, dict)]
    code = EXIT_DEGRADED if degraded else EXIT_OK
    if ctx.json:
        ctx.print_json(result)
        return code
    ctx.print(_status_head(result, degraded))
    for d in degraded:
        ctx.print(f"degraded: {d.get('reason')}: {d.get('message')}")
    if result.get("kernel"):
        ctx.print(f"kernel: {_kv(result['kernel'])}")
    sets = result.get("sets") or []
    if sets:
        ctx.print("sets:")
        rows = [[_cell(s.get(k)) for k in ("name", "blocklist", "family", "kind", "elements", "size")]
                for s in sets]
        _table(ctx, ["SET", "BLOCKLIST", "FAMILY", "KIND", "ELEMENTS", "SIZE"], rows, indent="  ")
    for key in ("batches", "errors"):
        if result.get(key):
            ctx.print(f"{key}: {_kv(result[key])}")
    jails = result.get("jails") or []
    if jails:
        ctx.print("jails:")
        for j in jails:
            if isinstance(j, dict):
                rest = {k: v for k, v in j.items() if k not in ("name", "missing")}
                ctx.print(f"  {j.get('name', '?')}: {_kv(rest)}" if rest else f"  {j.get('name', '?')}")
                for why in j.get("missing") or ():  # a jail reading nothing must not look healthy
                    ctx.print(f"    not found: {why}")
            else:
                ctx.print(f"  {j}")
    feeds = result.get("feeds") or []
    if feeds:
        ctx.print("feeds:")
        _table(ctx, _FEED_HEADER, _feed_rows(feeds, time.time()), indent="  ")
    if isinstance(result.get("fleet"), dict):
        ctx.print("fleet:")
        _print_fleet(ctx, result["fleet"], "  ")
    return code


def _cmd_fleet(ctx: _Context, ns: Any) -> int:
    result = ctx.call("fleet", {})
    if ctx.json:
        ctx.print_json(result)
        return EXIT_OK
    fleet = result.get("fleet")
    if not isinstance(fleet, dict):
        ctx.print("fleet mode is off (no fleet: block in the config)")
        return EXIT_OK
    _print_fleet(ctx, fleet, "")
    return EXIT_OK


def _print_fleet(ctx: _Context, f: Mapping[str, Any], indent: str) -> None:
    now = time.time()
    state = "connected" if f.get("connected") else "NOT connected"
    where = f" to {f['server']}" if f.get("server") else ""
    role = f" ({f['role']})" if f.get("role") else ""
    ctx.print(f"{indent}fleet {f.get('fleet', '?')}, host {f.get('host_id', '?')}: {state}{where}{role}")
    lag = f.get("lag_last")
    ctx.print(f"{indent}cursor {f.get('cursor') or '-'}"
              + (f", last propagation lag {float(lag) * 1000:.1f} ms" if isinstance(lag, int | float) and lag else "")
              + f", outbox {f.get('outbox', 0)}, published {f.get('published', 0)}"
              + f", publish failures {f.get('publish_failures', 0)}")
    received = f.get("received") or {}
    for op in sorted(received):
        counts = received[op]
        if isinstance(counts, dict):
            ctx.print(f"{indent}received {op}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    rejected = f.get("rejected") or {}
    if rejected:
        ctx.print(f"{indent}refused: " + ", ".join(f"{k} {v}" for k, v in sorted(rejected.items())))
    if f.get("deferred_total"):
        ctx.print(f"{indent}over the rate cap: {f.get('deferred', 0)} waiting, {f['deferred_total']} deferred in all "
                  "(applied as the cap refills)")
    ctx.print(f"{indent}catch-ups: {f.get('replays', 0)} replays, {f.get('snapshots', 0)} snapshots, "
              f"{f.get('reasserted', 0)} own bans re-asserted; {f.get('connects', 0)} connects")
    ctx.print(f"{indent}members: {f.get('members', 0)} streams followed; {f.get('heals', 0)} heals (the server had "
              f"lost this host's bans), {f.get('stream_resets', 0)} own stream re-created")
    problems = f.get("stream_problems") or {}
    if isinstance(problems, dict) and problems:
        ctx.print(f"{indent}BROKEN streams (their events are refused or re-read): "
                  + ", ".join(f"{h} ({why})" for h, why in sorted(problems.items())))
    if f.get("last_error"):
        ctx.print(f"{indent}last error ({_ago(f.get('last_error_at'), now)}): {f['last_error']}")
    c = f.get("counting")
    if isinstance(c, dict):
        ctx.print(f"{indent}counting ({'on' if c.get('connected') else 'paused'}): {c.get('sent', 0)} failures sent, "
                  f"{c.get('accepted', 0)} counted, {c.get('limited', 0)} over the rate limit, "
                  f"{c.get('skipped', 0)} already banned, {c.get('lost', 0)} lost while offline; "
                  f"{c.get('decided', 0)} bans decided here, {c.get('malformed', 0)} malformed entries dropped")


def _print_fleet_count(ctx: _Context, shown: str, fc: Any) -> None:
    """`check`: which fleet hosts saw failures of the address (fleet counting)."""
    if not isinstance(fc, dict):
        return
    if "error" in fc:
        ctx.print(f"fleet count: unknown ({fc['error']})")
        return
    for jail, v in sorted(fc.items()):
        if not isinstance(v, dict):
            continue
        d = v.get("decided")
        if isinstance(d, dict):
            ctx.print(f"fleet count, jail {jail}: banned fleet-wide after {d.get('count')} failures seen by "
                      f"{', '.join(d.get('seen_by') or []) or '?'} (decided by {d.get('by') or '?'})")
        if v.get("counting"):
            ctx.print(f"fleet count, jail {jail}: {v['counting']} failures of {shown} in the window, seen by "
                      f"{', '.join(v.get('seen_by') or [])}")


def _cmd_test_filter(ctx: _Context, ns: Any) -> int:
    try:
        from nftblockd.detect.testfilter import run  # type: ignore[import-not-found, unused-ignore]
    except ModuleNotFoundError as exc:
        if exc.name != "nftblockd.detect.testfilter":
            raise
        raise Failed("test-filter is not available in this build") from None
    if ns.logfile is None and not ns.journal:
        raise Failed("test-filter: give a LOGFILE or --journal FIELD=VALUE to read lines from")
    if ns.logfile is not None and ns.journal:
        raise Failed("test-filter: give a LOGFILE or --journal FIELD=VALUE, not both")
    if ns.journal_dir is not None and not ns.journal:
        raise Failed("test-filter: --journal-dir needs --journal FIELD=VALUE")
    journal = []
    for m in ns.journal:
        field, eq, value = m.partition("=")
        if not eq or not field:
            raise Failed(f"test-filter: --journal {m!r}: expected FIELD=VALUE, as _SYSTEMD_UNIT=ssh.service")
        journal.append((field, value))
    extra = {"journal": journal, "journal_dir": ns.journal_dir} if journal else {}
    try:
        code: int = run(ns.filter, ns.logfile, json_output=ctx.json, out=ctx.out, err=ctx.err, **extra)
    except OSError as exc:
        raise Failed(f"{exc.filename or ns.logfile}: {exc.strerror or exc}") from None
    return code


def _cmd_import_fail2ban(ctx: _Context, ns: Any) -> int:
    try:
        from nftblockd.addr import parse_target
        from nftblockd.state.f2bimport import read_fail2ban_bans, refusal  # type: ignore[import-not-found, unused-ignore]
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.f2bimport":
            raise
        raise Failed("import-fail2ban is not available in this build") from None
    now = time.time()
    try:
        bans = read_fail2ban_bans(ns.db, now)
    # The reader may fail with sqlite's, the filesystem's or its own errors; all mean "cannot read it".
    except Exception as exc:
        raise Failed(f"cannot read fail2ban bans from {ns.db}: {exc}") from None
    items: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    jail_of = _our_jails(ctx, {b.jail for b in bans}) if bans else {}
    for ban in bans:
        try:
            target = canonical_target(str(ban.ip))
            why = refusal(ban, parse_target(target), now)
        except ValueError as exc:  # addr.AddressError
            skipped.append(f"skipped fail2ban entry (jail {ban.jail}): {exc}")
            continue
        if why is not None:
            skipped.append(f"skipped fail2ban entry: {why}")
            continue
        left = ban.remaining
        if not isinstance(left, Permanent) and left <= 0:
            continue  # expired between fail2ban's bookkeeping and now
        timeout: float | str = "permanent" if isinstance(left, Permanent) else max(1, math.ceil(left))
        prev = items.get(target)
        if prev is not None and (prev["timeout"] == "permanent" or
                                 (timeout != "permanent" and prev["timeout"] >= timeout)):
            continue  # the same address in several jails: the longest ban wins
        items[target] = {"target": target, "timeout": timeout, "jail": jail_of.get(ban.jail, ban.jail),
                         "reason": f"imported from fail2ban jail {ban.jail}"}
    _report_each(ctx, skipped)
    if not items:
        ctx.print(f"no active fail2ban bans in {ns.db}")
        return EXIT_FAILED if skipped else EXIT_OK
    result = ctx.call("ban", {"targets": list(items.values()), "set": ns.set, "origin": "fail2ban"})
    refused = _refusals(result)
    if ctx.json:
        ctx.print_json(result)
    else:
        n = len(result.get("applied") or [])
        extra = f" ({len(refused)} refused)" if refused else ""
        ctx.print(f"imported {n} ban{'s' if n != 1 else ''} from {ns.db}{extra}")
    _report_each(ctx, refused)
    return EXIT_FAILED if refused or skipped else EXIT_OK


def _our_jails(ctx: _Context, f2b_jails: set[str]) -> dict[str, str]:
    """fail2ban's jail names -> the running daemon's jails they became at the config's import, so that the
    taken-over bans are the jails' own (`unban --all --jail`, escalation, recidive). A fail2ban jail with no
    counterpart keeps its name, said once."""
    from nftblockd.migrate.f2bjail import our_jail

    status = ctx.call("status", {})
    running = {j["name"] for j in status.get("jails") or () if isinstance(j, dict) and isinstance(j.get("name"), str)}
    out: dict[str, str] = {}
    for name in sorted(f2b_jails):
        ours = our_jail(name, running)
        if ours is None:
            ctx.err.write(f"nftblock: fail2ban jail {name} has no nftblockd jail: its bans keep the name {name}\n")
        else:
            out[name] = ours
    return out


def _write_dropin(ctx: _Context, ns: Any, plan: Migration, renamed: Mapping[str, str]) -> None:
    """What the imported actions need from the packaged unit's sandbox: written as a drop-in, or one line
    saying why none is needed (migrate/dropin.py)."""
    import os

    from nftblockd.migrate import netfacts
    from nftblockd.migrate.dropin import MARKER, default_path, needs_of, render_dropin
    from nftblockd.migrate.output import OutputError, write_config

    needs = [needs_of(renamed.get(a.name, a.name), netfacts.action_scripts(a.file, dict(a.options)))
             for a in plan.actions]
    names = {h for n in needs for h in n.hosts}
    mail = netfacts.mail_facts()
    names |= set(mail.relays) if any(n.mail for n in needs) and mail.kind == "msmtp" else set()
    resolved = {h: netfacts.resolve(h) for h in sorted(names) if not _is_ip(h)}
    config = os.path.abspath(ns.output) if ns.output is not None else "stdout"
    drop = render_dropin(needs, config, resolved, netfacts.resolvers(), mail)
    path = ns.dropin if ns.dropin is not None or ns.output is None else default_path(config)
    if drop.text is None:
        ctx.err.write(f"nftblock: {drop.said[0]}\n")
        if path is not None and _ours(path, MARKER):
            try:
                os.unlink(path)  # an earlier import's allowances, no longer needed
            except OSError as exc:
                raise Failed(f"{path}: {exc.strerror}; remove it by hand") from None
            ctx.err.write(f"nftblock: removed {path}, which an earlier import wrote\n")
        return
    if path is None:
        ctx.err.write("nftblock: the imported actions need a drop-in for the packaged unit; give -o or --dropin "
                      "FILE to write it:\n")
    else:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o755, exist_ok=True)
            write_config(path, drop.text, replace=True)
        except (OutputError, OSError) as exc:
            raise Failed(f"the drop-in: {exc}") from None
        ctx.err.write(f"nftblock: wrote the unit's drop-in for the imported actions to {path}; apply it with "
                      "systemctl daemon-reload && systemctl restart nftblockd\n")
    for line in drop.said:
        ctx.err.write(f"nftblock:   {line}\n")


def _is_ip(text: str) -> bool:
    try:
        _socket.inet_pton(_socket.AF_INET6 if ":" in text else _socket.AF_INET, text)
    except OSError:
        return False
    return True


def _ours(path: str, marker: str) -> bool:
    """A regular file (not a link) whose first line is `marker`."""
    import os
    import stat

    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().rstrip("\n") == marker
    except OSError:
        return False


def _cmd_import_fail2ban_config(ctx: _Context, ns: Any) -> int:
    import os

    from nftblockd.detect.matcher import FilterError
    from nftblockd.migrate.f2bjail import plan_migration
    from nftblockd.migrate.host import FsHost, read_jails
    from nftblockd.migrate.merge import Merged, MergeError, merge_config
    from nftblockd.migrate.output import OutputError, read_existing, write_config
    from nftblockd.migrate.render import render_config

    # The config names filter and action files by the paths found here: absolute, whatever the working
    # directory is when the daemon reads it
    confdir = os.path.abspath(ns.confdir)
    if not posix.access(f"{confdir}/jail.conf", posix.R_OK):
        raise Failed(f"{ns.confdir}/jail.conf: cannot read it (is {ns.confdir} fail2ban's directory?)")
    try:
        plan = plan_migration(read_jails(confdir), confdir, FsHost(confdir))
    except FilterError as exc:
        raise Failed(f"cannot read fail2ban's jails: {exc}") from None
    merged: Merged | None = None
    try:
        old = read_existing(ns.output) if ns.output is not None and ns.force else None
        if old is not None and old.text is not None:
            # the config nftblockd runs: what it holds stays (metrics, feeds, fleet, its own jails, ...)
            merged = merge_config(old.text, ns.output, plan)
            text = merged.text
        else:
            text = render_config(plan)
        if ns.output is None:
            ctx.out.write(text)
        else:
            write_config(ns.output, text, replace=ns.force)
    except (OutputError, MergeError) as exc:
        raise Failed(str(exc)) from None
    if merged is not None:
        ctx.err.write(f"nftblock: merged into {ns.output}, keeping {', '.join(merged.kept) or 'nothing'}\n")
        for note in merged.notes:
            ctx.err.write(f"nftblock: {note}\n")
    _write_dropin(ctx, ns, plan, dict(merged.renamed) if merged is not None else {})
    for d in plan.dropped:
        ctx.err.write(f"nftblock: not carried over: {d}\n")
    where = "stdout" if ns.output is None else ns.output
    ctx.err.write(f"nftblock: {len(plan.jails)} jail{'s' if len(plan.jails) != 1 else ''} and "
                  f"{len(plan.actions)} action{'s' if len(plan.actions) != 1 else ''} written to {where}; "
                  f"{len(plan.dropped)} item{'s' if len(plan.dropped) != 1 else ''} not carried over\n")
    return EXIT_OK


# --- formatting ----------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _table(ctx: _Context, header: list[str], rows: list[list[str]], indent: str = "") -> None:
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    for row in (header, *rows):
        ctx.print(indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _kv(obj: Any, prefix: str = "") -> str:
    """`{"sent": 3, "latency": {"p50": 0.001}}` → `sent=3 latency.p50=0.001`."""
    if not isinstance(obj, dict):
        return str(obj)
    parts: list[str] = []
    for k, v in obj.items():
        if isinstance(v, dict):
            parts.append(_kv(v, f"{prefix}{k}."))
        elif isinstance(v, float):
            parts.append(f"{prefix}{k}={v:.6g}")
        else:
            parts.append(f"{prefix}{k}={v}")
    return " ".join(p for p in parts if p)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
