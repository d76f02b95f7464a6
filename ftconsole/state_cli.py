"""`ftconsole state copy --to URL`: move the scheduler's state from its SQLite store to a PostgreSQL database
(docs/operations.md, "State on PostgreSQL"). The scheduler must be stopped: the copy holds the state_dir's lock,
so no scheduler starts on the old store while it runs. Every job, run, event, alert and node row is copied, ids
and cluster id kept, in one transaction; then `state: {url: ...}` in the config points the scheduler at it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from ftconsole.format import print_json, print_table
from ftconsole.jobs_cli import loaded_config
from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.serve.lock import StateLock
from ftconsole.scheduler.store.copy import copy_store
from ftconsole.scheduler.store.engine import is_postgres
from ftconsole.scheduler.store.files import STORE_FILE

# what the CLI's help and its warning say of a password in --to
IN_PS = (
    "a password in the URL is visible to every user of this host (ps, /proc) while the copy runs: leave it out "
    "and set PGPASSWORD, or put it in ~/.pgpass (or the file PGPASSFILE names), as for psql"
)


def cmd_state(args: argparse.Namespace) -> int:
    from ftconsole.scheduler.store.postgres import redact  # asyncpg: only where it is used

    if not is_postgres(args.to):
        raise UsageError(f"--to {redact(args.to)!r}: a postgresql:// URL (postgresql://USER@HOST:PORT/DATABASE)")
    if redact(args.to) != args.to:
        print(f"warning: --to {redact(args.to)}: {IN_PS}", file=sys.stderr)
    loaded = loaded_config(args)
    source = Path(args.source).expanduser() if args.source else loaded.state_dir / STORE_FILE
    with StateLock(loaded.state_dir):  # no scheduler on this state_dir meanwhile (AlreadyRunning names it)
        copied = asyncio.run(copy_store(source, args.to))
    if args.json:
        print_json({"source": copied.source, "target": copied.target, "cluster_id": copied.cluster_id,
                    "rows": copied.rows})  # fmt: skip
        return 0
    print(f"copied {copied.source} to {copied.target} (cluster id {copied.cluster_id}):")
    print_table(["TABLE", "ROWS"], [[table, n] for table, n in copied.rows.items()])
    print(f"next: set `state: {{url: {copied.target}}}` in the config, then start the scheduler")
    return 0


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    state = sub.add_parser("state", help="the scheduler's store: copy it to PostgreSQL")
    state_sub = state.add_subparsers(dest="state_command", required=True, metavar="COMMAND")
    copy = state_sub.add_parser(
        "copy",
        parents=parents,
        help="copy the SQLite store into an empty PostgreSQL database (the scheduler stopped)",
        description="Copies every row of the scheduler's SQLite store (state_dir/state.db, or --from FILE) into "
        "an empty PostgreSQL database, ids and cluster id kept, in one transaction. The scheduler must be "
        "stopped; runs on the nodes go on and are re-adopted by the scheduler started on the new store. The "
        "password is read as libpq and psql read it: PGPASSWORD, else ~/.pgpass (PGPASSFILE); a password written "
        "in the URL is visible to other users in ps.",
    )
    copy.add_argument(
        "--to",
        required=True,
        metavar="URL",
        help=f"the target database: postgresql://USER@HOST/DB, its password from PGPASSWORD or ~/.pgpass; {IN_PS}",
    )
    copy.add_argument("--from", dest="source", metavar="FILE", help="the SQLite store (default: state_dir/state.db)")
    copy.set_defaults(func=cmd_state)
