"""The cluster config's repair ladder (`repair`, issue 42): what the scheduler may do to bring an isolated node
back (reset its failed GPU, reboot it, test it) before an operator has to. Part of the cluster config (config.py
re-exports it); the ladder itself is scheduler/repair.py.
"""

from __future__ import annotations

import string
from typing import Literal

from pydantic import Field, field_validator

from ftconsole.scheduler.spec.specbase import Strict as _Strict
from ftconsole.scheduler.spec.values import PositiveDuration

# what a head-node reboot command may name, each replaced by the node's own value (no shell reads the command)
REBOOT_FIELDS = ("node", "host", "port")


class RepairSettings(_Strict):
    """`repair`: the steps of the ladder, each optional. `ftconsole repair NODES` climbs it by hand; with `auto`,
    the scheduler climbs it for each node it isolated, at most `max_per_day` times a day per node, and never for a
    flaky node (one that waits for an operator)."""

    auto: bool = False  # the scheduler repairs the nodes it isolates, by itself
    max_per_day: int = Field(2, ge=1)  # automatic repairs of one node in 24 hours, at most
    # reset the failed GPUs (`nvidia-smi -r -i N`, over the node's SSH) when the isolation names GPUs and no job
    # holds the node; the node tests then say whether that was enough
    gpu_reset: bool = True
    # None: no reboot step. "ssh": `systemctl reboot` over the node's own SSH (through `sudo -n` when the SSH user
    # is not root). A list: a command run on the head node, as Slurm's RebootProgram (an IPMI or BMC tool), each
    # word with {node}, {host} and {port} replaced by the node's; no shell reads it.
    reboot: Literal["ssh"] | list[str] | None = None
    boot_timeout: PositiveDuration = 600.0  # how long a reboot may take, until the node answers with a new boot id

    @field_validator("reboot")
    @classmethod
    def _command(cls, value: Literal["ssh"] | list[str] | None) -> Literal["ssh"] | list[str] | None:
        if not isinstance(value, list):
            return value
        if not value or not value[0].strip():
            raise ValueError('give a command as a list of words (["ipmitool", "-H", "{node}-bmc", ...]), or "ssh"')
        for word in value:
            try:
                names = [name for _, name, _, _ in string.Formatter().parse(word) if name is not None]
            except ValueError as exc:
                raise ValueError(f"{word!r}: {exc} (write a brace as {{{{ or }}}})") from None
            unknown = [n for n in names if n not in REBOOT_FIELDS]
            if unknown:
                raise ValueError(
                    f"{word!r} names {{{unknown[0]}}}: a reboot command may name "
                    + ", ".join(f"{{{f}}}" for f in REBOOT_FIELDS)
                )
        return value

    def reboot_argv(self, node: str, host: str, port: int) -> list[str]:
        """The head-node reboot command for a node, its fields filled in."""
        assert isinstance(self.reboot, list)
        return [word.format(node=node, host=host, port=port) for word in self.reboot]
