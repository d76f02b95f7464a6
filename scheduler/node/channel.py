"""The node channel: one long-lived supervisor per node and user, node side, standard library only, Python 3.8.

The scheduler keeps an SSH connection to each node anyway; over it, instead of one ``python3`` per command, it
may start the supervisor once with action "channel" and keep it: the supervisor then answers requests read from
its stdin, one JSON document a line ({"id": N, "params": the action's PARAMS}), with one line each
({"id": N, "doc": what the action prints in a command of its own}), and pushes what changes between them:

  {"event": "hello", "supervisor": PROTOCOL, "pid", "user"}   first, once it runs as its user
  {"event": "run", "run_dir", "state", "was", "step"}          a watched run's state or step changed (exited...)
  {"event": "output", "runs": {run_dir: mtime}}                 watched runs' output.log written since (OUTPUT_S)
  {"event": "log", "follow": N, "offset", "data"}              a followed file grew: its bytes from offset (base64)
  {"event": "heartbeat", "time", "watching"}                   after HEARTBEAT_S with nothing else said

The runs watched are those of the last status read by run folders (the scheduler's held runs of this node and
user): their status.json is looked at every WATCH_S (its size and mtime: one stat each), read again when it
changed (a new state, or a new step of a running run: its image pulled, its data prepared), and the liveness
of those starting or running is checked every LIVENESS_S (a supervisor that died writes nothing). An event is a
hint that wakes the scheduler: what it then reads is the truth, so an event lost costs at most the scheduler's
next read of the node.

Two requests are the channel's own: {"action": "follow", "path", "offset"} pushes the file at `path` (as the read
action reads it, with the user's rights) from `offset` as it grows, at most FOLLOW_CHUNK bytes an event, looked at
every WATCH_S, as "log" events numbered by the request's id, until {"action": "unfollow", "follow": N} (at most
MAX_FOLLOWED at once): `ftconsole logs --follow` and the console's live tail.

The channel runs as one user, switched once when it starts (see "Users" in supervisor.py); a request for
another user is refused. It exits when its stdin closes: the SSH connection is gone, or the scheduler closed it;
nothing stays running on the node. Requests are answered one at a time, in order; a start forks the run's
supervisor as in a command of its own (detached, stdio on /dev/null), so it outlives the channel.
"""

import base64
import json
import os
import select
import time

from ftconsole.scheduler.node.supervisor_files import STATUS, _expand, _read_status  # bundled
from ftconsole.scheduler.node.supervisor_liveness import _observe  # bundled
from ftconsole.scheduler.node.supervisor_output import _output_chunk  # bundled

WATCH_S = 0.1  # how often the watched runs' status files are looked at
LIVENESS_S = 1.0  # how often the supervisors of the watched starting or running runs are looked for
# "alive": each line costs the scheduler about 0.6 ms of CPU (docs/benchmarks.md). The scheduler counts a frozen
# node's silence from its last line, so a stall shorter than node_timeout less this costs nothing (7 s of 10)
HEARTBEAT_S = 3.0
# how often the watched running runs' output.log is looked at: one line for all that moved. As often as the
# heartbeat, whose place it takes: a node whose ranks print costs the scheduler no more lines than a quiet one
OUTPUT_S = HEARTBEAT_S
MAX_REQUEST = 64 * 1024 * 1024  # a request line longer than this ends the channel (the scheduler's are far less)
MAX_WATCHED = 10000
MAX_FOLLOWED = 64
FOLLOW_CHUNK = 64 * 1024
_LIVE = ("starting", "running")


def _emit(doc):
    data = (json.dumps(doc, separators=(",", ":")) + "\n").encode("utf-8")
    while data:
        data = data[os.write(1, data) :]


def _watch_from(params, doc, watch):
    """The runs to watch after a status read by run folders: those it read, with the state it read."""
    if params.get("action") != "status" or params.get("run_dirs") is None:
        return watch
    out = {}
    for entry in (doc.get("runs") or [])[:MAX_WATCHED]:
        given = entry.get("run_dir")
        if not isinstance(given, str):
            continue
        path = os.path.join(_expand(given), STATUS)
        status = entry.get("status") or {}
        out[given] = {
            "path": path,
            "sig": _signature(path),
            "state": status.get("state"),
            "step": status.get("step"),
            "output": status.get("output_mtime"),
        }
    return out


def _outputs(watch):
    """The event of the watched running runs whose output.log was written since last said (None: none was)."""
    moved = {}
    for given, seen in watch.items():
        if seen["state"] not in _LIVE:
            continue
        try:
            mtime = os.stat(os.path.join(os.path.dirname(seen["path"]), "output.log")).st_mtime
        except OSError:
            continue
        if mtime != seen["output"]:
            moved[given] = seen["output"] = mtime
    return {"event": "output", "runs": moved} if moved else None


