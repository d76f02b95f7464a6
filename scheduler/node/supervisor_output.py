"""output.log's cap (a job's `output_limit`): node side, standard library only, Python 3.8.

A rank's processes write output.log through the file descriptor the supervisor opened (O_APPEND, passed to
each step as its stdout and stderr): the supervisor never sees the bytes, so it caps the file from beside it.
A thread of the detached supervisor (`output_watch`) looks at the file's size, more often the faster it grows,
and once it passes half the limit cuts it (`output_cut`): under an exclusive lock on the file, it writes a
header line at its start, copies the newest quarter of the limit (from a line's start) behind it, and truncates
the file there. The rank's next writes land at the new end, since its descriptor appends. So output.log stays
under the limit while the cutter keeps up (it looks at least every CHECK_MAX_S, and often enough that at the
rate the file grows it passes at most an eighth of the limit between two looks), and the last cut leaves a
quarter of it. As with logrotate's copytruncate, a write that lands between the copy's last look at the size and
the truncation is lost (the cutter may be descheduled there on a busy node); a rank that writes faster than the
copy goes may pass the limit. A loss is said, not silent: the ranks' writes go through the open file they share
with the supervisor (their stdout is its descriptor), and each append moves its offset to the file's end, so an
offset past what the cut copied, right after the truncation, is the end of a write it took away. The cutter then
appends a line at once, where that write's bytes would have been:
`== ftconsole: output lost: 5050 bytes written while output.log was cut ==` (`output_lost_line`).

The header says how many bytes of output were dropped before what follows it, in all:
`== ftconsole: earlier output dropped: output_limit 64 KiB (the first 4980736 bytes) ==`. Readers count in
offsets of the whole output, as if nothing had been dropped (`_output_chunk`): byte p of the file (past the
header of H bytes) is byte p - H + D of the output; the header itself stands for the bytes D - H to D. So an
offset a reader got before a cut stays good after it: a reader whose next byte was kept goes on where it was,
and one whose next byte was dropped gets the header first, then what was kept. Readers take a shared lock on
the file, which a cut in progress holds exclusively (where the file system has no locks, they go on without).

Bundled into the supervisor script (`scheduler/node/bundle.py`): it imports only the standard library, and the
names it defines share one namespace with the other bundled modules.
"""

import errno
import fcntl
import os
import re
import threading
import time

CUT_AT = 2  # a cut once output.log passes limit / CUT_AT ...
KEEP = 4  # ... keeps its newest limit / KEEP bytes (and the header)
MIN_OUTPUT_LIMIT = 16 * 1024  # the least limit (the spec's bound too): the header and a line or two
CHECK_MIN_S = 0.005
CHECK_MAX_S = 1.0
RATE_HALF_LIFE_S = 10.0  # the rate a rank wrote at counts half as much this long after
COPY_BYTES = 1 << 20  # a cut copies this much at a time
LINE_SEARCH = 64 * 1024  # a cut keeps from the first line start within this many bytes of where the tail starts
CATCH_UP = 16  # times a cut copies what the rank wrote meanwhile before it truncates
# A write's new size shows only once it is done, and a truncation waits for it: the size is read again this long
# after the copy, so that a write under way at the copy's last look is copied rather than truncated away.
SETTLE_S = 0.001
LOCK_WAIT_S = 10.0  # a read waits this long for a cut to end (one of 256 MiB on a slow NFS home takes a while)
HEADER_MAX = 200
_HEADER = re.compile(
    rb"== ftconsole: earlier output dropped: output_limit [^\n]{1,40} \(the first (\d{1,19}) bytes\) ==\n"
)


def output_size_text(size):
    """`size` bytes as the spec writes it: 64 KiB, 1.5 GiB, 100 bytes."""
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return "%g %s" % (round(size / factor, 2), unit)
    return "%d bytes" % size


def output_header(limit, dropped):
    """The header line of a cut output.log: `dropped` bytes of output were dropped before what follows."""
    return ("== ftconsole: earlier output dropped: output_limit %s (the first %d bytes) ==\n"
            % (output_size_text(limit), dropped)).encode()  # fmt: skip


