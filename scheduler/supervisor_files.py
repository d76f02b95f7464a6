"""The run supervisor's run folder files: node side, standard library only, Python 3.8.

Paths with "~/" expanded, whole-or-nothing writes (temporary file, fsync, rename; 0600), reads that answer
None for a missing or broken file, private (0700) folders, and the claim of a run folder by a token (see
"Writes" and "Identity" in supervisor.py). Bundled into the supervisor script (`scheduler/bundle.py`): it
imports only the standard library, and the names it defines share one namespace with the other bundled
modules.
"""

import itertools
import json
import os

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


def _read_text(path):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


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
