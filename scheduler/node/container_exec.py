"""The MPI hybrid model of a job with `image` (issue 17): node side, standard library only, Python 3.8.

In modes horovod (OpenMPI's mpirun) and mpich (hydra), the launcher on the first node starts every process of
the job itself, on every node, over SSH: no supervisor of ours is there to start a container. So mpirun runs on
the host, and each MPI process it starts is this program, which starts the user's program in the job's image
(Apptainer's "hybrid model" for MPI, which podman and docker can follow too):

    mpirun ... PYTHON -c LOADER <attempt folder>/container.py PROGRAM ARGS...

`prepare` (and `start`, on the first node) writes ``container.py`` into the attempt's folder of every node: this
module and `supervisor_container` as one script (`scheduler/node/bundle.py`) with PARAMS prepended, the same bytes on
every node (so a run root on a shared home is fine):

    {"token", "image", "nodes": [{"rank": node rank, "first": its first MPI rank, "slots", "container": {...}}]}

`main` finds its node by its MPI rank (``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``, ``PMIX_RANK``): ftconsole's
mpirun line maps processes by slot in the hostfile's order, so node i holds ranks first..first+slots-1. It
checks that: the local rank the launcher gave (``OMPI_COMM_WORLD_LOCAL_RANK``, ``MPI_LOCALRANKID``) must be
rank - first, and the node's own run folder of the attempt must be there. Then:

- the image is pulled when the node lacks it (one process per node at a time: a lock in its run folder), its
  words on stderr, which mpirun carries to the first node's output.log;
- the container (``ft-<token>-p<MPI rank>``) gets the host's PID namespace too (``--pid host``: OpenMPI's
  shared-memory transport reads its peers' memory by pid, and ranks in one namespace need no init of their
  own), the folders the launcher's PMIx server named (``PMIX_SERVER_TMPDIR``, OpenMPI's session folder), and the
  whole environment the launcher gave the process by name, but PATH, HOME, LD_LIBRARY_PATH and the shell's
  own (the image has its own);
- a reaper is left behind (its own session, stdio on /dev/null): once this process (then the runtime's client)
  is gone, whatever the way, it removes the container. A SIGKILL of the client, which the launcher sends to
  what outlives its SIGTERM, would leave the container running under podman's conmon or docker's shim;
- this process becomes the runtime's client (exec), so the launcher's signals reach the container.

A process that cannot start its rank says why on stderr ("ftconsole: ...") and ends by SIGTERM (see `main`).
"""

import fcntl
import os
import signal
import subprocess
import sys
import time

from ftconsole.scheduler.node.proc import _alive, start_time  # bundled
from ftconsole.scheduler.node.supervisor_container import (  # bundled
    container_argv,
    container_expanded,
    container_gpu_env,
    container_remove,
    image_present,
    image_pull_argv,
    image_pulled,
)

RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMI_ID", "PMIX_RANK")  # OpenMPI, hydra (PMI_ID: -pmi-port), PMIx
LOCAL_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
SESSION_VARS = ("PMIX_SERVER_TMPDIR", "OMPI_MCA_orte_jobfam_session_dir")  # where the ranks meet their server
NOT_PASSED = frozenset(("PATH", "HOME", "LD_LIBRARY_PATH", "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_"))
PULL_S = 3600.0  # at most, for one pull
REAP_EVERY_S = 0.5


class HybridError(Exception):
    """This process cannot start its rank: the message says why (written to stderr, then SIGTERM: `main`)."""


def mpi_rank(env):
    """(MPI rank, local rank or None) from the launcher's variables."""
    rank = next((env[n] for n in RANK_VARS if env.get(n, "").isdigit()), None)
    if rank is None:
        raise HybridError(
            "no MPI rank in the environment (%s): this program is started by mpirun" % ", ".join(RANK_VARS)
        )
    local = next((env[n] for n in LOCAL_VARS if env.get(n, "").isdigit()), None)
    return int(rank), None if local is None else int(local)


