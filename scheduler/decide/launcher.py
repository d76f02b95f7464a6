"""Launch planning: from one attempt of a placed job to what each of its nodes runs. Pure code, no I/O.

`plan_launch(LaunchInput) -> LaunchPlan` gives, per node (one *rank* per node, in the order of
``LaunchInput.nodes``), the argv to exec, its environment, the files to write into its run folder
(``{run_root}/{job_id}/{attempt}/{rank}``) and whether a process is started there at all. Commands stay argv
lists: the run supervisor execs them without a shell, and nothing here builds a shell string. Paths are built
from ``run_root`` verbatim (no ``~`` expansion here).

Every rank, whatever the mode, gets:

- ``MASTER_ADDR`` (host of node 0), ``MASTER_PORT``, ``WORLD_SIZE`` (node count), ``RANK`` (node rank),
  ``SLOTS`` (the node's GPU count; 1 on a node without GPUs, as in seed 003);
- ``CUDA_VISIBLE_DEVICES``: the node's GPU indexes, comma-joined in the order given (``"2,5"``). A node
  with no GPUs gets it set to ``""`` on purpose: the job was given no GPUs, so CUDA must see none;
- ``FT_JOB_ID``, ``FT_ATTEMPT``, ``FT_HOSTFILE`` (``{run_dir}/hostfile``, always written: ``host slots=N``
  lines, ``host:N`` in mpich mode), ``FT_OUTPUT_DIR`` (``LaunchInput.output_dir``, else ``{run_dir}/output``),
  ``FT_RESTART_COUNT`` (earlier attempts: ``attempt - 1``) and ``FT_RESUME`` (``1`` from the second attempt on),
  ``FT_CHECKPOINT_DIR`` (``LaunchInput.checkpoint_dir``, when given).

The user's env is merged under ours (ours win; the spec layer rejects collisions before this). A rank with
``launch=False`` still gets its env and files written, so a debug shell sees them; its argv is the command the
launching rank runs, for display.

Modes (seed 003, "distributed modes"; seed 002 for ``--max_restarts``/``--monitor_interval`` and ``HYDRA_IFACE``,
which come from the spec's ``launcher:`` section, never from ``fault_tolerance.max_restarts``: that is the
scheduler's own restart limit, and giving it to torchrun too would restart a failing job twice over):

single
    The command as given, on exactly one node.
pytorch
    Every node runs its rank. A command whose argv[0] is a Python interpreter (``python``, ``python3``,
    ``python3.10``, with or without a path) running a script or a module (``-m``) is wrapped in
    ``<same python> -m torch.distributed.run --nproc_per_node=SLOTS --nnodes=N --node_rank=R
    --master_addr=A --master_port=P [--max_restarts=K] [--monitor_interval=S] <script|-m module> args``
    (K and S: ``torchrun_max_restarts`` and ``torchrun_monitor_interval``, when given).
    Interpreter options (``-u``, ``-X dev``...) stay on the interpreter, before ``-m torch.distributed.run``.
    Left alone: any other command (torchrun, a shell script, deepspeed), ``python -m torch.distributed.run``
    or ``-m torch.distributed.launch`` (already distributed), and ``python -c``/``python -``/bare ``python``,
    which torchrun cannot wrap.
pytorch-deepspeed
    The pytorch variables plus the hostfile (``host slots=N``). DeepSpeed's runner reads ``/job/hostfile``
    unless given ``--hostfile``, and we cannot write ``/job``; so when argv[0] is ``deepspeed`` we insert,
    right after it and only for options the user did not give among deepspeed's own options:
    ``--hostfile <FT_HOSTFILE>``, ``--master_addr A``, ``--master_port P`` (the scheduler's port, not
    deepspeed's fixed 29500) and ``--include host:gpus@host:gpus`` (the exact GPU indexes, which slots alone
    cannot express; not added with ``--include``/``--exclude``/``--num_nodes``/``--num_gpus``). deepspeed
    starts the other nodes itself (pdsh/ssh), so only the first node launches. Any other command is left as
    given and every node runs its rank.
horovod (OpenMPI)
    ``OMPI_MCA_orte_default_hostfile`` points at the hostfile (``host slots=N``); as in the seed no
    ``-hostfile`` is added. A command whose argv[0] is not an MPI launcher (``mpirun``, ``mpiexec``,
    ``orterun``, their ``.openmpi``/``.mpich``/``.hydra`` variants, ``horovodrun``) gets the seed's prefix
    ``mpirun --allow-run-as-root -np <total slots> -bind-to none -map-by slot -x NCCL_DEBUG=INFO
    -x LD_LIBRARY_PATH -x PATH -mca pml ob1 -mca btl ^openib``, followed by ``-x KEY`` for each user env
    key (sorted), because mpirun starts the other ranks over SSH where only exported variables arrive. A
    user ``NCCL_DEBUG`` replaces ``-x NCCL_DEBUG=INFO`` by ``-x NCCL_DEBUG``. A command with a launcher is
    left alone. mpirun on the first node starts the others: only rank 0 launches. With ``rank_wrapper`` (the
    MPI hybrid model of a job with an image) it goes between the prefix and the program.
mpich
    ``HYDRA_HOST_FILE`` points at the hostfile (``host:N``); ``HYDRA_IFACE`` is set when ``hydra_iface`` is
    given (over a ``HYDRA_IFACE`` of the job's env, which the spec refuses together with it). The seed
    prefixes OpenMPI commands only; we give a command without a launcher the minimal Hydra prefix ``mpirun -np
    <total slots>`` (Hydra reads the hostfile and interface from the env and forwards the whole environment by
    default), so it runs on all nodes. Only rank 0 launches. With ``rank_wrapper``: ``mpirun -pmi-port -envlist
    NAMES -np <total> WRAPPER PROGRAM`` (see `_hydra_hybrid`).
tensorflow
    ``TF_CONFIG`` per node, compact JSON ``{"cluster": ..., "task": {"type", "index"}, "environment":
    "cloud"}`` as in the seed. PS-Worker when ``ps_count > 0``: the first ``ps_count`` nodes are ``ps``,
    the rest ``worker``; AllReduce when ``ps_count == 0``: all ``worker``. Node i listens on
    ``master_port + i``. The command is run as given on every node.
"""

