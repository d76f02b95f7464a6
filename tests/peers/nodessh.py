"""Node-to-node SSH on the sshd test cluster, as a launcher on the first node needs it.

The test nodes are sshd processes on 127.0.0.11, 127.0.0.12... each on its own port, all of one user whose
`ssh` reads its config from the account's real home (not the node's $HOME). So instead of touching
~/.ssh, a job that needs node-to-node SSH gets a folder first on its PATH with an `ssh` that runs the system
ssh with ``-F`` a config of this cluster (each node's port, the cluster's client key and known_hosts,
BatchMode). Every launcher finds `ssh` on PATH: DeepSpeed's pdsh runner (and its own ssh check), OpenMPI's
rsh agent, hydra's ssh launcher, and ftconsole's pre-launch check.
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from tests.sshd_cluster import SshdCluster


def ssh_bin(cluster: SshdCluster, folder: Path, *, known_hosts: Path | None = None) -> Path:
    """Write `folder`/ssh (and its config) for `cluster`; return `folder`. `known_hosts` replaces the cluster's."""
    folder.mkdir(parents=True, exist_ok=True)
    system_ssh = shutil.which("ssh", path="/usr/bin:/bin")
    assert system_ssh, "no ssh client in /usr/bin"
    config = folder / "ssh_config"
    lines = []
    for node in cluster:
        lines += [f"Host {node.address}", f"    Port {node.port}"]
    lines += [
        "Host *",
        f"    User {cluster.user}",
        f'    IdentityFile "{cluster.key}"',
        "    IdentitiesOnly yes",
        "    IdentityAgent none",
        f'    UserKnownHostsFile "{known_hosts or cluster.known_hosts}"',
        "    GlobalKnownHostsFile /dev/null",
        "    StrictHostKeyChecking yes",
        "    BatchMode yes",
        "    LogLevel ERROR",
    ]
    config.write_text("\n".join(lines) + "\n")
    wrapper = folder / "ssh"
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.join([system_ssh, "-F", str(config)])} "$@"\n')
    os.chmod(wrapper, 0o755)
    return folder
