"""The run supervisor: node side, standard library only, Python 3.8.

Sent like the probe agent, to `python3 -` over SSH with one prepended line that sets PARAMS (a JSON
document in a Python string literal). PARAMS["action"] is one of:

start   {run_dir, token?, argv, env, workdir, files, grace, steps?, output_limit?}
        Claim the run folder for `token` (the attempt's token: see "Identity" below), write the files
        (hostfile...), argv.json and env.json (the main command), and steps.json when steps are given, then
        detach a supervisor (double fork, new session, stdio on /dev/null) that runs the steps one after
        another, each in its own process group, with stdout and stderr in output.log, and keeps status.json up
        to date. Without steps, the run is one step: argv with env. Idempotent: a run folder that already has
        a status.json is never started again; its status is returned instead. A folder claimed by another
        token is refused ({"started": false, "refused": why}): never adopted, never started. With
        output_limit (bytes), output.log is kept under it, its oldest output dropped (supervisor_output.py).
prepare {run_dir, argv, env, files, steps?}
        Write the run folder (files, argv.json, env.json, steps.json) without starting anything: the ranks of
        an MPI job that mpirun starts itself, so a debug shell on them still finds the hostfile and env. A file
        named "../NAME" goes into the attempt's folder, beside the rank's (container.py, see container_exec).
status  {root, prune?} or {run_dirs, tokens?, prune?}
        Every run under root (<root>/<job>/<attempt>/<rank>/status.json), or only the given run folders, in
        one JSON document (see "Liveness" for the states it adds). A given run folder without status.json
        reads state "absent"; one claimed by another token than the one asked for reads "foreign". Each
        status also carries output_mtime and output_size, output.log's mtime (epoch seconds) and size, once
        there is one: the progress heartbeat. With prune {run_root, cluster, retention, keep, tokens}, the
        folders of ended attempts older than the retention are removed first (see "Retention"); the answer
        lists them in "pruned" (as "<job>/<attempt>"), and a prune that fails says why in "prune_error"
        without failing the read.
signal  {run_dirs, tokens?, signal}
        Send the signal (a name, e.g. SIGUSR1: the checkpoint signal) to the process group of each run's
        current step, when it runs; each answer says whether it was signalled.
port    {}
        A TCP port free on this node now (bound to port 0 and released), for MASTER_PORT.
channel {}
        Stay: answer requests read from stdin (each a line {"id", "params"}: the PARAMS of one of these
        actions) until stdin closes, and push what changes in the runs of the last status read (channel.py).
read    {path, offset?, limit, tail?}
        Up to `limit` bytes of a file (a run's output.log) from `offset`, or with `tail` from where its last
        `tail` lines start: {"exists", "offset", "data" (base64), "end"}, offsets counting the output dropped
        by its output_limit (supervisor_output.py: a read from a dropped offset starts at the file's header).
processes {groups, sample, stacks, py_spy?}
        What the processes of each given process group (a rank's step) and their descendants are doing: state,
        wait channel, system call, CPU time moving, threads, and with `stacks` each Python process's stack by
        py-spy (supervisor_evidence.py). Asked as the SSH account: it reads /proc, no run folder.
files   {run_dir}
        argv.json, env.json and hostfile of a run folder as text (None when missing); {"absent": true} when
        there is no such folder.
leftovers {env, signal} / shells {env, warn}
        The signal to what an attempt (or a step) left on this node, once it ended: the user's processes with its
        FT_JOB_ID and FT_ATTEMPT (`env`) that came in through this node's SSH server, and their descendants. `shells`:
        their terminals and when each was last typed at, `warn` written on them first (supervisor_leftovers.py).
stop    {run_dirs, tokens?, force?}
        Ask each run's supervisor to stop: it sends SIGTERM to the current step's process group (not to the
        after hook's), runs no further step but the after hook, and once the grace period (counted from the
        stop) is over SIGKILLs whatever still runs, the after hook included, and skips the after hook if it
        has not started. Returns at once. With `force` (the scheduler's own escalation once the grace period
        is over) and for an orphaned run (its supervisor is dead), SIGKILL goes to the supervisor and to every
        process left in the step's process group. Each answer says whether anything of the run is still alive.

Steps: [{"kind": "data"|"pull"|"before"|"command"|"task"|"after", "name", "argv", "env", "index"?, "count"?,
"container"?}], in order: for a job with an image, its pull (nothing is pulled when the node has it); the data
preparation (the job's data_prep: `scheduler/node/datacopy.py`, run with this supervisor's own interpreter, the
scheduler's ssh.python, in place of argv[0]), the before hook, the command or a batch job's tasks (`index`
0-based of `count`; with an image each in its own container: "container", see supervisor_container, names the
runtime, the image and the container, which is removed once the step ends, on the SIGKILL after the grace period
and by a stop of an orphaned run, status.json's "container" naming it), the after hook. A pull, data, before,
command or task step that fails (non-zero exit, signal, cannot start) ends the sequence with its result (a
pull, data or before step's error quotes its last line of output);
the after step runs whatever the outcome (not after a SIGKILL) and its failure is only logged.
With more than one step, output.log gets a header line before each (`== ftconsole: task NAME (i/N) ==`, `==
ftconsole: before hook ==`) and a line for a step that failed (`ftconsole: task NAME exited with code N`, `...
killed by SIGTERM`).

status.json: {"state": "starting"|"running"|"exited"|"failed", "supervisor_pid", "pid", "pgid", "step",
"started", "ended", "exit_code", "signal", "stop_requested", "error"}; pid, pgid and step are the current (at
the end: the last) step's, exit_code and signal the failing step's, else the last command or task's. Each
action prints one JSON line.

Identity: a run folder is claimed by hard-linking a file holding the token to `claim` (atomic: link fails
when the name exists), and status.json carries the token. A folder with another token's claim, or with a
status.json but no claim at all (not ours), is never started, adopted or signalled.

Liveness: status.json records the node's boot id and, for the supervisor and the step it runs, the pid
with its start time (field 22 of /proc/<pid>/stat). A process is alive only if the boot id is the node's
current one and a process with that pid has that start time; nothing is signalled otherwise (a recycled
pid is someone else's process). A run left "starting" or "running" reads "lost" (with `error` saying why:
the node rebooted, or the supervisor died) once nothing of it is alive, or "orphaned" while its supervisor
is dead but processes of its step's group still run (they hold GPUs: the scheduler kills them with
`stop`, then the run reads "lost").

Nodes: PARAMS["node"] (the scheduler sends every action the name of the node it is asking) is recorded in
status.json at a start, as "node". Nodes may share the run folders (an NFS home) and the kernel (containers on
one host), so an action acts only on runs started for the node it was asked about: a status read of the
root lists only those (and runs that record no node, started by an earlier ftconsole); a given run folder
started for another node reads "foreign"; stop and signal leave another node's runs alone; retention judges
another node's ranks only by what their status.json says (ended, and when), never by this node's processes.

Writes: status.json and the other files are written to a temporary file, fsync'd, then renamed. Every
file of a run folder (env.json holds the job's tokens and keys) is 0600, and the run folder and the folders
this creates above it 0700: other users of the node read none of it.

Retention: an attempt folder <run_root>/<cluster>/<job>/<attempt> is removed only when its "<job>/<attempt>"
is not in keep, no rank's claim or status carries a token in tokens (the scheduler's current attempts), and
every rank in it has ended (status.json says exited, failed or lost, and neither its supervisor nor any
process of its step's group is alive) before now - retention, by the node's clock; a rank folder without
status.json (a rank mpirun starts, a start that never got going) counts when nothing in it changed since
then. Nothing outside <run_root>/<cluster> is touched: names must be plain (no "/", "." or ".."), symbolic
links are never followed, and the folder's real path is checked to lie under the real run root.

Users: with PARAMS["user"] (scheduler.run_as: submitter), the action runs as that account of the node, with its
groups and its home, before it touches anything: the supervisor, every step it starts (hooks, tasks, the
command), its files and its run folder are that user's, and a stop or a read acts with that user's rights only
(a run folder belongs to its user, who may change what is in it: nothing in it is ever acted on as root).
The SSH account switches itself when it is root (initgroups, setgid, setuid: for good), runs on when it is
that user, and otherwise answers {"sudo": user, "account": its own name}: the scheduler then sends the same
action through `sudo -n -u USER`. A user with no account here answers {"no_account": user}. Action `account`
{user} does only that: it answers the user's uid and home, and whether the home is usable ("home_usable": a
folder the user may write in; not so for an account made without one, such as nobody's /nonexistent).

Paths: run_dir, workdir, argv entries and env values that start with "~/" are expanded with the HOME of the
account the action runs as.
Modules: this file holds the actions and `main`; what they share lives beside it, node side too (stdlib only,
Python 3.8): supervisor_files (run folder files, writes, the claim), supervisor_liveness (process identity,
"Liveness"), supervisor_scan (output.log and /proc I/O counters), supervisor_retention ("Retention") and
supervisor_steps (the detached supervisor that runs the steps), supervisor_container (a step's
container) and supervisor_output (output.log's cap). Their imports of each other end in "# bundled":
`scheduler/ssh/runs.py` `supervisor_source()` sends them as one script, each module's source in dependency order
and this file last, without those lines (`scheduler/node/bundle.py`).
"""

