"""Data preparation (seed 003): node side, standard library only, Python 3.8.

The first step of a rank's run (step kind "data", see supervisor.py) when its job has `data_prep`, run as
``python3 -c SOURCE PARAMS`` with PARAMS a JSON document (built by `scheduler.dataprep.node_params`):

    {"sets": [{"from": SRC, "to": DST}, ...], "run_dir": the rank's run folder,
     "roots": the cluster's data_prep.roots, "retention": seconds (0: kept until removed by hand),
     "progress": seconds between progress lines, "lock_wait": seconds (default LOCK_WAIT_S)}

Paths starting with "~/" are the home of the account the run runs as. Everything it says goes to stdout (the
run's output.log), each line starting "data_prep: ", and on failure its last line says why (the supervisor
quotes a failing step's last line in the run's error, and so in the job's message).

For each data set, in order, holding an fcntl lock on a file beside DST (".NAME.ftconsole-lock") so that two
runs preparing one DST on a node take turns. The lock file is this account's and 0600 (one of another account,
or a link, is refused), so no other account can hold it; a lock held longer than PARAMS["lock_wait"] is given up
with a message naming its holder (from /proc/locks, when this node can see it):
- SRC must be a folder. Its manifest (every entry's path, each file's size and mtime, each link's target) is
  hashed. DST, when it exists, must carry our marker file (MARKER); a DST without it, or a symbolic link, is
  refused ("DST exists and was not made by data_prep: refusing to overwrite it"): nothing else of the node is
  ever written into or removed. DST and its marker must be this account's (the account the run runs as) and
  not writable by group or others: else refused ("DST belongs to uid N (bob), not to ...: refusing to trust it
  or write into it"), since anyone could have made a marker and files of the right sizes and mtimes. An entry
  inside our DST that is another account's, or writable by others, makes DST copied again afresh (never kept,
  never synced in place), and every copy is made not writable by group or others.
- Up to date (the marker's manifest is SRC's, and DST's own manifest is too): skipped, and the log says so.
- Else copied: ``rsync -a --delete SRC/ DST/`` where rsync is on PATH (into DST itself when it is ours
  already, so that only what changed moves; the marker reads "copying" meanwhile, so a half copy is never
  taken for a good one), else ``cp -a`` into a fresh temporary folder beside DST, renamed into place once
  whole (the old DST, ours, is renamed away and removed). Progress lines every PARAMS["progress"] seconds.
- Then the marker: the manifest, when it was prepared and last used, and the run folders that used it.
A failure (SRC missing, disk full, permission) ends the step with a non-zero status and the copy's own error
text; what a killed copy leaves (a temporary folder, the marker at "copying") is cleaned or copied over by
the next data_prep of that DST.

Keeping (DESIGN: "kept 7 days, configured by the administrator"): before it prepares anything, the step
removes the data sets under the configured roots (at most MAX_DEPTH folders down, never through a link) that
carry our marker, belong to this account, and were last used more than `retention` seconds ago. Last use is
the latest of the marker's use and the end of each run that used it (its status.json, while its run folder
is kept); a data set a live run used is never removed. This runs here, not in the status read that prunes
run folders, because removing a data set of millions of files may take minutes, and that read is the node's
heartbeat (scheduler.node_timeout); the data step is also where the space is needed.
"""

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

from ftconsole.scheduler.node.datacopy_locks import (  # bundled
    LOCK_WAIT_S,
    Refused,
    beside,
    duration_text,
    locked,
    say,
    stranger,
)
from ftconsole.scheduler.node.proc import _alive, boot_id  # bundled
from ftconsole.scheduler.node.supervisor_files import _expand  # bundled

MARKER = ".ftconsole-data.json"
BY = "ftconsole data_prep"
MAX_DEPTH = 4  # a data set lies at most this many folders below its root (the submit check says so too)
MAX_VISITS = 20000  # folders looked at per root while looking for expired data sets
MAX_RUNS = 16  # the run folders a marker remembers


class CopyFailed(Refused):
    def __init__(self, message, code):
        Refused.__init__(self, message)
        self.code = code if code and code > 0 else 1


class Stopped(BaseException):
    """SIGTERM: the run is being stopped."""


def size_text(count):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"


