"""The records the state store hands out and takes in (events, probe results, alerts, job activity), and the
mappings between table rows and records (jobs, attempts, runs, alerts, node health). Plain data and conversions,
no I/O: shared by `scheduler.store.db` and `scheduler.store.jobtx`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, TypeVar

from ftconsole.probes.health import NodeHealth, NodeState
from ftconsole.scheduler.decide.jobs import Attempt, Job, JobStatus, Run, StopReason
from ftconsole.scheduler.decide.reservations import Reservation
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store.engine import Row


@dataclass(frozen=True)
class StoredEvent:
    id: int
    time: float
    kind: str
    node: str | None
    job: str | None
    message: str
    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class StoredProbe:
    node: str
    time: float
    error: str | None
    report: dict[str, Any] | None


@dataclass(frozen=True)
class StoredAlert:
    id: int
    time: float
    kind: str
    severity: str
    job: int | None
    node: str | None
    message: str
    state: str  # open | acknowledged | resolved
    acked_by: str | None
    acked_at: float | None
    resolved_at: float | None
    resolved_by: str | None
    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class NewAlert:
    """An alert to raise about a job or a node."""

    time: float
    kind: str  # job_failed | job_hung | job_straggler | job_slow | job_rank_error | node_unhealthy |
    #            node_unreachable | node_isolated | host_key | node_flaky
    severity: str  # error | critical | warning
    message: str
    job: int | None = None
    node: str | None = None


@dataclass(frozen=True)
class AutoResolve:
    """Resolve, as ftconsole, a node's open and acknowledged alerts of one kind; `why` goes in the event."""

    time: float
    node: str
    kind: str
    why: str


@dataclass(frozen=True)
class JobActivity:
    """What a job listing shows beyond the job row (`Store.job_activity`)."""

    last_output: float | None = None  # the latest output.log mtime over the current attempt's runs
    open_alerts: int = 0  # open and acknowledged alerts about the job
    node_names: tuple[str, ...] = ()  # the current attempt's nodes, in rank order, each once

    def to_json(self) -> dict[str, Any]:
        return {"last_output": self.last_output, "open_alerts": self.open_alerts, "node_names": list(self.node_names)}


R = TypeVar("R")


def _record(cls: type[R], row: Row, **converted: Any) -> R:
    """A record dataclass from a row: columns named like its fields, those needing conversion given."""
    names = _fields(cls)
    wanted = [k for k in row.keys() if k in names and k not in converted]  # noqa: SIM118 (a Row iterates values)
    return cls(**{k: row[k] for k in wanted}, **converted)


_FIELDS: dict[type, frozenset[str]] = {}  # record class -> its field names


def _fields(cls: type) -> frozenset[str]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = frozenset(f.name for f in dataclasses.fields(cls))
    return names


def _job_from_row(row: Row, spec: JobSpec) -> Job:
    return _record(
        Job,
        row,
        spec=spec,
        status=JobStatus(row["status"]),
        requeued=bool(row["requeued"]),
        stop_reason=StopReason(row["stop_reason"]) if row["stop_reason"] else None,
        deleted=bool(row["deleted"]),
        excluded=tuple(json.loads(row["excluded"])),
        held_admin=bool(row["held_admin"]),
    )


def _attempt_from_row(row: Row) -> Attempt:
    return _record(Attempt, row)


def _run_from_row(row: Row) -> Run:
    return _record(
        Run, row, gpus=tuple(json.loads(row["gpus"])), launch=bool(row["launch"]), released=bool(row["released"])
    )


def _alert_from_row(row: Row) -> StoredAlert:
    return _record(StoredAlert, row, data=json.loads(row["data"]))


_NODE_COLUMNS = (
    "name", "health", "reasons", "since", "admin", "admin_reason", "admin_since", "admin_by", "pending",
    "good_streak", "boot_id", "last_probe", "isolated_passes", "needs_operator",
)  # fmt: skip
_UPSERT_NODE = (
    f"INSERT INTO nodes ({', '.join(_NODE_COLUMNS)}) VALUES ({', '.join('?' * len(_NODE_COLUMNS))}) "
    "ON CONFLICT (name) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in _NODE_COLUMNS[1:])
)


def _health_row(h: NodeHealth) -> tuple[Any, ...]:
    """The values of `_UPSERT_NODE`, in `_NODE_COLUMNS` order."""
    row = {
        "name": h.node,
        "health": h.health.value,
        "reasons": json.dumps(list(h.reasons)),
        "since": h.since,
        "admin": h.admin.value if h.admin else None,
        "admin_reason": h.admin_reason,
        "admin_since": h.admin_since,
        "admin_by": h.admin_by,
        "pending": h.pending.value if h.pending else None,
        "good_streak": h.good_streak,
        "boot_id": h.boot_id,
        "last_probe": h.last_probe,
        "isolated_passes": h.isolated_passes,
        "needs_operator": int(h.needs_operator),
    }
    return tuple(row[c] for c in _NODE_COLUMNS)


def _health_from_row(row: Row) -> NodeHealth:
    return NodeHealth(
        node=row["name"],
        health=NodeState(row["health"]),
        reasons=tuple(json.loads(row["reasons"])),
        since=row["since"],
        admin=NodeState(row["admin"]) if row["admin"] else None,
        admin_reason=row["admin_reason"],
        admin_since=row["admin_since"],
        admin_by=row["admin_by"],
        pending=NodeState(row["pending"]) if row["pending"] else None,
        good_streak=row["good_streak"],
        boot_id=row["boot_id"],
        last_probe=row["last_probe"],
        isolated_passes=row["isolated_passes"],
        needs_operator=bool(row["needs_operator"]),
    )


def reservation_from_row(row: Row) -> Reservation:
    return Reservation(
        name=row["name"],
        nodes=frozenset(json.loads(row["nodes"])),
        start=row["start"],
        end=row["end_time"],
        user=row["user"],
        project=row["project"],
        maintenance=bool(row["maintenance"]),
        reason=row["reason"],
        by=row["created_by"],
        created=row["created"],
    )
