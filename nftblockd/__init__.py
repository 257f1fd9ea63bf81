"""nftblockd: a dynamic blocklist daemon for nftables."""

__version__ = "0.1.0"
