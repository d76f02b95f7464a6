"""What the processes of a rank are doing, for the hang evidence: node side, standard library only, Python 3.8.

Action `processes` {groups: [{key, pgid?, start?, boot?, env?, user?, container?}], sample, stacks, py_spy?}: for
each group (a rank's current step, as its status.json names it: the leader's pid, its start time and the boot),
every process of the process group and every descendant of them (a launcher's workers that left the group
included); with `env` ({name: value}: the job's FT_JOB_ID and FT_ATTEMPT), also the processes of `user` that this
node's SSH server started with those values in their environment (ranks a launcher started over SSH: deepspeed's
runner through pdsh, mpirun's orted), and their descendants; with `container` (the name of the step's container),
the processes of `user` in it (FT_CONTAINER in their environment: the container's own, which its runtime started,
not the step) and their descendants; each with:

  pid, ppid, comm, cmdline (the first 300 characters), state (R running, S sleeping, D uninterruptible, T
  stopped, t traced, Z zombie, I idle), threads (how many, and how many in each state), wchan (the kernel
  function it waits in), syscall (the number of the system call it is in, or "running"), cpu (user + system
  seconds), cpu_moved (how much of it in the `sample` seconds between two looks), python (its executable is a
  Python), env (its rank variables: RANK, LOCAL_RANK, WORLD_SIZE and MPI's), and with `stacks` for a Python
  process: stack (py-spy's `dump --json --nonblocking`: each thread's
  frames, innermost first) or stack_error (why there is none), and stack_moved (its main thread's stack differs
  from a first look taken at the start of the sample: the process moves; None: not known), and for one that
  serves torch's flight recorder trace (torch_hook.py: a Unix socket whose path has "/ftconsole-torch-", found
  through /proc/PID/fd and /proc/PID/net/unix, reached through /proc/PID/root): collectives ({"groups":
  {process group: its last collective {"seq", "op", "done"}}}) or collectives_error (why it could not be read).

With `kernel_since` (a wall time), "kernel": the NVIDIA driver's Xid lines in the node's kernel log since then,
each with its GPU's index here (kernel_log.py), or {"error": why} where the log cannot be read.

A group whose leader is another process now (its pid reused), in another boot, or gone reads {"gone": why}.
Nothing is stopped or signalled: py-spy reads the process's memory without pausing it. It needs the right to
trace the process (the same user where the kernel's ptrace_scope is 0, else root); this action runs as the
SSH account, never in a user's run folder: what it reads is /proc and the processes themselves.

py-spy: the node's own (on PATH), else the copy the scheduler sent (PARAMS["py_spy"]: {path, sha256}, run only
when its bytes hash to sha256), else none ("stack_error" says so). The answer says which ("py_spy": its path or
null) and the node's machine (`uname -m`): where none is there, the scheduler sends its own and asks again.
"""

import hashlib
import json
import os
import pwd
import socket
import stat
import struct
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Set  # noqa: F401  (used in type comments: this file runs on Python 3.8)

from ftconsole.scheduler.node.kernel_log import xids  # bundled
from ftconsole.scheduler.node.proc import _pid, _stat, _ticks, boot_id  # bundled

MAX_SAMPLE_S = 3.0
STACK_TIMEOUT_S = 10.0
MAX_PROCESSES = 64  # per group: a launcher with its workers fits; a fork bomb is cut short
MAX_FRAMES = 64  # per thread
TRACE_TIMEOUT_S = 3.0  # torch's worker server answers its trace within this (all of it), or it is left out
MAX_NAME = 200  # characters of a process group's or a collective's name, as the trace names them
MAX_GROUPS = 64  # process groups of one rank's trace
DEADLINE_S = 30.0  # the whole answer: what is not read by then is left out, with why
TRACE_SOCKET = "/ftconsole-torch-"  # in the path of the socket torch_hook.py serves the trace on
MAX_TRACE = 16 << 20
SIM_GPUS_ENV = "FTCONSOLE_SIM_GPUS"  # names the simulated-GPU file where the node's GPUs are simulated (the lab)
LAB_NODE = "FTCONSOLE_LAB_NODE"  # in the environment of what the lab's SSH server starts (ftconsole/lab)
TICKS = os.sysconf("SC_CLK_TCK")


