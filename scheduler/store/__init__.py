"""The state store: the truth after a crash, in SQLite (aiosqlite, WAL; the default) or on PostgreSQL (asyncpg).

`db` opens it, runs the migrations (`schema`) and answers the queries; `engine` is the seam in front of the
database (one connection: statements, transactions, the schema version, other processes' writes), with SQLite
there and PostgreSQL in `postgres` (its DDL, numbered placeholders, the write lock); `jobtx` is one jobs
transaction's writes; `records` are the rows it hands out and takes in; `files` keeps the state directory and
the store private and says where the store is.

May import `scheduler.errors`, `scheduler.spec`, `scheduler.decide` and `probes`; never the SSH layer, the
socket or the loop.
"""
