"""The real-systemd tier's figures, per Debian release, at the end of the run: the time `apt-get install` of
the .deb took (postinst starts the unit and waits for READY), systemd's start-to-READY time, and the unit's
journal of that stock start; and the journey's (test_journey.py): install to first ban, the migrated
service's first start, the matcher engine under the unit. Printed in the terminal summary and saved as
systemd-tier.json in pytest's base temporary directory, so every `make test` leaves them for the release
notes and for the next session."""

from __future__ import annotations

import json

import pytest

from tests.helpers.container import RECORDS_KEY


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    recorded = config.stash.get(RECORDS_KEY, {})
    if not recorded:
        return
    path = config._tmp_path_factory.getbasetemp() / "systemd-tier.json"  # type: ignore[attr-defined]
    path.write_text(json.dumps(recorded, indent=2) + "\n")
    terminalreporter.section("real systemd: install and first start per release")
    for suite, r in recorded.items():
        if "release" not in r:  # the journey's (test_journey.py): its figures, then its journals
            terminalreporter.write_line(f"{suite}: " + ", ".join(
                f"{k} {v}" for k, v in r.items() if not isinstance(v, list)))
            for k, v in r.items():
                if isinstance(v, list):
                    terminalreporter.write_line(f"  {k}:")
                    for line in v:
                        terminalreporter.write_line(f"    {line}")
            continue
        terminalreporter.write_line(f"{suite} ({r['release']}, {r['python']}): apt-get install "
                                    f"{r['apt_install_seconds']} s, start to READY {r['start_to_ready_seconds']} s")
        for line in r["stock_start_journal"]:  # type: ignore[attr-defined]
            terminalreporter.write_line(f"    {line}")
    terminalreporter.write_line(f"(saved in {path})")
