"""DeepSpeed's runner (``deepspeed``): the arguments, hostfile and env file we give it (pure).

The runner starts every rank, on the first node too, through pdsh from a bare login: it reads the hostfile
(``host slots=N``, N meaning GPUs 0..N-1), picks GPUs with ``--include host:i,j@...``, and carries the
environment only through its env file (``DS_ENV_FILE``), one ``KEY=VALUE`` line each.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Protocol


class NodeAssignment(Protocol):
    """What these functions read of a node of the attempt (`scheduler.launcher.NodeAssignment`)."""

    @property
    def host(self) -> str: ...

    @property
    def gpus(self) -> tuple[int, ...]: ...


DEEPSPEED_ENV = "deepspeed_env"  # DeepSpeed's env file in a run folder (DS_ENV_FILE); ".N" for batch task N
_DS_PLAIN = re.compile(r"[\w@%+=:,./-]*")  # a value DeepSpeed's runner leaves unquoted

# deepspeed runner options that take a value (the first other bare token is the user's script)
_DEEPSPEED_VALUE_OPTIONS = frozenset(
    {
        "-H",
        "--hostfile",
        "-i",
        "--include",
        "-e",
        "--exclude",
        "--num_nodes",
        "--min_elastic_nodes",
        "--max_elastic_nodes",
        "--num_gpus",
        "--num_accelerators",
        "--master_port",
        "--master_addr",
        "--node_rank",
        "--launcher",
        "--launcher_args",
        "--enable_each_rank_log",
        "--autotuning",
        "--bind_core_list",
        "--ssh_port",
        "--venv_script",
        "--comment",
    }
)


def deepspeed_hostfile(nodes: tuple[NodeAssignment, ...]) -> bytes:
    """``host slots=N`` per node, N the highest GPU index + 1 (1 without GPUs).

    DeepSpeed's runner reads ``slots=N`` as GPUs 0..N-1 and refuses an ``--include`` of a GPU outside them
    (``No slot '2' specified on host``); ``--include`` then picks the job's own GPUs among them.
    """
    return "".join(f"{n.host} slots={max(n.gpus) + 1 if n.gpus else 1}\n" for n in nodes).encode()


def deepspeed_env_file(env: Mapping[str, str]) -> bytes:
    """DeepSpeed's env file (``DS_ENV_FILE``): ``KEY=VALUE`` lines its runner turns into ``export`` commands.

    DeepSpeed 0.19 (``MultiNodeRunner.add_export``) strips each value and wraps one with a character outside
    ``[\\w@%+=:,./-]`` in double quotes, unescaped, in the shell line that pdsh runs on every node; so such a
    value gets ``\\``, ``"``, ``$`` and backquotes escaped here, and arrives as given. A value that a line
    cannot carry (a newline, blanks at either end) is left out: only rank 0's launcher sees it.
    """
    lines = []
    for key, value in env.items():
        if "\n" in value or "\r" in value or value != value.strip():
            continue
        if not _DS_PLAIN.fullmatch(value):
            value = re.sub(r'([\\"$`])', r"\\\1", value)
        lines.append(f"{key}={value}\n")
    return "".join(lines).encode()


def deepspeed_argv(
    argv: tuple[str, ...], hostfile: str, nodes: tuple[NodeAssignment, ...], master_port: int
) -> tuple[str, ...]:
    """``deepspeed`` with ``--hostfile``, ``--master_addr``, ``--master_port``, ``--include`` where not given."""
    given = _deepspeed_options(argv)
    extra: list[str] = []
    if not given & {"-H", "--hostfile"}:
        extra += ["--hostfile", hostfile]
    if "--master_addr" not in given:
        extra += ["--master_addr", nodes[0].host]
    if "--master_port" not in given:
        extra += ["--master_port", str(master_port)]
    selecting = {"-i", "--include", "-e", "--exclude", "--num_nodes", "--num_gpus", "--num_accelerators"}
    if not given & selecting and any(n.gpus for n in nodes):
        include = "@".join(f"{n.host}:{','.join(str(g) for g in n.gpus)}" if n.gpus else n.host for n in nodes)
        extra += ["--include", include]
    return (argv[0], *extra, *argv[1:])


def deepspeed_value(argv: tuple[str, ...], option: str) -> str | None:
    """The value deepspeed's runner was given for `option` (``--opt V`` or ``--opt=V``), or None."""
    i = 1
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-") or token == "-":
            return None
        name, has_value, glued = token.partition("=")
        if name == option:
            return glued if has_value else (argv[i + 1] if i + 1 < len(argv) else None)
        i += 2 if name in _DEEPSPEED_VALUE_OPTIONS and not has_value else 1
    return None


def _deepspeed_options(argv: tuple[str, ...]) -> set[str]:
    """Option names deepspeed's runner itself was given (those before the user's script)."""
    names: set[str] = set()
    i = 1
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-") or token == "-":
            break
        name, has_value, _ = token.partition("=")
        names.add(name)
        if name in _DEEPSPEED_VALUE_OPTIONS and not has_value:
            i += 1
        i += 1
    return names
