"""The node-side probe agent, run for real: a `python3 -` subprocess fed the file with PARAMS prepended,
exactly as the console sends it over SSH, its one line of output parsed by `probes.results.parse_report`.

GPUs come from simulated files, a fake `pynvml` module on PYTHONPATH, or a fake `nvidia-smi` on PATH; the
node's /proc, /sys/class/infiniband and /etc/os-release from a fake tree (`sysroot`).
"""

from __future__ import annotations

import ast
import json
import os
import re
import resource
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from ftconsole.probes.results import ALL_CHECKS, CheckStatus, GPUInfo, NodeFacts, ProbeReport, parse_report
from ftconsole.scheduler.node import agent
from ftconsole.scheduler.spec.config import Thresholds
from ftconsole.scheduler.ssh.probing import agent_source
from tests.pythons import python38

AGENT_PATH = Path(agent.__file__)
AGENT_SOURCE = agent_source()  # agent.py and its agent_*.py modules, one script, as the console sends it
GPU_CHECKS = ["gpu-check", "gpu-health", "gpu-temperature", "nvlink"]
RUN_TIMEOUT_S = 30


def agent_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FTCONSOLE_SIM_GPUS", "PYTHONPATH")}
    env.update(extra)
    return env


def run_agent(
    params: dict[str, Any],
    env: dict[str, str] | None = None,
    python: str = sys.executable,
    **popen: Any,
) -> tuple[ProbeReport, dict[str, Any]]:
    """Run the agent the way the console does; return the parsed report and the raw document."""
    source = f"import json\nPARAMS = json.loads({json.dumps(params)!r})\n" + AGENT_SOURCE
    done = subprocess.run(
        [python, "-"],
        input=source,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env if env is not None else agent_env(),
        **popen,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    return parse_report(done.stdout), json.loads(lines[0])


def statuses(report: ProbeReport) -> dict[str, CheckStatus]:
    return {c.name: c.status for c in report.checks}


def message(report: ProbeReport, name: str) -> str:
    check = report.check(name)
    assert check is not None, f"no {name} check in {[c.name for c in report.checks]}"
    return check.message


# --- contract ---------------------------------------------------------------------------------------------


def test_agent_constants_match_the_console_contract() -> None:
    assert agent.CHECK_NAMES == ALL_CHECKS
    assert Thresholds.model_validate({}).model_dump() == agent.DEFAULT_THRESHOLDS
    assert [name for name, _ in agent.CHECKS] == list(ALL_CHECKS)


def test_document_has_every_key_on_one_compact_line(tmp_path: Path) -> None:
    sim = write_sim(tmp_path, {"driver_version": "550.54.15", "gpus": [gpu(0), gpu(1)]})
    report, doc = run_agent({}, env=agent_env(FTCONSOLE_SIM_GPUS=str(sim)))
    assert set(doc) == {"agent", "duration_s", "facts", "gpus", "checks"}
    assert list(doc["facts"]) == [f.name for f in fields(NodeFacts)]
    assert all(list(g) == [f.name for f in fields(GPUInfo)] for g in doc["gpus"])
    assert all(set(c) == {"name", "status", "value", "threshold", "unit", "message"} for c in doc["checks"])
    assert [c.name for c in report.checks] == list(ALL_CHECKS)
    assert report.facts.python and report.facts.hostname and report.facts.cpus
    assert report.duration_s is not None and report.duration_s < 2.0


# --- GPUs from a simulated file ---------------------------------------------------------------------------


def gpu(index: int, **overrides: Any) -> dict[str, Any]:
    healthy = {
        "index": index,
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total_mib": 81559,
        "utilization": 97,
        "temperature": 61,
        "ecc_uncorrectable": 0,
        "healthy": True,
    }
    return {**healthy, **overrides}


def write_sim(tmp_path: Path, content: dict[str, Any] | str) -> Path:
    path = tmp_path / "gpus.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def sim(*gpus: dict[str, Any]) -> dict[str, Any]:
    return {"driver_version": "550.54.15", "gpus": list(gpus)}


EIGHT = [gpu(i) for i in range(8)]

SIM_CASES = [
    # id, sim file content, thresholds, expected statuses, {check: text its message contains}
    pytest.param(
        sim(*EIGHT),
        {"gpus_expected": 8},
        {"gpu-check": "pass", "gpu-health": "pass", "gpu-temperature": "pass", "nvlink": "skip"},
        {"gpu-check": "found 8 GPUs via sim"},
        id="healthy",
    ),
    pytest.param(
        sim(*EIGHT[:3], gpu(3, ecc_uncorrectable=2), *EIGHT[4:]),
        {"gpus_expected": 8},
        {"gpu-check": "pass", "gpu-health": "fail"},
        {"gpu-health": "GPU 3: 2 uncorrectable ECC errors"},
        id="ecc-error",
    ),
    pytest.param(
        sim(gpu(0), gpu(1, healthy=False)),
        {},
        {"gpu-health": "fail"},
        {"gpu-health": "GPU 1: reported unhealthy"},
        id="unhealthy",
    ),
    pytest.param(
        sim(gpu(0, retired_pages_pending=True), gpu(1, remapped_rows_pending=True)),
        {},
        {"gpu-health": "warn"},
        {"gpu-health": "GPU 0: retired pages pending; GPU 1: remapped rows pending"},
        id="pending-retirement",
    ),
    pytest.param(
        sim(*EIGHT[:4]),
        {"gpus_expected": 8},
        {"gpu-check": "fail"},
        {"gpu-check": "found 4 GPUs, expected 8"},
        id="too-few-gpus",
    ),
    pytest.param(
        sim(gpu(0), gpu(1, temperature=88)),
        {},
        {"gpu-temperature": "warn"},
        {"gpu-temperature": "GPU 1 at 88 C, warn at >= 85 C"},
        id="warm",
    ),
    pytest.param(
        sim(gpu(0, temperature=96), gpu(1, temperature=88)),
        {},
        {"gpu-temperature": "fail"},
        {"gpu-temperature": "GPU 0 at 96 C, fail at >= 95 C"},
        id="hot",
    ),
    pytest.param(
        sim(gpu(0, temperature=70)),
        {"gpu_temp_warn_c": 70, "gpu_temp_fail_c": 80},
        {"gpu-temperature": "warn"},
        {},
        id="warn-threshold-inclusive",
    ),
    pytest.param(
        sim(gpu(0, nvlink_down=0), gpu(1, nvlink_down=2)),
        {},
        {"nvlink": "warn"},
        {"nvlink": "GPU 1 (2 down)"},
        id="nvlink-down",
    ),
    pytest.param(
        sim(gpu(0, temperature="hot", healthy="yes", ecc_uncorrectable=None)),
        {},
        {"gpu-check": "pass", "gpu-health": "pass", "gpu-temperature": "skip"},
        {"gpu-temperature": "no GPU temperature readable"},
        id="wrong-types-read-as-null",
    ),
    pytest.param(
        "{not json",
        {},
        {"gpu-check": "warn", "gpu-health": "skip", "gpu-temperature": "skip", "nvlink": "skip"},
        {"gpu-check": "cannot read simulated GPU file"},
        id="malformed-file",
    ),
    pytest.param(
        "{not json",
        {"gpus_expected": 8},
        {"gpu-check": "fail"},
        {"gpu-check": "found 0 GPUs, expected 8 (cannot read simulated GPU file"},
        id="malformed-file-gpus-expected",
    ),
    pytest.param(
        {"gpus": {"0": gpu(0)}},
        {},
        {"gpu-check": "warn"},
        {"gpu-check": 'has no "gpus" list'},
        id="gpus-not-a-list",
    ),
    pytest.param(
        sim(),
        {},
        {"gpu-check": "skip", "gpu-health": "skip"},
        {"gpu-check": "no GPU expected"},
        id="no-gpus-none-expected",
    ),
]


@pytest.mark.parametrize(("content", "thresholds", "expected", "messages"), SIM_CASES)
def test_simulated_gpus(
    tmp_path: Path,
    content: dict[str, Any] | str,
    thresholds: dict[str, Any],
    expected: dict[str, str],
    messages: dict[str, str],
) -> None:
    path = write_sim(tmp_path, content)
    params = {"checks": GPU_CHECKS, "thresholds": thresholds}
    report, _ = run_agent(params, env=agent_env(FTCONSOLE_SIM_GPUS=str(path)))
    assert report.facts.gpu_source == "sim"
    assert {name: statuses(report)[name] for name in expected} == expected
    for name, text in messages.items():
        assert text in message(report, name)


def test_simulated_gpus_fill_gpu_info(tmp_path: Path) -> None:
    path = write_sim(tmp_path, sim(gpu(0, processes=[101, "x", True, 102]), {"name": "bare"}))
    report, _ = run_agent({"checks": []}, env=agent_env(FTCONSOLE_SIM_GPUS=str(path)))
    assert report.facts.driver_version == "550.54.15"
    first, second = report.gpus
    assert first == GPUInfo(
        index=0,
        name="NVIDIA H100 80GB HBM3",
        memory_total_mib=81559,
        utilization=97,
        temperature=61,
        ecc_uncorrectable=0,
        healthy=True,
        processes=(101, 102),
    )
    assert second == GPUInfo(index=1, name="bare")


def test_sim_env_var_name_is_a_parameter(tmp_path: Path) -> None:
    path = write_sim(tmp_path, sim(gpu(0)))
    env = agent_env(MY_SIM=str(path))
    report, _ = run_agent({"checks": ["gpu-check"], "sim_gpus_env": "MY_SIM"}, env=env)
    assert report.facts.gpu_source == "sim"
    assert len(report.gpus) == 1


# --- GPUs from NVML and nvidia-smi (fakes), through the same checks ---------------------------------------

FAKE_PYNVML = """
class NVMLError(Exception):
    pass

NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_NVLINK_MAX_LINKS = 4
MIB = 1024 * 1024

class _Memory:
    total = 81559 * MIB
    used = 2048 * MIB

class _Rates:
    gpu = 97

class _Process:
    def __init__(self, pid):
        self.pid = pid

def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlSystemGetDriverVersion(): return b"550.54.15"
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(index): return index
def nvmlDeviceGetName(h): return b"NVIDIA H100 80GB HBM3"
def nvmlDeviceGetUUID(h): return "GPU-%d" % h
def nvmlDeviceGetMemoryInfo(h): return _Memory()
def nvmlDeviceGetUtilizationRates(h): return _Rates()
def nvmlDeviceGetTemperature(h, sensor): return 61 + 30 * h
def nvmlDeviceGetRetiredPagesPendingStatus(h): return 0

def nvmlDeviceGetTotalEccErrors(h, kind, counter):
    if h == 1:
        raise NVMLError("Not Supported")
    return 0

def nvmlDeviceGetNvLinkState(h, link):
    if link >= 2:
        raise NVMLError("Not Supported")
    return 0 if (h, link) == (1, 1) else 1

def nvmlDeviceGetComputeRunningProcesses(h):
    return [_Process(4242)] if h == 0 else []

# nvmlDeviceGetRemappedRows is missing on purpose, as in an old pynvml.
"""

NO_NVML = 'def nvmlInit():\n    raise RuntimeError("NVML Shared Library Not Found")\n'

FAKE_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=index,name,*)
    echo '0, NVIDIA H100 80GB HBM3, GPU-aaa, 81559, 1024, 97, 61, 0, No, 550.54.15'
    echo '1, NVIDIA H100 80GB HBM3, GPU-bbb, 81559, [N/A], [Not Supported], 90, [N/A], Yes, 550.54.15' ;;
  --query-compute-apps=*)
    echo 'GPU-aaa, 4242' ;;