from __future__ import annotations

import json
import math
import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ftconsole.scheduler.decide.deepspeed import (
    DEEPSPEED_ENV,
    deepspeed_argv,
    deepspeed_env_file,
    deepspeed_hostfile,
)
from ftconsole.scheduler.decide.launch_inputs import LaunchInput as LaunchInput
from ftconsole.scheduler.decide.launch_inputs import LaunchPlan as LaunchPlan
from ftconsole.scheduler.decide.launch_inputs import NodeAssignment as NodeAssignment
from ftconsole.scheduler.decide.launch_inputs import RankLaunch as RankLaunch
from ftconsole.scheduler.decide.launch_inputs import TaskRef as TaskRef
from ftconsole.scheduler.decide.sshcheck_plan import ssh_check_argv
from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.spec.command import is_mpi_launcher
from ftconsole.scheduler.spec.torchwrap import torch_wrap
from ftconsole.scheduler.spec.torchwrap import wraps_in_torchrun as wraps_in_torchrun

HOSTFILE = "hostfile"  # name of the hostfile inside a run folder

OPENMPI_PREFIX = (
    "mpirun",
    "--allow-run-as-root",
    "-np",
    "{np}",
    "-bind-to",
    "none",
    "-map-by",
    "slot",
    "-x",
    "NCCL_DEBUG=INFO",
    "-x",
    "LD_LIBRARY_PATH",
    "-x",
    "PATH",
    "-mca",
    "pml",
    "ob1",
    "-mca",
    "btl",
    "^openib",
)

FORWARDED_OURS = frozenset({"MASTER_ADDR", "MASTER_PORT"})  # ours that launchers carry to every rank (+ FT_*)


class LaunchError(FtError):
    """A launch cannot be planned from this input (bad mode, node count, ports, PS count...)."""

    title = "launch"


