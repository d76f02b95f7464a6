"""The console's list of nodes: each node in brief (no checks or facts, three fields per GPU), and by change
(`nodes_changed`), as the jobs are (`jobs_changed`).

The console reads the nodes every second. At 1,000 nodes the whole list is about 1 MiB of JSON, which took the
console 15 to 20 ms a second to read, while a node's view changes at its probe (every `probes.interval`), when a
job starts or ends on it, or when its state does. So the scheduler keeps, per console (a chain of cursors, each
caller's own), the last brief view it answered of each node: a call with the chain's cursor answers only the nodes
whose view differs since, and the names of all nodes only when a node came or went or their order changed. Two
consoles of one user each get only what changed since their own read. What the caller may not see (other users'
private jobs) is masked before the comparison, so a job that becomes hidden or visible changes its nodes' views
too.

Where every node changes at every read (a probe every second), the whole views were still about 1 MiB: a caller
that asks for `patches` is answered, for a node it already holds, only the keys of its view that changed (its
probe's time and its GPUs' utilisation, most often: a tenth of the bytes). A patch is sound only
against what the caller holds: it is answered only to a cursor that is the caller's newest answer (any other,
say after a lost reply, gets whole views as before).
"""

from __future__ import annotations

import collections
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any

from ftconsole.scheduler.redaction import may_name_a_job, redact_json

# what a list of nodes needs (the console reads it every second): no checks or facts, three fields per GPU
BRIEF_GPU_FIELDS = ("index", "name", "utilization")
# left out of a brief view: the probe's age moves with the clock alone (the console has the probe's time and a
# clock of its own), and would change every node at every read
BRIEF_LEFT_OUT = ("checks", "facts", "last_probe_age_s")
KEEP_CALLERS = 64  # the cursors' chains whose last answer is kept, all callers together; the longest unseen go first
CHAINS_PER_CALLER = 4  # a caller's consoles (and scripts) following the nodes at once, each with its own cursor's
# chain (a caller is a uid): a fifth starts over the longest unseen of theirs
FORGET_AFTER_S = 300.0  # a chain unseen this long is forgotten (its next call is answered everything): a copy of
# every node's brief view is 2 to 3 MiB at 1,000 nodes


def mask_held(view: dict[str, Any], hidden: frozenset[int]) -> dict[str, Any]:
    """A node view whose GPUs held by hidden jobs (running, or held for debugging) say only that: held by a
    private job."""
    if not hidden:
        return view
    out = dict(view)
    for key in ("held", "held_for_debug"):
        if view.get(key):
            out[key] = [{**h, "job": None, "private": True} if h["job"] in hidden else h for h in view[key]]
    return out


def seen_by(view: dict[str, Any], hidden: frozenset[int]) -> dict[str, Any]:
    """A node view as a caller who may not see the jobs in `hidden` reads it: their GPUs held by a private job
    (`mask_held`), what its texts say of them gone (`redact_json`: an isolated node's reasons name the job). A
    view that names no job is not walked (`may_name_a_job`): most are not, and walking every node's view for each
    such caller's console every second was most of what `nodes_changed` cost the scheduler."""
    if not hidden:
        return view
    view = mask_held(view, hidden)
    return redact_json(view, hidden) if may_name_a_job(view) else view


def brief_node(view: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in view.items() if k not in BRIEF_LEFT_OUT}
    if isinstance(out.get("labels"), dict):  # the config's own dict: a brief view kept is a copy of its own
        out["labels"] = dict(out["labels"])
    out["gpus"] = [{k: g.get(k) for k in BRIEF_GPU_FIELDS} for g in view.get("gpus") or []]
    return out


def patch(was: dict[str, Any], brief: dict[str, Any]) -> dict[str, Any]:
    """The keys of `brief` that differ from `was` (same keys), with its name. Where its GPUs differ only by their
    utilisation (a probe), `gpus_utilization` lists them instead of `gpus`: 8 numbers for 8 objects."""
    out = {"name": brief["name"]} | {k: v for k, v in brief.items() if was[k] != v}
    gpus, old = out.get("gpus"), was["gpus"]
    if not gpus or len(gpus) != len(old):
        return out
    pairs = list(zip(gpus, old, strict=True))
    if all(g.keys() == o.keys() and all(g[k] == o[k] for k in g if k != "utilization") for g, o in pairs):
        del out["gpus"]
        out["gpus_utilization"] = [g["utilization"] for g in gpus]
    return out


