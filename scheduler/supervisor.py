"""The run supervisor: node side, standard library only, Python 3.8.

Sent like the probe agent, to `python3 -` over SSH with one prepended line that sets PARAMS (a JSON
document in a Python string literal). PARAMS["action"] is one of:

start   {run_dir, argv, env, workdir, files, grace, steps?}
        Create the run folder, write the files (hostfile...), argv.json and env.json (the main command), and
        steps.json when steps are given, then detach a supervisor (double fork, new session, stdio on
        /dev/null) that runs the steps one after another, each in its own process group, with stdout and
        stderr in output.log, and keeps status.json up to date. Without steps, the run is one step: argv with
        env. Idempotent: a run folder that already has a status.json is never started again; its status is
        returned instead.
prepare {run_dir, argv, env, files, steps?}
        Write the run folder (files, argv.json, env.json, steps.json) without starting anything: the ranks of
        an MPI job that mpirun starts itself, so a debug shell on them still finds the hostfile and env.
status  {root} or {run_dirs}
        Every run under root (<root>/<job>/<attempt>/<rank>/status.json), or only the given run folders, in
        one JSON document; a run whose supervisor died without writing an end reads state "lost". A given
        run folder without status.json reads state "absent". Each status also carries output_mtime and
        output_size, output.log's mtime (epoch seconds) and size, once there is one: the progress heartbeat.
port    {}
        A TCP port free on this node now (bound to port 0 and released), for MASTER_PORT.
stop    {run_dirs, grace?}
        Ask each run's supervisor to stop: it sends SIGTERM to the current step's process group (not to the
        after hook's), runs no further step but the after hook, and once the grace period (counted from the
        stop) is over SIGKILLs whatever still runs, the after hook included, and skips the after hook if it
        has not started. Returns at once.

Steps: [{"kind": "before"|"command"|"task"|"after", "name", "argv", "env", "index"?, "count"?}], in order:
the before hook, the command or a batch job's tasks (`index` 0-based of `count`), the after hook. A before,
command or task step that fails (non-zero exit, signal, cannot start) ends the sequence with its result; the
after step runs whatever the outcome (not after a SIGKILL) and its failure is only logged. With more than one
step, output.log gets a header line before each (`== ftconsole: task NAME (i/N) ==`, `== ftconsole: before
hook ==`) and a line for a step that failed (`ftconsole: task NAME exited with code N`, `... killed by SIGTERM`).

status.json: {"state": "starting"|"running"|"exited"|"failed", "supervisor_pid", "pid", "pgid", "step",
"started", "ended", "exit_code", "signal", "stop_requested", "error"}; pid, pgid and step are the current (at
the end: the last) step's, exit_code and signal the failing step's, else the last command or task's. Each
action prints one JSON line.

Paths: run_dir, workdir, argv entries and env values that start with "~/" are expanded with the node's HOME.
"""

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple  # noqa: F401  (used in type comments: this file runs on Python 3.8)

PROTOCOL = 1
STATUS = "status.json"
_WRITES = itertools.count()


def _expand(path):
    return os.path.abspath(os.path.expanduser(path))


def _write_json(path, doc):
    tmp = "%s.%d.tmp" % (path, next(_WRITES))  # a stop handler may write while the main flow is writing
    with open(tmp, "w") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    os.replace(tmp, path)


def _read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _alive(pid):
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


# -- start -----------------------------------------------------------------------------------------------------