import base64
import contextlib
import fcntl
import json
import os
import pwd
import signal
import socket
import sys
import time
from typing import Any, Dict, List, Optional  # noqa: F401  (used in type comments: this file runs on Python 3.8)

from ftconsole.scheduler.node.channel import serve  # bundled
from ftconsole.scheduler.node.proc import _alive, _stat, boot_id, start_time  # bundled
from ftconsole.scheduler.node.supervisor_container import container_remove  # bundled
from ftconsole.scheduler.node.supervisor_evidence import processes  # bundled
from ftconsole.scheduler.node.supervisor_files import (  # bundled
    CLAIM,
    STATUS,
    _claim,
    _expand,
    _private_dirs,
    _read_json,
    _read_status,
    _unreadable,
    _write_file,
    _write_json,
)
from ftconsole.scheduler.node.supervisor_leftovers import shell_ttys, stop_leftovers  # bundled
from ftconsole.scheduler.node.supervisor_liveness import _group, _observe, _process_groups  # bundled
from ftconsole.scheduler.node.supervisor_output import _output_chunk  # bundled
from ftconsole.scheduler.node.supervisor_retention import MAX_PRUNED as MAX_PRUNED  # bundled
from ftconsole.scheduler.node.supervisor_retention import prune  # bundled
from ftconsole.scheduler.node.supervisor_scan import SCAN_BYTES as SCAN_BYTES  # bundled
from ftconsole.scheduler.node.supervisor_scan import _scan, _with_io, _with_output  # bundled
from ftconsole.scheduler.node.supervisor_steps import _supervise  # bundled