class _Answered:
    """What one chain of a caller's cursors was last answered: each node's brief view with the step it last changed
    at. A console's reads make one chain: a call with no cursor, or one unknown, starts another."""

    seen = 0.0  # when it last called (monotonic)

    def __init__(self) -> None:
        self.token = secrets.token_hex(6)  # a cursor from another scheduler, or from a forgotten caller, is unknown
        self.step = 0
        self.nodes: dict[str, tuple[dict[str, Any], int]] = {}
        self.names_step = 0  # the step a node last came or went at


class NodeChanges:
    """The nodes changed since a caller's cursor (`changed`). A cursor is `TOKEN:STEP`, the token naming its chain;
    an unknown, malformed or missing one answers every node, with their names, and starts a chain."""

    def __init__(self, keep: int = KEEP_CALLERS, clock: Callable[[], float] = time.monotonic) -> None:
        self.keep = keep
        self.clock = clock
        self._callers: collections.OrderedDict[tuple[Any, str], _Answered] = collections.OrderedDict()

    def changed(
        self,
        caller: Any,
        views: Iterable[dict[str, Any]],
        since: Any,
        patches: bool = False,
        shown: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """{"cursor", "nodes": the brief views changed since `since`, "names": every node's name, or null when
        none came or went since}. `caller`: whose views these are (they differ by what each may see).
        `patches`: a node the caller holds as of `since` comes in `patches` instead, as its name and the keys of
        its view that changed (when `since` is the caller's newest answer and the view has the same keys).
        `shown`: what the caller may see of a brief view (masked after the brief is made: a full view's checks and
        facts are most of it, and walking them to mask them took 0.1 s a call at 1,000 nodes)."""
        now = self.clock()
        token = since.partition(":")[0] if isinstance(since, str) else None
        answered = self._callers.pop((caller, token), None) if token else None
        while self._callers and (
            len(self._callers) >= self.keep or now - next(iter(self._callers.values())).seen > FORGET_AFTER_S
        ):
            self._callers.popitem(last=False)  # the longest unseen first
        if answered is None:
            answered = _Answered()
            theirs = [key for key in self._callers if key[0] == caller]  # the longest unseen first
            for key in theirs[: max(0, len(theirs) - CHAINS_PER_CALLER + 1)]:
                del self._callers[key]
        answered.seen = now
        self._callers[(caller, answered.token)] = answered
        newest, step = answered.step, answered.step + 1
        kept = answered.nodes
        fresh: dict[str, tuple[dict[str, Any], int]] = {}
        for view in views:
            brief = brief_node(view) if shown is None else shown(brief_node(view))
            old = kept.get(brief["name"])
            fresh[brief["name"]] = old if old is not None and old[0] == brief else (brief, step)
        if list(fresh) != list(kept):  # a node came or went, or the order changed (a reload)
            answered.names_step = step
        answered.nodes, answered.step = fresh, step
        after = _step_of(since, answered.token)
        if after is None or after > step:
            after = -1  # everything, names too
        answer: dict[str, Any] = {"cursor": f"{answered.token}:{step}", "nodes": [], "names": None}
        if answered.names_step > after:
            answer["names"] = list(fresh)
        if patches:
            answer["patches"] = []
        if not (patches and after == newest > 0):
            answer["nodes"] = [brief for brief, at in fresh.values() if at > after]
            return answer
        for name, (brief, at) in fresh.items():
            if at <= after:
                continue
            old = kept.get(name)
            if old is None or old[0].keys() != brief.keys():
                answer["nodes"].append(brief)
            else:
                answer["patches"].append(patch(old[0], brief))
        return answer


def _step_of(cursor: Any, token: str) -> int | None:
    if not isinstance(cursor, str):
        return None
    mine, _, step = cursor.partition(":")
    return int(step) if mine == token and step.isdecimal() and len(step) < 19 else None
