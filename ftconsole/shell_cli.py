"""`ftconsole shell JOB [--rank N] [--attempt A] | NODE`: the debug terminal, the system ssh client exec'd.

The argv comes from `scheduler.ssh.shell`; this module only resolves the target through the client and execs it
(`--print` prints it instead). With `--command`, the remote exit status is this command's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from typing import Any

from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.serve.client import open_client
from ftconsole.scheduler.spec.config import find_config, load_config


class SshNotFound(FtError):
    title = "ssh"


def cmd_shell(args: argparse.Namespace) -> int:
    from ftconsole.scheduler.ssh.shell import ShellTarget, shell_target  # asyncssh: only for this command

    loaded = load_config(find_config(args.config))

    async def go() -> ShellTarget:
        async with open_client(loaded) as client:
            return await shell_target(
                client, loaded, args.target, rank=args.rank, attempt=args.attempt, command=args.command
            )

    target = asyncio.run(go())
    if args.print:
        print(shlex.join(target.argv))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(target.argv[0], target.argv)
    except OSError as exc:
        raise SshNotFound(f"cannot run {target.argv[0]}: {exc.strerror or exc} (install the OpenSSH client)") from exc
    return 1  # not reached: execvp returns only by raising


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "shell",
        parents=[common],
        help="the debug terminal: ssh into a job's run folder with its env, or onto a node",
        description="An ssh session (host keys verified, the scheduler's own ssh settings) in the run folder "
        "of a job's rank with the run's env, as the job's user (root and other logins are switched to that user "
        "on the node), or a login shell on a node. An all-digits TARGET is a job id, anything else a node name.",
    )
    p.add_argument("target", metavar="JOB|NODE", help="job id, or node name from the cluster config")
    p.add_argument("--rank", type=int, help="job: which rank (default 0)")
    p.add_argument("--attempt", type=int, help="job: which attempt (default: the latest)")
    p.add_argument(
        "--command",
        metavar="CMD",
        help="run CMD there with sh -c (no terminal, no banner) instead of a shell; its exit status is ours",
    )
    p.add_argument("--print", action="store_true", help="print the ssh command line instead of running it")
    p.set_defaults(func=cmd_shell)
