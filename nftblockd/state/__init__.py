"""Durable state: the SQLite store (store.py) and the reader of fail2ban's database (f2bimport.py).
The only package that imports sqlite3."""
