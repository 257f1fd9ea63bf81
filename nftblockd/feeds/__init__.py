"""Threat feeds: fetch a body over HTTP(S) or from a file (fetch.py), parse it (parse.py), sanitise and
aggregate the prefixes (aggregate.py), and keep each feed's blocklist in step (manager.py).

parse.py and aggregate.py are pure; fetch.py is the only network code; manager.py drives the enforcer."""
