"""The state store's schema: the SQL scripts that build it, one per version (SQLite's `PRAGMA user_version`).

Migrations are append-only: a script once released is never edited; a change is a new script at the end, and
`SCHEMA_VERSION` is their count. `Store.open` runs, in order, each script the store has not had, each in its own
transaction, and refuses a store whose version is newer than this program's rather than guess at it.

On PostgreSQL the same scripts run turned into its DDL by `scheduler.store.postgres.postgres_script` (types,
row ids, quoted names): a new script sticks to SQL both understand, or gives its SQLite-only text a PostgreSQL
spelling there (`_FUNCTIONS`); the store's tests run every script on both.
"""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: nodes, probe results, events
    """
    CREATE TABLE nodes (
        name        TEXT PRIMARY KEY,
        health      TEXT NOT NULL,
        reasons     TEXT NOT NULL,          -- JSON list
        since       REAL,
        admin       TEXT,                   -- drained | isolated | NULL
        admin_reason TEXT NOT NULL DEFAULT '',
        admin_since REAL,
        admin_by    TEXT NOT NULL DEFAULT '',
        pending     TEXT,
        good_streak INTEGER NOT NULL DEFAULT 0,
        boot_id     TEXT,
        last_probe  REAL
    );
    CREATE TABLE probe_results (
        id          INTEGER PRIMARY KEY,
        node        TEXT NOT NULL,
        time        REAL NOT NULL,
        error       TEXT,                   -- why there is no report
        report      TEXT                    -- JSON (ProbeReport.to_json)
    );
    CREATE INDEX probe_results_node_time ON probe_results (node, time);
    CREATE TABLE events (
        id          INTEGER PRIMARY KEY,
        time        REAL NOT NULL,
        kind        TEXT NOT NULL,
        node        TEXT,
        job         TEXT,
        message     TEXT NOT NULL,
        data        TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX events_node ON events (node, id);
    CREATE INDEX events_job ON events (job, id);
    """,
    # 2: jobs, their attempts, the runs (one per rank: node, GPUs, run folder, state), alerts
    """
    CREATE TABLE jobs (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,   -- never reused, even after delete
        name        TEXT NOT NULL,
        owner       TEXT NOT NULL,
        uid         INTEGER NOT NULL,
        spec        TEXT NOT NULL,          -- JSON (JobSpec.to_json)
        status      TEXT NOT NULL,          -- queued | running | error | stopped | expired | succeeded
        priority    TEXT NOT NULL,          -- normal | urgent | very-urgent (changeable while queued)
        project     TEXT NOT NULL,
        access      TEXT NOT NULL,
        submitted   REAL NOT NULL,
        started     REAL,
        ended       REAL,
        attempt     INTEGER NOT NULL DEFAULT 0,
        requeued    INTEGER NOT NULL DEFAULT 0,
        extra_runtime REAL NOT NULL DEFAULT 0,
        stop_requested REAL,
        stop_reason TEXT,                   -- stopped | expired | error
        stop_by     TEXT,
        message     TEXT NOT NULL DEFAULT '',
        exit_code   INTEGER,
        deleted     INTEGER NOT NULL DEFAULT 0,
        cloned_from INTEGER
    );
    CREATE INDEX jobs_status ON jobs (status);
    CREATE TABLE attempts (
        job         INTEGER NOT NULL REFERENCES jobs (id),
        number      INTEGER NOT NULL,
        spec_name   TEXT,
        gpus_per_node INTEGER NOT NULL,
        master_port INTEGER NOT NULL,
        created     REAL NOT NULL,
        started     REAL,
        ended       REAL,
        result      TEXT,
        message     TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (job, number)
    );
    CREATE TABLE runs (
        job         INTEGER NOT NULL,
        attempt     INTEGER NOT NULL,
        rank        INTEGER NOT NULL,
        node        TEXT NOT NULL,
        gpus        TEXT NOT NULL,          -- JSON list of GPU indexes held
        run_dir     TEXT NOT NULL,
        launch      INTEGER NOT NULL,
        state       TEXT NOT NULL,          -- intent | prepared | starting | running | exited | failed | lost | absent
        pid         INTEGER,
        exit_code   INTEGER,
        signal      TEXT,
        started     REAL,
        ended       REAL,
        error       TEXT,
        stop_sent   REAL,
        released    INTEGER NOT NULL DEFAULT 0,   -- 1: its GPUs are free again
        PRIMARY KEY (job, attempt, rank),
        FOREIGN KEY (job, attempt) REFERENCES attempts (job, number)
    );
    CREATE INDEX runs_held ON runs (released, node);
    CREATE TABLE alerts (
        id          INTEGER PRIMARY KEY,
        time        REAL NOT NULL,
        kind        TEXT NOT NULL,
        severity    TEXT NOT NULL,
        job         INTEGER,
        node        TEXT,
        message     TEXT NOT NULL,
        state       TEXT NOT NULL DEFAULT 'open',   -- open | acknowledged | resolved
        acked_by    TEXT,
        acked_at    REAL,
        resolved_at REAL,
        data        TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX alerts_state ON alerts (state, id);
    """,
    # 3: who resolved an alert; a run's output heartbeat; a job's last change (the incremental job feed);
    #    how often each node failed (kept with its events, counted from the history so far)
    """
    ALTER TABLE alerts ADD COLUMN resolved_by TEXT;
    CREATE INDEX alerts_job ON alerts (job, state);
    CREATE INDEX alerts_node ON alerts (node, state);
    ALTER TABLE runs ADD COLUMN output_at REAL;             -- mtime of output.log when last read
    ALTER TABLE jobs ADD COLUMN updated REAL NOT NULL DEFAULT 0;
    UPDATE jobs SET updated = MAX(submitted, COALESCE(started, 0), COALESCE(ended, 0), COALESCE(stop_requested, 0));
    CREATE INDEX jobs_updated ON jobs (updated);
    ALTER TABLE nodes ADD COLUMN faults INTEGER NOT NULL DEFAULT 0;
    UPDATE nodes SET faults = (
        SELECT COUNT(*) FROM events e WHERE e.node = nodes.name AND (e.kind = 'isolated'
            OR (e.kind = 'state-changed' AND json_extract(e.data, '$.to') IN ('unhealthy', 'unreachable')))
    );
    """,
    # 4: an elastic job's size once scaled (NULL: the spec's `nodes`)
    """
    ALTER TABLE jobs ADD COLUMN scaled_to INTEGER;
    """,
    # 5: run identity: the store's cluster id (run folders are <run_root>/<cluster id>/...), each attempt's
    #    token (the claim of its run folders), and what proves a run alive (boot id, pid start times); when the
    #    scheduler escalated a stop to SIGKILL
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    INSERT INTO meta (key, value) VALUES ('cluster_id', lower(hex(randomblob(6))));
    ALTER TABLE attempts ADD COLUMN token TEXT;             -- NULL: an attempt started before schema 5
    ALTER TABLE runs ADD COLUMN boot_id TEXT;
    ALTER TABLE runs ADD COLUMN supervisor_pid INTEGER;
    ALTER TABLE runs ADD COLUMN supervisor_start INTEGER;   -- clock ticks since boot (/proc/<pid>/stat 22)
    ALTER TABLE runs ADD COLUMN pid_start INTEGER;
    ALTER TABLE runs ADD COLUMN kill_sent REAL;
    """,
    # 6: isolation (issue 12): an isolated node's passing probes in a row, whether only an operator may resume it
    #    (it was flaky while isolated); the node faults of a recent window, by time
    """
    ALTER TABLE nodes ADD COLUMN isolated_passes INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE nodes ADD COLUMN needs_operator INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX events_faults ON events (time) WHERE kind IN ('isolated', 'state-changed');
    """,
    # 7: detection (issue 13): when a failed job's hold on its GPUs was given up early (the kept debugging
    #    environment); the nodes a job is not placed on again (a slow job rescheduled without its slow node)
    """
    ALTER TABLE jobs ADD COLUMN debug_released REAL;
    ALTER TABLE jobs ADD COLUMN excluded TEXT NOT NULL DEFAULT '[]';  -- JSON list of node names
    CREATE INDEX jobs_status_ended ON jobs (status, ended);
    """,
    # 8: notifications across restarts (issue 26): per notify target, the id of the last alert up to which every
    #    alert is done for it (delivered, given up with a notify-failed event, or not for it: a job that did not
    #    opt in); the next scheduler goes on after it
    """
    CREATE TABLE notify_cursors (
        target      TEXT PRIMARY KEY,       -- webhook | command
        alert       INTEGER NOT NULL,
        updated     REAL NOT NULL
    );
    """,
    # 9: the checkpoint signal as intent (issue 26): one row per rank owed it, written with the decision that owes
    #    it, sent by the executor until its node says the rank got it, the run ends, or its grace period is over
    """
    CREATE TABLE checkpoint_signals (
        job         INTEGER NOT NULL,
        attempt     INTEGER NOT NULL,
        rank        INTEGER NOT NULL,
        signal      TEXT NOT NULL,          -- its name: SIGUSR1 ...
        asked       REAL NOT NULL,          -- when the decision was written
        deadline    REAL NOT NULL,          -- sent until then: the end of the grace period (the stop goes out then)
        tries       INTEGER NOT NULL DEFAULT 0,
        outcome     TEXT,                   -- signalled | ended | late; NULL: still owed
        done        REAL,
        error       TEXT,                   -- why the last try did not get through
        PRIMARY KEY (job, attempt, rank)
    );
    CREATE INDEX checkpoint_signals_owed ON checkpoint_signals (job) WHERE outcome IS NULL;
    """,
    # 10: the evidence of a hang (issue 29): what every rank was doing, as `ftconsole debug` gathered it (a JSON
    #     document up to 256 kB); its event (Evidence) carries the verdict alone, so listings stay small
    """
    CREATE TABLE evidence (
        id          INTEGER PRIMARY KEY,
        job         INTEGER NOT NULL,
        attempt     INTEGER NOT NULL,
        time        REAL NOT NULL,
        data        TEXT NOT NULL
    );
    CREATE INDEX evidence_job ON evidence (job, id);
    """,
    # 11: quota limits an admin set at run time (issue 30), over the config's for that project or user: limits is
    #     JSON {gpus, running_jobs, queued_jobs, gpu_hours}, a null or missing one is no limit
    """
    CREATE TABLE quota_limits (
        kind        TEXT NOT NULL,
        name        TEXT NOT NULL,
        limits      TEXT NOT NULL,
        set_by      TEXT NOT NULL,
        set_at      REAL NOT NULL,
        PRIMARY KEY (kind, name)
    );
    """,
    # 12: job arrays (issue 30): each task is a job; array_id is the id of the array's first task, which names the
    #     whole array (`12`), array_index its index (`12[7]`); both NULL for a job that is no array's
    """
    ALTER TABLE jobs ADD COLUMN array_id INTEGER;
    ALTER TABLE jobs ADD COLUMN array_index INTEGER;
    CREATE INDEX jobs_array ON jobs (array_id, array_index) WHERE array_id IS NOT NULL;
    """,
    # 13: reservations (issue 30): nodes kept for a user, a project or maintenance from start to end (a spec's count
    #     is resolved to nodes when it is made); a deleted one is removed (its Reservation events stay)
    """
    CREATE TABLE reservations (
        name        TEXT PRIMARY KEY,
        nodes       TEXT NOT NULL,          -- JSON list of node names
        start       REAL NOT NULL,
        end_time    REAL NOT NULL,
        user        TEXT,
        project     TEXT,
        maintenance INTEGER NOT NULL DEFAULT 0,
        reason      TEXT NOT NULL DEFAULT '',
        created_by  TEXT NOT NULL,
        created     REAL NOT NULL
    );
    """,
    # 14: what the scheduler itself found of a lost run's node (issue 40): set only by the scheduler (no answer, the
    #     node left the config), never from what the node reports of the run (the run's user may write that)
    """
    ALTER TABLE runs ADD COLUMN fault TEXT;
    """,
    # 15: a user's queued jobs counted at each submit (issue 40: at most quotas.default_user.queued_jobs)
    """
    CREATE INDEX jobs_owner_status ON jobs (owner, status);
    """,
    # 16: history retention (`history:`): what pruned jobs used, summed per UTC day and (user, project), so usage
    #     and goodput reports over any span still add up; how many rows were pruned (and the restarts of pruned
    #     attempts, so that counters in the metrics never go down); events found by their time
    """
    CREATE TABLE history_days (
        day         REAL NOT NULL,          -- the day's start, UTC midnight, seconds since the epoch
        owner       TEXT NOT NULL,
        project     TEXT NOT NULL,
        gpu_seconds REAL NOT NULL DEFAULT 0,
        jobs        INTEGER NOT NULL DEFAULT 0,   -- pruned jobs that used GPUs that day
        useful      REAL NOT NULL DEFAULT 0,      -- goodput's GPU-seconds (decide/goodput.py)
        rework      REAL NOT NULL DEFAULT 0,
        downtime    REAL NOT NULL DEFAULT 0,
        saved       REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (day, owner, project)
    );
    CREATE TABLE pruned (
        what        TEXT PRIMARY KEY,       -- jobs | events | alerts | restarts:<result>
        count       INTEGER NOT NULL DEFAULT 0,
        last        REAL
    );
    CREATE INDEX events_time ON events (time);
    CREATE INDEX runs_ended ON runs (ended);
    """,
    # 17: the usage ledger (decide/ledger.py): fair share's decayed usage and the quotas' GPU-seconds per slot, each
    #     ended run folded in once (`runs.folded`), so that neither reads the history again; the deleted jobs by
    #     status, so that `status` counts the jobs without reading them
    """
    ALTER TABLE runs ADD COLUMN folded INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX runs_unfolded ON runs (folded) WHERE folded = 0;  -- running, or ended and not folded in yet
    CREATE INDEX jobs_deleted ON jobs (status) WHERE deleted = 1;  -- `status` counts from indexes alone
    CREATE TABLE ledger (
        one         INTEGER PRIMARY KEY CHECK (one = 1),
        folds       INTEGER NOT NULL,       -- how many folds wrote it
        valued_at   REAL NOT NULL,          -- when the decayed usage is valued
        half_life   REAL,                   -- fair share's, when it was written (NULL: off)
        slot        REAL NOT NULL,          -- the slots' length, seconds
        since       REAL NOT NULL           -- slots that end before this were dropped
    );
    CREATE TABLE ledger_decayed (
        owner       TEXT NOT NULL,
        project     TEXT NOT NULL,
        gpu_seconds REAL NOT NULL,          -- decayed, valued at ledger.valued_at
        PRIMARY KEY (owner, project)
    );
    CREATE TABLE ledger_slots (
        kind        TEXT NOT NULL,          -- user | project
        name        TEXT NOT NULL,
        slot_start  REAL NOT NULL,
        gpu_seconds REAL NOT NULL,
        PRIMARY KEY (kind, name, slot_start)
    );
    """,
    # 18: usage rolled up per day as jobs end (`rolled`, into history_days, which pruning no longer adds to), so that
    #     `usage` over a month reads its days, not its jobs; the jobs not rolled yet found by their end
    """
    ALTER TABLE jobs ADD COLUMN rolled INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX jobs_unrolled ON jobs (status, ended) WHERE rolled = 0;
    """,
    # 19: holds (`ftconsole hold`): a queued job held is not placed until released; who held it, when, and whether
    #     as an admin (then only an admin releases it)
    """
    ALTER TABLE jobs ADD COLUMN held_by TEXT;
    ALTER TABLE jobs ADD COLUMN held_at REAL;
    ALTER TABLE jobs ADD COLUMN held_admin INTEGER NOT NULL DEFAULT 0;
    """,
    # 20: steps (`ftconsole run JOB -- CMD`, Slurm's srun inside an allocation): what ran in a running job, on which
    #     of its nodes and GPUs, who ran it, and how it ended
    """
    CREATE TABLE steps (
        job         INTEGER NOT NULL REFERENCES jobs (id),
        number      INTEGER NOT NULL,       -- 1, 2... within the job
        attempt     INTEGER NOT NULL,       -- the job's attempt it ran in
        argv        TEXT NOT NULL,          -- JSON list, as given
        mode        TEXT NOT NULL,          -- launch mode: single | pytorch | ...
        ranks       TEXT NOT NULL,          -- JSON list of {"node", "gpus"}, in rank order
        run_by      TEXT NOT NULL,
        started     REAL NOT NULL,
        ended       REAL,
        state       TEXT NOT NULL,          -- running | succeeded | failed | cancelled | lost
        exit_code   INTEGER,
        message     TEXT NOT NULL DEFAULT '',
        overlap     INTEGER NOT NULL DEFAULT 0, -- shares GPUs with the other steps (srun --overlap)
        PRIMARY KEY (job, number)
    );
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)

# The first ftconsole release that writes each schema version: a store of version N is read by that release and every
# later one. A new script in MIGRATIONS adds its version here with the release it will ship in (the next one);
# tests/unit/test_store_versions.py checks that every version has its release, in order.
RELEASE_OF_SCHEMA: dict[int, str] = {
    **dict.fromkeys(range(1, 16), "0.1.0"),  # 1 to 15: everything up to the first release
    16: "0.2.0",  # history retention
    17: "0.2.0",  # the usage ledger
    18: "0.2.0",  # usage rolled up per day
    19: "0.2.0",  # holds
    20: "0.2.0",  # steps
}


def newer_store_refusal(where: str, version: int) -> str:
    """Why a store of schema `version`, newer than this program's, is refused, and which ftconsole reads it."""
    release = RELEASE_OF_SCHEMA.get(version)
    wrote = f"ftconsole {release} or newer" if release else "a newer ftconsole"
    install = f"install ftconsole {release} or newer" if release else "install the ftconsole that wrote it, or newer"
    return (
        f"{where} was written by {wrote} (store schema {version}, this one knows up to {SCHEMA_VERSION}): "
        f"{install}; the store is not changed"
    )
