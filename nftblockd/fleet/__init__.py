"""Fleet mode: hosts share their bans through Redis/Valkey Streams.

Layers, from pure to IO (each imports only the ones above it):
- `codec`   event <-> stream fields, with typed rejections (pure)
- `gate`    the trust gate a received event passes, like a local detection (pure; time is an argument)
- `catchup` replay-or-snapshot decision, snapshot reconcile, re-assert of own bans (pure)
- `client`  whether the installed redis-py serves fleet mode, and what to install if not (before `link`
            is imported: it reads the version from package metadata, then tries the import)
- `link`    the only module that uses `redis` (connect, publish, read, snapshot)
- `service` the publisher, the receive loop and catch-up, driving a `FleetSink` (the enforcer) and a
            `FleetState` (the state store) through small Protocols

Nothing in this package is imported when the config has no `fleet:` block, so a single host never needs the
`redis` package.
"""
