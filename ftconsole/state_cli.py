"""`ftconsole state`: the scheduler's store.

`state copy --to URL` moves the scheduler's state from its SQLite store to a PostgreSQL database (docs/operations.md,
"State on PostgreSQL"). The scheduler must be stopped: the copy holds the state_dir's lock, so no scheduler starts
on the old store while it runs. Every job, run, event, alert and node row is copied, ids and cluster id kept, in one
transaction; then `state: {url: ...}` in the config points the scheduler at it.

`state backup FILE` and `state restore FILE` (docs/operations.md, "Backup and restore"; scheduler.store.backup):
a backup runs beside `serve`, taking no lock; a restore takes the state_dir's lock, so it refuses while a
scheduler runs. A store on PostgreSQL is refused by both, naming the pg_dump or pg_restore command that does it.
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
from ftconsole.scheduler.spec.pgurl import redact
from ftconsole.scheduler.store.backup import (
    PostgresStore,
    Restored,
    StoreFacts,
    backup_store,
    pg_dump_command,
    pg_restore_command,
    restore_file,
)
from ftconsole.scheduler.store.files import STORE_FILE

# what the CLI's help and its warning say of a password in --to
IN_PS = (
    "a password in the URL is visible to every user of this host (ps, /proc) while the copy runs: leave it out "
    "and set PGPASSWORD, or put it in ~/.pgpass (or the file PGPASSFILE names), as for psql"
)


def cmd_state(args: argparse.Namespace) -> int:
    from ftconsole.scheduler.store.copy import copy_store  # the store's engines: only this command needs them here
    from ftconsole.scheduler.store.engine import is_postgres

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


def cmd_backup(args: argparse.Namespace) -> int:
    loaded = loaded_config(args)
    target = Path(args.file).expanduser()
    if loaded.cluster.state is not None:
        url = loaded.cluster.state.url
        raise PostgresStore(
            f"the store is on PostgreSQL ({redact(url)}): back it up with pg_dump, which takes a consistent copy "
            f"while the schedulers run: {pg_dump_command(url, str(target))} (the password from PGPASSWORD or "
            "~/.pgpass, as for psql); docs/operations.md, Backup and restore"
        )
    # no StateLock: the backup runs beside `serve`, SQLite's backup reads one commit of the store
    facts = asyncio.run(backup_store(loaded.state_dir / STORE_FILE, target, force=args.force))
    if args.json:
        print_json({**facts.to_json(), "source": str(loaded.state_dir / STORE_FILE)})
        return 0
    print(f"backed up {loaded.state_dir / STORE_FILE} to {facts.path}: {_facts(facts)}")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    loaded = loaded_config(args)
    backup = Path(args.file).expanduser()
    if loaded.cluster.state is not None:
        url = loaded.cluster.state.url
        raise PostgresStore(
            f"the store is on PostgreSQL ({redact(url)}): stop every scheduler on it, then restore a pg_dump with "
            f"pg_restore: {pg_restore_command(url, str(backup))}; docs/operations.md, Backup and restore"
        )
    with StateLock(loaded.state_dir):  # no scheduler on this state_dir meanwhile (AlreadyRunning names it)
        restored = restore_file(backup, loaded.state_dir, force=args.force)
    if args.json:
        print_json({**restored.backup.to_json(), "store": restored.store, "moved_aside": restored.moved,
                    "last_job_id": restored.last_job, "next_job_id": restored.next_job,
                    "job_ids_carried": restored.carried})  # fmt: skip
        return 0
    _print_restored(restored)
    return 0


def _facts(facts: StoreFacts) -> str:
    rows = ", ".join(f"{n} {table}" for table, n in facts.rows.items())
    return (f"{facts.bytes} bytes, schema version {facts.schema_version}, cluster id {facts.cluster_id}, {rows}; "
            "integrity ok")  # fmt: skip


def _print_restored(restored: Restored) -> None:
    print(f"restored {restored.backup.path} as {restored.store}: {_facts(restored.backup)}")
    if restored.moved:
        print(f"the old store is kept, moved aside: {', '.join(restored.moved)}")
        if any(path.endswith(("-wal", "-shm")) for path in restored.moved):
            print("(its -wal and -shm files went with it: none is left beside the restored store)")
    if restored.carried:
        print(f"job ids go on from {restored.next_job}, after the old store's last: no new job takes the id of a job "
              f"the backup does not know (its last is {restored.last_job})")  # fmt: skip
    else:
        print(f"the backup's last job id is {restored.last_job}: jobs above it that ran after the backup are not in "
              "it, and new jobs get their ids again")  # fmt: skip
    print(
        "next: start the scheduler (`ftconsole serve`, or its service). It reads back the runs the backup knows "
        "and stops on the nodes every run of this cluster it does not know (started after the backup); jobs "
        "submitted after the backup are not in it: submit them again"
    )


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    state = sub.add_parser("state", help="the scheduler's store: back it up, restore it, copy it to PostgreSQL")
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

    backup = state_sub.add_parser(
        "backup",
        parents=parents,
        help="back the SQLite store up to FILE, while the scheduler runs",
        description="Copies the scheduler's SQLite store (state_dir/state.db) to FILE with SQLite's online backup, "
        "as of one commit, while `ftconsole serve` runs and writes: nothing is stopped or locked. Copying the "
        "file itself (cp) is no backup while the scheduler runs: its last commits are in state.db-wal. The copy "
        "is written to FILE.tmp, private (0600), checked (SQLite's integrity check, its schema version), then "
        "renamed to FILE. A store on PostgreSQL is backed up with pg_dump (this command prints the line).",
    )
    backup.add_argument("file", metavar="FILE", help="the backup file to write (not in state_dir: keep it on another "
                        "disk)")  # fmt: skip
    backup.add_argument("--force", action="store_true", help="replace FILE (and a FILE.tmp left over) if it exists")
    backup.set_defaults(func=cmd_backup)

    restore = state_sub.add_parser(
        "restore",
        parents=parents,
        help="put a backup in place as the SQLite store (the scheduler stopped)",
        description="Checks FILE (SQLite's integrity check; an ftconsole store, of a schema version no newer than "
        "this ftconsole's), moves the store and its -wal and -shm files aside to "
        "state_dir/state.db.before-restore-TIME (kept, never deleted), and puts a copy of FILE (0600) in its place. "
        "The scheduler must be stopped: this holds the state_dir's lock and refuses while a scheduler holds it. "
        "On its next start the scheduler reads back the runs that FILE knows and stops every run of this "
        "cluster on the nodes that it does not know (started after the backup).",
    )
    restore.add_argument("file", metavar="FILE", help="the backup to restore (made by `ftconsole state backup`)")
    restore.add_argument(
        "--force", action="store_true", help="restore a store of another cluster id than the one in place"
    )
    restore.set_defaults(func=cmd_restore)
