"""The pre-launch SSH check: node side, standard library only, Python 3.8.

Run on a job's first node right before a launcher that starts the other ranks from there over SSH (DeepSpeed's
pdsh runner, mpirun, hydra), as ``python3 -c SOURCE ME TIMEOUT PORT LAUNCHER NAME HOST [NAME HOST ...]``. It
runs ``ssh -o BatchMode=yes -o ConnectTimeout=TIMEOUT [-p PORT] HOST true`` to every peer at once, the ``ssh``
of the rank's PATH as the launchers do, and exits 255 (ssh's own code for a connection failure) with one line
on what to fix and then one line per unreachable peer naming the pair (last: the run's error quotes the last
line of output).
"""

import os
import pwd
import subprocess
import sys
import time

GRACE = 5  # seconds past ssh's ConnectTimeout before a peer that has not answered counts as failed


def check(me, timeout, port, launcher, peers):
    """Exit status: 0 when every peer answers, else 255 after the lines on stderr (see the module docstring)."""
    ssh = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=%d" % timeout] + (["-p", port] if port else [])
    user = pwd.getpwuid(os.getuid()).pw_name
    procs = []
    for name, host in peers:
        try:
            proc = subprocess.Popen(
                [*ssh, host, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
        except OSError as exc:
            sys.stderr.write("ftconsole: ssh check: cannot run ssh on %s: %s\n" % (me, exc))
            return 255
        procs.append((name, host, proc))
    deadline = time.monotonic() + timeout + GRACE
    failed = []
    for name, host, proc in procs:
        try:
            err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))[1]
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            failed.append((name, host, "no answer within %ds" % (timeout + GRACE)))
            continue
        if proc.returncode != 0:
            lines = [ln.strip() for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
            last = lines[-1] if lines else "no message"
            failed.append((name, host, "%s (ssh exit %d)" % (last, proc.returncode)))
    if not failed:
        print("ftconsole: ssh check: %s reaches %s by SSH" % (me, ", ".join(n for n, _ in peers)))
        return 0
    hosts = " ".join(sorted({host for _, host, _ in failed}))
    sys.stderr.write(
        "ftconsole: %s starts this job's ranks from %s over SSH as %s; fix it on the nodes, then resubmit: "
        "on %s, 'ssh -o BatchMode=yes%s HOST true' must work for HOST in %s with no prompt: %s's key allowed in "
        "~/.ssh/authorized_keys on each of them (ssh-copy-id), their host keys in %s's ~/.ssh/known_hosts "
        "(ssh-keyscan), and the user %s existing on every node (docs/jobs.md, node-to-node SSH)\n"
        % (launcher, me, user, me, " -p " + port if port else "", hosts, user, user, user)
    )
    for name, host, why in failed:  # last: the run's error quotes the last line, which names a pair
        target = "itself" if name == me else name
        sys.stderr.write(
            "ftconsole: ssh check: %s cannot reach %s (%s) by SSH without a prompt: %s\n" % (me, target, host, why)
        )
    return 255


def main(argv):
    me, timeout, port, launcher = argv[0], int(argv[1]), argv[2], argv[3]
    return check(me, timeout, port, launcher, list(zip(argv[4::2], argv[5::2])))  # noqa: B905  (Python 3.8)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
