"""Durable state. The only package that imports sqlite3.

store.py is the daemon's database (bans, history, positions, feed metadata); schema.py its tables and
migrations; salvage.py what happens to a damaged or unusable file; db.py the connection layer they share;
foreign.py and f2bimport.py read fail2ban's database, read-only.
"""