esac
"""

BROKEN_SMI = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
exit 9
"""

SOURCE_CASES = [
    # id, pynvml module text, nvidia-smi script or None, expected source, expected GPUs, statuses, messages
    pytest.param(
        FAKE_PYNVML,
        FAKE_SMI,
        "nvml",
        [
            GPUInfo(0, "NVIDIA H100 80GB HBM3", "GPU-0", 81559, 2048, 97, 61, 0, False, None, 0, None, (4242,)),
            GPUInfo(1, "NVIDIA H100 80GB HBM3", "GPU-1", 81559, 2048, 97, 91, None, False, None, 1, None, ()),
        ],
        {"gpu-check": "pass", "gpu-health": "pass", "gpu-temperature": "warn", "nvlink": "warn"},
        {"nvlink": "GPU 1 (1 down)", "gpu-check": "found 2 GPUs via nvml"},
        id="nvml",
    ),
    pytest.param(
        NO_NVML,
        FAKE_SMI,
        "nvidia-smi",
        [
            GPUInfo(0, "NVIDIA H100 80GB HBM3", "GPU-aaa", 81559, 1024, 97, 61, 0, False, processes=(4242,)),
            GPUInfo(1, "NVIDIA H100 80GB HBM3", "GPU-bbb", 81559, None, None, 90, None, True),
        ],
        {"gpu-check": "pass", "gpu-health": "warn", "gpu-temperature": "warn", "nvlink": "skip"},
        {"gpu-health": "GPU 1: retired pages pending"},
        id="nvidia-smi",
    ),
    pytest.param(
        NO_NVML,
        BROKEN_SMI,
        "nvidia-smi",
        [],
        {"gpu-check": "warn", "gpu-health": "skip"},
        {"gpu-check": "nvidia-smi failed: exit status 9: NVIDIA-SMI has failed"},
        id="nvidia-smi-broken",
    ),
    pytest.param(
        NO_NVML,
        None,
        "none",
        [],
        {"gpu-check": "skip", "gpu-health": "skip", "gpu-temperature": "skip", "nvlink": "skip"},
        {"gpu-check": "no GPU expected"},
        id="no-gpu-source",
    ),
]


