"""The run supervisor: node side, standard library only, Python 3.8.

Sent like the probe agent, to `python3 -` over SSH with one prepended line that sets PARAMS (a JSON
document in a Python string literal). PARAMS["action"] is one of:

start   {run_dir, token?, argv, env, workdir, files, grace, steps?}
        Claim the run folder for `token` (the attempt's token: see "Identity" below), write the files
        (hostfile...), argv.json and env.json (the main command), and steps.json when steps are given, then
        detach a supervisor (double fork, new session, stdio on /dev/null) that runs the steps one after
        another, each in its own process group, with stdout and stderr in output.log, and keeps status.json up
        to date. Without steps, the run is one step: argv with env. Idempotent: a run folder that already has
        a status.json is never started again; its status is returned instead. A folder claimed by another
        token is refused ({"started": false, "refused": why}): never adopted, never started.
prepare {run_dir, argv, env, files, steps?}
        Write the run folder (files, argv.json, env.json, steps.json) without starting anything: the ranks of
        an MPI job that mpirun starts itself, so a debug shell on them still finds the hostfile and env.
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
read    {path, offset?, limit, tail?}
        Up to `limit` bytes of a file (a run's output.log) from `offset`, or with `tail` from where its last
        `tail` lines start: {"exists", "offset", "data" (base64)}.
files   {run_dir}
        argv.json, env.json and hostfile of a run folder as text (None when missing); {"absent": true} when
        there is no such folder.
stop    {run_dirs, tokens?, force?}
        Ask each run's supervisor to stop: it sends SIGTERM to the current step's process group (not to the
        after hook's), runs no further step but the after hook, and once the grace period (counted from the
        stop) is over SIGKILLs whatever still runs, the after hook included, and skips the after hook if it
        has not started. Returns at once. With `force` (the scheduler's own escalation once the grace period
        is over) and for an orphaned run (its supervisor is dead), SIGKILL goes to the supervisor and to every
        process left in the step's process group. Each answer says whether anything of the run is still alive.

Steps: [{"kind": "data"|"before"|"command"|"task"|"after", "name", "argv", "env", "index"?, "count"?}], in
order: the data preparation (the job's data_prep: `scheduler/datacopy.py`, run with this supervisor's own
interpreter, the scheduler's ssh.python, in place of argv[0]), the before hook, the command or a batch job's
tasks (`index` 0-based of `count`), the after hook. A data, before, command or task step that fails (non-zero
exit, signal, cannot start) ends the sequence with its result (a data or before step's error quotes its last
line of output); the after step runs whatever the outcome (not after a SIGKILL) and its failure is only logged.
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
{user} does only that: it answers the user's uid and home.

Paths: run_dir, workdir, argv entries and env values that start with "~/" are expanded with the HOME of the
account the action runs as.
"""

import base64
import contextlib
import fcntl
import itertools
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple  # noqa: F401  (used in type comments: this file runs on Python 3.8)

PROTOCOL = 2
STATUS = "status.json"
CLAIM = "claim"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
_WRITES = itertools.count()


def _expand(path):
    return os.path.abspath(os.path.expanduser(path))


def _write_file(path, text):
    """Write whole or not at all: a temporary file, fsync'd, then renamed over `path`."""
    tmp = "%s.%d.%d.tmp" % (path, os.getpid(), next(_WRITES))  # a stop handler may write meanwhile
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _write_json(path, doc):
    _write_file(path, json.dumps(doc, separators=(",", ":")))


