"""What one action run is, made from ban events and the action's config: pure values, no IO, no clock.

- `command`: an argv whose every element is one template rendered alone (argtemplate.py): the program is
  exec'd directly, no shell reads anything, and a value stays inside the one argument it was put in. The
  environment is built from nothing (the daemon's own is not passed on): a fixed PATH, the templates of
  `env:`, and every field as NFTBLOCK_<FIELD>.
- `webhook`: a JSON body: one event as an object, or with `batch` > 1 `{"events": [...], "skipped": n}`.
- `fail2ban`: `/bin/sh -c SCRIPT` where SCRIPT is the action file's command with its event tags filled by
  f2baction.render_shell: text from log lines reaches the shell only as environment variables. Its
  `actionstart`/`actionstop` (render_f2b_life) are filled the same way, with the tags fail2ban has then: the
  jail's `<name>`, `<actname>`, the host names, `<time>`; no event tag (`<ip>`, `<matches>`...: empty).

Every run carries `skipped`: how many events of this action were dropped (rate limit, full queue) since the
previous run, so a flood leaves a count instead of a silence.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from nftblockd.actions.f2baction import F2bAction, ShellTemplate, render_shell
from nftblockd.argtemplate import PLACEHOLDERS, parse_template
from nftblockd.config import ActionConfig

__all__ = ["ActionEvent", "CommandRun", "Run", "WebhookPost", "f2b_name", "field_values", "render",
           "render_command", "render_f2b", "render_f2b_life", "render_webhook"]

MAX_MATCHES = 20  # lines of log text an event carries (the last ones), like fail2ban's own default per ticket
MAX_MATCH_CHARS = 1000  # per line
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True, slots=True)
class ActionEvent:
    """A ban or unban as actions see it. `address` is nftblockd's canonical form (addr.format_target)."""

    event: Literal["ban", "unban"]
    address: str
    jail: str = ""
    blocklist: str = ""
    origin: str = ""
    reason: str = ""
    duration: float | None = None  # seconds; None: permanent (or unknown for an unban)
    until: float | None = None
    time: float = 0.0
    failures: int = 0
    matches: tuple[str, ...] = ()
    fields: tuple[tuple[str, str], ...] = ()  # the last match's <F-...> captures
    host: str = ""  # this host (the fleet host id, else the hostname)

    @property
    def family(self) -> str:
        return "inet6" if ":" in self.address else "inet4"


class CommandRun(NamedTuple):
    argv: tuple[str, ...]
    env: dict[str, str]
    timeout: float


class WebhookPost(NamedTuple):
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    timeout: float


Run = CommandRun | WebhookPost


def _clean(text: str) -> str:
    """An environment value cannot hold NUL; nothing else is changed."""
    return text.replace("\0", "\ufffd")


def _matches(ev: ActionEvent) -> list[str]:
    return [m[:MAX_MATCH_CHARS] for m in ev.matches[-MAX_MATCHES:]]


def _number(x: float | None) -> str:
    return "" if x is None else str(int(x)) if x == int(x) else f"{x:.3f}"


def field_values(ev: ActionEvent, skipped: int) -> dict[str, str]:
    """The text of every placeholder (argtemplate.PLACEHOLDERS) for one event."""
    out = {
        "event": ev.event, "address": ev.address, "family": ev.family, "jail": ev.jail, "blocklist": ev.blocklist,
        "origin": ev.origin, "reason": ev.reason,
        "duration": "permanent" if ev.duration is None and ev.event == "ban" else _number(ev.duration),
        "until": _number(ev.until), "time": _number(ev.time), "failures": str(ev.failures),
        "matches": "\n".join(_matches(ev)), "skipped": str(skipped), "host": ev.host,
    }
    assert set(out) == PLACEHOLDERS
    return out


def render_command(cfg: ActionConfig, ev: ActionEvent, skipped: int) -> CommandRun:
    values = field_values(ev, skipped)
    argv = tuple(_clean(parse_template(t).render(values)) for t in cfg.argv)
    env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8"}
    env.update({"NFTBLOCK_" + k.upper(): _clean(v) for k, v in values.items()})
    env.update({k: _clean(parse_template(t).render(values)) for k, t in cfg.env})
    return CommandRun(argv, env, cfg.timeout)


def event_json(ev: ActionEvent) -> dict[str, object]:
    return {"event": ev.event, "address": ev.address, "family": ev.family, "jail": ev.jail,
            "blocklist": ev.blocklist, "origin": ev.origin, "reason": ev.reason, "duration": ev.duration,
            "until": ev.until, "time": ev.time, "failures": ev.failures, "matches": _matches(ev),
            "fields": dict(ev.fields), "host": ev.host}


