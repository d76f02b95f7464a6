"""The local lab cluster: a fake GPU cluster of SSH servers on 127.0.0.1, for the demo, tests and benchmark.

Every lab node is an asyncssh server on its own loopback port, all of them served by one Python process and
event loop. A session on a node runs the requested command as a real local process
(``/bin/sh -c COMMAND`` in the node's home folder, in a new session), with the node's environment::

    HOME=<lab>/nodes/<name>/home               the node's home folder (with ``cache/``); <lab>/home for every
                                               node with the layout's ``shared_home: true`` (or ``up --shared-home``)
    FTCONSOLE_SIM_GPUS=<lab>/nodes/<name>/gpus.json   its simulated GPUs (DESIGN.md, "Simulated GPUs")
    FTCONSOLE_LAB_NODE=<name>
    FTCONSOLE_LAB_ROOT=<lab>                   (as tests/sshd_cluster.py sets it: finds a lab's processes)

plus PATH, LANG, USER and LOGNAME of the lab process, SSH_CLIENT/SSH_CONNECTION as sshd sets them, TERM under
a pty, and whatever environment the client sent. A session with a pty runs under a real pseudo-terminal
(``ssh -t node``, or a login shell for ``ssh node``); a session without a command and without a pty runs
``/bin/sh`` reading commands from stdin, as sshd does. Subsystems (sftp) are refused.

When a client goes away while its command still runs, the command's process group gets SIGHUP (as a pty
hangup would); a process that detached into its own session (a run supervisor) is left alone. When the lab
stops, every process of every node is killed: the tracked process groups and every process of our uid whose
environment names this lab (found in ``/proc/*/environ``).

Shared home (layout key ``shared_home: true``, ``ftconsole lab up --shared-home``; default false):
every node's HOME is the same folder, ``<lab>/home``, as on a cluster with an NFS ``/home``; run folders, the
probes' cache and the kept agent files of all nodes then lie side by side, as the scheduler must expect on
such clusters. The lab itself never tells nodes apart by folder: a node's processes are the ones whose
environment says ``FTCONSOLE_LAB_NODE=<name>`` (what a kill or hang fault acts on), whatever their folder.

The lab folder (default ``~/.local/state/ftconsole/lab`` or ``$FTCONSOLE_LAB_DIR``)::

    id_ed25519, id_ed25519.pub   the client key, authorized on every node (kept across restarts)
    known_hosts                  ``[127.0.0.1]:PORT ssh-ed25519 ...`` per node (rewritten at each start)
    cluster.yaml                 a ready-to-use ftconsole cluster config (rewritten at each start)
    state/                       the state_dir of that config
    ports.json                   the ports of the last run, reused when free so cluster.yaml stays stable
    lab.json                     the running background server: pid, start time, nodes and ports
    lab.lock                     pid-file lock (flock): one server per lab folder
    lab.sock                     the background server's control socket (faults; see `control`)
    lab.log                      the background server's log
    nodes/<name>/host_key        the node's ed25519 host key (kept across restarts)
    nodes/<name>/home/           the node's home folder, with cache/ (not with shared_home)
    home/                        with shared_home: the home folder of every node, with cache/
    nodes/<name>/gpus.json       its simulated GPUs, written from the layout when the node starts

In-process (tests)::

    async with LabCluster(tmp_path, nodes=3) as lab:
        async with asyncssh.connect(**lab.connect_options("lab01")) as conn:
            await conn.run("echo $HOME")

As a background process (``ftconsole lab up|down|status``, the demo, the benchmark): `lab_up`, `lab_status`,
`lab_down`, which run ``python -m ftconsole.lab serve``. The layout (nodes, GPUs, injected faults and cluster
settings) is a YAML file, by default ``config/lab.yaml``; see that file for its keys.

Faults (``ftconsole lab fault NODE --kill|--hang|--gpu-ecc GPU|--heal``): a node killed (SSH refused, its
processes killed), hung (SSH accepted but silent, its processes SIGSTOPped), a GPU's uncorrectable ECC error
in gpus.json, or all of it healed; in this process ``await lab.fault("lab03", Fault.hang())``, in the
background lab ``lab_fault(lab_dir, "lab03", Fault.hang())``. Both return a `FaultReport`.

The package::

    files          the lab folder (LabPaths) and atomic writes
    layout         the lab layout: its model, loading and validation
    plan           the nodes planned from a layout (NodeSpec)
    gpus           a node's simulated GPUs (gpus.json)
    faults         faults to inject (Fault), a node's state (NodeState), what a fault did (FaultReport)
    clusterconfig  the generated cluster config (cluster.yaml)
    records        LabInfo and LabNodeInfo (lab.json)
    keys           the client key and the nodes' host keys
    processes      finding and killing the lab's processes; the lab.lock pid lock
    session        one SSH session: a local process behind a channel
    node           LabNode: one node's SSH server, environment and GPUs
    cluster        LabCluster: the lab in this process
    control        the background server's control socket (lab.sock): ControlServer and its client
    server         the background server: lab_up, lab_status, lab_fault, lab_down, serve
    command        the command line of ``python -m ftconsole.lab``
"""

from __future__ import annotations

from ftconsole.lab.cluster import LabCluster
from ftconsole.lab.clusterconfig import check_cluster_config, deep_merge, render_cluster_config
from ftconsole.lab.command import fault_from_args, main
from ftconsole.lab.faults import Fault, FaultKind, FaultReport, NodeState
from ftconsole.lab.files import LabPaths, default_lab_dir, default_layout_path
from ftconsole.lab.gpus import render_gpus
from ftconsole.lab.layout import (
    BUILTIN_LAYOUT,
    DEFAULT_DRIVER_VERSION,
    EccFault,
    GpuFault,
    LabLayout,
    NodeFaults,
    NodeGroupLayout,
    TemperatureFault,
    load_layout,
    parse_layout,
)
from ftconsole.lab.node import LabNode
from ftconsole.lab.plan import LAB_HOST, MAX_NODES, NodeSpec, node_names, plan_nodes
from ftconsole.lab.processes import (
    KILL_GRACE_S,
    STOP_TIMEOUT_S,
    PidLock,
    find_lab_processes,
    kill_lab_processes,
    pid_alive,
)
from ftconsole.lab.records import LabInfo, LabNodeInfo
from ftconsole.lab.server import lab_down, lab_fault, lab_status, lab_up, serve
from ftconsole.lab.session import OUTPUT_GRACE_S, SHELL

__all__ = [
    "BUILTIN_LAYOUT",
    "DEFAULT_DRIVER_VERSION",
    "KILL_GRACE_S",
    "LAB_HOST",
    "MAX_NODES",
    "OUTPUT_GRACE_S",
    "SHELL",
    "STOP_TIMEOUT_S",
    "EccFault",
    "Fault",
    "FaultKind",
    "FaultReport",
    "GpuFault",
    "LabCluster",
    "LabInfo",
    "LabLayout",
    "LabNode",
    "LabNodeInfo",
    "LabPaths",
    "NodeFaults",
    "NodeGroupLayout",
    "NodeSpec",
    "NodeState",
    "PidLock",
    "TemperatureFault",
    "check_cluster_config",
    "deep_merge",
    "default_lab_dir",
    "default_layout_path",
    "fault_from_args",
    "find_lab_processes",
    "kill_lab_processes",
    "lab_down",
    "lab_fault",
    "lab_status",
    "lab_up",
    "load_layout",
    "main",
    "node_names",
    "parse_layout",
    "pid_alive",
    "plan_nodes",
    "render_cluster_config",
    "render_gpus",
    "serve",
]