@pytest.mark.parametrize(("pynvml", "smi", "source", "gpus", "expected", "messages"), SOURCE_CASES)
def test_gpu_sources_share_one_path(
    tmp_path: Path,
    pynvml: str,
    smi: str | None,
    source: str,
    gpus: list[GPUInfo],
    expected: dict[str, str],
    messages: dict[str, str],
) -> None:
    (tmp_path / "pynvml.py").write_text(pynvml)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi is not None:
        (bin_dir / "nvidia-smi").write_text(smi)
        (bin_dir / "nvidia-smi").chmod(0o755)
    env = agent_env(PYTHONPATH=str(tmp_path), PATH=str(bin_dir))
    report, _ = run_agent({"checks": GPU_CHECKS}, env=env)
    assert report.facts.gpu_source == source
    assert list(report.gpus) == gpus
    if gpus:
        assert report.facts.driver_version == "550.54.15"
    assert statuses(report) == {**statuses(report), **expected}
    for name, text in messages.items():
        assert text in message(report, name)


# --- deeper GPU health: PCIe link, hardware slowdowns, retired pages, NVLink errors ---------------------------

# NVML of two GPUs as a driver of today answers: GPU 0 as the H200 the device check read (recorded below), but
# idle at PCIe gen 1 (a link's generation drops at idle by design); GPU 1 in a slot that gives it 8 lanes of 16,
# slowed down by its own thermal protection, with pages retired and NVLink errors counted
DEEPER_PYNVML = (
    FAKE_PYNVML
    + """
def nvmlDeviceGetCurrPcieLinkWidth(h): return 16 if h == 0 else 8
def nvmlDeviceGetMaxPcieLinkWidth(h): return 16
def nvmlDeviceGetCurrPcieLinkGeneration(h): return 1 if h == 0 else 5
def nvmlDeviceGetMaxPcieLinkGeneration(h): return 5
def nvmlDeviceGetCurrentClocksEventReasons(h): return 0x1 if h == 0 else 0x41  # idle; idle and HW thermal

def nvmlDeviceGetRetiredPages(h, cause):
    if h == 0:
        raise NVMLError("Not Supported")  # row remapping instead (A100 and later)
    return [0x1000, 0x2000] if cause == 1 else [0x3000]

def nvmlDeviceGetNvLinkErrorCounter(h, link, counter):
    if h == 0 or link >= 2:
        raise NVMLError("Not Supported")
    return 7 if counter == 0 else 0
"""
)
GOLDEN_PROBES = Path(__file__).resolve().parent / "golden" / "probes"


