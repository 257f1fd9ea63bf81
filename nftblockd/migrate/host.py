"""The reader edge of the fail2ban migration: fail2ban's files and systemd's unit aliases on this machine.

Reads files under the fail2ban directory it is given (and systemd's unit directories for aliases); never
writes, never runs anything. Everything it answers is what f2bjail.Host asks.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from nftblockd.actions.f2baction import check_action
from nftblockd.detect.f2b import F2bConfig, read_config, read_filter

__all__ = ["FsHost", "read_jails"]

_UNIT_DIRS = ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
_JOURNALMATCH = "journalmatch: "  # how read_filter reports a filter's journalmatch (Filter.notes)


def read_jails(confdir: str | Path) -> F2bConfig:
    """jail.conf, jail.d/*.conf, jail.local, jail.d/*.local and what they include, merged as fail2ban does."""
    return read_config(Path(confdir).absolute() / "jail.conf")


class FsHost:
    def __init__(self, confdir: str | Path, unit_dirs: tuple[str, ...] = _UNIT_DIRS) -> None:
        self.confdir = Path(confdir).absolute()  # the paths it answers end up in the config
        self.unit_dirs = unit_dirs

    def _find(self, sub: str, name: str) -> str | None:
        for suffix in (".conf", ".local"):
            p = self.confdir / sub / f"{name}{suffix}"
            if p.is_file():
                return str(p)
        return None

    def filter_file(self, name: str) -> str | None:
        return self._find("filter.d", name)

    def journalmatch(self, filter_path: str, options: Mapping[str, str]) -> str | None:
        for note in read_filter(filter_path, options).notes:
            if note.startswith(_JOURNALMATCH):
                return note[len(_JOURNALMATCH):]
        return None

    def action_file(self, name: str) -> str | None:
        return self._find("action.d", name)

    def ban_action(self, path: str, options: Mapping[str, str]) -> str | None:
        # Read without the jail's options: what makes a ban action is its script's command, and a ban
        # action's options (`chain="<known/chain>"`) need fail2ban's own reading of [Init] to resolve
        for why in check_action(path, {}, ("ban",)):
            if "is a ban action" in why:
                return why.split("(", 1)[1].split(")", 1)[0] if "(" in why else why
        return None

    def action_problems(self, path: str, options: Mapping[str, str]) -> list[str]:
        return check_action(path, options, ("ban",))

    def real_unit(self, unit: str) -> str:
        for d in self.unit_dirs:
            p = Path(d) / unit
            if p.is_symlink():
                target = p.resolve().name
                if target.endswith(".service") and target != unit:
                    return target
        return unit