def _prepare(run_dir, params):
    os.makedirs(run_dir, exist_ok=True)
    for name, content in sorted((params.get("files") or {}).items()):
        target = os.path.normpath(os.path.join(run_dir, name))
        if not target.startswith(run_dir + os.sep):
            raise ValueError("file outside the run folder: %r" % name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w") as fh:
            fh.write(content)
    _write_json(os.path.join(run_dir, "argv.json"), params["argv"])
    _write_json(os.path.join(run_dir, "env.json"), params.get("env") or {})
    if params.get("steps") is not None:
        _write_json(os.path.join(run_dir, "steps.json"), params["steps"])


def _tilde(value):
    return os.path.expanduser(value) if value.startswith("~/") else value


def _child_env(step):
    env = dict(os.environ)
    env.update({str(k): _tilde(str(v)) for k, v in (step.get("env") or {}).items()})
    return env


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
    """Runs in the detached grandchild: run the steps in turn, record their life in status.json."""
    status_path = os.path.join(run_dir, STATUS)
    status = _read_json(status_path) or {}
    grace = float(params.get("grace") or 30)
    workdir = _expand(params.get("workdir") or "~")
    steps = _steps(params)
    state = {"child": None, "kind": None, "stopping": False, "killed": False}  # type: Dict[str, Any]

    def signal_child(sig):
        child = state["child"]
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, sig)

    def on_stop(signum, frame):
        if state["stopping"]:
            return
        state["stopping"] = True
        status["stop_requested"] = time.time()
        _write_json(status_path, status)
        if state["kind"] != "after":  # the after hook is not interrupted: the grace period bounds it
            signal_child(signal.SIGTERM)
        signal.signal(signal.SIGALRM, on_grace_over)
        signal.setitimer(signal.ITIMER_REAL, grace)

    def on_grace_over(signum, frame):
        state["killed"] = True
        signal_child(signal.SIGKILL)

    def run(step):
        """(returncode, None) once the step ended, or (None, error) when it could not start."""
        state["kind"] = step["kind"]
        try:
            child = subprocess.Popen(
                [_tilde(a) for a in step["argv"]],
                cwd=workdir,
                env=_child_env(step),
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
        status.update(state="running", pid=child.pid, pgid=child.pid, step=step["name"])
        status.setdefault("started", time.time())
        _write_json(status_path, status)
        if state["stopping"] and step["kind"] != "after":  # the stop came while it was being started
            signal_child(signal.SIGTERM)
        code = child.wait()
        state["child"] = None
        # the process group may outlive its leader: finish it off so nothing of the step is left behind
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        return code, None

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    log = open(os.path.join(run_dir, "output.log"), "ab", buffering=0)  # noqa: SIM115  (open for the whole run)
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
        code, error = run(step)
        if code and len(steps) > 1:
            log.write(("ftconsole: %s %s\n" % (_label(step), _how(code))).encode())
        if step["kind"] == "after":
            continue  # its failure is logged, it does not change the run's outcome
        if step["kind"] != "before" or code != 0:
            outcome = (code, error)
        failed = code != 0
    log.close()
    code, error = outcome
    status.update(ended=time.time())
    if code is None:
        status.update(state="failed", error=error)
    elif code < 0:
        status.update(state="exited", exit_code=None, signal=signal.Signals(-code).name)
    else:
        status.update(state="exited", exit_code=code, signal=None)
    _write_json(status_path, status)


def start(params):
    run_dir = _expand(params["run_dir"])
    status_path = os.path.join(run_dir, STATUS)
    existing = _read_json(status_path)
    if existing is not None:
        return {"started": False, "run_dir": run_dir, "status": existing}
    _prepare(run_dir, params)
    _write_json(status_path, {"state": "starting", "supervisor_pid": None, "stop_requested": None})
    pid = os.fork()
    if pid == 0:  # first child: new session, fork again so the supervisor is not a session leader
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        _detach_stdio()
        status = _read_json(status_path) or {}
        status["supervisor_pid"] = os.getpid()
        _write_json(status_path, status)
        try:
            _supervise(run_dir, params)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    deadline = time.time() + 10
    status = _read_json(status_path) or {}
    while status.get("state") == "starting" and time.time() < deadline:
        time.sleep(0.01)
        status = _read_json(status_path) or {}
    return {"started": True, "run_dir": run_dir, "status": status}


def prepare(params):
    run_dir = _expand(params["run_dir"])
    _prepare(run_dir, params)
    return {"run_dir": run_dir}


def free_port(params):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return {"port": sock.getsockname()[1]}


def _detach_stdio():
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


# -- status and stop -------------------------------------------------------------------------------------------


def _with_liveness(status):
    if status.get("state") in ("starting", "running") and not _alive(status.get("supervisor_pid")):
        status = dict(status, state="lost")
    return status


def _with_output(run_dir, status):
    """The status with output.log's mtime and size (a run that prints is making progress)."""
    try:
        st = os.stat(os.path.join(run_dir, "output.log"))
    except OSError:
        return status
    return dict(status, output_mtime=st.st_mtime, output_size=st.st_size)


def runs(params):
    out = []  # type: List[Dict[str, Any]]
    if params.get("run_dirs") is not None:
        for given in params["run_dirs"]:
            run_dir = _expand(given)
            status = _read_json(os.path.join(run_dir, STATUS))
            status = _with_output(run_dir, _with_liveness(status)) if status is not None else {"state": "absent"}
            parts = run_dir.rstrip("/").split("/")
            out.append({"run_dir": given, "job": parts[-3], "attempt": parts[-2], "rank": parts[-1], "status": status})
        return {"runs": out}
    root = _expand(params.get("root") or "~/.ftconsole/runs")
    if not os.path.isdir(root):
        return {"root": root, "runs": out}
    for job in sorted(os.listdir(root)):
        job_dir = os.path.join(root, job)
        if not os.path.isdir(job_dir):
            continue
        for attempt in sorted(os.listdir(job_dir)):
            attempt_dir = os.path.join(job_dir, attempt)
            if not os.path.isdir(attempt_dir):
                continue
            for rank in sorted(os.listdir(attempt_dir)):
                run_dir = os.path.join(attempt_dir, rank)
                status = _read_json(os.path.join(run_dir, STATUS))
                if status is not None:
                    status = _with_output(run_dir, _with_liveness(status))
                    out.append({"job": job, "attempt": attempt, "rank": rank, "status": status})
    return {"root": root, "runs": out}


def stop(params):
    out = []  # type: List[Dict[str, Any]]
    for run_dir in params.get("run_dirs") or []:
        run_dir = _expand(run_dir)
        status = _read_json(os.path.join(run_dir, STATUS))
        if status is None:
            out.append({"run_dir": run_dir, "signalled": False, "reason": "no such run"})
            continue
        pid = status.get("supervisor_pid")
        if status.get("state") not in ("starting", "running") or not _alive(pid):
            out.append({"run_dir": run_dir, "signalled": False, "reason": "not running"})
            continue
        os.kill(pid, signal.SIGTERM)
        out.append({"run_dir": run_dir, "signalled": True})
    return {"stopped": out}


ACTIONS = {"start": start, "prepare": prepare, "status": runs, "stop": stop, "port": free_port}


def main(params):
    action = ACTIONS.get(params.get("action"))
    if action is None:
        doc = {"supervisor": PROTOCOL, "error": "unknown action %r" % params.get("action")}
    else:
        try:
            doc = dict(action(params), supervisor=PROTOCOL)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            doc = {"supervisor": PROTOCOL, "error": "%s: %s" % (type(exc).__name__, exc)}
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return 0 if "error" not in doc else 1


if __name__ == "__main__":
    _params = globals().get("PARAMS")
    if _params is None:
        _params = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    sys.exit(main(_params))