def _signature(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _state(path):
    """(state, step) of the run whose status.json is at `path`, as a status read would say."""
    status, problem = _read_status(path)
    if problem is not None:
        return "lost", None
    if status is None:
        return "absent", None
    observed = _observe(status, path)
    return observed.get("state"), observed.get("step")


def _look(watch, liveness):
    """The events of the watched runs whose state changed since last looked at."""
    events = []
    for given, seen in watch.items():
        sig = _signature(seen["path"])
        if sig == seen["sig"] and not (liveness and seen["state"] in _LIVE):
            continue
        seen["sig"] = sig
        try:
            state, step = _state(seen["path"])
        except Exception:  # a run that cannot be read now is read by the scheduler's next read
            continue
        if state != seen["state"] or step != seen["step"]:
            events.append({"event": "run", "run_dir": given, "state": state, "was": seen["state"], "step": step})
            seen["state"], seen["step"] = state, step
    return events


def serve(answer, params):
    """Answer requests from stdin with `answer` (the supervisor's: PARAMS -> its document) until stdin closes."""
    user = params.get("user")
    _emit({"event": "hello", "supervisor": params.get("protocol"), "pid": os.getpid(), "user": user})
    watch = {}  # type: dict
    follows = {}  # type: dict  # request id -> {"path", "offset"}
    buffered = b""
    now = time.monotonic()
    looked, live, printed, said = now, now, now, now
    while True:
        ready, _, _ = select.select([0], [], [], WATCH_S)
        if ready:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return {"closed": True}
            buffered += chunk
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                watch = _request(answer, user, line, watch, follows)
                said = time.monotonic()
            if len(buffered) > MAX_REQUEST:
                return {"error": "a request of over %d bytes" % MAX_REQUEST}
        now = time.monotonic()
        if now - looked >= WATCH_S:
            liveness = now - live >= LIVENESS_S
            for event in _look(watch, liveness) + _grown(follows):
                _emit(event)
                said = now
            looked, live = now, now if liveness else live
        if now - printed >= OUTPUT_S:
            event = _outputs(watch)
            if event is not None:
                _emit(event)
                said = now
            printed = now
        if now - said >= HEARTBEAT_S:
            _emit({"event": "heartbeat", "time": time.time(), "watching": len(watch)})
            said = now


def _request(answer, user, line, watch, follows):
    """One request line: its answer written, and the runs to watch from then on."""
    try:
        request = json.loads(line.decode("utf-8"))
        number, params = request["id"], request["params"]
        if not isinstance(params, dict):
            raise ValueError("params is not an object")
    except (ValueError, KeyError, TypeError) as exc:
        _emit({"id": None, "doc": {"error": "a request that is not one: %s" % exc}})
        return watch
    if params.get("user") != user:
        doc = {"error": "this channel runs as %r, not %r" % (user, params.get("user"))}
    elif params.get("action") in ("follow", "unfollow"):
        doc = _follow(params, number, follows)
    else:
        doc = answer(params)
    _emit({"id": number, "doc": doc})
    return _watch_from(params, doc, watch)


def _follow(params, number, follows):
    """A follow (numbered `number`) or unfollow request: its answer."""
    if params.get("action") == "unfollow":
        follows.pop(params.get("follow"), None)
        return {"following": len(follows)}
    if len(follows) >= MAX_FOLLOWED:
        return {"error": "%d files followed already" % MAX_FOLLOWED}
    try:
        follows[number] = {"path": _expand(str(params["path"])), "offset": max(0, int(params.get("offset") or 0))}
    except (KeyError, TypeError, ValueError) as exc:
        return {"error": "a follow that is not one: %s" % exc}
    return {"follow": number}


def _grown(follows):
    """The "log" events of the followed files that grew (one chunk each). Offsets count what a job's
    output_limit dropped (supervisor_output.py): a follower whose next byte was dropped gets the file's header and
    what was kept, from a later offset than it asked for. A file being cut is looked at again."""
    events = []
    for number, seen in follows.items():
        try:
            st = os.stat(seen["path"])
            sig = (st.st_ino, st.st_size, st.st_mtime_ns)
            if sig == seen.get("sig"):
                continue
            got = _output_chunk(seen["path"], seen["offset"], FOLLOW_CHUNK, wait=0)
        except OSError:  # not there yet, or gone: looked at again
            continue
        if got is None:
            continue
        start, data, end = got
        if start + len(data) >= end:
            seen["sig"] = sig  # read to its end: looked at again once it changes
        if data:
            events.append(
                {"event": "log", "follow": number, "offset": start, "data": base64.b64encode(data).decode("ascii")}
            )
            seen["offset"] = start + len(data)
    return events


def loader():
    """The ``python3 -c`` program that starts a channel: it reads a length line, then that many bytes of program
    (the supervisor with its PARAMS), from stdin unbuffered, and runs it; stdin goes on as the request stream."""
    return (
        "import os,sys\n"
        "def _r(n):\n"
        " b=b''\n"
        " while len(b)<n:\n"
        "  c=os.read(0,n-len(b))\n"
        "  if not c:sys.exit(0)\n"
        "  b+=c\n"
        " return b\n"
        "h=b''\n"
        "while not h.endswith(b'\\n'):h+=_r(1)\n"
        "exec(compile(_r(int(h)),'ftconsole-channel','exec'))\n"
    )
