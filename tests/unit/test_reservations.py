"""Reservations (decide/reservations.py): where a queued job may go as the reservations stand."""

from __future__ import annotations

import pytest

from ftconsole.scheduler.decide.reservations import Allowed, Never, Reservation, Waits, allowed, overlapping

NOW = 1_800_000_000.0
H = 3600.0
NODES = frozenset({"n1", "n2", "n3", "n4"})
MAINT = Reservation("maint", frozenset({"n1"}), NOW - H, NOW + H, maintenance=True)
LATER = Reservation("vision", frozenset({"n2", "n3"}), NOW + 2 * H, NOW + 4 * H, project="vision")
ANN = Reservation("ann", frozenset({"n4"}), NOW - H, NOW + H, user="ann")
OVER = Reservation("old", frozenset({"n4"}), NOW - 3 * H, NOW - 2 * H, user="ann")
ALL = [MAINT, LATER, ANN, OVER]


DECLARED = frozenset({"vision", "speech"})


def where(named: str | None = None, owner: str = "bob", project: str = "default", max_runtime: float | None = None,
          declared: frozenset[str] = DECLARED) -> Allowed | Waits | Never:  # fmt: skip
    return allowed(named, owner, project, max_runtime, ALL, NOW, NODES, declared)


def test_a_job_without_a_reservation_keeps_off_reserved_nodes_and_those_it_would_run_into() -> None:
    short = where(max_runtime=H)  # ends before the vision reservation starts: only the running ones keep it off
    assert isinstance(short, Allowed) and short.nodes == {"n2", "n3"}
    assert "reserved maint (maintenance, " in short.note and "on n1" in short.note and "ann (user ann" in short.note
    long = where(max_runtime=3 * H)  # would run into it
    assert isinstance(long, Allowed) and long.nodes == frozenset()
    assert "it would run into vision (project vision, " in long.note and "on n2,n3" in long.note
    forever = where()  # no max_runtime: it never ends, so it keeps off every reservation to come
    assert isinstance(forever, Allowed) and forever.nodes == frozenset()
    ended = allowed(None, "bob", "default", None, [OVER], NOW, NODES, DECLARED)
    assert ended == Allowed(None)  # an ended one holds nothing


@pytest.mark.parametrize(
    ("named", "owner", "project", "expected"),
    [
        ("ann", "ann", "default", Allowed(frozenset({"n4"}))),
        ("ann", "bob", "default", Never("reservation ann is for user ann, not bob")),
        ("vision", "bob", "vision", "waits"),
        ("vision", "bob", "speech", Never("reservation vision is for project vision, not speech")),
        ("maint", "ann", "default", Never("reservation maint is for maintenance: no job runs in it")),
        ("old", "ann", "default", Never("reservation old is over, or there is none")),
        ("nope", "ann", "default", Never("reservation nope is over, or there is none")),
    ],
)
def test_a_job_naming_a_reservation(named: str, owner: str, project: str, expected: object) -> None:
    found = where(named, owner, project)
    if expected == "waits":
        assert isinstance(found, Waits) and found.reason.startswith("waiting for reservation vision (project vision, ")
    else:
        assert found == expected


NOT_DECLARED = "reservation vision is for project vision, which the cluster config does not declare (projects)"


@pytest.mark.parametrize(
    ("project", "declared", "expected"),
    [
        ("vision", DECLARED, "waits"),  # declared and named: it may
        ("vision", frozenset(), Never(f"{NOT_DECLARED}: naming it proves nothing")),  # none declared: a label
        ("vision", frozenset({"speech"}), Never(f"{NOT_DECLARED}: naming it proves nothing")),  # no longer declared
        ("speech", frozenset(), Never("reservation vision is for project vision, not speech")),
    ],
)
def test_a_project_reservation_takes_only_jobs_of_a_declared_project_that_name_it(
    project: str, declared: frozenset[str], expected: object
) -> None:
    found = where("vision", "bob", project, declared=declared)
    assert isinstance(found, Waits) if expected == "waits" else found == expected
    assert where("ann", "ann", "fresh", declared=frozenset()) == Allowed(frozenset({"n4"}))  # a user's: as before


def test_a_node_is_in_one_reservation_at_a_time() -> None:
    new = Reservation("new", frozenset({"n3", "n9"}), NOW + 3 * H, NOW + 5 * H, user="cy")
    assert overlapping(new, ALL) == [LATER]
    assert overlapping(Reservation("x", frozenset({"n3"}), NOW + 4 * H, NOW + 5 * H, user="cy"), ALL) == []


def test_the_json_says_its_state() -> None:
    assert [r.to_json(NOW)["state"] for r in ALL] == ["active", "planned", "active", "ended"]
    assert MAINT.to_json(NOW)["nodes"] == ["n1"]
