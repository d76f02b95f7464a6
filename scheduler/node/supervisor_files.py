"""The run supervisor's run folder files: node side, standard library only, Python 3.8.

Paths with "~/" expanded, whole-or-nothing writes (temporary file, fsync, rename; 0600), reads that answer
None for a missing or broken file, private (0700) folders, and the claim of a run folder by a token (see
"Writes" and "Identity" in supervisor.py). Bundled into the supervisor script (`scheduler/node/bundle.py`): it
imports only the standard library, and the names it defines share one namespace with the other bundled
modules.
"""

import itertools
import json
import math
import os
import stat

STATUS = "status.json"
CLAIM = "claim"
_WRITES = itertools.count()


def _expand(path):
    return os.path.abspath(os.path.expanduser(path))


def _tilde(value):
    return os.path.expanduser(value) if value.startswith("~/") else value


def _write_file(path, text):
    """Write whole or not at all: a temporary file, fsync'd, then renamed over `path`."""
    # a stop handler may write meanwhile; nodes sharing a home write the attempt's container.py at once
    tmp = "%s.%s.%d.%d.tmp" % (path, os.uname()[1], os.getpid(), next(_WRITES))
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


# status.json belongs to the run's user, who may write anything in it: it is read as untrusted input
STATUS_MAX_BYTES = 64 * 1024  # the supervisor's own is well under 4 KiB
PID_MAX = 1 << 22  # the kernel's largest pid_max (PID_MAX_LIMIT)
_STATES = ("starting", "running", "exited", "failed", "lost")  # what the supervisor writes
_PIDS = ("supervisor_pid", "pid", "pgid")
_TICKS = ("supervisor_start", "pid_start")  # clock ticks since boot
_TIMES = ("started", "ended", "stop_requested")  # epoch seconds
_TEXTS = {"token": 200, "node": 1000, "boot_id": 100, "step": 1000, "signal": 32, "error": 10000}  # -> most chars
_CONTAINER = ("runtime", "path", "name", "cidfile")
UNREADABLE = "its status file is unreadable: "


def _read_status(path):
    """(status.json checked by `_checked_status`, None) or (None, what is wrong with it); (None, None) when
    there is none. Opened without following a link or waiting on a FIFO, and read only when it is a regular file
    of at most STATUS_MAX_BYTES: a run's user can put anything there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, "cannot open it (%s)" % (exc.strerror or exc)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "it is not a regular file"
        if st.st_size > STATUS_MAX_BYTES:
            return None, "it has %d bytes, more than %d" % (st.st_size, STATUS_MAX_BYTES)
        data = os.read(fd, STATUS_MAX_BYTES + 1)
    except OSError as exc:
        return None, "cannot read it (%s)" % (exc.strerror or exc)
    finally:
        os.close(fd)
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return None, "not JSON (%s)" % str(exc)[:200]
    return _checked_status(doc)


def _is_int(value, low, high):
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_time(value):
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and math.isfinite(value) and 0 <= value < 1e11


def _shown(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _checked_status(doc):
    """(the status document with only the keys the supervisor writes, None) when every one of them has its type
    and range, else (None, the first thing wrong). A run claimed by a token that has not ended has its
    supervisor's start time (a document without it is an earlier ftconsole's, from before tokens: "Liveness")."""
    if not isinstance(doc, dict):
        return None, "not a JSON object but %s" % type(doc).__name__
    if doc.get("state") not in _STATES:
        return None, "state %s is not one of %s" % (_shown(doc.get("state")), ", ".join(_STATES))
    out = {"state": doc["state"]}
    for key in _PIDS:
        if doc.get(key) is not None and not _is_int(doc[key], 1, PID_MAX):
            return None, "%s %s is not a pid" % (key, _shown(doc[key]))
    for key in _TICKS:
        if doc.get(key) is not None and not _is_int(doc[key], 0, 1 << 62):
            return None, "%s %s is not a start time in clock ticks" % (key, _shown(doc[key]))
    for key in _TIMES:
        if doc.get(key) is not None and not _is_time(doc[key]):
            return None, "%s %s is not a time" % (key, _shown(doc[key]))
    if doc.get("exit_code") is not None and not _is_int(doc["exit_code"], 0, 255):
        return None, "exit_code %s is not an exit status (0 to 255)" % _shown(doc["exit_code"])
    for key, most in _TEXTS.items():
        value = doc.get(key)
        if value is not None and not (isinstance(value, str) and len(value) <= most):
            return None, "%s %s is not a text of at most %d characters" % (key, _shown(value), most)
    container = doc.get("container")
    if container is not None:
        if not isinstance(container, dict) or not all(
            container.get(k) is None or (isinstance(container[k], str) and len(container[k]) <= 4096)
            for k in _CONTAINER
        ):
            return None, "container %s is not a container's runtime, path, name and cidfile" % _shown(container)
        container = {k: container.get(k) for k in _CONTAINER}
    if doc.get("token") is not None and doc["state"] in ("starting", "running") and "supervisor_start" not in doc:
        return None, "it has a token but no supervisor_start"
    for key in _PIDS + _TICKS + _TIMES + tuple(_TEXTS) + ("exit_code", "container"):
        if key in doc:
            out[key] = container if key == "container" else doc[key]
    return out, None


def _unreadable(problem):
    """What a run whose status file is unreadable reads: lost, nothing in the file trusted (nor acted on)."""
    return {"state": "lost", "error": UNREADABLE + problem}


def _read_text(path, most=4096):
    """The text of a small file of a run folder (a claim: its user's, like everything there), at most `most`
    bytes of it; None when it cannot be read. Never through a link, never waiting on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, most).decode("utf-8", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)


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