def _read(path, limit=4096):
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def _proc(pid):
    """{pid, ppid, pgid, comm, state, threads, cpu, start} of a live process, or None."""
    raw = _read("/proc/%d/stat" % pid)
    if raw is None:
        return None
    text = raw.decode("utf-8", "replace")
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    try:
        return {
            "pid": pid,
            "comm": head.split("(", 1)[1] if "(" in head else "",
            "state": fields[0],
            "ppid": int(fields[1]),
            "pgid": int(fields[2]),
            "cpu": (int(fields[11]) + int(fields[12])) / TICKS,
            "threads": int(fields[17]),
            "start": int(fields[19]),
        }
    except (IndexError, ValueError):
        return None


def _all():
    """pid -> _proc of every process of this node now."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            seen = _proc(int(entry))
            if seen is not None:
                out[seen["pid"]] = seen
    return out


def _members(group, table):
    """The pids of a group's processes and their descendants, or the reason there are none: its step's process
    group, and with "env" the processes of this node's SSH server whose environment has those values (the ranks
    a launcher started here over SSH: deepspeed's runner through pdsh, mpirun's orted)."""
    pgid, start, boot = group.get("pgid"), group.get("start"), group.get("boot")
    uid = _uid(group.get("user"))
    if uid is None:
        return None, "its user %r has no account here" % group.get("user")
    seeds, why = [], None
    if _pid(pgid) and _ticks(start):
        if boot is not None and boot != boot_id():
            return None, "the node rebooted since it started"
        leader = _stat(pgid)
        if leader is not None and leader[2] != start:
            why = "its process is gone (pid %d is another process now)" % pgid
        else:
            seeds = [p for p, seen in table.items() if seen["pgid"] == pgid]
            why = None if seeds else "its processes are gone"
    elif not group.get("env"):
        return None, "no process is known for it (not started yet?)"
    if group.get("container"):  # its step runs in a container: the runtime's client is in the step's group,
        # the container's processes are not (the runtime's monitor started them): FT_CONTAINER names them
        seeds = sorted(set(seeds) | set(_by_container(group["container"], group.get("user"), table)))
    if group.get("env"):
        started = _by_env(group["env"], group.get("user"), table)
        seeds = sorted(set(seeds) | set(started))
        if not seeds:
            return None, why or "no process of it here: its launcher has not started it, or it is gone"
    if not seeds:
        return None, why
    children = {}  # type: Dict[int, List[int]]
    for seen in table.values():
        children.setdefault(seen["ppid"], []).append(seen["pid"])
    # Only the job user's own processes, whoever the group names: its pgid comes from status.json, which that user
    # may point at anyone's (DESIGN.md, "Claims and evidence"); what root reads and traces must be theirs.
    seeds = [p for p in seeds if _owned_by(p, uid)]
    found, todo = set(seeds), list(seeds)
    while todo and len(found) < MAX_PROCESSES:
        for child in children.get(todo.pop(), []):
            if child not in found and _owned_by(child, uid):
                found.add(child)
                todo.append(child)
    if not found:
        return None, why or "no process of its user is in it"
    return sorted(found)[:MAX_PROCESSES], None


def _uid(user):
    """The uid of `user` (None: this account), or None where it has no account here."""
    try:
        return pwd.getpwnam(user).pw_uid if user else os.getuid()
    except KeyError:
        return None


def _owned_by(pid, uid):
    """Whether the process runs as `uid`: its real and effective uids both (a set-uid program it ran is not)."""
    for line in (_read("/proc/%d/status" % pid) or b"").splitlines():
        if line.startswith(b"Uid:"):
            ids = line.split()[1:3]
            return len(ids) == 2 and all(i == str(uid).encode("ascii") for i in ids)
    return False


def _by_env(want, user, table):
    """Pids of the processes of `user` (None: this account) whose environment has each of `want`'s values, and
    that this node's SSH server started (where nodes share a kernel, as in a lab, another node's are left out:
    their SSH server is another), outermost only (their descendants follow them)."""
    try:
        uid = pwd.getpwnam(user).pw_uid if user else os.getuid()
    except KeyError:
        return []
    mine = _listener(os.getpid(), table)
    want = dict(want)
    if os.environ.get(LAB_NODE):  # the lab's nodes share one SSH server process too: its sessions say whose
        want[LAB_NODE] = os.environ[LAB_NODE]
    wanted = [("%s=%s" % (k, v)).encode("utf-8") for k, v in sorted(want.items())]
    out = [pid for pid, env in _environs(uid, table) if all(w in env for w in wanted) and _listener(pid, table) == mine]
    return _outermost(out, table)


def _environs(uid, table):
    """(pid, the set of its environment's NAME=value) of each process of `uid`."""
    for pid in table:
        try:
            if os.stat("/proc/%d" % pid).st_uid != uid:
                continue
        except OSError:
            continue
        yield pid, set((_read("/proc/%d/environ" % pid, 1 << 20) or b"").split(b"\0"))


def _outermost(pids, table):
    """Those of `pids` whose parent is not among them (their descendants follow them)."""
    chosen = set(pids)
    return [p for p in pids if table[p]["ppid"] not in chosen]


def _by_container(name, user, table):
    """Pids of the processes of `user` (None: this account) in the container `name` (or one of its batch tasks'
    containers, `name-tN`): FT_CONTAINER in their environment, which the step passes in; outermost only."""
    try:
        uid = pwd.getpwnam(user).pw_uid if user else os.getuid()
    except KeyError:
        return []
    exact, task = ("FT_CONTAINER=%s" % name).encode("utf-8"), ("FT_CONTAINER=%s-t" % name).encode("utf-8")
    out = [pid for pid, env in _environs(uid, table) if exact in env or any(e.startswith(task) for e in env)]
    return _outermost(out, table)


def _listener(pid, table):
    """The outermost SSH server above `pid` (the node's listening sshd), or None."""
    found, seen = None, 0
    while pid in table and seen < 64:
        if table[pid]["comm"] == "sshd":
            found = pid
        pid, seen = table[pid]["ppid"], seen + 1
    return found


def _thread_states(pid):
    counts = {}  # type: Dict[str, int]
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return counts
    for tid in tids[:4096]:
        raw = _read("/proc/%d/task/%s/stat" % (pid, tid))
        if raw is None:
            continue
        fields = raw.decode("utf-8", "replace").rpartition(")")[2].split()
        if fields:
            counts[fields[0]] = counts.get(fields[0], 0) + 1
    return counts


def _syscall(pid):
    raw = _read("/proc/%d/syscall" % pid)
    if raw is None:
        return None
    first = raw.decode("ascii", "replace").split(" ", 1)[0].strip()
    return int(first) if first.lstrip("-").isdigit() else first or None


def _python(pid, comm):
    try:
        exe = os.path.basename(os.readlink("/proc/%d/exe" % pid))
    except OSError:
        exe = comm
    return exe.startswith("python") or exe.startswith("pypy")


def _cmdline(pid):
    raw = _read("/proc/%d/cmdline" % pid, 4096) or b""
    return " ".join(part.decode("utf-8", "replace") for part in raw.split(b"\0") if part)[:300]


RANK_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def _env(pid):
    """The process's rank variables (a launcher's worker has RANK), where its environment can be read."""
    raw = _read("/proc/%d/environ" % pid, 1 << 20)
    out = {}
    for item in (raw or b"").split(b"\0"):
        name, _, value = item.partition(b"=")
        if name.decode("ascii", "replace") in RANK_ENV:
            out[name.decode("ascii")] = value.decode("utf-8", "replace")[:20]
    return out


def _py_spy(params):
    """The node's own py-spy (on PATH), else the copy the scheduler sent (PARAMS["py_spy"]: {path, sha256}) when
    its bytes are the ones named, else None."""
    for folder in [*os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep), "/usr/local/bin"]:
        path = os.path.join(folder, "py-spy")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    sent = params.get("py_spy")
    if not isinstance(sent, dict) or not isinstance(sent.get("path"), str):
        return None
    path = os.path.expanduser(sent["path"])
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return path if digest.hexdigest() == sent.get("sha256") and os.access(path, os.X_OK) else None