def test_nvml_tells_a_narrow_pcie_link_and_a_hardware_slowdown_apart_from_an_idle_gpu(tmp_path: Path) -> None:
    (tmp_path / "pynvml.py").write_text(DEEPER_PYNVML)
    report, raw = run_agent({"checks": GPU_CHECKS}, env=agent_env(PYTHONPATH=str(tmp_path), PATH="/nonexistent"))
    idle, slowed = report.gpus
    assert (idle.pcie_width, idle.pcie_width_max, idle.pcie_gen, idle.pcie_gen_max) == (16, 16, 1, 5)
    assert (idle.slowdown, idle.retired_pages, idle.nvlink_errors) == ((), None, None)
    assert (slowed.pcie_width, slowed.slowdown, slowed.retired_pages, slowed.nvlink_errors) == (
        8,
        ("hw_thermal",),
        3,
        14,
    )
    assert raw["gpus"][1]["slowdown"] == ["hw_thermal"]
    assert statuses(report)["gpu-health"] == CheckStatus.WARN  # suspect: the node is degraded, not failed
    assert message(report, "gpu-health") == "GPU 1: PCIe link x8 of x16, slowed down by the hardware (hw_thermal)"


def test_a_driver_that_knows_only_the_older_throttle_reasons_is_read_the_same(tmp_path: Path) -> None:
    older = DEEPER_PYNVML.replace(
        "def nvmlDeviceGetCurrentClocksEventReasons", "def nvmlDeviceGetCurrentClocksThrottleReasons"
    )
    (tmp_path / "pynvml.py").write_text(older)
    report, _ = run_agent({"checks": GPU_CHECKS}, env=agent_env(PYTHONPATH=str(tmp_path), PATH="/nonexistent"))
    assert [g.slowdown for g in report.gpus] == [(), ("hw_thermal",)]


def test_what_a_real_h200_answered_reads_as_a_healthy_gpu_with_every_deeper_reading() -> None:
    """Recorded on a lent NVIDIA H200 (driver 580.159.04, nvidia-ml-py): the agent as the scheduler sends it,
    run there with python3. NVML answers the PCIe link (gen 5, x16 of x16) and the clock event reasons (idle
    only); it has no retired pages on a GPU that remaps rows, and no NVLink on a single GPU."""
    report = parse_report((GOLDEN_PROBES / "h200-nvml.json").read_text())
    (gpu,) = report.gpus
    assert (gpu.name, gpu.pcie_width, gpu.pcie_width_max, gpu.pcie_gen, gpu.pcie_gen_max) == (
        "NVIDIA H200",
        16,
        16,
        5,
        5,
    )
    assert (gpu.slowdown, gpu.retired_pages, gpu.nvlink_errors, gpu.remapped_rows_pending) == ((), None, None, False)
    assert statuses(report)["gpu-health"] == CheckStatus.PASS


# nvidia-smi as the H200 answered (golden/probes/h200-smi.json: each field's value): any --query-gpu, its fields
# in the order asked; a field the recorded driver did not answer, or one `{unknown}` names, is refused as a real
# nvidia-smi refuses it (the whole query, exit 2)
RECORDED_SMI = """#!{python}
import json, sys
fields = json.load(open({recorded!r}))
fields.update({changes!r})
unknown = {unknown!r}
for arg in sys.argv[1:]:
    if arg.startswith("--query-gpu="):
        asked = arg.split("=", 1)[1].split(",")
        for name in asked:
            if name not in fields or name in unknown:
                print('Field "%s" is not a valid field to query.' % name)
                print()
                sys.exit(2)
        print(", ".join(fields[name] for name in asked))
"""


def recorded_smi(tmp_path: Path, changes: dict[str, str] | None = None, unknown: tuple[str, ...] = ()) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    recorded = str(GOLDEN_PROBES / "h200-smi.json")
    smi.write_text(
        RECORDED_SMI.format(python=sys.executable, recorded=recorded, changes=changes or {}, unknown=unknown)
    )
    smi.chmod(0o755)
    (tmp_path / "pynvml.py").write_text(NO_NVML)  # no NVML: nvidia-smi is what there is
    return bin_dir


def test_nvidia_smi_gives_the_deeper_readings_as_the_h200_answered_them(tmp_path: Path) -> None:
    env = agent_env(PYTHONPATH=str(tmp_path), PATH=str(recorded_smi(tmp_path)))
    report, _ = run_agent({"checks": GPU_CHECKS}, env=env)
    assert report.facts.gpu_source == "nvidia-smi"
    (gpu,) = report.gpus
    assert (gpu.name, gpu.pcie_width, gpu.pcie_width_max, gpu.pcie_gen, gpu.pcie_gen_max) == (
        "NVIDIA H200",
        16,
        16,
        5,
        5,
    )
    assert (gpu.slowdown, gpu.retired_pages, gpu.remapped_rows_pending) == ((), None, False)
    assert statuses(report)["gpu-health"] == CheckStatus.PASS