PROTOCOL = 2


# -- start -----------------------------------------------------------------------------------------------------


HOOK_DIR = "torch-hook"


def _prepare(run_dir, params):
    _private_dirs(run_dir)
    for name, content in sorted((params.get("files") or {}).items()):
        target = os.path.normpath(os.path.join(run_dir, name))
        attempt = os.path.dirname(run_dir)  # a file of the attempt's, or its torch hook (torch_hook.py)
        attempt_file = name.startswith("../") and os.path.dirname(target) in (attempt, os.path.join(attempt, HOOK_DIR))
        if not (target.startswith(run_dir + os.sep) or attempt_file):
            raise ValueError("file outside the run folder: %r" % name)
        _private_dirs(os.path.dirname(target))
        _write_file(target, content)
    _write_json(os.path.join(run_dir, "argv.json"), params["argv"])
    _write_json(os.path.join(run_dir, "env.json"), params.get("env") or {})
    checkpoints = (params.get("env") or {}).get("FT_CHECKPOINT_DIR")
    if checkpoints:  # the job's, across attempts: made here when it can be (shared storage may refuse)
        with contextlib.suppress(OSError):
            os.makedirs(_expand(checkpoints), 0o700, exist_ok=True)
    if params.get("steps") is not None:
        _write_json(os.path.join(run_dir, "steps.json"), params["steps"])


def start(params):
    run_dir = _expand(params["run_dir"])
    status_path = os.path.join(run_dir, STATUS)
    token = params.get("token")
    if token is not None:
        refused = _claim(run_dir, token)
        if refused is not None:
            return {"started": False, "run_dir": run_dir, "refused": refused}
        lock = os.open(os.path.join(run_dir, CLAIM), os.O_RDONLY)
        fcntl.flock(lock, fcntl.LOCK_EX)  # a start sent again while the first is under way waits for it
    else:  # no identity (the supervisor driven directly, as in its own tests)
        lock = None
    try:
        return _start(run_dir, status_path, token, params, lock)
    finally:  # released here, not at the process's exit: a channel (channel.py) lives on and may start it again
        if lock is not None:
            os.close(lock)


