"""Validation of the config's actions: and fleet: sections (docs/actions.md, docs/fleet.md).

It builds ActionConfig and FleetConfig values and checks action references; it must NOT read the other
sections (config/load.py does) nor touch the network, the kernel or any file other than the secrets a fleet names.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import replace
from typing import Any

from nftblockd.argtemplate import TemplateError, parse_template
from nftblockd.config.model import (
    ACTION_EVENTS,
    ACTION_TYPES,
    NAME_RE,
    ActionConfig,
    Config,
    FleetConfig,
    FleetTLS,
)
from nftblockd.config.reader import SectionReader
from nftblockd.config.yamlsrc import Path_

# a host id names the host's own keys and its ACL user (docs/fleet.md): lower case, and no ':' or glob
# character, so `nftblock:{F}:h:<id>:*` covers that host's keys and no other host's
FLEET_HOST_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_HEADER_RE = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}")  # an HTTP token (RFC 9110)
_F2B_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


class ActionFleetSections(SectionReader):
    """The actions: and fleet: sections, read with SectionReader's getters."""

    def action_refs(self, cfg: Config) -> None:
        known = {a.name for a in cfg.actions}
        users: list[tuple[Path_, tuple[str, ...]]] = [(("jails", j.name), j.actions) for j in cfg.jails]
        users += [(("feeds", f.name), f.actions) for f in cfg.feeds]
        if cfg.fleet is not None:
            users.append((("fleet",), cfg.fleet.actions))
        for path, names in users:
            for i, n in enumerate(names):
                if n not in known:
                    hint = f" (defined: {', '.join(sorted(known))})" if known else " (no actions: are defined)"
                    self.fail((*path, "actions", i), f"unknown action {n!r}{hint}")
                elif n in names[:i]:
                    self.fail((*path, "actions", i), f"action {n!r} is listed twice")

    def actions(self, value: Any) -> tuple[ActionConfig, ...]:
        m = self.mapping(value, ("actions",), set(value) if isinstance(value, dict) else set())
        out = []
        for name, body in m.items():
            a = self.action(str(name), body)
            if a is not None:
                out.append(a)
        return tuple(out)

    # complexity exempt (C901): one flat walk over an action's keys, each checked where it is read
    def action(self, name: str, body: Any) -> ActionConfig | None:  # noqa: C901
        path: Path_ = ("actions", name)
        if not NAME_RE.fullmatch(name):
            self.fail(path, "an action name is a letter then up to 23 letters, digits or _")
            return None
        common = {"type", "on", "timeout", "retries", "retry_delay", "queue", "concurrency", "rate", "burst"}
        kind = body.get("type") if isinstance(body, dict) else None
        specific = {"command": {"argv", "env"}, "webhook": {"url", "headers", "batch"},
                    "fail2ban": {"file", "options", "lifecycle"}}
        if kind not in ACTION_TYPES:
            self.fail(path if kind is None else (*path, "type"),
                      f"an action needs type: {', '.join(ACTION_TYPES)}" + ("" if kind is None else f"; got {kind!r}"))
            return None
        a = self.mapping(body, path, common | specific[str(kind)])
        on_raw = a.get("on", ["ban"])
        if isinstance(on_raw, str):
            on_raw = [on_raw]
        on: list[str] = []
        if not isinstance(on_raw, list) or not on_raw:
            self.fail((*path, "on"), "on is a list of events: ban, unban")
        else:
            for i, ev in enumerate(on_raw):
                if ev not in ACTION_EVENTS:
                    self.fail((*path, "on", i), f"unknown event {ev!r} (events: {', '.join(ACTION_EVENTS)})")
                elif ev not in on:
                    on.append(str(ev))
        rate = self.get(a, "rate", path, (int, float), 1.0)
        if not 0 < rate <= 10_000:
            self.fail((*path, "rate"), "rate is runs per second, more than 0 and at most 10000")
            rate = 1.0
        cfg = ActionConfig(
            name=name, type=str(kind), on=tuple(on) or ("ban",),
            timeout=self.duration(a, "timeout", path, 30.0, positive=True, most=3600.0),
            retries=self.positive_int(a, "retries", path, 2, 0, 100),
            retry_delay=self.duration(a, "retry_delay", path, 1.0, most=3600.0),
            queue=self.positive_int(a, "queue", path, 1000, 1, 1_000_000),
            concurrency=self.positive_int(a, "concurrency", path, 1, 1, 64),
            rate=float(rate),
            burst=self.positive_int(a, "burst", path, 20, 1, 1_000_000),
            line=self.doc.line(path),
        )
        if kind == "command":
            argv = a.get("argv")
            if not isinstance(argv, list) or not argv or not all(isinstance(x, str | int | float) for x in argv):
                self.fail((*path, "argv"), "argv is a non-empty list of strings: the program, then its arguments "
                          "(no shell; {address}-style placeholders are filled in each one)")
                argv = []
            args = [str(x) for x in argv]
            for i, t in enumerate(args):
                try:
                    parse_template(t)
                except TemplateError as exc:
                    self.fail((*path, "argv", i), str(exc))
            if args and not os.path.isabs(args[0]):
                self.fail((*path, "argv", 0), f"the program must be an absolute path, got {args[0]!r} "
                          "(no PATH lookup: the daemon's PATH is not the operator's)")
            elif args and "{" in args[0]:
                self.fail((*path, "argv", 0), "the program cannot hold a placeholder")
            env = self.str_pairs(a.get("env"), (*path, "env"), _ENV_NAME_RE, "environment variable")
            for k, v in env:
                try:
                    parse_template(v)
                except TemplateError as exc:
                    self.fail((*path, "env", k), str(exc))
            return replace(cfg, argv=tuple(args), env=tuple(env))
        if kind == "webhook":
            url = self.get(a, "url", path, str, "")
            if not re.fullmatch(r"https?://[^\s]+", url):
                self.fail((*path, "url"), "a webhook needs url: http://... or https://...")
            headers = self.str_pairs(a.get("headers"), (*path, "headers"), _HEADER_RE, "header")
            return replace(cfg, url=url, headers=tuple(headers),
                           batch=self.positive_int(a, "batch", path, 1, 1, 10_000))
        # the file itself is read in the daemon's build step (daemon.compile_actions), as filters are
        file = self.get(a, "file", path, str, "")
        # fail2ban options may span lines (`logpath` of the *-lines actions), as in a jail.local
        options = self.str_pairs(a.get("options"), (*path, "options"), _F2B_TAG_RE, "fail2ban option", "\0")
        if not file:
            self.fail(path, "a fail2ban action needs file: (an action.d .conf file)")
        elif not os.path.isabs(file):
            self.fail((*path, "file"), f"file must be an absolute path, got {file!r}")
        life = a.get("lifecycle", True)
        if not isinstance(life, bool):
            self.fail((*path, "lifecycle"), f"lifecycle is true or false (whether the file's actionstart and "
                      f"actionstop run), got {life!r}")
            life = True
        return replace(cfg, file=file, options=tuple(options), file_line=self.doc.line((*path, "file")),
                       lifecycle=life)

    # complexity exempt (C901): one flat walk over the fleet block's keys, each checked where it is read
    def fleet(self, value: Any, cfg: Config) -> FleetConfig | None:  # noqa: C901
        path: Path_ = ("fleet",)
        m = self.mapping(value, path, {
            "name", "host_id", "url", "sentinel", "username", "password_file", "tls", "share", "blocklist",
            "trust", "history", "actions", "count",
        })
        if not m:
            self.fail(path, "fleet needs at least a name and a server (url: or sentinel:)")
            return None
        name = self.get(m, "name", path, str, "")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,32}", name):
            self.fail((*path, "name"), "a fleet name is 1 to 32 letters, digits, '.', '_' or '-'")
        host_id = self.get(m, "host_id", path, str, None)
        if host_id is None:
            host_id = socket.gethostname().split(".")[0].lower()
            if not FLEET_HOST_RE.fullmatch(host_id):
                self.fail((*path, "host_id"), f"the hostname {host_id!r} is not usable as a host id; set host_id")
        elif not FLEET_HOST_RE.fullmatch(host_id):
            self.fail((*path, "host_id"), "a host id is a lower-case letter or digit then up to 62 lower-case "
                      "letters, digits, '.', '_' or '-' (it names the host's keys and ACL user)")
        url = self.get(m, "url", path, str, None)
        hosts: list[tuple[str, int]] = []
        service = ""
        if url is not None and not re.fullmatch(r"rediss?://[^\s]+", url):
            self.fail((*path, "url"), "url must start with redis:// or rediss://")
        if url is not None and re.match(r"rediss?://[^/@]*:[^/@]*@", url):
            self.fail((*path, "url"), "no password in the url: the config is world-readable; use password_file")
        if "sentinel" in m:
            sp: Path_ = (*path, "sentinel")
            s = self.mapping(m["sentinel"], sp, {"hosts", "service"})
            service = self.get(s, "service", sp, str, "")
            if not service:
                self.fail(sp, "sentinel needs service: (the name the Sentinels monitor)")
            raw = s.get("hosts")
            if not isinstance(raw, list) or not raw:
                self.fail((*sp, "hosts"), "sentinel needs hosts: a list of HOST:PORT")
                raw = []
            for i, h in enumerate(raw):
                hm = re.fullmatch(r"\[?([A-Za-z0-9.:-]+?)\]?:(\d{1,5})", str(h))
                if hm is None or not 0 < int(hm.group(2)) < 65536:
                    self.fail((*sp, "hosts", i), f"expected HOST:PORT, got {h!r}")
                else:
                    hosts.append((hm.group(1), int(hm.group(2))))
        if (url is None) == ("sentinel" not in m):
            self.fail(path, "fleet needs exactly one of url: or sentinel:")
        tls: FleetTLS | None = None
        if "tls" in m:
            tp: Path_ = (*path, "tls")
            t = self.mapping(m["tls"], tp, {"ca", "cert", "key"})
            tls = FleetTLS(ca=self.plain_file(t, "ca", tp), cert=self.plain_file(t, "cert", tp),
                           key=self.secret_file(t, "key", tp))
            if (tls.cert is None) != (tls.key is None):
                self.fail(tp, "a client certificate needs both cert: and key:")
        share_path: Path_ = (*path, "share")
        share = self.mapping(m.get("share"), share_path, {"jails", "cli"})
        jails_raw = share.get("jails", "all")
        share_jails: tuple[str, ...] | None = None
        jail_names = {j.name for j in cfg.jails}
        if jails_raw == "all":
            share_jails = None
        elif jails_raw in ("none", False):
            share_jails = ()
        elif isinstance(jails_raw, list) and all(isinstance(j, str) for j in jails_raw):
            for j in jails_raw:
                if j not in jail_names:
                    self.fail((*share_path, "jails"), f"{j!r} is not a jail of this config")
            share_jails = tuple(jails_raw)
        else:
            self.fail((*share_path, "jails"), "jails is all, none or a list of jail names")
        blocklist = self.get(m, "blocklist", path, str, "default")
        owned = {f.blocklist for f in cfg.feeds}
        if blocklist not in {b.name for b in cfg.blocklists}:
            self.fail((*path, "blocklist"), f"unknown blocklist {blocklist!r}")
        elif blocklist in owned:
            self.fail((*path, "blocklist"), f"blocklist {blocklist!r} is filled by feeds; fleet bans need another")
        tp2: Path_ = (*path, "trust")
        trust = self.mapping(m.get("trust"), tp2, {"min_prefix_v4", "min_prefix_v6", "max_ban",
                                                   "allow_permanent", "rate", "burst"})
        max_ban = self.duration(trust, "max_ban", tp2, 7 * 86400.0)
        if max_ban < 1:
            self.fail((*tp2, "max_ban"), "max_ban must be at least 1s")
            max_ban = 7 * 86400.0
        history = self.duration(m, "history", path, 7 * 86400.0)
        if history < 60:
            self.fail((*path, "history"), "history must be at least 1m (how long a host may be away and replay)")
            history = 7 * 86400.0
        rate = self.get(trust, "rate", tp2, (int, float), 2000.0)
        if rate <= 0:
            self.fail((*tp2, "rate"), "rate must be positive (events per second per origin)")
            rate = 2000.0
        cp: Path_ = (*path, "count")
        count = self.mapping(m.get("count"), cp, {"rate", "burst"})
        count_rate = self.get(count, "rate", cp, (int, float), 100.0)
        if count_rate <= 0:
            self.fail((*cp, "rate"), "rate must be positive (failures per second one host may count)")
            count_rate = 100.0
        return FleetConfig(
            count_rate=float(count_rate),
            count_burst=self.positive_int(count, "burst", cp, 1000, 1, 10_000_000),
            name=name,
            host_id=host_id,
            url=url,
            sentinel_hosts=tuple(hosts),
            sentinel_service=service,
            username=self.get(m, "username", path, str, None),
            password_file=self.secret_file(m, "password_file", path),
            tls=tls,
            share_jails=share_jails,
            share_cli=self.get(share, "cli", share_path, bool, True),
            blocklist=blocklist,
            min_prefix_v4=self.positive_int(trust, "min_prefix_v4", tp2, 16, 1, 32),
            min_prefix_v6=self.positive_int(trust, "min_prefix_v6", tp2, 48, 1, 128),
            max_ban=max_ban,
            allow_permanent=self.get(trust, "allow_permanent", tp2, bool, False),
            rate=float(rate),
            burst=self.positive_int(trust, "burst", tp2, 20000, 1, 10_000_000),
            history=history,
            actions=self.names(m, "actions", path),
            line=self.doc.line(path),
        )
