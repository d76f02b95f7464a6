"""Mode pytorch's wrapping rule (see launcher.py, "pytorch"): a Python command that runs a script or a module is
run by ``torch.distributed.run`` with the attempt's options; anything else is left as it is. Pure code."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence

TORCH_LAUNCH_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")


def torch_wrap(
    argv: tuple[str, ...],
    *,
    nproc_per_node: int,
    nnodes: int,
    node_rank: int,
    master_addr: str,
    master_port: int,
    max_restarts: int | None = None,
    monitor_interval: float | None = None,
) -> tuple[str, ...] | None:
    """The argv wrapped in ``torch.distributed.run``, or None when the rule leaves it alone (see module doc)."""
    split = _torch_split(argv)
    if split is None:
        return None
    head, target, rest = split
    opts = [
        f"--nproc_per_node={nproc_per_node}",
        f"--nnodes={nnodes}",
        f"--node_rank={node_rank}",
        f"--master_addr={master_addr}",
        f"--master_port={master_port}",
    ]
    if max_restarts is not None:
        opts.append(f"--max_restarts={max_restarts}")
    if monitor_interval is not None:
        opts.append(f"--monitor_interval={_number(monitor_interval)}")
    return (*head, "-m", "torch.distributed.run", *opts, *target, *rest)


def wraps_in_torchrun(argv: Sequence[str]) -> bool:
    """Whether mode pytorch wraps this command in ``torch.distributed.run`` (so that torchrun's options apply)."""
    return _torch_split(tuple(argv)) is not None


def _torch_split(argv: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] | None:
    """`_split_python`, or None also when the command runs torch's launcher already."""
    split = _split_python(argv)
    if split is None or (split[1][0] == "-m" and split[1][1] in TORCH_LAUNCH_MODULES):
        return None
    return split


def _split_python(argv: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] | None:
    """Split ``python [options] (script | -m module) args`` into (interpreter + options, target, args).

    None when argv[0] is not a Python interpreter or the command is not a script or module run (``-c``,
    ``-`` for stdin, no target, ``--help``/``--version``). Short options are read as CPython's getopt does:
    ``-um pkg`` is ``-u -m pkg``; ``-W``/``-X`` take a value, glued or as the next token.
    """
    if not argv or not _PYTHON.fullmatch(_basename(argv[0])):
        return None
    head: list[str] = [argv[0]]
    i = 1
    while i < len(argv):
        token = argv[i]
        if token == "--":
            if i + 1 >= len(argv) or argv[i + 1] == "-":
                return None
            return tuple(head), (argv[i + 1],), tuple(argv[i + 2 :])
        if token == "-":
            return None
        if not token.startswith("-"):
            return tuple(head), (token,), tuple(argv[i + 1 :])
        if token.startswith("--"):
            if token in ("--help", "--version"):
                return None
            head.append(token)
            if token == "--check-hash-based-pycs" and i + 1 < len(argv):
                head.append(argv[i + 1])
                i += 1
            i += 1
            continue
        for j, char in enumerate(token[1:], start=1):
            if char not in "cmWX":
                continue
            glued = token[j + 1 :]
            if char == "c":
                return None
            if char == "m":
                if j > 1:
                    head.append(token[:j])
                module = glued or (argv[i + 1] if i + 1 < len(argv) else "")
                if not module:
                    return None
                args_from = i + 1 if glued else i + 2
                return tuple(head), ("-m", module), tuple(argv[args_from:])
            # -W / -X: the value is glued or the next token
            head.append(token)
            if not glued and i + 1 < len(argv):
                head.append(argv[i + 1])
                i += 1
            break
        else:
            head.append(token)
        i += 1
    return None


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _basename(arg: str) -> str:
    return posixpath.basename(arg)
