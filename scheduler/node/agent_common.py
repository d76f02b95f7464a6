"""The probe agent's shared helpers (node side, bundled into the agent's script: see agent.py and bundle.py).

Value coercion (everything that leaves a reader goes through these, so the checks see clean types), the one
time budget of the slow sub-steps, file reads under the sysroot, and bounded subprocesses. Python 3.8,
standard library only; no ``from __future__`` (a prepended PARAMS line would break it).
"""

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time

MIB = 1024 * 1024
NOT_AVAILABLE = ("", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]")


def as_number(value):
    """An int or finite float, else None (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def as_int(value):
    number = as_number(value)
    return None if number is None else int(number)


def as_str(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def as_bool(value):
    return value if isinstance(value, bool) else None


def as_list(value):
    if isinstance(value, (list, tuple)):
        return list(value)
    return []


def as_pids(value):
    return [p for p in as_list(value) if isinstance(p, int) and not isinstance(p, bool)]


class Deadline(object):
    """The one time budget shared by the slow sub-steps."""

    def __init__(self, seconds):
        self.end = time.monotonic() + max(0.0, float(seconds))

    def remaining(self, floor=0.05):
        return max(floor, self.end - time.monotonic())


def host_path(sysroot, path):
    return os.path.join(sysroot, path.lstrip("/"))


def read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def safe(function, *args):
    try:
        return function(*args)
    except Exception:
        return None


def run_bounded(argv, seconds):
    """(exit status, stdout, stderr) of a command given at most `seconds`; raises OSError when it cannot start
    and subprocess.TimeoutExpired when it runs over. It runs in a session of its own, and on a timeout the
    whole session is killed, so a child that keeps the output pipes open cannot hold the agent past its time."""
    child = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        universal_newlines=True,
        start_new_session=True,
    )
    try:
        out, err = child.communicate(timeout=seconds)
    except subprocess.TimeoutExpired as exc:
        with contextlib.suppress(OSError):
            os.killpg(child.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.communicate(timeout=1.0)  # reaps it; a process that left the session may still hold a pipe
        raise exc
    return child.returncode, out, err


def merged_params(argv, prepended, defaults, apart=()):
    """A node script's parameters: those the scheduler prepended (`PARAMS`, passed as `prepended`), else argv[1]
    (a JSON string), else none; each given with a value over `defaults`, but the keys `apart` (the script merges
    those itself). Also the whole given dict, for those keys."""
    given = prepended
    if given is None and len(argv) > 1:
        given = json.loads(argv[1])
    if not isinstance(given, dict):
        given = {}
    params = dict(defaults)
    params.update((k, v) for k, v in given.items() if v is not None and k not in apart)
    return params, given


def print_one_line(name, load, make, argv):
    """A node script's main: its parameters (`load(argv)`), then `make(params)` printed as one compact JSON line;
    0, or 2 when argv[1] is not JSON."""
    try:
        params = load(argv)
    except ValueError as exc:
        sys.stderr.write("%s: argv[1] is not a JSON object: %s\n" % (name, exc))
        return 2
    sys.stdout.write(json.dumps(make(params), separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return 0


def keep_json(path, doc):
    """Write `doc` at `path` whole, for the next runs (0600, in a 0700 folder, by rename: a reader never sees half
    of it); a home that cannot be written keeps nothing."""
    folder = os.path.dirname(path)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        os.makedirs(folder, 0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def first_line(*texts):
    """The first non-empty line of the first text that has one, or "no output"."""
    for text in texts:
        for line in (text or "").splitlines():
            if line.strip():
                return line.strip()
    return "no output"


def run_command(argv, deadline):
    """stdout of a command, or an exception (OSError, SubprocessError) with a readable message."""
    status, out, err = run_bounded(argv, deadline.remaining())
    if status != 0:
        raise subprocess.SubprocessError("exit status %d: %s" % (status, first_line(err, out)))
    return out
