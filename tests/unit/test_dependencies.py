"""Job dependencies (`after:`, decide/dependencies.py): one row per kind and status, and the spec's rules."""

from __future__ import annotations

import pytest

from ftconsole.scheduler.decide.dependencies import Never, Waits, array_status, met, state
from ftconsole.scheduler.decide.jobs import JobStatus as S
from ftconsole.scheduler.errors import ConfigError
from ftconsole.scheduler.spec.jobspec import parse_jobspec

MET = {  # kind -> status -> met (None: not yet)
    "ok": {S.QUEUED: None, S.RUNNING: None, S.SUCCEEDED: True, S.ERROR: False, S.STOPPED: False, S.EXPIRED: False},
    "any": {S.QUEUED: None, S.RUNNING: None, S.SUCCEEDED: True, S.ERROR: True, S.STOPPED: True, S.EXPIRED: True},
    "failed": {S.QUEUED: None, S.RUNNING: None, S.SUCCEEDED: False, S.ERROR: True, S.STOPPED: True, S.EXPIRED: True},
}


@pytest.mark.parametrize("kind", list(MET))
def test_each_kind_against_each_status(kind: str) -> None:
    assert set(MET[kind]) == set(S)
    for status, want in MET[kind].items():
        assert met(kind, status) is want, (kind, status)


CASES = [
    ({"ok": [1]}, {1: S.RUNNING}, Waits("waiting for job 1 to succeed (after.ok)")),
    ({"ok": [1]}, {1: S.SUCCEEDED}, None),
    ({"ok": [1, 2], "failed": [3]}, {1: S.SUCCEEDED, 2: S.QUEUED, 3: S.RUNNING},
     Waits("waiting for job 2 to succeed (after.ok) and 1 more")),
    ({"any": [4]}, {4: S.STOPPED}, None),
    ({"failed": [5]}, {5: S.SUCCEEDED}, Never("job 5 ended succeeded; after.failed needs it to fail")),
    ({"ok": [6]}, {6: S.ERROR}, Never("job 6 ended error; after.ok needs it to succeed")),
    ({"ok": [1], "any": [7]}, {1: S.RUNNING, 7: None}, Never("job 7 does not exist (after.any)")),  # never first
    ({"ok": [], "any": [], "failed": []}, {}, None),
]  # fmt: skip


@pytest.mark.parametrize(("after", "statuses", "want"), CASES)
def test_a_jobs_dependency_state(after, statuses, want) -> None:  # type: ignore[no-untyped-def]
    assert state(after, statuses) == want


def test_the_spec_key() -> None:
    spec = parse_jobspec("name: t\ncommand: x\nafter: {ok: [3, 4], failed: [5]}\n")
    assert spec.after is not None and spec.after.as_map() == {"ok": [3, 4], "any": [], "failed": [5]}
    assert parse_jobspec("name: t\ncommand: x\n").after is None
    for bad, said in [
        ("after: {}", "after: name at least one job under ok, any or failed"),
        ("after: {ok: [0]}", "after.ok[0]: must be at least 1, not 0"),
        ("after: {ok: [3, 3]}", "after.ok: each entry must be unique: 3 given more than once"),
        ("after: {okay: [1]}", "after.okay: unknown key"),
        ("after: {ok: ['3']}", "after.ok[0]: must be a whole number"),
    ]:
        with pytest.raises(ConfigError) as info:
            parse_jobspec(f"name: t\ncommand: x\n{bad}\n")
        assert said in str(info.value), (bad, str(info.value))


def test_an_arrays_id_stands_for_all_its_tasks() -> None:
    assert array_status([S.SUCCEEDED, S.RUNNING, S.QUEUED]) is S.RUNNING
    assert array_status([S.SUCCEEDED, S.QUEUED]) is S.QUEUED
    assert array_status([S.SUCCEEDED, S.SUCCEEDED]) is S.SUCCEEDED
    assert array_status([S.SUCCEEDED, S.STOPPED]) is S.ERROR  # one did not succeed: after.ok never, .failed met