@dataclass(frozen=True)
class _Rank:
    """A rank before its mode is applied: shared by every mode function."""

    node: NodeAssignment
    rank: int
    run_dir: str
    hostfile: str
    env: dict[str, str]  # ours only, before the mode's extras and the user's env


# --- public entry ----------------------------------------------------------------------------------------------


def plan_launch(inp: LaunchInput) -> LaunchPlan:
    """Plan one attempt: one RankLaunch per node, in node order. Raises LaunchError on input it cannot plan."""
    _validate(inp)
    root = inp.run_root.rstrip("/")
    master = inp.nodes[0].host
    ranks = []
    for rank, node in enumerate(inp.nodes):
        run_dir = f"{root}/{inp.job_id}/{inp.attempt}/{rank}"
        hostfile = f"{run_dir}/{HOSTFILE}"
        output = inp.output_dir if inp.output_dir is not None else f"{run_dir}/output"
        env = {
            "MASTER_ADDR": master,
            "MASTER_PORT": str(inp.master_port),
            "WORLD_SIZE": str(len(inp.nodes)),
            "RANK": str(rank),
            "SLOTS": str(node.slots),
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in node.gpus),
            "FT_JOB_ID": inp.job_id,
            "FT_ATTEMPT": str(inp.attempt),
            "FT_HOSTFILE": hostfile,
            "FT_OUTPUT_DIR": output if inp.task is None else posixpath.join(output, inp.task.output),
            # every attempt after the first restarts the processes: they resume from their checkpoint
            "FT_RESTART_COUNT": str(max(0, inp.attempt - 1)),
            "FT_RESUME": "1" if inp.attempt > 1 else "0",
        }
        if inp.checkpoint_dir is not None:
            env["FT_CHECKPOINT_DIR"] = inp.checkpoint_dir
        if inp.task is not None:
            env |= {"FT_TASK": inp.task.name, "FT_TASK_INDEX": str(inp.task.index)}
        if inp.torch_trace:
            env |= torch_trace(inp, run_dir)
        ranks.append(_Rank(node=node, rank=rank, run_dir=run_dir, hostfile=hostfile, env=env))
    planned = _MODE_PLANNERS[inp.mode](inp, tuple(ranks))
    return LaunchPlan(ranks=planned, ssh_check=ssh_check_argv(inp, planned))


# --- one function per mode -------------------------------------------------------------------------------------


def _plan_single(inp: LaunchInput, ranks: tuple[_Rank, ...]) -> tuple[RankLaunch, ...]:
    hosts = openmpi_hostfile(inp.nodes)
    return tuple(_finish(inp, r, inp.argv, hosts) for r in ranks)


def _plan_pytorch(inp: LaunchInput, ranks: tuple[_Rank, ...]) -> tuple[RankLaunch, ...]:
    hosts = openmpi_hostfile(inp.nodes)
    out = []
    for r in ranks:
        argv = torch_wrap(
            inp.argv,
            nproc_per_node=r.node.slots,
            nnodes=len(inp.nodes),
            node_rank=r.rank,
            master_addr=inp.nodes[0].host,
            master_port=inp.master_port,
            max_restarts=inp.torchrun_max_restarts,
            monitor_interval=inp.torchrun_monitor_interval,
        )
        out.append(_finish(inp, r, argv or inp.argv, hosts))
    return tuple(out)


