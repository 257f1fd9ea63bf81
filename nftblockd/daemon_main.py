"""`nftblockd`: run the daemon in the foreground, or validate a config (`--check-config`)."""

from __future__ import annotations

import argparse
import sys

from nftblockd.config import ConfigError, load_config
from nftblockd.daemon import Overrides, apply_overrides, build_filters, run
from nftblockd.service.logsetup import setup_logging


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nftblockd", description="Dynamic blocklist daemon for nftables.")
    p.add_argument("--config", "-c", default="/etc/nftblockd/nftblockd.yaml", help="YAML config file")
    p.add_argument("--check-config", metavar="FILE", help="validate FILE and exit (0 valid, 1 invalid)")
    p.add_argument("--socket", help="control socket path (overrides control.socket)")
    p.add_argument("--state-dir", help="state directory (overrides state_dir)")
    p.add_argument("--metrics", metavar="ADDR:PORT", help="Prometheus listen address (overrides metrics.listen)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    a = p.parse_args(argv)
    if a.check_config:
        try:
            build_filters(load_config(a.check_config))
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return 1
        print(f"{a.check_config}: valid")
        return 0
    try:
        cfg = load_config(a.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    cfg = apply_overrides(cfg, Overrides(a.socket, a.state_dir, a.metrics))
    setup_logging(a.log_level or cfg.log_level)
    try:
        return run(cfg, a.config, Overrides(a.socket, a.state_dir, a.metrics))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the one place that turns a fatal error into an exit code and a sentence
        import logging
        logging.getLogger("nftblockd").critical("nftblockd cannot run: %s", exc, exc_info=True)
        print(f"nftblockd: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
