"""Real log lines to run matchers on: fail2ban's own sample logs (when the fail2ban package is installed)
and ours in tests/data/logs, comment lines left out. The matcher's fast lane and the native core are both
checked against the general path on these."""

from __future__ import annotations

from pathlib import Path

F2B_LOGS = Path("/usr/lib/python3/dist-packages/fail2ban/tests/files/logs")
DATA = Path(__file__).resolve().parents[1] / "data" / "logs"


def sample_lines() -> list[str]:
    lines: list[str] = []
    for d in (F2B_LOGS, DATA):
        if d.is_dir():
            for p in sorted(d.iterdir()):
                if p.is_file():
                    text = p.read_text(errors="surrogateescape")
                    lines += [x for x in text.splitlines() if not x.startswith("#")]
    return lines