def _start(run_dir, status_path, token, params, lock):
    existing = _read_json(status_path)
    if existing is not None:
        return {"started": False, "run_dir": run_dir, "status": _observe(existing, status_path)}
    _prepare(run_dir, params)
    pid = os.fork()
    if pid == 0:  # first child: new session, fork again so the supervisor is not a session leader
        if lock is not None:
            os.close(lock)
        os.setsid()
        supervisor = os.fork()
        if supervisor != 0:  # status.json appears whole, with the supervisor's identity in it
            boot = boot_id()
            start = start_time(supervisor)
            _write_json(status_path, dict(_STARTING, token=token, node=params.get("node"), boot_id=boot,
                                          supervisor_pid=supervisor, supervisor_start=start))  # fmt: skip
            os._exit(0)
        _detach_stdio()
        deadline = time.time() + 10
        while (_read_json(status_path) or {}).get("supervisor_pid") != os.getpid() and time.time() < deadline:
            time.sleep(0.005)
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
    return {"started": True, "run_dir": run_dir, "status": _observe(status, status_path)}


_STARTING = {"state": "starting", "stop_requested": None}


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


def _other_node(status, params):
    """The node another than the one asked about that the run was started for (None: this node's, or a run
    that records no node, or no node asked about): see "Nodes"."""
    asked, started_for = params.get("node"), status.get("node")
    if asked is None or started_for is None or started_for == asked:
        return None
    return started_for


def runs(params):
    doc = {}  # type: Dict[str, Any]
    if params.get("prune"):
        try:
            doc["pruned"] = prune(params["prune"], params.get("node"))
        except Exception as exc:  # never let retention break the read: it is the node's heartbeat
            doc["prune_error"] = "%s: %s" % (type(exc).__name__, exc)
    doc.update(_runs(params))
    return doc


def _runs(params):
    out = []  # type: List[Dict[str, Any]]
    tokens = params.get("tokens") or {}
    if params.get("run_dirs") is not None:
        seen = {"groups": None, "cgroups": {}}  # type: Dict[str, Any]  # one look at /proc per read
        for given in params["run_dirs"]:
            run_dir = _expand(given)
            try:
                status = _given_status(given, run_dir, tokens.get(given), params, seen)
            except Exception as exc:  # a run that cannot be read is that run's trouble alone, never the node's read
                status = _cannot_read(exc)
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
                try:
                    status, problem = _read_status(os.path.join(run_dir, STATUS))
                    if problem is not None:
                        status = _unreadable(problem)
                    elif status is None or _other_node(status, params) is not None:
                        continue
                    else:
                        status = _with_output(run_dir, _observe(status, os.path.join(run_dir, STATUS)))
                except Exception as exc:  # as above: this run alone
                    status = _cannot_read(exc)
                out.append({"job": job, "attempt": attempt, "rank": rank, "status": status})
    return {"root": root, "runs": out}


def _given_status(given, run_dir, token, params, seen):
    """The status of the run folder `given`, asked for by its attempt's `token` (see action `status`). A status
    file that is unreadable (its user may write anything in it) reads lost: nothing of it is passed on or acted
    on. `seen`: the node's process groups (and containers' cgroups), looked at once per read."""
    status, problem = _read_status(os.path.join(run_dir, STATUS))
    if problem is not None:
        return _unreadable(problem)
    if status is None:
        return {"state": "absent"}
    if token is not None and status.get("token") != token:
        return {"state": "foreign", "error": "the run folder holds another attempt's run (token %s)"
                % status.get("token")}  # fmt: skip
    if _other_node(status, params) is not None:
        return {"state": "foreign", "error": "the run folder holds a run started for %s" % _other_node(status, params)}
    status = _with_output(run_dir, _observe(status, os.path.join(run_dir, STATUS)))
    if status.get("state") == "running":
        if seen["groups"] is None:
            seen["groups"] = _process_groups()
        status = _with_io(status, seen["groups"], seen["cgroups"], run_dir)
    ask = (params.get("scan") or {}).get(given)
    if ask is not None:
        status = dict(status, scan=_scan(run_dir, ask))
    return status


def _cannot_read(exc):
    """What a run reads that could not be read for an unexpected reason: lost, with the reason."""
    return {"state": "lost", "error": "its status could not be read: %s: %s" % (type(exc).__name__, str(exc)[:500])}


def stop(params):
    """Stop runs (see the module docstring); each answer: signalled (a signal went out) and alive (anything
    of the run may still run: the scheduler keeps its GPUs held and asks again). A run whose stop fails for an
    unexpected reason answers so alone (alive: asked again), the others are stopped."""
    out = []  # type: List[Dict[str, Any]]
    tokens = params.get("tokens") or {}
    for given in params.get("run_dirs") or []:
        try:
            answer = _stop_one(given, tokens.get(given), params)
        except Exception as exc:
            answer = {"signalled": False, "alive": True, "reason": _cannot_read(exc)["error"]}
        out.append(dict(answer, run_dir=given))
    return {"stopped": out}