def _stack(py_spy, pid):
    """(threads, None) from py-spy, or (None, why not)."""
    if py_spy is None:
        return None, "py-spy is not on this node (and none was sent)"
    try:
        done = subprocess.run(
            [py_spy, "dump", "--pid", str(pid), "--json", "--nonblocking"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=STACK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return None, "py-spy did not answer within %gs" % STACK_TIMEOUT_S
    except OSError as exc:
        return None, "py-spy cannot run: %s" % exc
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return None, "py-spy: %s" % (said[0][:300] if said else "exit code %d" % done.returncode)
    try:
        threads = json.loads(done.stdout.decode("utf-8", "replace"))
    except ValueError:
        return None, "py-spy printed something that is not JSON"
    out = []
    for thread in threads if isinstance(threads, list) else []:
        frames = [
            {"name": f.get("name"), "file": f.get("filename"), "line": f.get("line")}
            for f in (thread.get("frames") or [])[:MAX_FRAMES]
            if isinstance(f, dict)
        ]
        out.append({
            "tid": thread.get("os_thread_id"),
            "name": thread.get("thread_name"),
            "active": bool(thread.get("active")),
            "frames": frames,
        })  # fmt: skip
    return out, None


def _main_frames(threads, pid):
    """The frames of a process's main thread in a stack `_stack` read, as comparable tuples (None: no stack)."""
    if not threads:
        return None
    main = next((t for t in threads if t.get("tid") == pid), threads[0])
    return [(f.get("name"), f.get("file"), f.get("line")) for f in main.get("frames") or []]


def _sockets(pid):
    """Inodes of the sockets the process holds open."""
    out = set()  # type: Set[str]
    try:
        names = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, name))
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def _torch_socket(pid):
    """The Unix socket on which torch_hook.py serves this process's trace (its path names it), or None. Looked up
    in the process's own network namespace, and reached through its own root: a rank in a container has both.
    The path is the user's to choose: `_post` connects only to a socket their own and served by this process."""
    inodes = _sockets(pid)
    if not inodes:
        return None
    try:
        with open("/proc/%d/net/unix" % pid) as fh:
            lines = fh.read().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 8 and fields[6] in inodes and TRACE_SOCKET in fields[7]:
            inside = "/proc/%d/root%s" % (pid, fields[7])
            return inside if os.path.exists(inside) else fields[7]
    return None


