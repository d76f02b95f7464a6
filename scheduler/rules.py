"""What callers may ask for, beyond who owns a job: which specs, priorities and output limits are admitted, the
urgent cap, which jobs a user may see, and how far a job may be extended (docs/jobs.md, "Who may do what").

The engine asks these before it writes; the urgent cap is asked inside the transaction that writes the job,
so two submits at once cannot both pass it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ftconsole.scheduler.caller import Caller
from ftconsole.scheduler.decide import placement
from ftconsole.scheduler.decide.jobs import Job, JobStatus
from ftconsole.scheduler.decide.requests import job_request, urgent_scope
from ftconsole.scheduler.errors import FtError, PermissionDenied, UsageError
from ftconsole.scheduler.spec import dataprep
from ftconsole.scheduler.spec.config import format_duration
from ftconsole.scheduler.spec.containers import run_root_problem
from ftconsole.scheduler.spec.jobspec import Access, JobSpec
from ftconsole.scheduler.spec.values import format_size

if TYPE_CHECKING:  # only annotations: the API's clients import Caller from here without the scheduler's machinery
    from ftconsole.scheduler.nodeops import ClusterService
    from ftconsole.scheduler.placing import Placer


class Rules:
    def __init__(self, service: ClusterService, *, placer: Placer) -> None:
        self.store = service.store
        self.config = service.config
        self.settings = service.config.scheduler
        self.placer = placer
        self._nodes = {n.name for n in service.all_nodes}

    def is_admin(self, caller: Caller) -> bool:
        return caller.uid == 0 or caller.user in self.config.admins

    def admissible(self, caller: Caller, spec: JobSpec, priority: str) -> None:
        """Refuse what can never be scheduled as asked: unknown specs or nodes, very-urgent for non-admins, a
        project that is not declared or not the caller's. (The urgent cap: `within_cap`, in the write's
        transaction.) The first of `refusals`."""
        found = self.refusals(caller, spec, priority)
        if found:
            raise found[0]

    def refusals(self, caller: Caller, spec: JobSpec, priority: str) -> list[FtError]:
        """Every reason `admissible` has to refuse the job, in its order (`ftconsole check` shows them all)."""
        out: list[FtError] = []

        def check(step: Callable[[], object]) -> None:
            try:
                step()
            except FtError as exc:
                out.append(exc)

        check(lambda: job_request(spec, self.config, job_id=spec.name, now=0))  # UsageError: a spec not in config
        check(lambda: self._nodes_known(spec))
        check(lambda: self._priority_allowed(caller, priority))
        check(lambda: self._project_allowed(caller, spec))
        check(lambda: self._hang_window_seen(spec))
        check(lambda: self._debug_allowed(spec))
        check(lambda: self._output_limit_allowed(caller, spec))
        check(lambda: self._idle_allowed(spec))
        check(lambda: dataprep.check_admissible(spec, self.config.data_prep, run_root=self.settings.run_root,
                                                user=caller.user))  # fmt: skip
        check(lambda: self._mounts_allowed(spec))
        check(lambda: self._topology_known(spec))
        return out

    def _topology_known(self, spec: JobSpec) -> None:
        """A job's `topology:` asks for what the cluster's must be able to give: switches, or blocks for segments; and
        its nodes fit in the largest group of blocks a job may span, where the cluster sets `block_sizes`."""
        want, tree = spec.topology, self.config.topology
        sizes = tree.block_sizes if tree is not None else None
        fewest = spec.elastic_range[0] if spec.elastic_range is not None else spec.nodes
        if sizes and fewest > sizes[-1]:
            raise UsageError(
                f"nodes: {fewest}: a job of this cluster spans at most {sizes[-1]} nodes, a group of blocks "
                f"(topology.block_sizes {sizes}, as Slurm's BlockSizes): ask for fewer nodes"
            )
        if want is None:
            return
        if tree is None:
            raise UsageError("topology: this cluster declares no topology (no topology: in its config), so neither "
                             "max_switches nor segment could be met")  # fmt: skip
        if want.segment is not None and not tree.blocks and tree.discover is None:
            raise UsageError("topology.segment: this cluster declares no blocks (topology.blocks) and does not "
                             "discover them (topology.discover): no group could be placed inside one")  # fmt: skip

    def _nodes_known(self, spec: JobSpec) -> None:
        unknown = [n for n in spec.node_list() if n not in self._nodes]
        if unknown:
            raise UsageError(f"job {spec.name}: node_names not in the cluster config: {', '.join(unknown)}")

    def _priority_allowed(self, caller: Caller, priority: str) -> None:
        if priority == "very-urgent" and not self.is_admin(caller):
            raise PermissionDenied(f"priority very-urgent is for admins only ({', '.join(self.config.admins)})")

    def _project_allowed(self, caller: Caller, spec: JobSpec) -> None:
        projects = self.config.projects
        if projects and spec.project not in projects:
            raise UsageError(f"project {spec.project!r} is not declared in the cluster config (projects: "
                             f"{', '.join(sorted(projects))})")  # fmt: skip
        members = projects[spec.project].members if projects else None
        if members is not None and caller.user not in members and not self.is_admin(caller):
            raise PermissionDenied(f"{caller.user} is not a member of project {spec.project} ({', '.join(members)})")

    def _debug_allowed(self, spec: JobSpec) -> None:
        debug = self.config.debug
        if spec.debug.retention is not None and spec.debug.retention > debug.max_retention:
            raise UsageError(
                f"job {spec.name}: debug.retention {format_duration(spec.debug.retention)} is over this cluster's "
                f"debug.max_retention ({format_duration(debug.max_retention)})"
            )
        if spec.debug.hold_nodes and debug.max_hold <= 0:
            raise UsageError(
                f"job {spec.name}: debug.hold_nodes is refused here: this cluster lets no failed job keep its GPUs "
                "(debug.max_hold is 0); leave it out, the run folders are kept all the same"
            )

    def _mounts_allowed(self, spec: JobSpec) -> None:
        over = run_root_problem(spec.mounts or (), self.settings.run_root)
        if over is not None:
            raise UsageError(f"job {spec.name}: {over}")

    def _output_limit_allowed(self, caller: Caller, spec: JobSpec) -> None:
        """A job's `output_limit` may be lower than the cluster's `scheduler.output_limit`; higher, or off where the
        cluster has one, only for an admin (as Slurm lets users lower their limits, not raise them)."""
        cluster, asked = self.settings.output_limit, spec.output_limit
        if asked is None or cluster == 0 or 0 < asked <= cluster or self.is_admin(caller):
            return
        said = "off" if asked == 0 else format_size(asked)
        raise PermissionDenied(
            f"job {spec.name}: output_limit {said} is over this cluster's scheduler.output_limit "
            f"({format_size(cluster)}): ask for at most that (or leave it out), or ask an admin"
        )

    def _idle_allowed(self, spec: JobSpec) -> None:
        """A job's `idle_timeout` within the cluster's `scheduler.max_idle_timeout`, where it has one."""
        bound, asked = self.settings.max_idle_timeout, spec.idle_window
        if bound and asked is not None and asked > bound:
            raise UsageError(
                f"job {spec.name}: idle_timeout {format_duration(asked)} is over this cluster's "
                f"scheduler.max_idle_timeout ({format_duration(bound)}): ask for at most that"
            )

    def allocation(self, spec: JobSpec) -> JobSpec:
        """An allocation's spec (`ftconsole alloc`) with the cluster's idle rules: without an idle_timeout of its own,
        `scheduler.idle_timeout`, else `max_idle_timeout`; off where the cluster bounds it, refused."""
        bound, default = self.settings.max_idle_timeout, self.settings.idle_timeout
        if spec.idle_timeout is None:
            return spec.model_copy(update={"idle_timeout": default or bound or None})
        if bound and spec.idle_window is None:
            raise UsageError(f"allocation {spec.name}: idle_timeout off, and this cluster ends idle allocations "
                             f"after at most {format_duration(bound)} (scheduler.max_idle_timeout)")  # fmt: skip
        return spec

    def _hang_window_seen(self, spec: JobSpec) -> None:
        """A hang window the job asks for under 3 probe intervals would never flag anything: the GPU utilisation is
        sampled once a probe, and the detector needs samples in each half of the window (scheduler.detect.gpu_flat).
        The default window is never refused: with probes that far apart, no job's default could be seen either."""
        window, interval = spec.hang_window, self.config.probes.interval
        asked = spec.hang_detect is not None or "MA_HANG_DETECT_TIME" in spec.env  # not the default window
        if window is None or window >= 3 * interval or not asked:
            return
        where = "hang_detect" if spec.hang_detect is not None else "MA_HANG_DETECT_TIME in env"
        raise UsageError(
            f"job {spec.name}: a hang window of {format_duration(window)} ({where}) would never see a hang: GPU "
            f"utilisation is sampled once a probe (probes.interval {format_duration(interval)}) and a hang needs "
            f"3 samples; give at least {format_duration(3 * interval)}, or hang_detect: off"
        )

    async def within_cap(self, owner: str, project: str, priority: str, *, count: int = 1) -> None:
        """The urgent cap (`scheduler.urgent_cap`), counted over `urgent_scope`, for `count` new urgent jobs (an
        array's tasks): called inside the transaction that writes them, so that two submits at once cannot both
        pass it."""
        cap = self.settings.urgent_cap
        if priority != "urgent" or cap is None:
            return
        scope = urgent_scope(self.config, owner, project)
        active = await self.store.jobs(statuses=[JobStatus.QUEUED, JobStatus.RUNNING])
        active_count = sum(
            1 for j in active if urgent_scope(self.config, j.owner, j.project) == scope and j.priority == "urgent"
        )
        if active_count + count > cap:
            tasks = f" (and this array has {count} tasks)" if count > 1 else ""
            raise UsageError(
                f"{scope} already has {active_count} urgent job(s) running or queued (cap {cap}){tasks}; "
                "submit it as normal, or wait for one to finish"
            )

    def may_see(self, caller: Caller, job: Job) -> bool:
        """Whether the caller may see the job at all (listings, events, alerts, who holds a GPU): `access: none`
        hides it from everyone but its owner and the admins."""
        return self.is_admin(caller) or caller.uid == job.uid or job.access != Access.NONE.value

    async def extend_allowed(self, job: Job, seconds: float, now: float) -> None:
        """What non-admins may extend: `scheduler.max_extend` in all, and never so far that the head of the
        queue starts later than placement promised it (a job started in a gap before the head's reserved
        start, or otherwise in its way, keeps to its end)."""
        most = self.settings.max_extend
        if job.extra_runtime + seconds > most:
            left = max(0.0, most - job.extra_runtime)
            raise PermissionDenied(
                f"job {job.id} may be extended by {format_duration(most)} in all without an admin "
                f"({format_duration(job.extra_runtime)} so far, {format_duration(left)} left; scheduler.max_extend)"
            )
        if job.status is not JobStatus.RUNNING or job.deadline is None:
            return
        queued = await self.store.jobs(statuses=[JobStatus.QUEUED])
        state, requests, _, _ = await self.placer.placement_inputs(queued)
        before = _head_start(placement.plan(state, requests, now, urgent_cap=self.settings.urgent_cap))
        if before is None:
            return
        longer = tuple(
            dataclasses.replace(a, ends_at=a.ends_at + seconds) if a.job_id == str(job.id) and a.ends_at else a
            for a in state.allocations
        )
        extended = dataclasses.replace(state, allocations=longer)
        after = _head_start(placement.plan(extended, requests, now, urgent_cap=self.settings.urgent_cap))
        if after is None or after[1] > before[1] + 1e-6:
            head, start = before
            later = "never" if after is None else time.strftime("%H:%M:%S", time.localtime(after[1]))
            raise PermissionDenied(
                f"extending job {job.id} by {format_duration(seconds)} would delay job {head}, the head of the "
                f"queue, from {time.strftime('%H:%M:%S', time.localtime(start))} to {later}: ask an admin"
            )


def _head_start(decisions: Sequence[placement.Decision]) -> tuple[str, float] | None:
    """The head of the queue and the start placement reserved for it, if it waits for one."""
    for d in decisions:
        if isinstance(d, placement.Wait) and d.earliest_start is not None:
            return d.job_id, d.earliest_start
    return None