def inside(path, folder):
    """`path` is `folder` or lies inside it (both absolute, normalised)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


# -- the manifest and the marker -------------------------------------------------------------------------------


def manifest(top):
    """(digest, files, bytes) of the tree under `top`: each entry's relative path, with each file's size and
    mtime (whole seconds: what rsync -a and cp -a keep) and each link's target; the top's marker left out."""
    digest = hashlib.sha256()
    files = total = 0
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(top, rel) if rel else top) as found:
            entries = sorted(found, key=lambda e: e.name)
        for entry in entries:
            if not rel and entry.name == MARKER:
                continue
            path = rel + "/" + entry.name if rel else entry.name
            if entry.is_symlink():
                line = f"l {path} {os.readlink(entry.path)}"
            elif entry.is_dir(follow_symlinks=False):
                line = "d " + path
                stack.append(path)
            elif entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                files += 1
                total += st.st_size
                line = f"f {path} {st.st_size} {int(st.st_mtime)}"
            else:
                line = "o " + path
            digest.update(line.encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest(), files, total


class Untrusted(Refused):
    """An entry of a data set that this account did not make alone (see `stranger`)."""


def read_marker(folder):
    """Our marker in `folder` (a dict), or None when there is none, it is not ours, or someone else could have
    written it (another account's, or writable by others: see `stranger`)."""
    path = os.path.join(folder, MARKER)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or stranger(st) is not None:
        return None
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("by") == BY else None


def check_trusted(dst):
    """Refused unless the existing folder `dst` and its marker (when it has one) are this account's alone: a
    data set someone else made or could have changed is never copied into, and never taken for a copy."""
    for path in (dst, os.path.join(dst, MARKER)):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        why = stranger(st)
        if why is not None:
            raise Refused(f"{path} {why}: refusing to trust it or write into it (remove it, or choose another `to`)")


def not_ours(top):
    """The first entry under `top` (the folder itself included) that is not this account's alone, with why; None
    when every one is (a walk of lstat calls, as `manifest`'s)."""
    stack = [top]
    while stack:
        folder = stack.pop()
        why = stranger(os.lstat(folder))
        if why is not None:
            return f"{folder} {why}"
        with os.scandir(folder) as found:
            for entry in found:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
                    continue
                why = stranger(st)
                if why is not None:
                    return f"{entry.path} {why}"
    return None


def private_copy(top):
    """Take write permission from group and others on every entry of a fresh copy (links have none of their own):
    what the source allowed them, on a shared file system, is not to be allowed on this node's copy."""
    for folder, _, names in os.walk(top):
        for path in [folder] + [os.path.join(folder, n) for n in names]:  # each folder comes as `folder`
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022:
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)