def _post(path, url, pid, uid):
    """The body of torch's worker server's answer to POST `url`, over the Unix socket at `path`, served by process
    `pid` of `uid`: the socket file must be a socket of `uid` (a path the user chose may name anyone's, root's
    included: root would connect for them), and its server, once connected, process `pid` itself (SO_PEERCRED);
    else nothing is sent. The whole answer within TRACE_TIMEOUT_S: a server that drips bytes is cut off."""
    deadline = time.monotonic() + TRACE_TIMEOUT_S
    info = os.stat(path)
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != uid:
        raise ValueError("its socket is not a socket of the job's user")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(TRACE_TIMEOUT_S)
    try:
        conn.connect(path)
        peer_pid, peer_uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if peer_pid != pid or peer_uid != uid:
            raise ValueError("its socket is served by another process (pid %d)" % peer_pid)
        conn.sendall(("POST %s HTTP/1.0\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n" % url).encode("ascii"))
        data = b""
        while len(data) <= MAX_TRACE:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ValueError("its server did not answer within %gs" % TRACE_TIMEOUT_S)
            conn.settimeout(left)
            try:
                chunk = conn.recv(1 << 16)
            except socket.timeout:
                raise ValueError("its server did not answer within %gs" % TRACE_TIMEOUT_S) from None
            if not chunk:
                break
            data += chunk
    finally:
        conn.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or status[1] != b"200":
        raise ValueError("torch's worker server did not answer 200")
    return body


def _collectives(pid, uid):
    """(trace, why none) of a process that keeps torch's flight recorder trace and serves it (torch_hook.py): per
    process group, its last collective: {"seq", "op", "done"} ("done": torch retired it). What the server says is
    the user's: checked by type, its names cut to MAX_NAME, at most MAX_GROUPS groups."""
    path = _torch_socket(pid)
    if path is None:
        return None, None
    try:
        doc = json.loads(_post(path, "/handler/fr_trace_json", pid, uid).decode("utf-8", "replace"))
    except Exception as exc:  # a trace that cannot be read now: the rest of the evidence still comes
        return None, "torch's trace could not be read: %s" % str(exc)[:200]
    entries = doc.get("entries") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        return None, "torch's trace is not what torch writes (no list of entries)"
    last = {}  # type: Dict[str, Dict[str, Any]]
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("is_p2p") or not isinstance(entry.get("collective_seq_id"), int):
            continue
        group = entry.get("process_group") or [entry.get("pg_id")]
        key = str(group[0] if isinstance(group, list) and group else entry.get("pg_id"))[:MAX_NAME]
        if key not in last and len(last) >= MAX_GROUPS:
            continue
        seq = entry["collective_seq_id"]
        if key not in last or seq >= last[key]["seq"]:
            name = str(entry.get("profiling_name") or "")
            last[key] = {"seq": seq, "op": name.split(":", 1)[-1][:MAX_NAME], "done": bool(entry.get("retired"))}
    return {"groups": last}, None


def _results(futures, deadline, missing):
    """Each future's result, or `missing` for one not done by `deadline` (time.monotonic())."""
    out = []
    for future in futures:
        try:
            out.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
        except Exception:  # not done in time (or failed): left out, the rest of the evidence still comes
            future.cancel()
            out.append(missing)
    return out


