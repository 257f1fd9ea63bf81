"""The daemon, `nftblockd`: main.py is its entry point (run, --check-config), root.py the composition root
(Daemon, run), the other modules its parts. Nothing is imported here, so importing a part does not import the
rest: import from the module that defines a name."""