def output_header_of(head):
    """(bytes dropped, the header's length) of a file that starts with `head`; (0, 0) when it has no header."""
    match = _HEADER.match(head)
    if match is None:
        return 0, 0
    return int(match.group(1)), match.end()


def output_position(offset, dropped, header, size):
    """(the offset of the output a read from `offset` starts at, where in the file that is): see the module's
    docstring. A read from a dropped offset starts at the header, or right after it when `offset` lies within
    the header's own offsets (a reader never gets part of it)."""
    if offset >= dropped:
        return offset, min(size, offset - dropped + header)
    if offset <= dropped - header:
        return dropped - header, 0
    return dropped, header


def output_cut_due(size, limit):
    """Whether output.log of `size` bytes is to be cut (`limit` 0: never)."""
    return limit > 0 and size > limit // CUT_AT


def output_keep_from(size, limit, window):
    """Where in the file the kept tail starts: limit // KEEP bytes before its end, moved on to the start of the
    next line when one starts within `window` (the bytes from there on)."""
    start = max(0, size - limit // KEEP)
    newline = window.find(b"\n")
    return start if newline < 0 or newline + 1 >= len(window) else start + newline + 1


def output_rate(rate, grown, elapsed):
    """How fast output.log grows, in bytes a second: what it grew by in the last `elapsed` seconds, or the rate
    seen before (`rate`) halved every RATE_HALF_LIFE_S when that was more (a rank prints in bursts)."""
    return max(grown / max(elapsed, 1e-6), rate * 0.5 ** (elapsed / RATE_HALF_LIFE_S))


def output_next_check(interval, rate, limit):
    """Seconds until the next look at the size, the last `interval` after: soon enough that, at `rate`, it grows by
    at most an eighth of the limit meanwhile (a quarter of the room between where a cut happens and the limit),
    and at most twice the last interval (a rank that has not printed yet may start at once), within CHECK_MIN_S
    and CHECK_MAX_S."""
    soon = limit / 8.0 / rate if rate > 0 else CHECK_MAX_S
    return max(CHECK_MIN_S, min(CHECK_MAX_S, interval * 2, soon))


def output_lock(fd, how, wait):
    """Lock the open file `fd` (fcntl.LOCK_SH or LOCK_EX), waiting at most `wait` seconds: False if it stayed
    locked. True, without a lock, where the file system has none (an NFS mount without its lock service)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


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


def _output_chunk(path, offset, limit, tail=None, wait=LOCK_WAIT_S, last=None):
    """(where the bytes start, up to `limit` bytes, where the output ends) of output.log at `path` from
    `offset`, or with `tail` from where its last `tail` lines start, or with `last` from at most that many bytes
    before its end (an `offset` past the end then reads from the start: the file was replaced), all in offsets
    of the whole output (see the module's docstring); None while a cut holds it past `wait` seconds.
    FileNotFoundError: there is none."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not output_lock(fd, fcntl.LOCK_SH, wait):
            return None
        with os.fdopen(os.dup(fd), "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(0)
            dropped, header = output_header_of(fh.read(HEADER_MAX))
            end = size - header + dropped
            if tail is not None:  # as many lines as there are: the header's too
                offset = max(_tail_start(fh, size, int(tail)) - header, -header) + dropped
            if last is not None:
                offset = max(0 if offset > end else offset, end - last)
            start, at = output_position(max(0, offset), dropped, header, size)
            fh.seek(at)
            data = fh.read(limit)
        return start, data, end
    finally:
        os.close(fd)  # and with it the lock


def _output_copy(fd, src, to, end):
    """Copy the bytes from `src` to `end` of the file to `to` (before `src`: a forward copy); (src, to) after."""
    while src < end:
        data = os.pread(fd, min(COPY_BYTES, end - src), src)
        if not data:
            break
        os.pwrite(fd, data, to)
        src, to = src + len(data), to + len(data)
    return src, to


def output_lost_line(lost):
    """The line a cut appends where a write it took away would have been (see the module's docstring)."""
    return ("== ftconsole: output lost: %d bytes written while output.log was cut ==\n" % lost).encode()


def output_lost(writers, before, copied, fd, to):
    """Bytes of the ranks' last write that the truncation to `to` took away: the offset of the open file they share
    (`writers`; `before`: it at the cut's start) past `copied`, the end of what the cut copied. 0 when no write
    went through it during the cut, or one came after the truncation (the offset is that write's then)."""
    after = os.lseek(writers, 0, os.SEEK_CUR)
    if after == before or os.fstat(fd).st_size != to:
        return 0
    return max(0, after - copied)


def output_cut(path, limit, writers=None):
    """Cut output.log at `path` to its newest bytes when it is over its share of `limit` (see the module's
    docstring): the bytes of output dropped in all once cut, None when nothing was (not due, or locked by a
    reader for over a second). `writers`: the descriptor the ranks write through (O_APPEND), whose offset tells
    a write the truncation took away; a line then says so (`output_lost_line`)."""
    fd = os.open(path, os.O_RDWR)  # the path of the file the ranks write to (/proc/self/fd/N: not O_NOFOLLOW)
    try:
        if not output_lock(fd, fcntl.LOCK_EX, 1.0):
            return None
        before = None if writers is None else os.lseek(writers, 0, os.SEEK_CUR)
        size = os.fstat(fd).st_size
        if not output_cut_due(size, limit):
            return None
        dropped, header = output_header_of(os.pread(fd, HEADER_MAX, 0))
        start = max(size - limit // KEEP, 0)
        src = output_keep_from(size, limit, os.pread(fd, LINE_SEARCH, start))
        dropped += max(0, src - header)
        line = output_header(limit, dropped)
        os.pwrite(fd, line, 0)  # before the kept tail, which lies further on: nothing is written over unread
        src, to = _output_copy(fd, src, len(line), size)
        for _ in range(CATCH_UP):
            time.sleep(SETTLE_S)  # a write under way when the size was read has ended by now (see SETTLE_S)
            end = os.fstat(fd).st_size  # what the rank wrote meanwhile, at the end: copied too
            if src >= end:
                break
            src, to = _output_copy(fd, src, to, end)
        os.ftruncate(fd, to)
        lost = 0 if writers is None else output_lost(writers, before, src, fd, to)
        if lost:  # an append: after the kept tail (ended first where the write cut short a line), or a write since
            cut_short = to > 0 and os.pread(fd, 1, to - 1) != b"\n"
            os.write(writers, b"\n" * cut_short + output_lost_line(lost))
        return dropped
    finally:
        os.close(fd)


class OutputWatch(object):
    """The thread that keeps output.log under `limit` while the supervisor runs its steps (`output_watch`): it
    watches the file the ranks write to through the supervisor's descriptor `fd`, whatever its name is now."""

    def __init__(self, fd, limit):
        self.fd = fd
        self.limit = limit
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="output-limit")
        self.thread.daemon = True

    def _size(self):
        try:
            return os.fstat(self.fd).st_size
        except OSError:
            return 0

    def cut(self):
        """One look, and a cut when due; the size after it. Never fails: a cut that cannot be made now is tried
        at the next look."""
        size = self._size()
        if output_cut_due(size, self.limit):
            try:
                output_cut("/proc/self/fd/%d" % self.fd, self.limit, writers=self.fd)
            except OSError:
                return size
            size = self._size()
        return size

    def _run(self):
        interval, rate, last = CHECK_MIN_S, 0.0, self._size()
        looked = time.monotonic()
        while not self.done.wait(interval):
            size, now = self._size(), time.monotonic()
            rate = output_rate(rate, size - last, now - looked)
            interval = output_next_check(interval, rate, self.limit)
            last, looked = self.cut(), now

    def stop(self):
        """Stop the thread, then one last look: the file as the run leaves it is under the limit too."""
        self.done.set()
        self.thread.join(5.0)
        self.cut()


def output_watch(fd, limit):
    """A started `OutputWatch` of output.log open as `fd`, or None when there is no limit (0)."""
    if not limit or limit <= 0:
        return None
    watch = OutputWatch(fd, int(limit))
    watch.thread.start()
    return watch