def test_the_agent_on_a_real_h200_through_nvidia_smi_reads_what_nvml_reads() -> None:
    """Recorded on a lent NVIDIA H200 (driver 580.159.04): the agent as the scheduler sends it, with NVML made
    unavailable, so through the real nvidia-smi. The same deeper readings as golden/probes/h200-nvml.json."""
    report = parse_report((GOLDEN_PROBES / "h200-smi-agent.json").read_text())
    nvml = parse_report((GOLDEN_PROBES / "h200-nvml.json").read_text())
    assert report.facts.gpu_source == "nvidia-smi"
    fields = ("name", "pcie_width", "pcie_width_max", "pcie_gen", "pcie_gen_max", "slowdown", "remapped_rows_pending")
    (smi,), (gpu,) = report.gpus, nvml.gpus
    assert [getattr(smi, f) for f in fields] == [getattr(gpu, f) for f in fields]
    assert statuses(report)["gpu-health"] == CheckStatus.PASS


def test_nvidia_smi_tells_a_narrow_link_and_a_slowdown_and_counts_retired_pages(tmp_path: Path) -> None:
    changes = {
        "pcie.link.width.current": "8",
        "clocks_throttle_reasons.hw_power_brake_slowdown": "Active",
        "retired_pages.single_bit_ecc.count": "2",
        "retired_pages.double_bit.count": "1",
    }
    env = agent_env(PYTHONPATH=str(tmp_path), PATH=str(recorded_smi(tmp_path, changes)))
    report, _ = run_agent({"checks": GPU_CHECKS}, env=env)
    (gpu,) = report.gpus
    assert (gpu.pcie_width, gpu.slowdown, gpu.retired_pages) == (8, ("hw_power_brake",), 3)
    assert statuses(report)["gpu-health"] == CheckStatus.WARN
    assert message(report, "gpu-health") == "GPU 0: PCIe link x8 of x16, slowed down by the hardware (hw_power_brake)"


def test_an_older_nvidia_smi_that_refuses_the_newer_fields_still_gives_the_gpus_and_their_link(tmp_path: Path) -> None:
    """A driver that knows no `remapped_rows.pending` refuses the whole deeper query: the GPUs are still read,
    and their PCIe link, asked alone."""
    env = agent_env(PYTHONPATH=str(tmp_path), PATH=str(recorded_smi(tmp_path, unknown=("remapped_rows.pending",))))
    report, _ = run_agent({"checks": GPU_CHECKS}, env=env)
    (gpu,) = report.gpus
    assert (gpu.name, gpu.memory_total_mib, gpu.pcie_width, gpu.pcie_gen_max) == ("NVIDIA H200", 143771, 16, 5)
    assert (gpu.slowdown, gpu.retired_pages) == (None, None)  # not read: not "none"
    assert statuses(report)["gpu-health"] == CheckStatus.PASS
    unknown = ("remapped_rows.pending", "pcie.link.gen.max")
    (tmp_path / "bin" / "nvidia-smi").unlink()
    (tmp_path / "bin").rmdir()
    env = agent_env(PYTHONPATH=str(tmp_path), PATH=str(recorded_smi(tmp_path, unknown=unknown)))
    report, _ = run_agent({"checks": GPU_CHECKS}, env=env)
    (gpu,) = report.gpus
    assert (gpu.name, gpu.pcie_width) == ("NVIDIA H200", None)  # neither deeper query answered: the GPU still is


@pytest.mark.parametrize(
    ("changes", "status", "said"),
    [
        ({}, CheckStatus.PASS, "1 GPUs healthy"),
        ({"pcie_width": 4, "pcie_width_max": 16}, CheckStatus.WARN, "GPU 0: PCIe link x4 of x16"),
        ({"pcie_gen": 1, "pcie_gen_max": 5}, CheckStatus.PASS, "1 GPUs healthy"),  # idle: by design
        ({"slowdown": ["hw_power_brake", "nonsense"]}, CheckStatus.WARN, "(hw_power_brake)"),
        ({"slowdown": "hw_slowdown"}, CheckStatus.PASS, "1 GPUs healthy"),  # not a list: not read
    ],
)
def test_a_simulated_gpu_carries_the_deeper_readings_too(
    tmp_path: Path, changes: dict[str, Any], status: CheckStatus, said: str
) -> None:
    sim = tmp_path / "gpus.json"
    gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "temperature": 40, "healthy": True, **changes}
    sim.write_text(json.dumps({"driver_version": "550.54.15", "gpus": [gpu]}))
    report, _ = run_agent({"checks": GPU_CHECKS}, env=agent_env(FTCONSOLE_SIM_GPUS=str(sim)))
    assert statuses(report)["gpu-health"] == status
    assert said in message(report, "gpu-health")


# --- disks --------------------------------------------------------------------------------------------------


def free_gb(path: str) -> float:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize / 1e9


