"""Which log scans ride on a read: a running rank's log is scanned at most every SCAN_EVERY_S, and only once it
was written since its last scan (a quiet node's read waits for none, `Watchdog.read_every`)."""

from __future__ import annotations

import dataclasses

from ftconsole.scheduler.logwatch import SCAN_EVERY_S, LogWatch
from tests.unit.test_jobs import make_job, run


def test_a_log_is_scanned_again_only_once_it_was_written_since() -> None:
    now = [1000.0]
    watch = LogWatch(store=None, clock=lambda: now[0])  # type: ignore[arg-type]  # scans() reads no store
    job = make_job()
    watch._jobs = {job.id: job}  # as its last check left it
    printed = run(0, "running", output_at=990.0)
    assert watch.wants([printed])
    (first,) = watch.scans([printed]).values()
    assert first["from"] == 0 and "progress" in first["patterns"]
    now[0] += SCAN_EVERY_S / 2
    assert watch.scans([printed]) == {}  # too soon
    now[0] += SCAN_EVERY_S
    assert not watch.wants([printed]) and watch.scans([printed]) == {}  # nothing written since
    moved = dataclasses.replace(printed, output_at=1012.0)
    assert watch.wants([moved]) and list(watch.scans([moved])) == [moved.run_dir]
    assert watch.scans([run(1, "exited", output_at=1.0)]) == {}  # a rank that ended is not scanned
