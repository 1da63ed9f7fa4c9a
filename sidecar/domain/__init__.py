"""Tasks, attempts, leases, checkpoints and effects: the pure rules, with no I/O.

Stores load state, call these functions, and persist what they return; the rules
therefore hold identically for the in-memory, SQLite and PostgreSQL stores.
"""
