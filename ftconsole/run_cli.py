"""`ftconsole run JOB -- COMMAND [ARGS...]`: a step in a running job, as Slurm's `srun` inside an allocation.

The scheduler picks the step's nodes and GPUs among the job's (by default all its nodes and all their GPUs; never a
GPU another running step holds, unless --overlap: a step that finds them busy waits, saying so) and plans it in the
launch mode asked (single, pytorch, horovod, mpich...: `scheduler/decide/stepplan.py`). This command then runs each
rank over SSH as the debug terminal does (`ftconsole shell`: as the job's user, in the run folder of the job on that
node, with its env), the step's variables over the run's, streams their output here (`--label`: each line after its
rank) and exits with the highest exit status of the ranks, as srun does. Ctrl-C, or any end of this command before
the step's, cancels the step: the scheduler stops what it left on its nodes. Where the scheduler restarts meanwhile,
the step goes on and this command follows it again once the scheduler is back.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import IO, Any

from ftconsole.scheduler.errors import FtError, NotFound, PermissionDenied, UsageError
from ftconsole.scheduler.serve.client import SocketClient, connect
from ftconsole.scheduler.spec.config import LoadedConfig, find_config, load_config

REATTACH_S = 60.0  # how long this command tries to reach a restarted scheduler again (its STEP_ATTACH_S)
STOP_WAIT_S = 5.0  # after Ctrl-C: how long the ssh clients have to end before SIGKILL
NO_FOLDER_EXIT = 2  # scheduler/ssh/shell.py's: the run folder (or the step's workdir) is not there


class StepCancelled(FtError):
    title = "run"


def workdir_line(workdir: str) -> str:
    """POSIX sh that enters the job's workdir on the node: "~" is the user's home (/tmp where it has none, as for
    the job's ranks), "~/x" a folder in it."""
    if workdir == "~":
        return 'cd "$HOME" 2>/dev/null || cd /tmp'
    if workdir.startswith("~/"):
        return f'cd "$HOME"/{shlex.quote(workdir[2:])} || exit {NO_FOLDER_EXIT}'
    return f"cd {shlex.quote(workdir)} || exit {NO_FOLDER_EXIT}"


def step_script(rank: dict[str, Any]) -> str:
    """What one rank of a step runs in the job's run folder (its env.json loaded): the step's folder and files, its
    env over the run's, its workdir, then its command. Every value quoted."""
    folder = rank["step_dir"]
    lines = [f"mkdir -p {shlex.quote(folder)} || exit {NO_FOLDER_EXIT}"]
    for name, text in sorted(rank["files"].items()):
        lines.append(f"printf %s {shlex.quote(text)} > {shlex.quote(folder + '/' + name)} || exit {NO_FOLDER_EXIT}")
    if rank["env"]:
        lines.append("export " + " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(rank["env"].items())))
    lines.append(workdir_line(rank["workdir"]))
    lines.append("exec " + shlex.join(rank["argv"]))
    return "\n".join(lines)


def rank_argv(loaded: LoadedConfig, rank: dict[str, Any], owner: str) -> list[str]:
    """The system ssh client's argv that runs a rank of a step on its node, as the debug terminal's."""
    from ftconsole.scheduler.ssh.shell import job_remote_command, ssh_argv, ssh_options  # the ssh layer: here only

    nodes = {n.name: n for n in loaded.cluster.node_list()}
    node = nodes.get(rank["node"])
    if node is None:
        raise UsageError(f"node {rank['node']} of the step is not in {loaded.file}: is this the scheduler's config?")
    options = ssh_options(loaded)
    user = owner if loaded.cluster.scheduler.run_as == "submitter" else ""
    remote = job_remote_command(rank["run_dir"], banner="", command=step_script(rank), python=options.python, user=user)
    return ssh_argv(options, node, remote, tty=False)


async def _pump(reader: asyncio.StreamReader, out: IO[bytes], label: bytes) -> None:
    """Copy a rank's output here, each line after its label."""
    rest = b""
    while chunk := await reader.read(65536):
        *lines, rest = (rest + chunk).split(b"\n")
        if lines:
            out.write(b"".join(label + line + b"\n" for line in lines))
            out.flush()
    if rest:
        out.write(label + rest + b"\n")
        out.flush()


class StepRun:
    """One `ftconsole run`: the step's stream, its ranks' ssh clients, and how it ends."""

    def __init__(self, loaded: LoadedConfig, args: argparse.Namespace) -> None:
        self.loaded = loaded
        self.args = args
        self.job = str(args.job)
        self.number = 0
        self.procs: list[asyncio.subprocess.Process] = []
        self.pumps: list[asyncio.Task[None]] = []
        self.interrupted = asyncio.Event()

    def say(self, text: str) -> None:
        if not self.args.quiet:
            print(f"ftconsole: {text}", file=sys.stderr, flush=True)

    async def _client(self) -> SocketClient:
        client = await connect(self.loaded)
        if client is None:
            raise UsageError("run needs a running scheduler (ftconsole serve, or an open console): it gives the step "
                             "its nodes and GPUs")  # fmt: skip
        return client

    async def main(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, self.interrupted.set)
        client = await self._client()
        try:
            ask = {"argv": self.args.command, "mode": self.args.mode, "nodes": self.args.nodes,
                   "gpus_per_node": self.args.gpus_per_node, "overlap": self.args.overlap}  # fmt: skip
            stream = client.stream("step", job=self.job, **ask)
            plan = await self._planned(stream)
            if plan is None:
                return 130
            self.number = int(plan["step"])
            await self._start(plan)
            return await self._follow(client, stream)
        finally:
            await self._end_procs()
            await client.close()

    async def _planned(self, stream: AsyncIterator[Any]) -> dict[str, Any] | None:
        """The step's plan once the scheduler gives it (its waits said on stderr); None when interrupted first."""
        while True:
            item = await _first(anext(stream), self.interrupted)
            if item is None:
                return None
            if "waiting" in item:
                self.say(f"step waiting: {item['waiting']}")
                continue
            return dict(item)

    async def _start(self, plan: dict[str, Any]) -> None:
        launching = [r for r in plan["ranks"] if r["launch"]]
        where = " ".join(f"{r['node']}:{','.join(str(g) for g in _gpus(r)) or '-'}" for r in plan["ranks"])
        self.say(f"step {self.job}.{self.number} on {where}")
        label = self.args.label
        for i, rank in enumerate(launching):
            argv = rank_argv(self.loaded, rank, plan["owner"])
            pipe = asyncio.subprocess.PIPE if label else None
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=None if i == 0 else asyncio.subprocess.DEVNULL,  # srun's: the input goes to the first rank
                stdout=pipe,
                stderr=pipe,
                start_new_session=True,  # Ctrl-C is this command's to act on, not the ssh clients'
            )
            self.procs.append(proc)
            if label:
                tag = f"{rank['rank']}: ".encode()
                assert proc.stdout is not None and proc.stderr is not None
                self.pumps += [asyncio.create_task(_pump(proc.stdout, sys.stdout.buffer, tag)),
                               asyncio.create_task(_pump(proc.stderr, sys.stderr.buffer, tag))]  # fmt: skip

    async def _follow(self, client: SocketClient, stream: AsyncIterator[Any]) -> int:
        """Wait for the ranks (then say how they ended), the step's end elsewhere (its job ended), or Ctrl-C."""
        ranks: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*(p.wait() for p in self.procs), *self.pumps))
        ended: asyncio.Future[Any] = asyncio.ensure_future(_ended(stream))
        stop: asyncio.Future[Any] = asyncio.ensure_future(self.interrupted.wait())
        try:
            while True:
                await asyncio.wait({ranks, ended, stop}, return_when=asyncio.FIRST_COMPLETED)
                if ranks.done():
                    codes = [p.returncode if p.returncode is not None else 1 for p in self.procs]
                    codes = [c if c >= 0 else 128 - c for c in codes]  # killed by a signal: as the shell says it
                    step = await self._report(client, codes)
                    if step is not None and step["state"] == "cancelled":
                        self.say(f"step {self.job}.{self.number} cancelled: {step['message']}")
                    return max(codes)
                if stop.done():
                    self.say(f"step {self.job}.{self.number} interrupted: cancelled, its processes are stopped")
                    return 130
                if ended.exception() is None:
                    step = ended.result()
                    if step is None or step["state"] == "running":
                        ended = asyncio.ensure_future(self._attach_again())
                        continue
                    why = step.get("message") or step["state"]
                    self.say(f"step {self.job}.{self.number} {step['state']}: {why}")
                    return int(step["exit_code"]) if step.get("exit_code") else 1
                lost = ended.exception()
                if isinstance(lost, (UsageError, NotFound, PermissionDenied)):  # the step is over, or not ours
                    self.say(f"step {self.job}.{self.number}: {lost}")
                    return 1
                self.say(f"the scheduler went away ({lost}): following the step again once it is back")
                await asyncio.sleep(1.0)
                ended = asyncio.ensure_future(self._attach_again())
        finally:
            for task in (ranks, ended, stop):
                task.cancel()
            await asyncio.gather(ranks, ended, stop, return_exceptions=True)

    async def _attach_again(self) -> dict[str, Any] | None:
        """Follow the step again through a scheduler that is back (a restart); what `_ended` gives, or an FtError
        when none answered within REATTACH_S."""
        deadline = time.monotonic() + REATTACH_S
        while True:
            try:
                client = await self._client()
            except FtError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(1.0)
                continue
            try:
                stream = client.stream("step", job=self.job, attach=self.number)
                await anext(stream)  # {"step", "attached"}
                self.say(f"following step {self.job}.{self.number} again")
                return await _ended(stream)
            finally:
                await client.close()

    async def _report(self, client: SocketClient, codes: list[int]) -> dict[str, Any] | None:
        """Tell the scheduler how the ranks ended (again through a restarted one, within REATTACH_S); the step as
        recorded."""
        deadline = time.monotonic() + REATTACH_S
        while True:
            try:
                return dict(await client.call("step_end", job=self.job, step=self.number, codes=codes))
            except (OSError, FtError) as exc:
                if isinstance(exc, UsageError) or time.monotonic() >= deadline:
                    self.say(f"cannot record how step {self.job}.{self.number} ended: {exc}")
                    return None
                await asyncio.sleep(1.0)
                with contextlib.suppress(FtError):
                    client = await self._client()

    async def _end_procs(self) -> None:
        """The ssh clients still running (Ctrl-C, an error): SIGTERM, SIGKILL after STOP_WAIT_S. What they started on
        the nodes is the scheduler's to stop (the step is cancelled when this command's stream closes)."""
        alive = [p for p in self.procs if p.returncode is None]
        for proc in alive:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in alive)), STOP_WAIT_S)
        except TimeoutError:
            for proc in alive:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            await asyncio.gather(*(p.wait() for p in alive))
        for pump in self.pumps:
            pump.cancel()
        await asyncio.gather(*self.pumps, return_exceptions=True)


