"""The console's actions on jobs, nodes and alerts, and its debug terminal: a part of `ConsoleApp` (app.py), which
binds them to keys (`BINDINGS`), decides where they apply (`check_action`) and gives them what they act on
(`_targets`, `_one`, `_job`) and the way they act (`act`: one operation through the client).

An array's row (`array:12`, Jobs view) names the whole array to stop, delete, clone and priority: the scheduler
takes its id, that of its first task, for all of its tasks. So a task's own row names it as `12[7]`, even the first
one. Where an action needs one job (logs, shell, debug, its screen), an array's row gives its most pressing task,
and says so; extend and scale work on tasks one by one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import App

from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.spec.config import LoadedConfig, parse_duration
from ftconsole.scheduler.ssh.shell import ShellTarget, is_job_id, job_shell, node_shell
from ftconsole.tui import alertevidence as E
from ftconsole.tui import rows as R
from ftconsole.tui.detail import JobScreen, NodeScreen
from ftconsole.tui.dialogs import ChoiceDialog, ConfirmDialog, PromptDialog, SubmitDialog
from ftconsole.tui.feed import Feed
from ftconsole.tui.views import View

PRIORITIES = ("normal", "urgent", "very-urgent")


class Actions(App[int]):
    """The `action_*` methods of the console that change something, and the debug terminal."""

    if TYPE_CHECKING:  # given by ConsoleApp
        client: Any
        feed: Feed
        loaded: LoadedConfig
        clock: Callable[[], float]

        @property
        def view(self) -> View: ...
        def _targets(self, kind: str) -> list[str]: ...
        def _one(self, kind: str) -> str | None: ...
        def _job(self, job_id: int) -> dict[str, Any]: ...
        def act(self, what: str, op: str, **args: Any) -> Any: ...
        def open_job(self, job_id: int, *, alert: dict[str, Any] | None = None) -> JobScreen | None: ...

    # -- job actions ---------------------------------------------------------------------------------------

    def action_stop(self) -> None:
        ids = self._targets("job")
        if ids:
            what = self._what(ids)
            self._confirmed(f"Stop {what}?", "Running ranks get SIGTERM, then SIGKILL.",
                            lambda: self.act(f"stop requested for {what}", "stop", jobs=self._refs(ids)))  # fmt: skip

    def action_delete(self) -> None:
        ids = self._targets("job")
        if ids:
            what = self._what(ids)
            self._confirmed(f"Delete {what}?", "Running ones are stopped first; gone from the queue.",
                            lambda: self.act(f"deleted {what}", "delete", jobs=self._refs(ids)))  # fmt: skip

    def action_hold(self) -> None:
        """Hold the jobs selected (their queued ones: `hold`), or release them where each is held already."""
        ids = self._targets("job")
        if not ids:
            return
        what = self._what(ids)
        held = [self._job(a if (a := R.array_of_key(key)) is not None else int(key)).get("held") for key in ids]
        if all(held):
            self.act(f"released {what}", "release", jobs=self._refs(ids))
        else:
            self.act(f"held {what}", "hold", jobs=self._refs(ids))

    def action_clone(self) -> None:
        if (job := self._one("job")) is not None:
            self.act(f"cloned {self._what([job])}", "clone", job=self._refs([job])[0])

    def action_priority(self) -> None:
        ids = self._targets("job")
        if not ids:
            return
        first = R.array_of_key(ids[0])
        current = self._job(first if first is not None else int(ids[0])).get("priority")

        def chosen(level: str | None) -> None:
            for key in ids if level else []:
                array = R.array_of_key(key) is not None
                for job in self._refs([key]):  # an array: its id (each task's name where that is gone)
                    what = f"array {job}" if array and isinstance(job, int) else f"job {job}"
                    self.act(f"{what} is now {level}", "priority", job=job, level=level)

        self.push_screen(ChoiceDialog(f"Priority of {self._what(ids)}", PRIORITIES, current), chosen)

    def action_extend(self) -> None:
        ids = self._tasks_only(self._targets("job"), "extend")
        if not ids:
            return

        def check(value: str) -> str | None:
            try:
                parse_duration(value)
            except (ValueError, FtError) as exc:
                return str(exc)
            return None

        def given(value: str | None) -> None:
            for job in ids if value else []:
                self.act(f"job {job} extended by {value}", "extend", job=int(job), duration=value)

        self.push_screen(
            PromptDialog(
                f"Extend the max runtime of {_plural(ids, 'job')} by", placeholder="e.g. 2h, 30m", check=check
            ),
            given,
        )

    def action_scale(self) -> None:
        """Resize elastic jobs: a running one's attempt is replaced by one of the new size (the `scale` op)."""
        ids = self._tasks_only(self._targets("job"), "scale")
        if not ids:
            return
        ranges = {job: r for job in ids if (r := self._job(int(job)).get("elastic"))}
        if not ranges:
            what = f"job {ids[0]} is" if len(ids) == 1 else f"none of the {len(ids)} jobs is"
            text = f"{what} not elastic (no fault_tolerance.elastic in its spec)"
            self.notify(text, title="scale", severity="error", timeout=10)
            return
        elastic = list(ranges)
        low = max(r["min_nodes"] for r in ranges.values())
        high = min(r["max_nodes"] for r in ranges.values())
        if low > high:
            text = f"the elastic ranges of {_plural(elastic, 'job')} have no size in common: mark fewer"
            self.notify(text, title="scale", severity="error", timeout=10)
            return

        def check(value: str) -> str | None:
            if value.isdecimal() and low <= int(value) <= high:
                return None
            return f"a whole number of nodes from {low} to {high}"

        def given(value: str | None) -> None:
            if value is None:
                return
            for job in elastic:
                self.act(f"job {job} scaling to {value} nodes", "scale", job=int(job), nodes=int(value))

        now = f", now {self._job(int(elastic[0]))['nodes']}" if len(elastic) == 1 else ""
        skipped = sorted(set(ids) - set(elastic), key=int)
        notes = [
            f"Not elastic, left as they are: job(s) {', '.join(skipped)}." if skipped else "",
            "A running job restarts at the new size: SIGTERM first, to save a checkpoint.",
        ]
        self.push_screen(
            PromptDialog(
                f"Scale {_plural(elastic, 'job')} to how many nodes? ({low}-{high}{now})\n"
                + "\n".join(filter(None, notes)),
                placeholder=f"{low}-{high}",
                check=check,
            ),
            given,
        )

    def action_logs(self) -> None:
        if isinstance(self.screen, JobScreen):
            self.screen.action_logs()
            return
        job = self._task_of(self._one("job"), "the log of")
        if job is not None and (screen := self.open_job(int(job))) is not None:
            self.call_after_refresh(screen.action_logs)

    def action_debug(self) -> None:
        """`D`: the job's Debug tab, gathering what every rank does now (`ftconsole debug`); on an alert, its job's,
        opened at the alert's evidence."""
        if isinstance(self.screen, JobScreen):
            self.screen.action_debug()
            return
        screen = None
        if self.view.kind == "alert":
            key = self._one("alert")
            alert = self.feed.alerts.get(int(key)) if key is not None else None
            if alert is not None and alert.get("job") is not None:
                screen = self.open_job(int(alert["job"]), alert=alert)
            elif key is not None:
                self.notify(f"alert {key} names no job: no ranks to look at", title="debug", severity="warning")
        elif (job := self._task_of(self._one("job"), "the ranks of")) is not None:
            screen = self.open_job(int(job))
        if screen is not None:
            self.call_after_refresh(screen.action_debug)

    def action_submit(self) -> None:
        async def predict(spec: dict[str, Any]) -> dict[str, Any]:
            return dict(await self.client.call("predict", spec=spec))

        def chosen(spec: dict[str, Any] | None) -> None:
            if spec is not None:
                self.act(f"submitted {spec.get('name')}", "submit", spec=spec)

        self.push_screen(SubmitDialog(predict, start=Path.cwd()), chosen)

    # -- node actions --------------------------------------------------------------------------------------

    def action_drain(self) -> None:
        nodes = self._targets("node")
        if not nodes:
            return

        def given(reason: str | None) -> None:
            if reason:
                self.act(f"drained {','.join(nodes)}: {reason}", "drain", nodeset=",".join(nodes), reason=reason)

        self.push_screen(
            PromptDialog(
                f"Drain {','.join(nodes)}: no new work is placed there. Reason:",
                placeholder="e.g. fan alarm, ticket #123",
                check=lambda v: None if v else "a reason, so the next person on call knows why",
            ),
            given,
        )

    def action_resume(self) -> None:
        if nodes := self._targets("node"):
            self.act(f"resumed {','.join(nodes)}", "resume", nodeset=",".join(nodes))

    def action_probe(self) -> None:
        if nodes := self._targets("node"):
            self.notify(f"probing {','.join(nodes)}…", timeout=2)
            self.act(f"probed {','.join(nodes)}", "probe", nodeset=",".join(nodes))

    def action_probe_all(self) -> None:
        self.notify("probing every node…", timeout=2)
        self.act("probed every node", "probe", nodeset=None)

    # -- alert actions -------------------------------------------------------------------------------------

    def action_ack(self) -> None:
        if ids := self._targets("alert"):
            self.act(f"acknowledged {_plural(ids, 'alert')}", "ack", alerts=[int(i) for i in ids])

    def action_resolve(self) -> None:
        ids = self._targets("alert")
        if ids:
            self._confirmed(f"Resolve {_plural(ids, 'alert')}?", "They leave the open list.",
                            lambda: self.act(f"resolved {_plural(ids, 'alert')}", "resolve",
                                              alerts=[int(i) for i in ids]))  # fmt: skip

    # -- the debug terminal --------------------------------------------------------------------------------

    def action_shell(self) -> None:
        if isinstance(self.screen, JobScreen):
            self.open_shell(str(self.screen.job_id), self.screen.rank, self.screen.focus_attempt)
            return
        if not isinstance(self.screen, NodeScreen) and self.view.kind == "alert":
            if (key := self._one("alert")) is not None:
                self._shell_on_alert(int(key))
            return
        kind = "node" if isinstance(self.screen, NodeScreen) or self.view.kind == "node" else "job"
        target = self._one(kind)
        if kind == "job":
            target = self._task_of(target, "a shell on")
        if target is not None:
            self.open_shell(target, None)

    def _shell_on_alert(self, alert_id: int) -> None:
        """A job alert: the rank and node its evidence names (rank 0 when it names none); a node alert: the node."""
        alert = self.feed.alerts.get(alert_id)
        if alert is not None and alert.get("job") is not None:
            self.open_shell(str(alert["job"]), None, alert=alert)
        elif alert is not None and alert.get("node"):
            self.open_shell(str(alert["node"]), None)
        else:
            self.notify(
                f"alert {alert_id} names no job and no node: no shell to open", title="shell", severity="warning"
            )

    @work(exclusive=True, group="terminal", exit_on_error=False)
    async def open_shell(
        self, target: str, rank: int | None, attempt: int | None = None, *, alert: dict[str, Any] | None = None
    ) -> None:
        """Suspend the app and run `ssh -t` into the node; the scheduler keeps running meanwhile."""
        try:
            shell = await self.shell_for(target, rank, attempt, alert=alert)
        except FtError as exc:
            self.notify(str(exc), title=f"shell: {exc.title}", severity="error", timeout=10)
            return
        code = await self.run_terminal(shell)
        if code not in (0, 130):
            self.notify(f"ssh to {shell.node} ended with exit code {code}", severity="warning")

    async def shell_for(
        self, target: str, rank: int | None, attempt: int | None = None, *, alert: dict[str, Any] | None = None
    ) -> ShellTarget:
        """The ssh argv for a job's rank (a job alert: the rank, and attempt, its evidence names) or a node."""
        if not is_job_id(target):
            return node_shell(self.loaded, target)
        job = await self.client.call("show", job=int(target))
        if alert is not None:
            evidence = E.alert_evidence(alert, job.get("events") or [])
            rank, attempt = evidence.rank, evidence.attempt
        return job_shell(self.loaded, job, rank=rank, attempt=attempt)

    async def run_terminal(self, shell: ShellTarget) -> int:
        """Give the terminal to `shell.argv` until it exits; its exit code. (Tests replace this.)"""
        # Nothing is drawn while the shell has the terminal (batch_update), and this waits without blocking
        # the event loop, so the embedded scheduler and its API go on serving.
        with self.batch_update(), self.suspend():  # the remote side prints the banner (where you are)
            process = await asyncio.create_subprocess_exec(*shell.argv)
            code = await process.wait()
        self.refresh(layout=True)
        return code

    # -- helpers -------------------------------------------------------------------------------------------

    def _tasks(self, array_id: int) -> list[dict[str, Any]]:
        return [j for j in self.feed.jobs.values() if j.get("array_id") == array_id]

    def _refs(self, keys: list[str]) -> list[int | str]:
        """What the scheduler is asked to act on for these rows: an array's id (all its tasks; each task by name if
        the first one is gone, as the id then names nothing), a task's `12[7]`, a job's id."""
        out: list[int | str] = []
        for key in keys:
            array = R.array_of_key(key)
            if array is not None:
                out += [array] if array in self.feed.jobs else [str(t.get("ref")) for t in self._tasks(array)]
                continue
            job = self._job(int(key))
            task = job.get("array_id") is not None and job.get("array_index") is not None
            out.append(f"{job['array_id']}[{job['array_index']}]" if task else int(key))
        return out

    def _what(self, keys: list[str]) -> str:
        """`job 12`, `job 12[7]`, `array 12 (100 tasks)`, `3 jobs`, `2 arrays and 1 job`: for questions and notes."""
        arrays = [a for k in keys if (a := R.array_of_key(k)) is not None]
        if len(keys) == 1 and arrays:
            tasks = len(self._tasks(arrays[0]))
            return f"array {arrays[0]} ({tasks} task{'s' * (tasks != 1)})"
        if len(keys) == 1:
            return f"job {self._refs(keys)[0]}"
        jobs = len(keys) - len(arrays)
        counts = [(len(arrays), "array"), (jobs, "job")]
        return " and ".join(f"{n} {word}{'s' * (n != 1)}" for n, word in counts if n)

    def _task_of(self, key: str | None, what: str) -> str | None:
        """The job a row names for what acts on one job: an array's row gives its most pressing task, and says so."""
        array = None if key is None else R.array_of_key(key)
        if array is None:
            return key
        tasks = self._tasks(array)
        if not tasks:
            return None
        lead = R.array_lead(tasks, self.clock())
        self.notify(f"array {array}: {what} task {lead.get('ref')}, its most pressing; `t` lists every task", timeout=5)
        return str(lead["id"])

    def _tasks_only(self, keys: list[str], verb: str) -> list[str]:
        """`keys` less the arrays' rows, with a word on those: `verb` works on tasks one by one."""
        arrays = [str(a) for k in keys if (a := R.array_of_key(k)) is not None]
        if arrays:
            text = f"{verb} works on one task at a time: `t` lists the tasks of array {', '.join(arrays)}"
            self.notify(text, title=verb, severity="warning")
        return [k for k in keys if R.array_of_key(k) is None]

    def _confirmed(self, question: str, detail: str, then: Callable[[], Any]) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                then()

        self.push_screen(ConfirmDialog(question, detail), answered)


def _plural(items: list[str], word: str) -> str:
    return f"{word} {items[0]}" if len(items) == 1 else f"{len(items)} {word}s"