DISKS = [
    # check, threshold key, path measured (None: the test's cache folder)
    ("disk-size root", "disk_root_gb", "/"),
    ("disk-size shm", "disk_shm_gb", "/dev/shm"),
    ("disk-size cache", "disk_cache_gb", None),
]
MARGIN_GB = 0.5  # room for other processes writing while the test runs


@pytest.mark.parametrize(("check", "key", "path"), DISKS)
@pytest.mark.parametrize(("offset", "status"), [(-MARGIN_GB, "pass"), (MARGIN_GB, "fail")])
def test_disk_threshold_edges(
    tmp_path: Path, check: str, key: str, path: str | None, offset: float, status: str
) -> None:
    measured = path or str(tmp_path)
    need = round(free_gb(measured) + offset, 3)
    report, _ = run_agent({"checks": [check], "cache_dir": str(tmp_path), "thresholds": {key: need}})
    (result,) = report.checks
    assert result.status == status, result.message
    assert result.unit == "GB"
    assert result.threshold == need
    assert isinstance(result.value, float) and abs(result.value - free_gb(measured)) < MARGIN_GB
    assert f"GB free on {measured}, need > " in result.message


def test_missing_cache_dir_is_skipped(tmp_path: Path) -> None:
    missing = tmp_path / "no-cache"
    report, _ = run_agent({"checks": ["disk-size cache"], "cache_dir": str(missing)})
    (result,) = report.checks
    assert result.status == CheckStatus.SKIP
    assert result.message == f"{missing} does not exist"


def test_cache_dir_expands_user(tmp_path: Path) -> None:
    env = agent_env(HOME=str(tmp_path))
    (tmp_path / "cache").mkdir()
    report, _ = run_agent({"checks": ["disk-size cache"], "cache_dir": "~/cache"}, env=env)
    assert f"free on {tmp_path / 'cache'}," in message(report, "disk-size cache")


# --- a fake node tree: InfiniBand, ulimit, memory, load, facts ----------------------------------------------


def fake_sysroot(
    root: Path,
    ports: dict[str, str] | None = None,
    meminfo_kb: tuple[int, int] = (32_000_000, 16_000_000),
    load1: float = 0.5,
) -> Path:
    """A node tree under root; ports maps "dev/port" to its state file's text."""
    for dev_port, state in (ports or {}).items():
        dev, port = dev_port.split("/")
        port_dir = root / "sys/class/infiniband" / dev / "ports" / port
        port_dir.mkdir(parents=True)
        (port_dir / "state").write_text(state + "\n")
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/sys/kernel/random/boot_id").write_text("0f1e2d3c-boot\n")
    total, available = meminfo_kb
    (root / "proc/meminfo").write_text(
        f"MemTotal:       {total} kB\nMemFree:        1000 kB\nMemAvailable:   {available} kB\n"
    )
    (root / "proc/loadavg").write_text(f"{load1:.2f} 0.40 0.30 1/123 4567\n")
    (root / "etc").mkdir()
    (root / "etc/os-release").write_text('NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n')
    (root / "dev/shm").mkdir(parents=True)
    return root


def test_facts_come_from_the_sysroot(tmp_path: Path) -> None:
    root = fake_sysroot(tmp_path, meminfo_kb=(32_000_000, 16_000_000), load1=1.25)
    report, _ = run_agent({"checks": [], "sysroot": str(root)})
    facts = report.facts
    assert (facts.boot_id, facts.os) == ("0f1e2d3c-boot", "Ubuntu 22.04.4 LTS")
    assert (facts.mem_total_mib, facts.mem_available_mib, facts.load1) == (31250, 15625, 1.25)
    assert facts.infiniband is False


def test_unreadable_facts_are_null(tmp_path: Path) -> None:
    report, _ = run_agent({"checks": ["memory", "load"], "sysroot": str(tmp_path)})
    facts = report.facts
    assert (facts.boot_id, facts.os, facts.mem_total_mib, facts.load1) == (None, None, None, None)
    assert statuses(report) == {"memory": "skip", "load": "skip"}


IB_CASES = [
    # id, ports, infiniband status, message text, ulimit status when limits are no concern
    pytest.param({"mlx5_0/1": "4: ACTIVE", "mlx5_1/1": "4: ACTIVE"}, "pass", "2 ports ACTIVE", "pass", id="active"),
    pytest.param(
        {"mlx5_0/1": "4: ACTIVE", "mlx5_1/1": "1: DOWN", "mlx5_1/2": "2: INIT"},
        "fail",
        "ports not ACTIVE: mlx5_1/1 DOWN, mlx5_1/2 INIT",
        "pass",
        id="down",
    ),
    pytest.param({}, "skip", "no InfiniBand device", "skip", id="no-infiniband"),
]


@pytest.mark.parametrize(("ports", "status", "text", "ulimit_status"), IB_CASES)
def test_infiniband_ports(tmp_path: Path, ports: dict[str, str], status: str, text: str, ulimit_status: str) -> None:
    root = fake_sysroot(tmp_path, ports=ports)
    no_limits = {key: -1 for key in ("ulimit_memlock_kb", "ulimit_nofile", "ulimit_stack_kb", "ulimit_nproc")}
    params = {"checks": ["ulimit", "infiniband"], "sysroot": str(root), "thresholds": no_limits}
    report, _ = run_agent(params)
    assert report.facts.infiniband is bool(ports)
    assert statuses(report) == {"ulimit": ulimit_status, "infiniband": status}
    assert message(report, "infiniband") == text
    if not ports:
        assert message(report, "ulimit") == "no InfiniBand device; not required"


