"""The data copy's locks and trust (see datacopy.py): node side, standard library only, Python 3.8.

Who owns an entry and whether this account may trust it (`stranger`), and the lock of a data set: an fcntl lock
on a file beside it, this account's and 0600, never waited for longer than its patience, with who holds it
when it is given up (`locked`). With them, what every part of the copy says and refuses with (`say`,
`Refused`). Bundled into the data copy's script (`bundle.py`): it imports only the standard library.
"""

import contextlib
import fcntl
import os
import pwd
import stat
import sys
import time

LOCK_WAIT_S = 600.0  # at most this long for another data_prep's lock (PARAMS["lock_wait"]), then refused
PROC_LOCKS = "/proc/locks"


class Refused(Exception):
    """A data set this step may not or cannot prepare: the message says why."""

    code = 1


def say(text):
    sys.stdout.write(f"data_prep: {text}\n")
    sys.stdout.flush()


def duration_text(seconds):
    if seconds < 60:
        return f"{seconds:.1f} s"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def beside(dst, what):
    return os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.ftconsole-{what}")


def owner_text(uid):
    """`uid` as it reads in a message: "uid 1001 (alice)", or "uid 1001" with no name."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def stranger(st):
    """Why an entry (its lstat) cannot be trusted by this account, or None: it belongs to another account, or
    others may write in it (group or world write permission; a link's own mode means nothing)."""
    if st.st_uid != os.geteuid():
        return f"belongs to {owner_text(st.st_uid)}, not to {owner_text(os.geteuid())} that this run runs as"
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022:
        return f"may be written by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


@contextlib.contextmanager
def locked(dst, wait=True, patience=LOCK_WAIT_S):
    """Hold the lock of `dst` (an fcntl lock on a file beside it); yields False when `wait` is off and another
    process holds it. The lock file may be removed by its holder (a sweep): the lock is then taken again.

    The lock file is this account's, 0600: no other account may open it, so none can hold it. One of another
    account (or a link) is refused, and a lock held longer than `patience` seconds is given up with who holds it,
    where that can be known: a data_prep never waits forever."""
    path = beside(dst, "lock")
    said = False
    deadline = time.monotonic() + patience
    while True:
        fd = open_lock(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                os.close(fd)
                yield False
                return
            if not said:
                say(f"{dst}: another data_prep on this node is preparing it: waiting for it (at most "
                    f"{duration_text(patience)})")  # fmt: skip
                said = True
            if not wait_for_lock(fd, deadline):
                holder = lock_holder(fd)
                os.close(fd)
                raise Refused(
                    f"{dst}: gave up waiting for its lock {path} after {duration_text(patience)}: "
                    f"{holder or 'held by a process this node cannot name (another node sharing the folder?)'}"
                ) from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield True
    finally:
        os.close(fd)


def open_lock(path):
    """The lock file, opened (made 0600 when missing): never through a link, never another account's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        if os.path.islink(path):
            raise Refused(f"{path} is a symbolic link: refusing to use it as a lock (remove it by hand)") from None
        raise Refused(f"cannot open the lock {path}: {exc.strerror}") from None
    st = os.fstat(fd)
    why = stranger(st) if stat.S_ISREG(st.st_mode) else "is not a regular file"
    if why is not None and why.startswith("may be written"):
        why = None  # ours: its mode is ours to set (a lock made 0644 by an earlier ftconsole)
    if why is not None:
        os.close(fd)
        raise Refused(f"the lock {path} {why}: refusing to use it (its owner may remove it)")
    if stat.S_IMODE(st.st_mode) != 0o600:
        os.fchmod(fd, 0o600)  # no other account may open it now, so none can hold it
    return fd


def wait_for_lock(fd, deadline):
    """Take the lock of `fd`, waiting until `deadline` (time.monotonic()); False when it was not to be had."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


def lock_holder(fd):
    """Who holds the flock of the open file `fd`, from /proc/locks: "held by pid N of uid U (name)", or None."""
    st = os.fstat(fd)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open(PROC_LOCKS) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->" or fields[1] != "FLOCK" or fields[5] != dev:
            continue
        pid = fields[4]
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            return f"held by pid {pid}"
        return f"held by pid {pid} of {owner_text(uid)}"
    return None
