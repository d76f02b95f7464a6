"""The repair ladder's pieces that need no node (scheduler/repair.py, climbs.py, spec/repairspec.py): the config's
reboot command and what it may name, what `nodes` says of a node being repaired, how a climb is kept in the store,
and which GPUs an isolation names. The ladder itself climbs on real sshd nodes (tests/integration/test_repair_sshd.py);
a climb picked up after a restart, and the daily cap of automatic repairs, are tests/unit/test_repair_pickup.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ftconsole.format import node_doing
from ftconsole.scheduler.climbs import Climb
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


def test_nodes_says_the_step_of_a_repair_before_the_reasons() -> None:
    view = {"repair": {"step": "boot", "by": "ann", "since": 1.0}, "testing": True}
    assert node_doing(view) == ["repair: boot (by ann)", "node tests running"]
    assert node_doing({"repair": None, "testing": False}) == []


def test_the_gpus_an_isolation_names() -> None:
    found = GPU_NAMED.findall("job 4: GPU 3: Xid 79 (fallen off the bus); gpu1 hot; gpus 4 of 8; GPU 12: ecc")
    assert sorted({int(g) for g in found}) == [1, 3, 12]


@pytest.mark.parametrize(
    "climb",
    [
        Climb("n1", "ann", "drained by ann", 1.0),
        Climb(
            "n1", "scheduler (repair)", "isolated by scheduler", 1.0, "boot", 2.5, True, "b1", 2.0, ("rebooted",), True
        ),
    ],
)
def test_a_climb_is_kept_in_the_store_as_it_is(climb: Climb) -> None:
    assert Climb.from_record("n1", climb.to_record()) == climb


NAN_START = '{"by": "a", "why": "w", "started": "NaN", "step": "tests", "since": 1}'


@pytest.mark.parametrize("record", ["{not json", "[]", '{"by": "ann"}', NAN_START])
def test_a_climb_record_that_cannot_be_read_is_none(record: str) -> None:
    assert Climb.from_record("n1", record) is None