def _looks(groups, table, before, sample):
    """The answer's groups: each process of each group as /proc shows it now."""
    out = []
    for key, pids, why in groups:
        if why is not None:
            out.append({"key": key, "gone": why})
            continue
        listed = []  # type: List[Dict[str, Any]]
        for pid in pids:
            now = _proc(pid)
            if now is None or now["start"] != table[pid]["start"]:
                continue  # it ended in between
            entry = {
                "pid": pid,
                "ppid": now["ppid"],
                "comm": now["comm"],
                "cmdline": _cmdline(pid),
                "state": now["state"],
                "threads": now["threads"],
                "thread_states": _thread_states(pid),
                "wchan": (_read("/proc/%d/wchan" % pid, 200) or b"").decode("ascii", "replace") or None,
                "syscall": _syscall(pid),
                "cpu": round(now["cpu"], 2),
                "cpu_moved": round(now["cpu"] - before[pid], 2) if sample > 0 else None,
                "python": _python(pid, now["comm"]),
                "env": _env(pid),
            }
            listed.append(entry)
        out.append({"key": key, "sample": sample, "processes": listed})
    return out


def _stacks(out, pool, py_spy, owners, earlier, deadline):
    """Each Python process's stack and torch trace into its entry of `out`, all at once, by `deadline`."""
    wanted = [e for g in out for e in g.get("processes", []) if e["python"] and e["state"] != "Z"]
    late = "not read within the answer's %gs" % DEADLINE_S
    dumps = _results([pool.submit(_stack, py_spy, e["pid"]) for e in wanted], deadline, (None, late))
    # a stopped process's server is stopped with it: it would be waited for in vain (TRACE_TIMEOUT_S)
    asked = [(e, pool.submit(_collectives, e["pid"], owners[e["pid"]])) for e in wanted if e["state"] not in "Tt"]
    traces = dict(zip([id(e) for e, _ in asked], _results([f for _, f in asked], deadline, (None, late))))  # noqa: B905
    for entry, (stack, why) in zip(wanted, dumps):  # noqa: B905
        entry["stack"], entry["stack_error"] = stack, why
        seen = earlier.get(entry["pid"])
        was, now_frames = _main_frames(seen[0] if seen else None, entry["pid"]), _main_frames(stack, entry["pid"])
        entry["stack_moved"] = None if was is None or now_frames is None else was != now_frames
        got, missing = traces.get(id(entry), (None, None))
        if got is not None or missing is not None:
            entry["collectives"], entry["collectives_error"] = got, missing


def processes(params):
    sample = min(max(float(params.get("sample") or 0.0), 0.0), MAX_SAMPLE_S)
    stacks = bool(params.get("stacks"))
    deadline = time.monotonic() + DEADLINE_S
    table = _all()
    groups = []
    owners = {}  # type: Dict[int, int]
    for group in params.get("groups") or []:
        pids, why = _members(group, table)
        groups.append((group.get("key"), pids, why))
        uid = _uid(group.get("user"))
        owners.update((p, uid) for p in pids or [] if uid is not None)
    before = {pid: table[pid]["cpu"] for _, pids, _ in groups for pid in pids or []}
    py_spy = _py_spy(params) if stacks else None
    pythons = [p for p in before if _python(p, table[p]["comm"]) and table[p]["state"] != "Z"] if stacks else []
    pool, first = ThreadPoolExecutor(max_workers=16), []  # type: ThreadPoolExecutor, List[Any]
    try:
        # a first look at the stacks while the CPU time is sampled: a stack that differs in the second look is
        # of a process that moves (a job that progresses is not stuck wherever one look finds it)
        first = [pool.submit(_stack, py_spy, p) for p in pythons] if sample > 0 else []
        if sample > 0 and before:
            time.sleep(sample)
        earlier = dict(zip(pythons, _results(first, deadline, (None, None))))  # noqa: B905
        out = _looks(groups, table, before, sample)
        if stacks:  # each Python process's stack and torch trace, all at once (py-spy takes tenths of a second each)
            _stacks(out, pool, py_spy, owners, earlier, deadline)
    finally:
        for future in first:
            future.cancel()
        pool.shutdown(wait=False)  # what still runs ends within its own timeout (py-spy's, the trace's)
    answer = {"groups": out, "time": time.time(), "py_spy": py_spy, "machine": os.uname().machine}
    if params.get("kernel_since") is not None:  # the driver's Xid lines since the attempt started
        answer["kernel"] = xids(float(params["kernel_since"]), os.environ.get(SIM_GPUS_ENV))
    return answer
