"""What a run on a node is told to run (pure): the root of its folders for a user, and its steps in order.

The supervisor (`supervisor.py`, "steps") runs a run's `Step`s one after another: the image pull and the data
copy first, the hooks around the command or the batch tasks. `jobplan` plans them; `runs` sends them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


def user_root(run_root: str, user: str | None) -> str:
    """`run_root` for the runs of `user`: its "{user}" replaced by the name; "~" is that user's home on the node."""
    return run_root if user is None else run_root.replace("{user}", user)


class StepKind(StrEnum):
    PULL = "pull"  # a job with `image`: pulls it unless the node has it, first (scheduler.spec.containers)
    DATA = "data"  # data_prep: copies the job's data sets to node-local storage, first (scheduler.spec.dataprep)
    BEFORE = "before"  # hooks.before: its failure ends the run before the command
    COMMAND = "command"  # a regular job's command
    TASK = "task"  # one task of a batch job
    AFTER = "after"  # hooks.after: runs whatever the outcome (not after a SIGKILL); its failure is only logged


@dataclass(frozen=True)
class Step:
    """One command of a run's sequence (the supervisor's `steps`); `index` of `count` for a batch task."""

    kind: StepKind
    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    index: int | None = None
    count: int | None = None
    container: dict[str, Any] | None = None  # runs in this container (scheduler.containers.container_step)
    # a stop SIGKILLs its process (the group's leader) and SIGTERMs the rest of its group: DeepSpeed's runner, whose
    # SIGTERM handler runs `pkill -f` of every DeepSpeed launcher of the user on the job's nodes, other jobs' too;
    # its ranks end otherwise (the node's leftovers, `end_leftovers`)
    leader_kill: bool = False

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"kind": self.kind.value, "name": self.name, "argv": list(self.argv), "env": self.env}
        if self.container is not None:
            doc["container"] = self.container
        if self.leader_kill:
            doc["leader_kill"] = True
        return doc if self.index is None else {**doc, "index": self.index, "count": self.count}