def node_of(doc, rank, local):
    """The entry of `doc["nodes"]` that holds MPI rank `rank` (checked against its local rank)."""
    for node in doc["nodes"]:
        if node["first"] <= rank < node["first"] + node["slots"]:
            if local is not None and local != rank - node["first"]:
                raise HybridError(
                    "MPI rank %d has local rank %d, not %d: the launcher did not place the processes by slot in "
                    "the hostfile's order, so this process cannot tell which node it is on"
                    % (rank, local, rank - node["first"])
                )
            return node
    raise HybridError("MPI rank %d is beyond the %d slots of the job's hostfile" % (rank, _slots(doc)))


def _slots(doc):
    return sum(n["slots"] for n in doc["nodes"])


def rank_container(doc, node, rank, env):
    """The container document of one MPI process: its node's, named by rank, with the launcher's folders."""
    base = container_expanded(node["container"])
    shares = base["shares"] + [env[n] for n in SESSION_VARS if env.get(n)]
    return dict(base, name="ft-%s-p%d" % (doc["token"], rank), shares=shares, pid_host=True)


def passed_env(env):
    """The names of the environment the container gets (their values are read from this process's)."""
    return sorted(n for n in env if n not in NOT_PASSED)


def _pull(container, run_dir):
    """Pull the image where the node lacks it, one process of the node at a time."""
    with open(os.path.join(run_dir, "pull.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image_present(container):
            return
        argv = image_pull_argv(container)
        if argv is None:
            raise HybridError("image %s is not on this node" % container["image"])
        sys.stderr.write("ftconsole: pulling image %s on %s\n" % (container["image"], os.uname()[1]))
        sys.stderr.flush()
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=sys.stderr, timeout=PULL_S)
        except (OSError, subprocess.SubprocessError) as exc:
            raise HybridError("cannot pull image %s: %s" % (container["image"], exc)) from exc
        if done.returncode != 0:
            raise HybridError("pulling image %s exited with code %d" % (container["image"], done.returncode))
        image_pulled(container)


def _reaper(container):
    """Leave a process behind that removes the container once this one (then the client) is gone."""
    if container["runtime"] not in ("podman", "docker"):
        return  # apptainer's processes are the program's own: nothing outlives them
    watched = os.getpid()
    started = start_time(watched)
    if os.fork() != 0:
        os.wait()
        return
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, 65536)  # nothing of the launcher's (its output pipes, sockets) is held open by the reaper
    try:
        while _alive(watched, started):  # the same process (pid and start time), not a zombie
            time.sleep(REAP_EVERY_S)
        container_remove(container)
    finally:
        os._exit(0)


def hybrid_exec(doc, script, argv, env):
    """Start the program `argv` of this MPI process in its container (see the module docstring)."""
    if not argv:
        raise HybridError("no program to run")
    rank, local = mpi_rank(env)
    node = node_of(doc, rank, local)
    attempt_dir = os.path.dirname(os.path.abspath(script))
    run_dir = os.path.join(attempt_dir, str(node["rank"]))
    if not os.path.isdir(run_dir):
        raise HybridError(
            "MPI rank %d belongs to node rank %d, whose run folder %s is not on this node (%s): the processes are "
            "not where ftconsole placed them" % (rank, node["rank"], run_dir, os.uname()[1])
        )
    container = rank_container(doc, node, rank, env)
    if container["runtime"] != "apptainer":  # its id, for the hang detector's I/O counters (supervisor_scan)
        container["cidfile"] = os.path.join(run_dir, container["name"] + ".cid")
        if os.path.exists(container["cidfile"]):
            os.unlink(container["cidfile"])  # the runtime refuses to write over one
    _pull(container, run_dir)
    env = dict(env, CUDA_VISIBLE_DEVICES=container_gpu_env(container))
    command = container_argv(container, list(argv), passed_env(env), os.getcwd(), os.getuid(), os.getgid())
    _reaper(container)
    os.execve(command[0], command, env)


def main(doc, args):
    try:
        hybrid_exec(doc, args[0], args[1:], dict(os.environ))
    except (HybridError, OSError) as exc:
        sys.stderr.write("ftconsole: %s\n" % exc)
        sys.stderr.flush()
        # ended by a signal: hydra cleans up the job's other processes only then (an exit code alone leaves them
        # waiting in MPI_Init for this one); mpirun ends the job either way
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return 125
    return 0  # not reached: the process became the runtime's client


if __name__ == "__main__":
    sys.exit(main(globals()["PARAMS"], sys.argv))