# in the attempt's folder, the same path on every node (a launcher that starts the ranks of other nodes carries
# one PYTHONPATH to them: deepspeed's runner): scheduler/node/torch_hook.py
TORCH_HOOK = "../torch-hook/sitecustomize.py"
TRACE_ENTRIES = "2000"  # collectives the flight recorder keeps
TORCH_HOOK_SOURCE = (Path(__file__).parent.parent / "node" / "torch_hook.py").read_bytes()  # read once, at import
TRACE_ENV = frozenset({"PYTHONPATH", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"})  # + FT_TORCH_TRACE


def torch_trace(inp: LaunchInput, run_dir: str) -> dict[str, str]:
    """The environment with which a rank's Python processes keep torch's flight recorder trace and serve it
    (``torch_hook.py``, written as `TORCH_HOOK`): the hook first on PYTHONPATH (before the job's own), and the
    recorder's sizes unless the job set them."""
    hook_dir = posixpath.normpath(posixpath.dirname(f"{run_dir}/{TORCH_HOOK}"))  # "~/..." stays as it is
    path = inp.env.get("PYTHONPATH")
    return {
        "FT_TORCH_TRACE": "1",
        "PYTHONPATH": hook_dir if not path else f"{hook_dir}:{path}",
        "TORCH_FR_BUFFER_SIZE": inp.env.get("TORCH_FR_BUFFER_SIZE", TRACE_ENTRIES),
        "TORCH_NCCL_TRACE_BUFFER_SIZE": inp.env.get("TORCH_NCCL_TRACE_BUFFER_SIZE", TRACE_ENTRIES),
    }


def _plan_deepspeed(inp: LaunchInput, ranks: tuple[_Rank, ...]) -> tuple[RankLaunch, ...]:
    hosts = deepspeed_hostfile(inp.nodes)
    if _basename(inp.argv[0]) != "deepspeed":
        return tuple(_finish(inp, r, inp.argv, hosts) for r in ranks)
    argv = deepspeed_argv(inp.argv, ranks[0].hostfile, inp.nodes, inp.master_port)
    name = DEEPSPEED_ENV if inp.task is None else f"{DEEPSPEED_ENV}.{inp.task.index}"
    # PYTHONPATH not: deepspeed's runner exports its own (PYTHON*), which the supervisor expanded ("~/" of the
    # hook's path); the file's value would arrive as written, "~" and all, in double quotes
    forwarded = forwarded_env({**inp.env, **ranks[0].env}, inp.env)
    env_file = deepspeed_env_file({k: v for k, v in forwarded.items() if k != "PYTHONPATH"})
    return tuple(
        _finish(inp, r, argv, hosts, {"DS_ENV_FILE": f"{r.run_dir}/{name}"}, launch=r.rank == 0, files={name: env_file})
        for r in ranks
    )


def _plan_horovod(inp: LaunchInput, ranks: tuple[_Rank, ...]) -> tuple[RankLaunch, ...]:
    hosts = openmpi_hostfile(inp.nodes)
    ours = forwarded_env({**inp.env, **ranks[0].env}, inp.env)
    argv = (
        inp.argv
        if is_mpi_launcher(inp.argv)
        else openmpi_prefix(inp.nodes, inp.env, ours) + inp.rank_wrapper + inp.argv
    )
    return tuple(
        _finish(inp, r, argv, hosts, {"OMPI_MCA_orte_default_hostfile": r.hostfile}, launch=r.rank == 0) for r in ranks
    )


def _plan_mpich(inp: LaunchInput, ranks: tuple[_Rank, ...]) -> tuple[RankLaunch, ...]:
    hosts = mpich_hostfile(inp.nodes)
    total = sum(n.slots for n in inp.nodes)
    argv = (
        inp.argv
        if is_mpi_launcher(inp.argv)
        else ("mpirun", *_hydra_hybrid(inp, ranks), "-np", str(total), *inp.rank_wrapper, *inp.argv)
    )
    out = []
    for r in ranks:
        extra = {"HYDRA_HOST_FILE": r.hostfile}
        if inp.hydra_iface is not None:
            extra["HYDRA_IFACE"] = inp.hydra_iface
        out.append(_finish(inp, r, argv, hosts, extra, launch=r.rank == 0))
    return tuple(out)


def _hydra_hybrid(inp: LaunchInput, ranks: tuple[_Rank, ...]) -> tuple[str, ...]:
    """Hydra's options for the MPI hybrid model: ``-pmi-port`` (the processes reach the proxy over TCP, PMI_PORT,
    not through an inherited descriptor, PMI_FD, which no container runtime passes on) and ``-envlist`` of the
    job's env and ours, PATH and LD_LIBRARY_PATH, as OpenMPI's ``-x``: hydra's default, the first node's whole
    environment, would give every node its HOME, where each node's own folders are found."""
    if not inp.rank_wrapper:
        return ()
    names = {*forwarded_env({**inp.env, **ranks[0].env}, inp.env), "PATH", "LD_LIBRARY_PATH"}
    return ("-pmi-port", "-envlist", ",".join(sorted(names)))


def _plan_tensorflow(inp: LaunchInput, ranks: tuple[_Rank, ...]) -> tuple[RankLaunch, ...]:
    hosts = openmpi_hostfile(inp.nodes)
    return tuple(
        _finish(inp, r, inp.argv, hosts, {"TF_CONFIG": tf_config(inp.nodes, inp.ps_count, inp.master_port, r.rank)})
        for r in ranks
    )


_MODE_PLANNERS: dict[str, Callable[[LaunchInput, tuple[_Rank, ...]], tuple[RankLaunch, ...]]] = {
    "single": _plan_single,
    "pytorch": _plan_pytorch,
    "pytorch-deepspeed": _plan_deepspeed,
    "horovod": _plan_horovod,
    "mpich": _plan_mpich,
    "tensorflow": _plan_tensorflow,
}
MODES = tuple(_MODE_PLANNERS)  # single | pytorch | pytorch-deepspeed | horovod | mpich | tensorflow


def _finish(
    inp: LaunchInput,
    r: _Rank,
    argv: tuple[str, ...],
    hostfile: bytes,
    extra_env: Mapping[str, str] | None = None,
    *,
    launch: bool = True,
    files: Mapping[str, bytes] | None = None,
) -> RankLaunch:
    env = {**inp.env, **r.env, **(extra_env or {})}
    return RankLaunch(
        node=r.node.name,
        rank=r.rank,
        argv=tuple(argv),
        env=env,
        files={HOSTFILE: hostfile, **({TORCH_HOOK: TORCH_HOOK_SOURCE} if inp.torch_trace else {}), **(files or {})},
        run_dir=r.run_dir,
        launch=launch,
        workdir=inp.workdir,
    )


# --- building blocks (public for tests and for `ftconsole show`) -------------------------------------------------


def openmpi_hostfile(nodes: tuple[NodeAssignment, ...]) -> bytes:
    """``host slots=N`` per node (OpenMPI)."""
    return "".join(f"{n.host} slots={n.slots}\n" for n in nodes).encode()


def mpich_hostfile(nodes: tuple[NodeAssignment, ...]) -> bytes:
    """``host:N`` per node (MPICH Hydra)."""
    return "".join(f"{n.host}:{n.slots}\n" for n in nodes).encode()


def openmpi_prefix(
    nodes: tuple[NodeAssignment, ...], user_env: Mapping[str, str], ours: Iterable[str] = ()
) -> tuple[str, ...]:
    """The seed's mpirun prefix for ``sum(slots)`` processes, then ``-x KEY`` for each user env key and `ours`.

    mpirun starts the other ranks over SSH, where only exported variables arrive: each key, sorted, once.
    """
    total = sum(n.slots for n in nodes)
    prefix = [a.format(np=total) if a == "{np}" else a for a in OPENMPI_PREFIX]
    if "NCCL_DEBUG" in user_env:
        prefix[prefix.index("NCCL_DEBUG=INFO")] = "NCCL_DEBUG"
    already = {"NCCL_DEBUG", "LD_LIBRARY_PATH", "PATH"}
    for key in sorted({*user_env, *ours} - already):
        prefix += ["-x", key]
    return tuple(prefix)


def forwarded_env(env: Mapping[str, str], user_env: Mapping[str, str]) -> dict[str, str]:
    """What a launcher must carry from the first node to ranks it starts elsewhere (sorted by key).

    The job's own ``env:`` keys, every ``FT_`` variable, and ``MASTER_ADDR``/``MASTER_PORT`` (the same on
    every node), with their values in `env` (rank 0's). Not the per-node ones (``RANK``, ``WORLD_SIZE``,
    ``SLOTS``, ``CUDA_VISIBLE_DEVICES``): the launcher sets its own per process.
    """
    ours = FORWARDED_OURS | (TRACE_ENV if env.get("FT_TORCH_TRACE") == "1" else frozenset())
    keys = {k for k in env if k in user_env or k.startswith("FT_") or k in ours} - {"DS_ENV_FILE"}
    return {k: env[k] for k in sorted(keys)}


def tf_config(nodes: tuple[NodeAssignment, ...], ps_count: int, master_port: int, rank: int) -> str:
    """TF_CONFIG of node ``rank``: PS-Worker when ``ps_count > 0``, AllReduce otherwise."""
    addresses = [_host_port(n.host, master_port + i) for i, n in enumerate(nodes)]
    cluster = {"ps": addresses[:ps_count], "worker": addresses[ps_count:]} if ps_count else {"worker": addresses}
    task = {"type": "ps", "index": rank} if rank < ps_count else {"type": "worker", "index": rank - ps_count}
    return json.dumps({"cluster": cluster, "task": task, "environment": "cloud"}, separators=(",", ":"))


# --- helpers -----------------------------------------------------------------------------------------------------


def _basename(arg: str) -> str:
    return posixpath.basename(arg)


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _validate(inp: LaunchInput) -> None:
    if inp.mode not in _MODE_PLANNERS:
        raise LaunchError(f"unknown mode {inp.mode!r}; one of: {', '.join(MODES)}")
    if not inp.argv or not inp.argv[0]:
        raise LaunchError("empty command")
    if not inp.job_id or "/" in inp.job_id or inp.job_id in (".", ".."):
        raise LaunchError(f"job id {inp.job_id!r} cannot name a run folder")
    if inp.attempt < 0:
        raise LaunchError(f"attempt must be 0 or more, not {inp.attempt}")
    if not inp.nodes:
        raise LaunchError("no nodes to launch on")
    names = [n.name for n in inp.nodes]
    if len(set(names)) != len(names):
        raise LaunchError(f"a node appears twice: {', '.join(names)}")
    for node in inp.nodes:
        if not node.host:
            raise LaunchError(f"node {node.name} has no host")
        if any(g < 0 for g in node.gpus) or len(set(node.gpus)) != len(node.gpus):
            raise LaunchError(f"node {node.name}: bad GPU indexes {list(node.gpus)}")
    last_port = inp.master_port + (len(inp.nodes) - 1 if inp.mode == "tensorflow" else 0)
    if inp.master_port < 1 or last_port > 65535:
        raise LaunchError(f"master port {inp.master_port} out of range for {len(inp.nodes)} node(s)")
    if inp.mode == "single" and len(inp.nodes) != 1:
        raise LaunchError(f"single mode runs on one node, not {len(inp.nodes)}")
    if inp.mode == "tensorflow":
        if not 0 <= inp.ps_count < len(inp.nodes):
            raise LaunchError(
                f"parameter-server count {inp.ps_count} must be 0 or more and fewer than the {len(inp.nodes)} "
                "node(s): at least one worker is needed"
            )
    elif inp.ps_count:
        raise LaunchError(f"a parameter-server count is for tensorflow mode only, not {inp.mode}")
    restarts, interval = inp.torchrun_max_restarts, inp.torchrun_monitor_interval
    if inp.mode != "pytorch" and (restarts is not None or interval is not None):
        raise LaunchError(f"torchrun's max restarts and monitor interval are for pytorch mode only, not {inp.mode}")
    if inp.rank_wrapper and (inp.mode not in ("horovod", "mpich") or is_mpi_launcher(inp.argv)):
        raise LaunchError(f"each MPI process is wrapped only under the mpirun line ftconsole writes (modes horovod "
                          f"and mpich, a command without its own launcher), not in mode {inp.mode} for "
                          f"{inp.argv[0]}")  # fmt: skip
    if inp.mode != "mpich" and inp.hydra_iface is not None:
        raise LaunchError(f"a hydra interface is for mpich mode only, not {inp.mode}")
    if restarts is not None and restarts < 0:
        raise LaunchError(f"torchrun max restarts must be 0 or more, not {restarts}")
    if interval is not None and not (math.isfinite(interval) and interval > 0):
        raise LaunchError(f"torchrun monitor interval must be a positive number of seconds, not {interval}")