def _stop_one(given, token, params):
    status_path = os.path.join(_expand(given), STATUS)
    status, problem = _read_status(status_path)
    if problem is not None:  # nothing in it is trusted: no signal goes out on its word
        return {"signalled": False, "alive": False, "reason": _unreadable(problem)["error"]}
    if status is None:
        return {"signalled": False, "alive": False, "reason": "no such run"}
    if token is not None and status.get("token") != token:
        return {"signalled": False, "alive": False, "reason": "another attempt's run"}
    if _other_node(status, params) is not None:
        return {"signalled": False, "alive": False, "reason": "a run started for %s" % _other_node(status, params)}
    seen = _observe(status, status_path)
    if seen["state"] in ("starting", "running") and not params.get("force"):
        try:  # its supervisor, alive with that pid and start time (see Liveness)
            os.kill(status["supervisor_pid"], signal.SIGTERM)
        except (ProcessLookupError, PermissionError):  # gone meanwhile, or not ours: asked again
            return {"signalled": False, "alive": True}
        return {"signalled": True, "alive": True}
    if seen["state"] in ("starting", "running", "orphaned"):
        return _kill(status_path, status, seen)
    return {"signalled": False, "alive": False, "reason": "not running"}


def send_signal(params):
    """Send `signal` (a name: the checkpoint signal) to the process group of each run's current step."""
    out = []  # type: List[Dict[str, Any]]
    tokens = params.get("tokens") or {}
    sig = signal.Signals[params["signal"]]
    for given in params.get("run_dirs") or []:
        try:
            answer = _signal_one(given, tokens.get(given), sig, params)
        except Exception as exc:  # this run alone
            answer = {"signalled": False, "reason": _cannot_read(exc)["error"]}
        out.append(dict(answer, run_dir=given))
    return {"signalled": out}


def _signal_one(given, token, sig, params):
    status_path = os.path.join(_expand(given), STATUS)
    status, problem = _read_status(status_path)
    if problem is not None:  # nothing in it is trusted: no signal goes out on its word
        return {"signalled": False, "reason": _unreadable(problem)["error"]}
    if status is None or (token is not None and status.get("token") != token):
        return {"signalled": False, "reason": "no such run"}
    if _other_node(status, params) is not None:
        return {"signalled": False, "reason": "a run started for %s" % _other_node(status, params)}
    seen = _observe(status, status_path)
    leader = status.get("pgid")
    if seen["state"] != "running" or not _alive(leader, status.get("pid_start"), status.get("boot_id")):
        return {"signalled": False, "reason": "not running"}
    try:
        os.killpg(leader, sig)
    except (ProcessLookupError, PermissionError):  # ended meanwhile, or not ours to signal
        return {"signalled": False, "reason": "not running"}
    return {"signalled": True}


def _kill(status_path, status, seen):
    """SIGKILL the supervisor (if alive) and every process left in the step's group, then record the end."""
    boot = status.get("boot_id")
    victims = []
    if seen["state"] != "orphaned" and _alive(status.get("supervisor_pid"), status.get("supervisor_start"), boot):
        victims.append(status["supervisor_pid"])
    victims += _group(status.get("pgid"), status.get("pid_start"), boot)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if status.get("container"):
        container_remove(status["container"])  # its client is killed: the container itself would run on
    deadline = time.time() + 2
    left = victims
    while left and time.time() < deadline:
        time.sleep(0.02)
        left = [p for p in left if _stat(p) is not None and _stat(p)[0] != "Z"]
    if not left:
        how = "the scheduler killed it (SIGKILL) after the grace period"
        if seen["state"] == "orphaned":
            how = "its supervisor died; the scheduler killed what was left of it (SIGKILL)"
        end = dict(status, ended=time.time(), signal="SIGKILL", exit_code=None, error=how)
        end["state"] = "lost" if seen["state"] == "orphaned" else "exited"
        _write_json(status_path, end)
    return {"signalled": bool(victims) or bool(status.get("container")), "alive": bool(left)}


# -- reading a run's files -------------------------------------------------------------------------------------


def read(params):
    path, offset, limit = _expand(params["path"]), int(params.get("offset") or 0), int(params["limit"])
    try:
        got = _output_chunk(path, offset, limit, params.get("tail"))
    except FileNotFoundError:
        return {"exists": False, "offset": 0, "data": ""}
    if got is None:
        return {"error": "%s is being cut to its output_limit: try again in a moment" % path}
    return {"exists": True, "offset": got[0], "data": base64.b64encode(got[1]).decode("ascii"), "end": got[2]}


