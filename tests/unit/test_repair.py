"""The repair ladder's pieces that need no node (scheduler/repair.py, climbs.py, spec/repairspec.py): the config's
reboot command and what it may name, the daily cap of automatic repairs, what `nodes` says of a node being
repaired, and which GPUs an isolation names. The ladder itself climbs on real sshd nodes
(tests/integration/test_repair_sshd.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ftconsole.format import node_doing
from ftconsole.scheduler.climbs import DAY_S, Repairs
from ftconsole.scheduler.repair import GPU_NAMED
from ftconsole.scheduler.spec.repairspec import RepairSettings


def test_a_reboot_command_names_only_the_nodes_fields_and_no_shell_reads_it() -> None:
    settings = RepairSettings(reboot=["ipmitool", "-H", "{node}-bmc", "-p", "{port}", "echo {{x}}; rm -rf /"])
    assert settings.reboot_argv("gpu07", "10.0.0.7", 22) == ["ipmitool", "-H", "gpu07-bmc", "-p", "22",
                                                             "echo {x}; rm -rf /"]  # fmt: skip
    assert RepairSettings(reboot="ssh").reboot == "ssh" and RepairSettings().reboot is None
    for bad, said in [
        (["ipmitool", "{bmc}"], "names {bmc}: a reboot command may name {node}, {host}, {port}"),
        ([], "give a command as a list of words"),
        (["ipmitool", "{node"], "write a brace as {{ or }}"),
        ("reboot", "Input should be 'ssh'"),
    ]:
        with pytest.raises(ValidationError, match=said.replace("{", r"\{").replace("}", r"\}")):
            RepairSettings(reboot=bad)
    with pytest.raises(ValidationError):
        RepairSettings(max_per_day=0)


def test_the_scheduler_repairs_a_node_at_most_max_per_day_times_in_24_hours() -> None:
    repairs = Repairs()
    assert [repairs.auto_room("n1", t, 2) for t in (0.0, 10.0, 20.0)] == [True, True, False]
    assert repairs.auto_room("n2", 20.0, 2)  # each node its own
    assert not repairs.auto_room("n1", DAY_S - 1, 2)
    assert repairs.auto_room("n1", DAY_S + 1, 2)  # the first has aged out of the day


def test_nodes_says_the_step_of_a_repair_before_the_reasons() -> None:
    view = {"repair": {"step": "boot", "by": "ann", "since": 1.0}, "testing": True}
    assert node_doing(view) == ["repair: boot (by ann)", "node tests running"]
    assert node_doing({"repair": None, "testing": False}) == []


def test_the_gpus_an_isolation_names() -> None:
    found = GPU_NAMED.findall("job 4: GPU 3: Xid 79 (fallen off the bus); gpu1 hot; gpus 4 of 8; GPU 12: ecc")
    assert sorted({int(g) for g in found}) == [1, 3, 12]