def _read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def boot_id():
    try:
        with open(BOOT_ID) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _stat(pid):
    """(state, pgrp, start time in clock ticks since boot) of a process, or None when there is none."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[2]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def start_time(pid):
    stat = _stat(pid)
    return None if stat is None else stat[2]


def _alive(pid, started, boot=None):
    """The process `pid` started at `started` (clock ticks) in this boot, and not a zombie."""
    if not pid or started is None or (boot is not None and boot != boot_id()):
        return False
    stat = _stat(pid)
    return stat is not None and stat[2] == started and stat[0] != "Z"


def _group(pgid, leader_start, boot):
    """Pids of the live processes of the step's process group `pgid` (leader started at `leader_start`).

    A pgid is not reused while any process of the group lives, so the group is ours when its leader (pid ==
    pgid) is gone or is the very process we started; never in another boot."""
    if not pgid or leader_start is None or boot != boot_id():
        return []
    leader = _stat(pgid)
    if leader is not None and leader[2] != leader_start:
        return []  # the pid was reused: another process group
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[1] == pgid and stat[0] != "Z":
                out.append(int(entry))
    return sorted(out)


# -- start -----------------------------------------------------------------------------------------------------


def _private_dirs(path):
    """Make the folder `path` (0700) and the missing folders above it (0700 too, whatever the umask).

    Folders that exist already are left as they are, but `path` itself, which this supervisor owns. Tried
    again when a folder above vanishes meanwhile (an old job's folder pruned at that instant)."""
    for attempt in range(3):
        missing = []
        here = path
        while not os.path.isdir(here):
            missing.append(here)
            parent = os.path.dirname(here)
            if parent == here:
                break
            here = parent
        try:
            for folder in reversed(missing):
                try:
                    os.mkdir(folder, 0o700)
                except FileExistsError:
                    continue
                os.chmod(folder, 0o700)
            break
        except FileNotFoundError:
            if attempt == 2:
                raise
    os.chmod(path, 0o700)


def _prepare(run_dir, params):
    _private_dirs(run_dir)
    for name, content in sorted((params.get("files") or {}).items()):
        target = os.path.normpath(os.path.join(run_dir, name))
        if not target.startswith(run_dir + os.sep):
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


def _read_text(path):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _claim(run_dir, token):
    """None once the run folder is `token`'s (claimed now, or earlier by the same token), else why not.

    The claim is a hard link to a complete file holding the token: link() fails when `claim` exists, so of
    two schedulers racing for one folder exactly one wins, and a crash leaves either no claim or a whole one.
    """
    _private_dirs(run_dir)
    claim = os.path.join(run_dir, CLAIM)
    if not os.path.exists(claim) and os.path.exists(os.path.join(run_dir, STATUS)):
        return "run folder %s holds a run without a claim (an earlier ftconsole's, or not ours)" % run_dir
    tmp = "%s.%s.%d.tmp" % (claim, token, os.getpid())
    _write_file(tmp, token)
    try:
        os.link(tmp, claim)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    owner = _read_text(claim)
    if owner != token:
        return "run folder %s is claimed by another attempt (token %s, this one is %s)" % (run_dir, owner, token)
    return None


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
    if params.get("workdir", "~") == "~" and not os.path.isdir(workdir):  # as slurmd does for a missing home
        workdir = "/tmp"
        notice = "ftconsole: no home folder %s: running in /tmp\n" % _expand("~")
    else:
        notice = None
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
        argv = [_tilde(a) for a in step["argv"]]
        if step["kind"] == "data" and sys.executable:
            argv[0] = sys.executable  # the interpreter the scheduler runs node-side programs with (ssh.python)
        try:
            child = subprocess.Popen(
                argv,
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
        status.update(
            state="running", pid=child.pid, pgid=child.pid, pid_start=start_time(child.pid), step=step["name"]
        )
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
    log_path = os.path.join(run_dir, "output.log")
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    log = os.fdopen(log_fd, "ab", buffering=0)  # open for the whole run
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
        if code and step["kind"] in ("data", "before"):  # a step that stops the run first: which, its last words
            error = "%s %s: %s" % (_label(step), _how(code), _last_line(log_path, mark) or "no output")
        if code and len(steps) > 1:
            log.write(("ftconsole: %s %s\n" % (_label(step), _how(code))).encode())
        if step["kind"] == "after":
            continue  # its failure is logged, it does not change the run's outcome
        if step["kind"] not in ("data", "before") or code != 0:
            outcome = (code, error)
        failed = code != 0
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


def _last_line(path, since, limit=4096):
    """The last non-empty line written to `path` after offset `since` (at most `limit` bytes back), or None."""
    try:
        with open(path, "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            fh.seek(max(since, end - limit))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:500] if lines else None


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
            _write_json(status_path, dict(_STARTING, token=token, boot_id=boot, supervisor_pid=supervisor,
                                          supervisor_start=start))  # fmt: skip
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


def _observe(status, path):
    """The status with what is true now: "lost" or "orphaned" when its supervisor is gone (see Liveness).

    The supervisor writes its end before it exits, so once it is seen gone, status.json is read again: a run
    that ended between the first read and the look at its supervisor reads as ended, never as lost."""
    if status.get("state") not in ("starting", "running"):
        return status
    if "supervisor_start" not in status:  # written by an earlier ftconsole: the pid is all there is
        if _alive_legacy(status.get("supervisor_pid")):
            return status
        return _ended(path) or dict(status, state="lost")
    boot = status.get("boot_id")
    if boot != boot_id():
        return dict(status, state="lost", error="the node rebooted since the run started")
    if _alive(status.get("supervisor_pid"), status.get("supervisor_start"), boot):
        return status
    ended = _ended(path)
    if ended is not None:
        return ended
    left = _group(status.get("pgid"), status.get("pid_start"), boot)
    if left:
        return dict(status, state="orphaned", orphans=left, error="its supervisor died; its processes still run")
    return dict(status, state="lost", error="its supervisor died without recording an end")


def _ended(path):
    """status.json read again, if it now records an end."""
    again = _read_json(path)
    return again if again is not None and again.get("state") not in ("starting", "running") else None


def _alive_legacy(pid):
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = _stat(pid)
    return stat is None or stat[0] != "Z"


def _with_output(run_dir, status):
    """The status with output.log's mtime and size (a run that prints is making progress)."""
    try:
        st = os.stat(os.path.join(run_dir, "output.log"))
    except OSError:
        return status
    return dict(status, output_mtime=st.st_mtime, output_size=st.st_size)


def runs(params):
    doc = {}  # type: Dict[str, Any]
    if params.get("prune"):
        try:
            doc["pruned"] = prune(params["prune"])
        except Exception as exc:  # never let retention break the read: it is the node's heartbeat
            doc["prune_error"] = "%s: %s" % (type(exc).__name__, exc)
    doc.update(_runs(params))
    return doc


IO_FIELDS = ("rchar", "wchar", "read_bytes", "write_bytes")
SCAN_BYTES = 256 * 1024  # at most this much of output.log (its end) is scanned per read
SCAN_MATCHES = 64  # the last matches kept per pattern
SCAN_BUDGET_S = 1.0  # CPU for all the patterns of one read: a pattern that takes longer is reported, not waited for


class _ScanTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _ScanTimeout()


def _scan(run_dir, ask):
    """Matches of a job's patterns (`ask["patterns"]`: name -> regex) in output.log's complete lines after
    byte `ask["from"]` (at most SCAN_BYTES from its end): {"to": the offset scanned to, "matches": name ->
    the last SCAN_MATCHES matches' named groups (and "line": the line, cut to 300 characters)}."""
    import re

    path = os.path.join(run_dir, "output.log")
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            start = ask.get("from") or 0
            if start > size:
                start = 0  # the log was replaced: from its start
            start = max(start, size - SCAN_BYTES)
            fh.seek(start)
            data = fh.read(size - start)
    except OSError as exc:
        return {"error": "cannot read output.log: %s" % exc.strerror}
    end = data.rfind(b"\n") + 1
    out = {"to": start + end, "matches": {}}  # type: Dict[str, Any]
    lines = data[:end].decode("utf-8", "replace").splitlines()
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, SCAN_BUDGET_S)
    try:
        for name, regex in (ask.get("patterns") or {}).items():
            found = []
            compiled = re.compile(regex)
            for line in lines:
                m = compiled.search(line)
                if m is not None:
                    found.append(dict(m.groupdict(), line=line[:300]))
            out["matches"][name] = found[-SCAN_MATCHES:]
    except _ScanTimeout:
        out["error"] = "the patterns took more than %gs over %d bytes: simplify them" % (SCAN_BUDGET_S, end)
    except re.error as exc:
        out["error"] = "bad pattern: %s" % exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return out


def _io(pids):
    """The sum of /proc/<pid>/io's counters over `pids` (None when none could be read: another user's, or
    gone): the hang detector's sign of life, any change of it being one."""
    total, seen = 0, False
    for pid in pids:
        try:
            with open("/proc/%d/io" % pid) as fh:
                for line in fh:
                    key, _, value = line.partition(":")
                    if key in IO_FIELDS:
                        total += int(value)
            seen = True
        except (OSError, ValueError):
            continue
    return total if seen else None


def _with_io(status, groups):
    """A running run's status with `io`: the I/O counters of its step's process group (see `_io`)."""
    pgid = status.get("pgid")
    if status.get("state") != "running" or not pgid or pgid not in groups:
        return status
    leader = _stat(pgid)
    if leader is not None and leader[2] != status.get("pid_start"):
        return status  # the pgid is another group's now
    io = _io(groups[pgid])
    return status if io is None else dict(status, io=io)


def _runs(params):
    out = []  # type: List[Dict[str, Any]]
    tokens = params.get("tokens") or {}
    if params.get("run_dirs") is not None:
        groups = None  # type: Optional[Dict[int, List[int]]]
        for given in params["run_dirs"]:
            run_dir = _expand(given)
            status = _read_json(os.path.join(run_dir, STATUS))
            if status is None:
                status = {"state": "absent"}
            elif tokens.get(given) is not None and status.get("token") != tokens[given]:
                status = {"state": "foreign", "error": "the run folder holds another attempt's run (token %s)"
                          % status.get("token")}  # fmt: skip
            else:
                status = _with_output(run_dir, _observe(status, os.path.join(run_dir, STATUS)))
                if status.get("state") == "running":
                    groups = _process_groups() if groups is None else groups  # one look at /proc per read
                    status = _with_io(status, groups)
                ask = (params.get("scan") or {}).get(given)
                if ask is not None:
                    status = dict(status, scan=_scan(run_dir, ask))
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
                    status = _with_output(run_dir, _observe(status, os.path.join(run_dir, STATUS)))
                    out.append({"job": job, "attempt": attempt, "rank": rank, "status": status})
    return {"root": root, "runs": out}


def stop(params):
    """Stop runs (see the module docstring); each answer: signalled (a signal went out) and alive (anything
    of the run may still run: the scheduler keeps its GPUs held and asks again)."""
    out = []  # type: List[Dict[str, Any]]
    tokens = params.get("tokens") or {}
    for given in params.get("run_dirs") or []:
        run_dir = _expand(given)
        status_path = os.path.join(run_dir, STATUS)
        status = _read_json(status_path)
        if status is None:
            out.append({"run_dir": given, "signalled": False, "alive": False, "reason": "no such run"})
            continue
        if tokens.get(given) is not None and status.get("token") != tokens[given]:
            out.append({"run_dir": given, "signalled": False, "alive": False, "reason": "another attempt's run"})
            continue
        seen = _observe(status, status_path)
        if seen["state"] in ("starting", "running") and not params.get("force"):
            os.kill(status["supervisor_pid"], signal.SIGTERM)
            out.append({"run_dir": given, "signalled": True, "alive": True})
        elif seen["state"] in ("starting", "running", "orphaned"):
            out.append(dict(_kill(status_path, status, seen), run_dir=given))
        else:
            out.append({"run_dir": given, "signalled": False, "alive": False, "reason": "not running"})
    return {"stopped": out}


def send_signal(params):
    """Send `signal` (a name: the checkpoint signal) to the process group of each run's current step."""
    out = []  # type: List[Dict[str, Any]]
    tokens = params.get("tokens") or {}
    sig = signal.Signals[params["signal"]]
    for given in params.get("run_dirs") or []:
        status_path = os.path.join(_expand(given), STATUS)
        status = _read_json(status_path)
        if status is None or (tokens.get(given) is not None and status.get("token") != tokens[given]):
            out.append({"run_dir": given, "signalled": False, "reason": "no such run"})
            continue
        seen = _observe(status, status_path)
        leader = status.get("pgid")
        if seen["state"] != "running" or not _alive(leader, status.get("pid_start"), status.get("boot_id")):
            out.append({"run_dir": given, "signalled": False, "reason": "not running"})
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader, sig)
        out.append({"run_dir": given, "signalled": True})
    return {"signalled": out}


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
    return {"signalled": bool(victims), "alive": bool(left)}


# -- retention -------------------------------------------------------------------------------------------------

ENDED = ("exited", "failed", "lost")
# attempt folders removed by one prune at most: the prune rides on the node's status read, the scheduler's
# heartbeat of the node, which must answer within node_timeout; what is left goes on the next prune
MAX_PRUNED = 100


def _plain(name):
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def prune(spec):
    """Remove the attempt folders of <run_root>/<cluster> that may go (see "Retention"); their names."""
    retention = float(spec["retention"])
    cluster = spec["cluster"]
    if not _plain(cluster):
        raise ValueError("not a cluster id: %r" % (cluster,))
    if retention <= 0:
        return []
    run_root = _expand(spec["run_root"])
    root = os.path.join(run_root, cluster)
    if os.path.islink(root) or not os.path.isdir(root):
        return []
    real_root = os.path.realpath(root)
    if os.path.dirname(real_root) != os.path.realpath(run_root):
        raise ValueError("%s is not a folder of the run root %s" % (root, run_root))
    keep = set(spec.get("keep") or ())
    tokens = set(spec.get("tokens") or ())
    cutoff = time.time() - retention
    groups = None  # type: Optional[Dict[int, List[int]]]
    removed = []
    for job in sorted(os.listdir(root)):
        job_dir = os.path.join(root, job)
        if not _plain(job) or os.path.islink(job_dir) or not os.path.isdir(job_dir):
            continue
        for attempt in sorted(os.listdir(job_dir)):
            name = "%s/%s" % (job, attempt)
            attempt_dir = os.path.join(job_dir, attempt)
            if name in keep or not _plain(attempt) or os.path.islink(attempt_dir) or not os.path.isdir(attempt_dir):
                continue
            if groups is None:
                groups = _process_groups()
            if not _expired(attempt_dir, cutoff, tokens, groups):
                continue
            if os.path.dirname(os.path.dirname(os.path.realpath(attempt_dir))) != real_root:
                continue  # never reached through a link: only the run root's own folders go
            shutil.rmtree(attempt_dir)
            removed.append(name)
            if len(removed) >= MAX_PRUNED:
                return removed
        if not any(k.split("/", 1)[0] == job for k in keep):
            with contextlib.suppress(OSError):
                os.rmdir(job_dir)  # only when empty: a job none of whose attempts is left
    return removed


def _expired(attempt_dir, cutoff, tokens, groups):
    """Every rank of the attempt folder ended before `cutoff`, none is alive, none is a current token's."""
    for rank in os.listdir(attempt_dir):
        run_dir = os.path.join(attempt_dir, rank)
        if os.path.islink(run_dir) or not os.path.isdir(run_dir):
            if os.lstat(run_dir).st_mtime >= cutoff:
                return False
            continue
        if _read_text(os.path.join(run_dir, CLAIM)) in tokens:
            return False
        status_path = os.path.join(run_dir, STATUS)
        status = _read_json(status_path)
        if status is None:  # nothing was started in it (a rank mpirun starts): judged by its last change
            if _last_change(run_dir) >= cutoff:
                return False
            continue
        if status.get("token") in tokens:
            return False
        seen = _observe(status, status_path)
        if seen.get("state") not in ENDED or _any_alive(status, groups):
            return False
        ended = seen.get("ended")
        if not isinstance(ended, (int, float)):
            ended = os.stat(status_path).st_mtime
        if ended >= cutoff:
            return False
    return True


def _last_change(folder):
    times = [os.lstat(folder).st_mtime]
    for entry in os.listdir(folder):
        with contextlib.suppress(OSError):
            times.append(os.lstat(os.path.join(folder, entry)).st_mtime)
    return max(times)


def _process_groups():
    """pgid -> pids of the live (not zombie) processes of this node now: one look at /proc for a whole prune."""
    out = {}  # type: Dict[int, List[int]]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] != "Z":
                out.setdefault(stat[1], []).append(int(entry))
    return out


def _any_alive(status, groups):
    """The run's supervisor or a process of its step's group still runs (as `_group`, from one /proc scan)."""
    boot = status.get("boot_id")
    if boot is not None and boot != boot_id():
        return False  # another boot: nothing of it survived
    if "supervisor_start" not in status:
        return _alive_legacy(status.get("supervisor_pid")) or bool(status.get("pgid") in groups)
    if _alive(status.get("supervisor_pid"), status.get("supervisor_start"), boot):
        return True
    pgid = status.get("pgid")
    if not pgid or pgid not in groups:
        return False
    leader = _stat(pgid)
    return leader is None or leader[2] == status.get("pid_start")


# -- reading a run's files -------------------------------------------------------------------------------------


def read(params):
    path = _expand(params["path"])
    if not os.path.exists(path):
        return {"exists": False, "offset": 0, "data": ""}
    with open(path, "rb") as fh:
        end = fh.seek(0, os.SEEK_END)
        offset = int(params.get("offset") or 0)
        if params.get("tail") is not None:
            offset = _tail_start(fh, end, int(params["tail"]))
        fh.seek(min(offset, end))
        data = fh.read(int(params["limit"]))
    return {"exists": True, "offset": offset, "data": base64.b64encode(data).decode("ascii")}


def _tail_start(fh, end, lines):
    """Where the last `lines` lines of the file start (a last line without a newline counts as one)."""
    if lines <= 0:
        return end
    pos, seen, block = end, 0, 65536
    fh.seek(max(0, end - 1))
    if fh.read(1) == b"\n":
        end -= 1  # the final newline ends the last line, it does not start a new one
        pos = end
    while pos > 0:
        start = max(0, pos - block)
        fh.seek(start)
        chunk = fh.read(pos - start)
        at = len(chunk)
        while True:
            at = chunk.rfind(b"\n", 0, at)
            if at < 0:
                break
            seen += 1
            if seen == lines:
                return start + at + 1
        pos = start
    return 0


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

# what a session of the SSH account leaves in the environment that is not the user's
_NOT_THE_USERS = ("MAIL", "PWD", "OLDPWD", "SUDO_USER", "SUDO_UID", "SUDO_GID", "SUDO_COMMAND", "XDG_RUNTIME_DIR")


def _account_name():
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return "uid %d" % os.geteuid()


def become(user):
    """Go on as `user` (see "Users"): None once this process is that user, else the answer that says why not."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return {"no_account": user}
    if os.geteuid() == entry.pw_uid:
        return None  # the SSH account itself (or sudo made us the user): the session's environment is the user's
    if os.geteuid() != 0:
        return {"sudo": user, "account": _account_name()}
    os.initgroups(user, entry.pw_gid)
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)  # real, effective and saved: there is no way back to root
    for name in _NOT_THE_USERS:
        os.environ.pop(name, None)
    os.environ.update(HOME=entry.pw_dir, USER=user, LOGNAME=user, SHELL=entry.pw_shell or "/bin/sh")
    os.umask(0o077)
    with contextlib.suppress(OSError):
        os.chdir(entry.pw_dir)
    return None


def account(params):
    entry = pwd.getpwuid(os.geteuid())
    return {"account": entry.pw_name, "uid": entry.pw_uid, "home": entry.pw_dir}


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
}


def main(params):
    action = ACTIONS.get(params.get("action"))
    if action is None:
        doc = {"supervisor": PROTOCOL, "error": "unknown action %r" % params.get("action")}
    else:
        try:
            refused = become(params["user"]) if params.get("user") else None
            doc = dict(refused or action(params), supervisor=PROTOCOL)
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