def lower_nofile(soft: int) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_ulimit_below_threshold_fails_with_infiniband(tmp_path: Path) -> None:
    root = fake_sysroot(tmp_path, ports={"mlx5_0/1": "4: ACTIVE"})
    soft = min(1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    report, _ = run_agent({"checks": ["ulimit"], "sysroot": str(root)}, preexec_fn=lambda: lower_nofile(soft))
    (result,) = report.checks
    assert result.status == CheckStatus.FAIL
    assert f"open files {soft} (need > 1000000)" in result.message
    assert f"nofile={soft}" in str(result.value)
    assert result.threshold == "memlock>16000 nofile>1000000 stack>8000 nproc>1000000"


def test_ulimit_threshold_is_strictly_greater(tmp_path: Path) -> None:
    root = fake_sysroot(tmp_path, ports={"mlx5_0/1": "4: ACTIVE"})
    soft = min(1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    no_limits = {"ulimit_memlock_kb": -1, "ulimit_stack_kb": -1, "ulimit_nproc": -1}
    reports = [
        run_agent(
            {"checks": ["ulimit"], "sysroot": str(root), "thresholds": {**no_limits, "ulimit_nofile": need}},
            preexec_fn=lambda: lower_nofile(soft),
        )[0]
        for need in (soft - 1, soft)
    ]
    assert [r.checks[0].status for r in reports] == ["pass", "fail"]


CPUS = os.cpu_count() or 1

MEMORY_LOAD_CASES = [
    # id, (MemTotal, MemAvailable) kB, load1, expected statuses
    pytest.param((1_000_000, 500_000), 0.0, {"memory": "pass", "load": "pass"}, id="idle"),
    pytest.param((1_000_000, 40_000), 0.0, {"memory": "warn", "load": "pass"}, id="low-memory"),
    pytest.param((1_000_000, 500_000), CPUS * 3.0, {"memory": "pass", "load": "warn"}, id="overloaded"),
    pytest.param((1_000_000, 500_000), CPUS * 2.0, {"memory": "pass", "load": "pass"}, id="load-at-threshold"),
]


@pytest.mark.parametrize(("meminfo", "load1", "expected"), MEMORY_LOAD_CASES)
def test_memory_and_load(tmp_path: Path, meminfo: tuple[int, int], load1: float, expected: dict[str, str]) -> None:
    root = fake_sysroot(tmp_path, meminfo_kb=meminfo, load1=load1)
    report, _ = run_agent({"checks": ["memory", "load"], "sysroot": str(root)})
    assert statuses(report) == expected


# --- DNS ------------------------------------------------------------------------------------------------------

DNS_CASES = [
    # id, names, status, value, threshold, message text
    pytest.param(["localhost"], "pass", 1, 1, "all 1 names resolve", id="localhost"),
    pytest.param(["localhost", "localhost"], "pass", 1, 1, "all 1 names resolve", id="duplicates"),
    pytest.param(
        ["localhost", "nonexistent-host.invalid"],
        "fail",
        1,
        2,
        "did not resolve: nonexistent-host.invalid (",
        id="invalid-tld",
    ),
    pytest.param([], "skip", None, None, "no host names to resolve", id="no-names"),
]


@pytest.mark.parametrize(("names", "status", "value", "threshold", "text"), DNS_CASES)
def test_dns(names: list[str], status: str, value: int | None, threshold: int | None, text: str) -> None:
    report, _ = run_agent({"checks": ["dns"], "dns_names": names, "timeout": 3})
    (result,) = report.checks
    assert (result.status, result.value, result.threshold) == (status, value, threshold)
    assert text in result.message
    assert "localhost (" not in result.message


# --- selection, robustness, invocation ------------------------------------------------------------------------

FILTER_CASES = [
    pytest.param(None, ALL_CHECKS, id="default-all"),
    pytest.param(["load", "memory"], ("memory", "load"), id="fixed-order"),
    pytest.param(["dns", "no-such-check"], ("dns",), id="unknown-ignored"),
    pytest.param([], (), id="none"),
]


@pytest.mark.parametrize(("checks", "expected"), FILTER_CASES)
def test_checks_filter(checks: list[str] | None, expected: tuple[str, ...]) -> None:
    params = {} if checks is None else {"checks": checks}
    report, _ = run_agent(params)
    assert tuple(c.name for c in report.checks) == expected


CRASH_CASES = [
    pytest.param({"checks": ["disk-size cache", "load"], "cache_dir": 42}, "disk-size cache", id="cache-dir"),
    pytest.param({"checks": ["disk-size root", "load"], "thresholds": {"disk_root_gb": "big"}}, "disk-size root"),
]


@pytest.mark.parametrize(("params", "crashed"), CRASH_CASES)
def test_a_crashing_check_is_reported_not_raised(params: dict[str, Any], crashed: str) -> None:
    report, _ = run_agent(params)
    assert statuses(report)[crashed] == CheckStatus.FAIL
    assert message(report, crashed).startswith("check crashed: TypeError")
    assert statuses(report)["load"] in (CheckStatus.PASS, CheckStatus.WARN)


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(AGENT_PATH), *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=agent_env(),
    )


def test_plain_script_uses_defaults_or_argv() -> None:
    default = parse_report(run_script().stdout)
    assert [c.name for c in default.checks] == list(ALL_CHECKS)
    chosen = parse_report(run_script(json.dumps({"checks": ["load"]})).stdout)
    assert [c.name for c in chosen.checks] == ["load"]


def test_plain_script_rejects_bad_argv() -> None:
    done = run_script("{not json")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "not a JSON object" in done.stderr


# --- Python 3.8, standard library only ------------------------------------------------------------------------


def imported_modules(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, "relative import in the agent"
            names.add(node.module.split(".")[0])
    return names


def test_agent_is_python38_syntax() -> None:
    ast.parse(AGENT_SOURCE, feature_version=(3, 8))


def test_agent_imports_only_the_standard_library_and_pynvml() -> None:
    outside = imported_modules(AGENT_SOURCE) - set(sys.stdlib_module_names) - {"pynvml"}
    assert outside == set()
    assert "__future__" not in imported_modules(AGENT_SOURCE), "a prepended PARAMS line would break it"


def test_agent_runs_on_python38(tmp_path: Path) -> None:
    interpreter = python38()
    if interpreter is None:
        pytest.skip("no Python 3.8 interpreter on this machine")
    path = write_sim(tmp_path, sim(gpu(0), gpu(1, temperature=90)))
    env = agent_env(FTCONSOLE_SIM_GPUS=str(path))
    report, _ = run_agent({"dns_names": ["localhost"], "cache_dir": str(tmp_path)}, env=env, python=interpreter)
    assert report.facts.python is not None and report.facts.python.startswith("3.8.")
    assert [c.name for c in report.checks] == list(ALL_CHECKS)
    assert not any(c.message.startswith("check crashed") for c in report.checks)
    assert statuses(report)["gpu-temperature"] == CheckStatus.WARN


def test_nvlink_errors_are_a_rate_since_the_node_s_last_probe(tmp_path: Path) -> None:
    """The counters count from the driver's load: the agent keeps each probe's totals (per node, under the
    account's home) and warns on the rate since the last one, from nvlink_error_rate_warn on."""
    home = tmp_path / "home"
    kept = home / ".ftconsole" / "probe" / "nvlink-node01.json"  # one file per node: nodes may share the home
    env = agent_env(HOME=str(home))

    def probe(errors: int, boot: str = "b1", back: float = 10.0) -> ProbeReport:
        if kept.exists():  # the last probe was `back` seconds ago
            doc = json.loads(kept.read_text())
            doc["at"] -= back
            kept.write_text(json.dumps(doc))
        data = sim(gpu(0, uuid="GPU-a", nvlink_down=0, nvlink_errors=7), gpu(1, uuid="GPU-b", nvlink_down=0,
                   nvlink_errors=errors))  # fmt: skip
        data["boot_id"] = boot
        env["FTCONSOLE_SIM_GPUS"] = str(write_sim(tmp_path, data))
        report, _ = run_agent({"checks": ["nvlink"], "node": "node01"}, env=env)
        return report

    first = probe(100)
    assert statuses(first) == {"nvlink": CheckStatus.PASS} and first.gpus[1].nvlink_error_rate is None
    calm = probe(150)  # 50 errors in 10 s
    assert statuses(calm) == {"nvlink": CheckStatus.PASS}
    assert 50 / 30 < calm.gpus[1].nvlink_error_rate <= 5.0 and calm.gpus[0].nvlink_error_rate == 0  # 10 s and more
    storm = probe(150 + 20_000)  # 2,000 a second (the probe's own time on top of the 10 s: a little less)
    assert statuses(storm) == {"nvlink": CheckStatus.WARN}
    shown = message(storm, "nvlink")
    assert re.fullmatch(r"GPU 1: 1\d{3}(\.\d+)? NVLink errors/s since the last probe, warn at >= 100/s", shown), shown
    rebooted = probe(3, boot="b2")  # counting again from the driver's load: no rate
    assert statuses(rebooted) == {"nvlink": CheckStatus.PASS} and rebooted.gpus[1].nvlink_error_rate is None
    assert oct(kept.stat().st_mode & 0o777) == "0o600"


def test_the_labs_load_skips_what_only_holds_its_gpus(tmp_path: Path) -> None:
    """The lab's simulated load (`"load": "jobs"`): a process of the node that names a GPU loads it, unless it only
    holds it, as an allocation's holder (`sleep infinity`) does: an idle allocation reads idle, as on a real node."""
    idle = [gpu(0, utilization=0), gpu(1, utilization=0)]
    path = write_sim(tmp_path, {"driver_version": "550.54.15", "load": "jobs", "gpus": idle})
    env = agent_env(FTCONSOLE_SIM_GPUS=str(path))
    holder = subprocess.Popen(["sleep", "infinity"], env={**env, "CUDA_VISIBLE_DEVICES": "0"})
    worker = subprocess.Popen(["sleep", "60"], env={**env, "CUDA_VISIBLE_DEVICES": "1"})
    try:
        _, doc = run_agent({"checks": ["gpu-check"]}, env=env)
        util = {g["index"]: g["utilization"] for g in doc["gpus"]}
        assert util[0] == 0 and util[1] >= 48, util
    finally:
        for p in (holder, worker):
            p.kill()
            p.wait()
