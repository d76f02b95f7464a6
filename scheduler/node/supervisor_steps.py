"""The detached run supervisor: node side, standard library only, Python 3.8.

`_supervise` runs in the grandchild that action `start` detaches: it runs the steps one after another, each in
its own process group with its output in output.log (kept under the job's output_limit by a thread of
supervisor_output.py), handles the stop (SIGTERM, the grace period, SIGKILL) and keeps status.json up to date
(see "Steps" and "status.json" in supervisor.py). Bundled into the supervisor script (`scheduler/node/bundle.py`):
it imports only the standard library and the other bundled modules (lines marked "# bundled", dropped from the
bundle).
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, Optional, Tuple  # noqa: F401  (used in type comments: this file runs on Python 3.8)

from ftconsole.scheduler.node.proc import start_time  # bundled
from ftconsole.scheduler.node.supervisor_container import (  # bundled
    container_argv,
    container_expanded,
    container_gpu_env,
    container_mount_problem,
    container_remove,
    image_present,
    image_pull_argv,
    image_pulled,
)
from ftconsole.scheduler.node.supervisor_files import STATUS, _expand, _read_json, _tilde, _write_json  # bundled
from ftconsole.scheduler.node.supervisor_leftovers import LEFTOVER_GRACE_S, end_leftovers  # bundled
from ftconsole.scheduler.node.supervisor_output import output_watch  # bundled
from ftconsole.scheduler.node.supervisor_scan import _last_line  # bundled


def _ours(steps):
    """{FT_JOB_ID, FT_ATTEMPT} of the run, as its command's env gives them (None where it has no such env)."""
    for step in reversed(steps):
        env = step.get("env") or {}
        if env.get("FT_JOB_ID") and env.get("FT_ATTEMPT"):
            return {"FT_JOB_ID": str(env["FT_JOB_ID"]), "FT_ATTEMPT": str(env["FT_ATTEMPT"])}
    return None


def _child_env(step):
    env = dict(os.environ)
    env.update({str(k): _tilde(str(v)) for k, v in (step.get("env") or {}).items()})
    return env


def _container(step):
    """The step's container (see supervisor_container.py) with ~ expanded in its paths, or None."""
    container = step.get("container")
    return None if container is None else container_expanded(container)


def _in_container(step, container, argv, env, workdir, run_dir, log):
    """The argv that runs the step (a pull, or the command in its container), or (None, error) or (0, None)
    when there is nothing to run: the image is there already."""
    problem = container_mount_problem(container, run_dir)
    if problem is not None:
        return None, problem
    if step["kind"] == "pull":
        if image_present(container):
            log.write(("ftconsole: image %s is on this node: not pulled\n" % container["image"]).encode())
            return 0, None
        pull = image_pull_argv(container)
        if pull is None:
            return None, "image %s is not on this node" % container["image"]
        log.write(("ftconsole: pulling image %s\n" % container["image"]).encode())  # docker's errors omit it
        return pull, None
    if container["runtime"] != "apptainer":
        container["cidfile"] = os.path.join(run_dir, container["name"] + ".cid")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(container["cidfile"])  # the runtime refuses to write over one
    env["CUDA_VISIBLE_DEVICES"] = container_gpu_env(container)
    names = step.get("env") or {}
    return container_argv(container, argv, names, workdir, os.getuid(), os.getgid()), None


def _steps(params):
    if params.get("steps") is not None:
        return params["steps"]
    return [{"kind": "command", "name": "command", "argv": params["argv"], "env": params.get("env") or {}}]


def _label(step):
    return "task " + step["name"] if step["kind"] == "task" else step["name"]


def _header(step):
    if step["kind"] == "task":
        return "== ftconsole: task %s (%d/%d) ==\n" % (step["name"], step["index"] + 1, step["count"])
    return "== ftconsole: %s ==\n" % step["name"]


def _how(code):
    return "killed by %s" % signal.Signals(-code).name if code < 0 else "exited with code %d" % code