def render_webhook(cfg: ActionConfig, events: Sequence[ActionEvent], skipped: int) -> WebhookPost:
    if cfg.batch <= 1 and len(events) == 1:
        body: dict[str, object] = {**event_json(events[0]), "skipped": skipped}
    else:
        body = {"events": [event_json(e) for e in events], "skipped": skipped}
    headers = (("Content-Type", "application/json"), *cfg.headers)
    return WebhookPost(cfg.url, headers, json.dumps(body, ensure_ascii=False).encode(), cfg.timeout)


def f2b_values(action: F2bAction, cfg: ActionConfig, ev: ActionEvent, skipped: int) -> dict[str, str]:
    """fail2ban's event tags for one event (its names; `<skipped>` is nftblockd's own)."""
    matches = "\n".join(_matches(ev))
    bantime = "-1" if ev.duration is None else _number(ev.duration)
    ip = ev.address[:-3] if ev.address.endswith("/32") else ev.address  # a host, as fail2ban writes it
    values = {
        "ip": ip, "fid": ip, "family": ev.family, "name": ev.jail or ev.origin, "failures": str(ev.failures),
        "ipfailures": str(ev.failures), "ipjailfailures": str(ev.failures), "time": _number(ev.time),
        "bantime": bantime, "bancount": "1", "restored": "0", "matches": matches, "ipmatches": matches,
        "ipjailmatches": matches, "fq-hostname": ev.host, "sh-hostname": ev.host.split(".")[0],
        "actname": cfg.name, "skipped": str(skipped), "agent": "nftblockd",  # fail2ban's HTTP user agent tag
    }
    values.update({k if k.startswith("F-") else "F-" + k.upper(): v for k, v in ev.fields})
    values.update(action.fixed)  # `options: {name: SSH}` wins, as `action = X[name=SSH]` does in fail2ban
    return values


def render_f2b(action: F2bAction, cfg: ActionConfig, ev: ActionEvent, skipped: int) -> CommandRun | None:
    """The action file's actionban/actionunban for `ev` as a shell run; None when the file has none."""
    t = action.command("action" + ev.event)
    if t is None:
        return None
    return _shell_run(t, f2b_values(action, cfg, ev, skipped), cfg)


def _shell_run(t: ShellTemplate, values: Mapping[str, str], cfg: ActionConfig) -> CommandRun:
    script, tag_env = render_shell(t, values)
    env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8"}
    env.update({k: _clean(v) for k, v in tag_env.items()})
    return CommandRun(("/bin/sh", "-c", script), env, cfg.timeout)


def f2b_name(action: F2bAction, jail: str) -> str:
    """fail2ban's `<name>` of an action's runs for `jail` (a jail; `fleet`; `feed` for feed entries): the
    jail, unless the options fix `name` (`action = X[name=SSH]`)."""
    return dict(action.fixed).get("name") or jail


def render_f2b_life(action: F2bAction, cfg: ActionConfig, which: Literal["start", "stop"], name: str, host: str,
                    now: float) -> CommandRun | None:
    """The action file's actionstart/actionstop for the jail `name` (None when the file has none). fail2ban
    fills them with the jail's tags and an "empty ticket" (action.py `_executeOperation`): no address, no
    failures, no log text; a tag it would not have is empty here."""
    t = action.command("action" + which)
    if t is None:
        return None
    values = {"name": name, "actname": cfg.name, "fq-hostname": host, "sh-hostname": host.split(".")[0],
              "time": _number(now), "agent": "nftblockd", "skipped": "0"}
    values.update((k, v) for k, v in action.fixed if k != "name")  # `name` is already f2b_name's
    return _shell_run(t, values, cfg)


def render(cfg: ActionConfig, events: Sequence[ActionEvent], skipped: int,
           f2b: Mapping[str, F2bAction]) -> list[Run]:
    """The runs for a batch of events (a webhook takes them in one request, the others one run each)."""
    if cfg.type == "webhook":
        return [render_webhook(cfg, events, skipped)] if events else []
    out: list[Run] = []
    for i, ev in enumerate(events):
        n = skipped if i == 0 else 0
        if cfg.type == "command":
            out.append(render_command(cfg, ev, n))
        elif (action := f2b.get(cfg.name)) is not None and (run := render_f2b(action, cfg, ev, n)) is not None:
            out.append(run)
    return out
