"""One MPI process of a test job of the MPI hybrid model (tests/peers/test_container_mpi.py), in its container.

Run with the host's /usr/bin/python3 (the image mounts the host's /usr): it calls the MPI library the launcher
belongs to through ctypes (OpenMPI's libmpi.so.40 under mpirun, MPICH's libmpich.so.12 under hydra, which
gives PMI_PORT), so MPI_Init must reach the launcher's PMI server on the host from inside the container, and
MPI_Allreduce of (1, rank) must cross the containers and the nodes. Then it writes ``$PEER_RESULTS/<rank>.json``
with what it saw, and sleeps ``$PEER_SLEEP`` seconds when that is set (a job to stop while it runs).

Which node it ran on: its container has the host's PID namespace, so it finds the runtime client that started
it (the process whose argv names its container, ``ft-<token>-p<rank>``) and walks up from there to the
launcher's daemon of that node (`launcher_node`).
"""

import ctypes
import json
import os
import time

OPENMPI = ("libmpi.so.40", "ompi_mpi_comm_world", "ompi_mpi_int", "ompi_mpi_op_sum")
MPICH = ("libmpich.so.12", 0x44000000, 0x4C000405, 0x58000003)  # MPI_COMM_WORLD, MPI_INT, MPI_SUM: mpi.h's


def allreduce():
    """(rank, size, [sum of 1, sum of ranks]) through the MPI library."""
    hydra = "PMI_PORT" in os.environ or "PMI_FD" in os.environ
    name, comm, dtype, op = MPICH if hydra else OPENMPI
    lib = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
    if hydra:
        handle = ctypes.c_int
    else:  # OpenMPI's handles are the addresses of its global objects
        handle = ctypes.c_void_p
        comm, dtype, op = (ctypes.addressof(ctypes.c_char.in_dll(lib, s)) for s in (comm, dtype, op))
    if lib.MPI_Init(None, None) != 0:
        raise SystemExit("MPI_Init failed")
    rank, size = ctypes.c_int(), ctypes.c_int()
    lib.MPI_Comm_rank(handle(comm), ctypes.byref(rank))
    lib.MPI_Comm_size(handle(comm), ctypes.byref(size))
    send, got = (ctypes.c_int * 2)(1, rank.value), (ctypes.c_int * 2)()
    if lib.MPI_Allreduce(send, got, 2, handle(dtype), handle(op), handle(comm)) != 0:
        raise SystemExit("MPI_Allreduce failed")
    lib.MPI_Finalize()
    return rank.value, size.value, list(got)


def _stat(pid):
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read()
    return stat[stat.rfind(b")") + 2 :].split()


def _argv(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().split(b"\0")


def client_of(rank):
    """The runtime client whose argv names this rank's container (``--name ft-...-p<rank>``)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = _argv(entry)
        except OSError:
            continue
        if b"--name" in argv[:-1] and b"run" in argv:
            name = argv[argv.index(b"--name") + 1].decode()
            if name.startswith("ft-") and name.endswith(f"-p{rank}"):
                return int(entry), name
    return None, None


def launcher_node(client):
    """The index, in the hostfile's order, of the node whose launcher daemon started `client`: walking up its
    parents (their argv is readable from the container; their environment is not), hydra's proxy says
    ``--proxy-id N``, OpenMPI's orted ``-mca ess_base_vpid N``, and mpirun itself (OpenMPI's first node) is 0."""
    pid = client
    while pid > 1:
        pid = int(_stat(pid)[1])
        argv = _argv(pid)
        name = os.path.basename(argv[0])
        for flag in (b"--proxy-id", b"ess_base_vpid"):
            if name in (b"hydra_pmi_proxy", b"orted") and flag in argv[:-1]:
                return int(argv[argv.index(flag) + 1].strip(b'"'))
        if name.startswith((b"mpirun", b"orterun")):
            return 0
    return None


def main():
    rank, size, total = allreduce()
    client, container = client_of(rank)
    with open("/etc/ftlab-image") as fh:
        marker = fh.read()
    keep = ("FT_", "FTLAB_CDI_GPU_", "NVIDIA_VISIBLE_DEVICES", "PEER_MARK", "CUDA_VISIBLE_DEVICES", "PATH", "HOME")
    record = {
        "rank": rank,
        "size": size,
        "sum": total,
        "marker": marker,
        "container": container,
        "node": launcher_node(client) if client else None,
        "env": {k: v for k, v in os.environ.items() if k.startswith(keep)},
    }
    with open(os.path.join(os.environ["PEER_RESULTS"], f"{rank}.json"), "w") as fh:
        json.dump(record, fh)
    print(f"rank {rank}/{size} in {container} on node index {record['node']}: sum {total}", flush=True)
    time.sleep(float(os.environ.get("PEER_SLEEP") or 0))


if __name__ == "__main__":
    main()