def _supervise(run_dir, params):
    """Runs in the detached grandchild: run the steps in turn, record their life in status.json; at the end, stop
    what the run left running (`end_leftovers`)."""
    status_path = os.path.join(run_dir, STATUS)
    status = _read_json(status_path) or {}
    grace = float(params.get("grace") or 30)
    workdir = _expand(params.get("workdir") or "~")
    if params.get("workdir", "~") == "~" and not os.path.isdir(workdir):  # as slurmd does for a missing home
        workdir = "/tmp"
        notice = "ftconsole: no home folder %s: running in /tmp\n" % _expand("~")
    else:
        notice = None
    steps = _steps(params)
    state = {"child": None, "kind": None, "container": None, "stopping": False, "killed": False, "leader_kill": False}  # type: Dict[str, Any]

    def signal_child(sig):
        child = state["child"]
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, sig)

    def terminate():
        """A stop's signal to the step: SIGTERM to its group, its own process SIGKILLed first where the step says
        (`leader_kill`: DeepSpeed's runner, whose SIGTERM handler would pkill other jobs' launchers)."""
        child = state["child"]
        if child is not None and state["leader_kill"]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
        signal_child(signal.SIGTERM)

    def on_stop(signum, frame):
        if state["stopping"]:
            return
        state["stopping"] = True
        status["stop_requested"] = time.time()
        _write_json(status_path, status)
        if state["kind"] != "after":  # the after hook is not interrupted: the grace period bounds it
            terminate()
        signal.signal(signal.SIGALRM, on_grace_over)
        signal.setitimer(signal.ITIMER_REAL, grace)

    def on_grace_over(signum, frame):
        state["killed"] = True
        signal_child(signal.SIGKILL)
        if state["container"] is not None:
            container_remove(state["container"])  # the client is gone: its container would run on

    def run(step):
        """(returncode, None) once the step ended, or (None, error) when it could not start."""
        state["kind"], state["leader_kill"] = step["kind"], bool(step.get("leader_kill"))
        argv = [_tilde(a) for a in step["argv"]]
        if step["kind"] == "data" and sys.executable:
            argv[0] = sys.executable  # the interpreter the scheduler runs node-side programs with (ssh.python)
        env = _child_env(step)
        container = _container(step)
        if container is not None:
            argv, error = _in_container(step, container, argv, env, workdir, run_dir, log)
            if not isinstance(argv, list):
                if error is not None:
                    log.write(("ftconsole: %s\n" % error).encode())
                return argv, error
            if step["kind"] != "pull":
                state["container"] = container
                status["container"] = {k: container.get(k) for k in ("runtime", "path", "name", "cidfile")}
        try:
            child = subprocess.Popen(
                argv,
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except (OSError, ValueError) as exc:
            error = "cannot start %s: %s" % (step["argv"][0], exc)
            log.write(("ftconsole: %s\n" % error).encode())
            return None, error
        state["child"] = child
        status.update(
            state="running", pid=child.pid, pgid=child.pid, pid_start=start_time(child.pid), step=step["name"]
        )
        status.setdefault("started", time.time())
        _write_json(status_path, status)
        if state["stopping"] and step["kind"] != "after":  # the stop came while it was being started
            terminate()
        code = child.wait()
        state["child"] = None
        # the process group may outlive its leader: finish it off so nothing of the step is left behind
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        if state["container"] is not None:
            container_remove(state["container"])  # --rm's own removal may not have happened (a kill)
            state["container"] = None
        elif container is not None and code == 0:
            image_pulled(container)
        return code, None

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    log_path = os.path.join(run_dir, "output.log")
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    log = os.fdopen(log_fd, "ab", buffering=0)  # open for the whole run
    # O_APPEND: after a cut (the job's output_limit, supervisor_output.py) the ranks' writes go to the new end
    watch = output_watch(log_fd, params.get("output_limit") or 0)
    if notice:
        log.write(notice.encode())
    outcome = (None, "stopped before the command started")  # type: Tuple[Optional[int], Optional[str]]
    failed = False
    for step in steps:
        if step["kind"] == "after":
            if state["killed"]:
                continue
        elif failed or state["stopping"]:
            continue
        if len(steps) > 1:
            log.write(_header(step).encode())
        mark = log.tell()
        code, error = run(step)
        if code and step["kind"] in ("data", "pull", "before"):  # a step that stops the run first: its last words
            error = "%s %s: %s" % (_label(step), _how(code), _last_line(log_path, mark) or "no output")
        if code and len(steps) > 1:
            log.write(("ftconsole: %s %s\n" % (_label(step), _how(code))).encode())
        if step["kind"] == "after":
            continue  # its failure is logged, it does not change the run's outcome
        if step["kind"] not in ("data", "pull", "before") or code != 0:
            outcome = (code, error)
        failed = code != 0
    # a stopped run's leftovers get what is left of its grace period (ranks DeepSpeed's runner started here, which
    # its SIGKILL spared: Step.leader_kill), a run that ended by itself the short one: what is left then is a shell's
    rest = (status.get("stop_requested") or 0) + grace - time.time() if state["stopping"] else LEFTOVER_GRACE_S
    left = end_leftovers(_ours(steps), max(1.0, rest))
    if left:
        log.write(("ftconsole: %d process(es) started over SSH in this run's environment (a shell, or what it left "
                   "running) stopped as the run ended\n" % left).encode())  # fmt: skip
    if watch is not None:
        watch.stop()
    log.close()
    code, error = outcome
    status.update(ended=time.time())
    if code is None:
        status.update(state="failed", error=error)
    elif code < 0:
        status.update(state="exited", exit_code=None, signal=signal.Signals(-code).name, error=error)
    else:
        status.update(state="exited", exit_code=code, signal=None, error=error)
    _write_json(status_path, status)
