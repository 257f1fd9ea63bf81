"""The config's public face: `from nftblockd.config import X` for every name in __all__ (load.py's).

load.py loads the file and reads the core sections; model.py holds the values, reader.py the typed getters,
the other modules their sections, yamlsrc.py the YAML reader that keeps line numbers.

The face is lazy: a name is imported from load.py when it is first asked for, so a module that needs only the
values (model.py) or the YAML reader (yamlsrc.py, which detect/filterload.py reads filter files with) does not
import the loader (~20 ms, `python -X importtime`). mypy reads the imports below as plain re-exports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nftblockd.config.load import ACTION_EVENTS as ACTION_EVENTS
    from nftblockd.config.load import ACTION_TYPES as ACTION_TYPES
    from nftblockd.config.load import ActionConfig as ActionConfig
    from nftblockd.config.load import BatchConfig as BatchConfig
    from nftblockd.config.load import BlocklistConfig as BlocklistConfig
    from nftblockd.config.load import ChainConfig as ChainConfig
    from nftblockd.config.load import Config as Config
    from nftblockd.config.load import ConfigError as ConfigError
    from nftblockd.config.load import ControlConfig as ControlConfig
    from nftblockd.config.load import Escalation as Escalation
    from nftblockd.config.load import FeedConfig as FeedConfig
    from nftblockd.config.load import FleetConfig as FleetConfig
    from nftblockd.config.load import FleetTLS as FleetTLS
    from nftblockd.config.load import JailConfig as JailConfig
    from nftblockd.config.load import Problem as Problem
    from nftblockd.config.load import SubnetEscalation as SubnetEscalation
    from nftblockd.config.load import examine_config as examine_config
    from nftblockd.config.load import examine_text as examine_text
    from nftblockd.config.load import in_file_order as in_file_order
    from nftblockd.config.load import load_config as load_config
    from nftblockd.config.load import parse_config as parse_config

__all__ = [
    "ACTION_EVENTS", "ACTION_TYPES", "ActionConfig", "BatchConfig", "BlocklistConfig", "ChainConfig", "Config",
    "ConfigError", "ControlConfig", "Escalation", "FeedConfig", "FleetConfig", "FleetTLS", "JailConfig", "Problem",
    "SubnetEscalation", "examine_config", "examine_text", "in_file_order", "load_config", "parse_config",
]

if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        if name not in __all__:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module("nftblockd.config.load"), name)
        globals()[name] = value  # once: the next lookup is a plain attribute
        return value
