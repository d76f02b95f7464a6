"""The state store: SQLite (aiosqlite, WAL), the truth after a crash.

`db` opens it, runs the migrations (`schema`) and answers the queries; `jobtx` is one jobs transaction's
writes; `records` are the rows it hands out and takes in; `files` keeps the state directory and the store
private.

May import `scheduler.errors`, `scheduler.spec`, `scheduler.decide` and `probes`; never the SSH layer, the
socket or the loop.
"""
