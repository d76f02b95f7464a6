"""The driver's Xid lines in the kernel log (scheduler/node/kernel_log.py): the parsing, the GPU a line names, and
the real /dev/kmsg (written as root: the kernel takes a line written there into its log)."""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

import pytest

from ftconsole.scheduler.node.kernel_log import gpu_addresses, parse_xid, pci_address, xids


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
         ("0000:3b:00", 79, "pid=1234, GPU has fallen off the bus.")),
        ("[ 4411.213] NVRM: Xid (PCI:0000:B1:00): 48, pid=88, name=python, An uncorrectable double bit error",
         ("0000:b1:00", 48, "pid=88, name=python, An uncorrectable double bit error")),
        ("NVRM: Xid (PCI:0001:18:00.0): 119, pid='<unknown>', name=<unknown>, Timeout after 6s of waiting for RPC",
         ("0001:18:00", 119, "pid='<unknown>', name=<unknown>, Timeout after 6s of waiting for RPC")),
        ("NVRM: GPU at PCI:0000:3b:00: GPU-5f1a...", None),
        ("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal", None),
        # another author's line holding the words (a segfault names the user's file): never the driver's (issue 40)
        ("python3[4242]: segfault at 0 ip 00007f in NVRM: Xid (PCI:0000:3b:00): 79, pid=1, fell off[7f+1000]", None),
        ("audit: comm=\"NVRM: Xid (PCI:0000:3b:00): 79\"", None),
    ],
)  # fmt: skip
def test_an_xid_line_gives_its_gpus_address_and_number(line: str, parsed: tuple[str, int, str] | None) -> None:
    assert parse_xid(line) == parsed


def test_nvmls_and_the_drivers_forms_of_an_address_are_one() -> None:
    assert pci_address("00000000:3B:00.0") == pci_address("0000:3b:00") == "0000:3b:00"
    assert pci_address("not an address") is None


def sim_file(tmp_path: Path, addresses: list[str | None]) -> Path:
    gpus = [{"index": i, "pci_bus_id": a} if a else {"index": i} for i, a in enumerate(addresses)]
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"gpus": gpus}))
    return path


def test_the_simulated_gpus_addresses_number_them(tmp_path: Path) -> None:
    assert gpu_addresses(str(sim_file(tmp_path, ["00000001:18:00.0", "00000001:19:00.0"]))) == {
        "0001:18:00": 0,
        "0001:19:00": 1,
    }
    assert gpu_addresses(str(sim_file(tmp_path, ["00000001:18:00.0", None]))) is None  # one GPU without: unknown
    assert gpu_addresses(str(tmp_path / "missing.json")) is None


def write_kmsg(line: str) -> None:
    with open("/dev/kmsg", "w") as fh:
        fh.write(f"<4>{line}\n")


@pytest.mark.skipif(not os.access("/dev/kmsg", os.W_OK | os.R_OK), reason="needs root: /dev/kmsg is not writable")
def test_xids_in_the_real_kernel_log_since_a_time_with_their_gpu_and_another_machines_counted_apart(
    tmp_path: Path,
) -> None:
    domain = secrets.randbelow(0xF000) + 0x1000  # an address no real GPU here has
    mine, other = f"{domain:04x}:3b:00", f"{domain:04x}:5e:00"
    write_kmsg(f"NVRM: Xid (PCI:{mine}): 48, pid=1, before the window")
    time.sleep(0.3)
    since = time.time()
    time.sleep(0.3)
    write_kmsg(f"NVRM: Xid (PCI:{mine}): 79, pid=2, GPU has fallen off the bus.")
    write_kmsg(f"NVRM: Xid (PCI:{other}): 74, pid=3, NVLink: fatal error")
    here = sim_file(tmp_path, [f"{domain:08x}:3b:00.0", f"{domain:08x}:3c:00.0"])
    got = xids(since, str(here))
    assert [(x["pci"], x["code"], x["gpu"], x["text"]) for x in got["xids"]] == [
        (mine, 79, 0, "pid=2, GPU has fallen off the bus.")
    ]
    assert got["foreign"] >= 1  # the other machine's line (the test nodes share this kernel)
    assert since <= got["xids"][0]["time"] <= time.time() + 1
    if not Path("/proc/driver/nvidia/gpus").exists():  # no driver: no address known, every line is this node's
        unknown = xids(since, None)
        assert {(x["pci"], x["gpu"]) for x in unknown["xids"]} >= {(mine, None), (other, None)}