def write_marker(folder, doc):
    path = os.path.join(folder, MARKER)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(dict(doc, by=BY), fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def used_by(marker, run_dir, now):
    runs = [r for r in marker.get("runs") or [] if r != run_dir]
    if run_dir:
        runs.append(run_dir)
    return dict(marker, used=now, runs=runs[-MAX_RUNS:])


# -- leftovers -------------------------------------------------------------------------------------------------


def clean_leftovers(dst):
    """Temporary and trash folders of earlier data_preps of `dst` that were killed (they carry our marker)."""
    parent, prefix = os.path.dirname(dst), f".{os.path.basename(dst)}.ftconsole-"
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        if not name.startswith(prefix) or name.endswith("-lock"):
            continue
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and read_marker(path):  # ours alone
            shutil.rmtree(path, ignore_errors=True)


# -- copying ---------------------------------------------------------------------------------------------------


def tree_bytes(top):
    total = 0
    for folder, _, names in os.walk(top):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def copy(argv, target, total, every, rsync):
    """Run the copy tool, saying how far it got every `every` seconds; raise CopyFailed with its last error line."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if rsync else subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    errors = []  # the tool's stderr lines (also passed on to the log as they come)
    done = {"bytes": 0}

    stderr, stdout = proc.stderr, proc.stdout
    assert stderr is not None

    def pump_errors():
        for raw in iter(stderr.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
                errors.append(line)
                del errors[:-20]

    def pump_progress():  # rsync --info=progress2: records ended by \r, the first field the bytes so far
        assert stdout is not None
        pending = b""
        while True:
            chunk = os.read(stdout.fileno(), 65536)
            if not chunk:
                return
            pending += chunk
            records = pending.replace(b"\r", b"\n").split(b"\n")
            pending = records.pop()
            for record in records:
                fields = record.split()
                if fields and fields[0].replace(b",", b"").isdigit():
                    done["bytes"] = int(fields[0].replace(b",", b""))

    pumps = [threading.Thread(target=pump_errors, daemon=True)]
    if rsync:
        pumps.append(threading.Thread(target=pump_progress, daemon=True))
    for pump in pumps:
        pump.start()
    started = time.time()
    next_at = started + every
    try:
        while proc.poll() is None:
            time.sleep(0.1)
            if time.time() >= next_at:
                looked = time.time()
                copied = done["bytes"] if rsync else tree_bytes(target)
                spent = time.time() - looked  # a large tree is not walked more often than it is worth
                share = f" ({min(100, copied * 100 // total)}%)" if total else ""
                took = duration_text(time.time() - started)
                say(f"{size_text(copied)} of {size_text(total)} copied{share}, {took}")
                next_at = time.time() + max(every, 4 * spent)
    finally:
        if proc.poll() is None:  # stopped: the tool got the same SIGTERM (one process group); make sure
            with contextlib.suppress(OSError):
                proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        for pump in pumps:
            pump.join(5)
    if proc.returncode != 0:
        causes = [e for e in errors if not e.startswith("rsync error:")] or errors
        code = proc.returncode
        how = f"exited with code {code}" if code > 0 else f"was killed by signal {-code}"
        raise CopyFailed(f"{argv[0]} {how}: {causes[-1] if causes else 'it said nothing'}", code)


def prepare_set(entry, run_dir, roots, every, patience=LOCK_WAIT_S):
    src, dst = _expand(entry["from"]), _expand(entry["to"])
    try:
        os.stat(src)
    except OSError as exc:
        raise Refused(f"source {src}: {exc.strerror}") from None
    if not os.path.isdir(src):
        raise Refused(f"source {src} is not a folder: data_prep copies folders")
    parent = os.path.dirname(dst)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise Refused(f"cannot make {parent}: {exc.strerror}") from None
    real_src, real_dst = os.path.realpath(src), os.path.join(os.path.realpath(parent), os.path.basename(dst))
    real_roots = [os.path.realpath(_expand(r)) for r in roots]
    if roots and not any(inside(real_dst, r) and real_dst != r for r in real_roots):
        named = ", ".join(roots)
        raise Refused(f"{dst} is not inside this cluster's data_prep.roots ({named}) once links are followed: refusing")
    if inside(real_dst, real_src) or inside(real_src, real_dst):
        raise Refused(f"{src} and {dst} overlap (once links are followed): refusing to copy one into the other")
    with locked(dst, patience=patience):
        clean_leftovers(dst)
        if os.path.islink(dst):
            raise Refused(f"{dst} is a symbolic link: refusing to write through it")
        marker = None
        if os.path.lexists(dst):
            check_trusted(dst)  # another account's folder or marker (or one others may write) is never trusted
            marker = read_marker(dst) if os.path.isdir(dst) else None
            if marker is None:
                raise Refused(
                    f"{dst} exists and was not made by data_prep: refusing to overwrite it (remove it by hand, or "
                    "choose another `to`)"
                )
        listed = time.time()
        digest, files, total = manifest(src)
        now = time.time()
        # what is in DST is trusted (kept, or copied over in place) only when every entry of it is ours alone
        stray = not_ours(dst) if marker is not None else None
        if stray is not None:
            say(f"{dst}: {stray}: copying it again, afresh")
        elif marker is not None and marker.get("state") == "ready" and marker.get("digest") == digest:
            if manifest(dst)[0] == digest:
                write_marker(dst, used_by(marker, run_dir, now))
                took = duration_text(now - listed)
                say(f"{dst}: up to date: {files} files, {size_text(total)}, skipped (source listed in {took})")
                return
            say(f"{dst}: changed since it was prepared: copying again")
        rsync = shutil.which("rsync") is not None
        tool = "rsync" if rsync else "cp"
        say(f"copying {src} to {dst}: {files} files, {size_text(total)} ({tool})")
        started = time.time()
        tmp = None
        try:
            if marker is not None and rsync and stray is None:  # in place: only what changed moves
                target = dst
                write_marker(dst, dict(marker, state="copying"))
            else:
                target = tmp = beside(dst, f"tmp-{os.getpid()}")
                os.mkdir(tmp, 0o700)
                write_marker(tmp, {"state": "copying", "from": src, "to": dst})
            if rsync:
                argv = ["rsync", "-a", "--delete", "--exclude=/" + MARKER, "--info=progress2", src + "/", target + "/"]
            else:
                argv = ["cp", "-a", "--", src + "/.", target + "/"]
            try:
                copy(argv, target, total, every, rsync)
            except CopyFailed as exc:
                raise CopyFailed(f"copying {src} to {dst} failed: {exc}", exc.code) from None
            private_copy(target)
            copied = manifest(target)[0]
            if copied != digest:  # the source changed meanwhile: good only if the copy is the source as it is now
                digest, files, total = manifest(src)
                if copied != digest:
                    raise Refused(f"{src} changed while it was copied: run the job again once it is still")
            now = time.time()
            write_marker(target, used_by({"state": "ready", "from": src, "to": dst, "digest": digest, "files": files,
                                          "bytes": total, "prepared": now}, run_dir, now))  # fmt: skip
            if tmp is not None:
                if marker is not None:  # our earlier copy: renamed away, then removed
                    trash = beside(dst, f"trash-{os.getpid()}")
                    os.rename(dst, trash)
                    os.rename(tmp, dst)
                    shutil.rmtree(trash, ignore_errors=True)
                else:
                    os.rename(tmp, dst)
                tmp = None
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        spent = max(time.time() - started, 0.001)
        rate = size_text(int(total / spent))
        say(f"{dst}: copied {files} files, {size_text(total)} in {duration_text(spent)} ({rate}/s)")


# -- keeping ---------------------------------------------------------------------------------------------------


def last_use(marker, now):
    """When the data set was last used, or None while a run that used it may still run (or cannot be read)."""
    last = marker.get("used") or marker.get("prepared") or now
    for run_dir in marker.get("runs") or []:
        path = os.path.join(_expand(run_dir), "status.json")
        try:
            with open(path) as fh:
                status = json.load(fh)
            changed = os.stat(path).st_mtime
        except FileNotFoundError:
            continue  # its run folder is gone (pruned): its start is all that is known
        except (OSError, ValueError):
            return None
        if not isinstance(status, dict):
            return None
        if status.get("state") in ("starting", "running"):
            pid, started = status.get("supervisor_pid"), status.get("supervisor_start")
            if status.get("boot_id") == boot_id() and _alive(pid, started):
                return None
        ended = status.get("ended")
        last = max(last, ended if isinstance(ended, (int, float)) else changed)
    return last


def prepared_under(root):
    """Folders under `root` (at most MAX_DEPTH down, never through a link) that carry our marker."""
    found, queue, visits = [], [(root, 0)], 0
    while queue and visits < MAX_VISITS:
        folder, depth = queue.pop(0)
        visits += 1
        try:
            with os.scandir(folder) as entries:
                subs = sorted(
                    e.path for e in entries if ".ftconsole-" not in e.name and e.is_dir(follow_symlinks=False)
                )
        except OSError:
            continue
        for sub in subs:
            if read_marker(sub) is not None:
                found.append(sub)
            elif depth + 1 < MAX_DEPTH:
                queue.append((sub, depth + 1))
    return found


def sweep(roots, retention, keep, now):
    """Remove the expired data sets of this account under the roots (see the module docstring); never fails."""
    if not roots or retention <= 0:
        return
    for root in roots:
        real = os.path.realpath(_expand(root))
        if not os.path.isdir(real):
            continue
        for folder in prepared_under(real):
            if folder in keep:
                continue
            try:
                expire(folder, retention, now)
            except OSError as exc:
                say(f"cannot remove {folder}: {exc}")


def expire(folder, retention, now):
    marker = read_marker(folder)  # None for a marker of another account's, or one others may write
    if marker is None or os.lstat(folder).st_uid != os.geteuid():
        return  # another account's: its own runs keep it
    last = last_use(marker, now)
    if last is None or now - last < retention:
        return
    with locked(folder, wait=False) as mine:
        if not mine or read_marker(folder) != marker:
            return  # being prepared or used right now
        trash = beside(folder, f"trash-{os.getpid()}")
        os.rename(folder, trash)
        ago, kept = age_text(now - last), age_text(retention)
        say(f"removed {folder}: last used {ago} ago, data_prep.retention is {kept}")
        shutil.rmtree(trash, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.unlink(beside(folder, "lock"))


def age_text(seconds):
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}".rstrip("0").rstrip(".") + unit
    return f"{int(seconds)}s"


# -- main ------------------------------------------------------------------------------------------------------


def on_term(signum, frame):
    raise Stopped()


def main(argv):
    params = json.loads(argv[1])
    signal.signal(signal.SIGTERM, on_term)
    sets = params.get("sets") or []
    run_dir = _expand(params["run_dir"]) if params.get("run_dir") else None  # as the marker remembers it
    roots = params.get("roots") or []
    every = float(params.get("progress") or 5)
    patience = float(params.get("lock_wait") or LOCK_WAIT_S)
    keep = set()
    for entry in sets:
        dst = _expand(entry["to"])
        keep.add(os.path.join(os.path.realpath(os.path.dirname(dst)), os.path.basename(dst)))
    try:
        sweep(roots, float(params.get("retention") or 0), keep, time.time())
        for entry in sets:
            prepare_set(entry, run_dir, roots, every, patience)
    except Refused as exc:
        say(str(exc))
        return exc.code
    except OSError as exc:  # disk full, permission...: the call's own words
        where = f" {exc.filename}" if exc.filename else ""
        say(f"failed:{where}: {exc.strerror or exc}")
        return 1
    except Stopped:
        say("stopped")
        return 128 + signal.SIGTERM
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