def files(params):
    run_dir = _expand(params["run_dir"])
    if not os.path.isdir(run_dir):
        return {"absent": True}
    out = {}  # type: Dict[str, Optional[str]]
    for name in ("argv.json", "env.json", "hostfile"):
        try:
            with open(os.path.join(run_dir, name), encoding="utf-8", errors="replace") as fh:
                out[name] = fh.read()
        except FileNotFoundError:
            out[name] = None
    return out


# -- users -----------------------------------------------------------------------------------------------------


# what a session of the SSH account (or sudo) leaves in the environment that is not the user's: these names, and
# every SUDO_* (sudo sets SUDO_USER, SUDO_UID, SUDO_GID, SUDO_COMMAND, and newer ones SUDO_HOME...)
_NOT_THE_USERS = ("MAIL", "PWD", "OLDPWD", "XDG_RUNTIME_DIR")


def _account_name():
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return "uid %d" % os.geteuid()


def become(user):
    """Go on as `user` (see "Users"): None once this process is that user, else the answer that says why not.

    Switched here by root or before by sudo, the process goes on with the same environment (the session's,
    without what is not the user's, and the user's HOME, USER, LOGNAME and SHELL) and umask 077. When the SSH
    account is the user (no switch at all, no SUDO_UID of another uid), the session is the user's own and kept
    as it is (its HOME may be the admin's `SetEnv`, as on the lab's nodes): only the umask is set."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return {"no_account": user}
    if os.geteuid() == entry.pw_uid and os.environ.get("SUDO_UID", str(entry.pw_uid)) == str(entry.pw_uid):
        os.umask(0o077)  # run folders and whatever the job writes are the user's alone, in every case
        return None
    if os.geteuid() != entry.pw_uid:
        if os.geteuid() != 0:
            return {"sudo": user, "account": _account_name()}
        os.initgroups(user, entry.pw_gid)
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)  # real, effective and saved: there is no way back to root
    for name in list(os.environ):  # a switch, here or by sudo: the same clean-up
        if name in _NOT_THE_USERS or name.startswith("SUDO_"):
            del os.environ[name]
    os.environ.update(HOME=entry.pw_dir, USER=user, LOGNAME=user, SHELL=entry.pw_shell or "/bin/sh")
    os.umask(0o077)
    with contextlib.suppress(OSError):
        os.chdir(entry.pw_dir)
    return None


def account(params):
    """The account's name, uid and home, and whether it may keep run folders in that home (a folder it can
    enter and write in, or whose .ftconsole it can): an account made without a home (nobody's /nonexistent)
    cannot, whatever it may do elsewhere."""
    entry = pwd.getpwuid(os.geteuid())
    home = entry.pw_dir or ""
    mine = os.path.join(home, ".ftconsole")
    usable = (
        os.path.isdir(home)
        and os.access(home, os.X_OK)
        and (os.access(home, os.W_OK) or (os.path.isdir(mine) and os.access(mine, os.W_OK | os.X_OK)))
    )
    return {"account": entry.pw_name, "uid": entry.pw_uid, "home": home, "home_usable": usable}


ACTIONS = {
    "start": start,
    "prepare": prepare,
    "status": runs,
    "stop": stop,
    "port": free_port,
    "account": account,
    "read": read,
    "files": files,
    "signal": send_signal,
    "processes": processes,
    "leftovers": stop_leftovers,
    "shells": shell_ttys,
}


def channel(params):
    """Action channel (see channel.py): answer requests on stdin until it closes, as this process's user."""
    return serve(answer, dict(params, protocol=PROTOCOL))


ACTIONS["channel"] = channel


def answer(params):
    """What the action of `params` answers: one JSON document, as the user it names (see "Users")."""
    action = ACTIONS.get(params.get("action"))
    if action is None:
        return {"supervisor": PROTOCOL, "error": "unknown action %r" % params.get("action")}
    try:
        refused = become(params["user"]) if params.get("user") else None
        return dict(refused or action(params), supervisor=PROTOCOL)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {"supervisor": PROTOCOL, "error": "%s: %s" % (type(exc).__name__, exc)}


def main(params):
    doc = answer(params)
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return 0 if "error" not in doc else 1


if __name__ == "__main__":
    _params = globals().get("PARAMS")
    if _params is None:
        _params = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    sys.exit(main(_params))
