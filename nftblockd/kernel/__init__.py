"""Enforcement: from ban decisions to elements in nftables sets.

ruleset.py (the objects we own, from the config), bans.py (the ban-state rules, pure), batcher.py (coalesce
and flush), enforcer.py (decisions -> set operations, reconcile), sink.py (the one path jail bans take),
writer.py (table, apply, verify: the SetWriter the enforcer is given), nfmsg.py (the netlink wire format,
pure) and netlink.py (the socket). Only writer.py and netlink.py talk to nf_tables; ownaddr.py (the machine's
addresses) and links.py (its network devices, for ingress chains) only read rtnetlink, framed by rtnl.py."""
