"""`nftblockd`: run the daemon in the foreground, or validate a config (`--check-config`)."""

from __future__ import annotations

import argparse
import sys

from nftblockd import __version__
from nftblockd.config import Config, ConfigError, Problem, examine_config, in_file_order, load_config
from nftblockd.daemon.build import (
    Overrides,
    apply_overrides,
    compile_actions,
    compile_filters,
    device_names,
    ingress_warnings,
    log_file_warnings,
    regex_warnings,
)
from nftblockd.daemon.root import run
from nftblockd.detect import native
from nftblockd.service.logsetup import setup_logging


def fleet_client_problem(cfg: Config, path: str) -> Problem | None:
    """With a `fleet:` block, a Redis client that cannot serve it (missing, too old) is a config error: the
    sentence says what to install, at `--check-config` and at start, before `redis` is ever imported."""
    if cfg.fleet is None:
        return None
    from nftblockd.fleet import client  # only with a fleet: block, like the rest of the package

    msg = client.check()
    return None if msg is None else Problem(path, cfg.fleet.line, "fleet", msg)


def check_config(path: str) -> int:
    """Every problem in one run, in file order: the file's own (types, unknown and duplicate keys), the
    filters that do not compile, and as warnings the log files and the ingress devices that do not exist.
    0 valid, 1 invalid."""
    cfg, problems = examine_config(path)
    if cfg is not None:
        problems = problems + compile_filters(cfg)[1] + compile_actions(cfg)[1] + log_file_warnings(cfg)
        problems += regex_warnings(cfg, compile_filters(cfg)[0])
        fleet = fleet_client_problem(cfg, path)
        if fleet is not None:
            problems.append(fleet)
        if cfg.chain.ingress:
            problems += ingress_warnings(cfg, device_names())
    problems = in_file_order(problems)
    for p in problems:
        print(p, file=sys.stderr)
    errors = sum(not p.warning for p in problems)
    if errors:
        return 1
    warnings = len(problems)
    print(f"{path}: valid" + (f" ({warnings} warning{'s' if warnings > 1 else ''})" if warnings else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line; also what packaging/manpages.py renders as nftblockd(8)."""
    p = argparse.ArgumentParser(prog="nftblockd", description="Dynamic blocklist daemon for nftables.")
    p.add_argument("--config", "-c", default="/etc/nftblockd/nftblockd.yaml", help="YAML config file")
    p.add_argument("--check-config", metavar="FILE", help="validate FILE and exit (0 valid, 1 invalid)")
    p.add_argument("--socket", help="control socket path (overrides control.socket)")
    p.add_argument("--state-dir", help="state directory (overrides state_dir)")
    p.add_argument("--metrics", metavar="ADDR:PORT", help="Prometheus listen address (overrides metrics.listen)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    p.add_argument("--version", action="store_true",
                   help="print the version and the engine the log matcher runs on (and why, if not the native "
                        "one), and exit")
    return p


def version() -> str:
    return f"nftblockd {__version__}\nmatcher: {native.describe()}"


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.version:
        print(version())
        return 0
    if a.check_config:
        return check_config(a.check_config)
    try:
        cfg = load_config(a.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    cfg = apply_overrides(cfg, Overrides(a.socket, a.state_dir, a.metrics))
    fleet = fleet_client_problem(cfg, a.config)
    if fleet is not None:  # one line in the journal (stderr), no traceback: what to install is all it needs
        print(f"nftblockd: {fleet}", file=sys.stderr)
        return 1
    setup_logging(a.log_level or cfg.log_level)
    try:
        return run(cfg, a.config, Overrides(a.socket, a.state_dir, a.metrics))
    except KeyboardInterrupt:
        return 130
    except ConfigError as exc:  # found while building (a filter that does not compile): the operator's, no traceback
        import logging
        logging.getLogger("nftblockd").critical("nftblockd cannot run: %s", exc)
        print(f"nftblockd: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the one place that turns a fatal error into an exit code and a sentence
        import logging
        logging.getLogger("nftblockd").critical("nftblockd cannot run: %s", exc, exc_info=True)
        print(f"nftblockd: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
