"""The control socket: the wire codec (protocol.py, pure), the root-only UNIX server (server.py), the client
the CLI uses (client.py) and the command handlers (api.py). Nothing here decides a ban: api.py hands requests
to the enforcer and reports what it answered."""