def _gpus(rank: dict[str, Any]) -> list[str]:
    value = rank["env"].get("CUDA_VISIBLE_DEVICES", "")
    return [g for g in value.split(",") if g]


async def _first(item: Any, interrupted: asyncio.Event) -> Any:
    """The awaitable's result, or None once `interrupted` is set first."""
    got = asyncio.ensure_future(item)
    stop = asyncio.ensure_future(interrupted.wait())
    await asyncio.wait({got, stop}, return_when=asyncio.FIRST_COMPLETED)
    stop.cancel()
    if not got.done():
        got.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await got
        return None
    return got.result()


async def _ended(stream: AsyncIterator[Any]) -> dict[str, Any] | None:
    """The step as it ended, once the scheduler says so; None when its stream ended without saying."""
    async for item in stream:
        if "ended" in item:
            return dict(item["ended"])
    return None


def cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0].startswith("-"):  # options after JOB: they end at "--"
        if "--" not in command:
            raise UsageError("give the command after --: ftconsole run JOB [OPTIONS] -- COMMAND [ARGS...]")
        cut = command.index("--")
        after = argparse.ArgumentParser(prog="ftconsole run JOB", add_help=False)
        _options(after)
        args = after.parse_args(command[:cut], namespace=args)
        command = command[cut + 1 :]
    if not command:
        raise UsageError("a step needs a command: ftconsole run JOB -- COMMAND [ARGS...]")
    args.command = command
    loaded = load_config(find_config(args.config))
    return asyncio.run(StepRun(loaded, args).main())


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "run",
        parents=[common],
        help="run a step in a running job, an allocation (srun): its output here, its exit status ours",
        description="Run COMMAND as a step of a running job of yours (an allocation: ftconsole alloc --keep), on "
        "its nodes and GPUs, as you, in the job's run folder with its env and the step's (FT_STEP, and the launch "
        "mode's MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, CUDA_VISIBLE_DEVICES). Steps side by side never share "
        "a GPU (unless --overlap): one that finds too few free waits. Output streams here; the exit status is the "
        "highest of the ranks'. Ctrl-C cancels the step and stops its processes on the nodes.",
    )
    p.add_argument("job", metavar="JOB", help="the running job (allocation) to run in")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command and its arguments")
    _options(p)
    p.set_defaults(func=cmd_run)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nodes", "-N", type=int, help="on how many of the job's nodes (default: 1 in mode single, else all)"
    )
    p.add_argument("--gpus-per-node", type=int, metavar="G", help="GPUs on each node (default: all the job has there)")
    p.add_argument("--mode", default="single", metavar="MODE",
                   help="launch mode, as a job's: single (default: one node), pytorch, pytorch-deepspeed, horovod, "
                   "mpich, tensorflow")  # fmt: skip
    p.add_argument("--overlap", action="store_true", help="share GPUs with the other steps (srun --overlap)")
    p.add_argument("--label", "-l", action="store_true", help="each output line after its rank (srun --label)")
    p.add_argument("--quiet", "-q", action="store_true", help="say nothing of the step itself on stderr")
