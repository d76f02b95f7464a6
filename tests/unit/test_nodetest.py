"""The node tests' node side (scheduler/node/nodetest.py): its reading of `dcgmi diag -j` on the recorded documents
of tests/unit/golden/dcgm/ (their README says where each shape comes from), and the script run for real, as a
node runs it: `python3 -` fed the bundle with PARAMS prepended, GPUs from a simulated file or a fake `dcgmi` on
PATH."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.node import nodetest
from ftconsole.scheduler.node.bundle import FOLDER, modules, python_stdin_script, script
from ftconsole.scheduler.node.nodetest import dcgmi_verdict, parse_dcgmi_diag
from tests.pythons import python38

GOLDEN = Path(__file__).parent / "golden" / "dcgm"
RUN_TIMEOUT_S = 60  # the bound on every run of the script; each test's own expectations are far below it
MEMORY_MISMATCH_1 = "A memory mismatch was detected on GPU 1, but no error was reported by CUDA or NVML."
MEMORY_MISMATCH_3 = "A memory mismatch was detected on GPU 3, but no error was reported by CUDA or NVML."
CONNECTION_ERROR = "Error: unable to establish a connection to the specified host: localhost"


def golden(name: str) -> Any:
    return json.loads((GOLDEN / name).read_text(encoding="utf-8"))


# -- reading dcgmi diag -j ---------------------------------------------------------------------------------------

GOLDEN_VERDICTS = {
    "dcgm2_fail_diagnostic_r3.json": (
        "fail",
        [
            "GPU 1: Diagnostic: CUDA APIs have indicated that a double-bit ECC error has occured on GPU 1.",
        ],
        [0, 1],
        12,
    ),
    "dcgm3_pass_r2.json": ("pass", [], [0, 1], 11),
    "dcgm3_fail_memory_r2.json": ("fail", [f"GPU 1: GPU Memory: {MEMORY_MISMATCH_1}"], [0, 1, 2, 3], 11),
    "dcgm3_fail_deployment_r1.json": (
        "fail",
        ["GPU 2: Page Retirement/Row Remap: GPU 2 had uncorrectable memory errors and row remapping failed."],
        [0, 1, 2, 3],
        9,
    ),
    "dcgm4_pass_r2.json": ("pass", [], [0, 1, 2, 3], 3),
    "dcgm4_fail_memory_r2.json": ("fail", [f"GPU 3: memory: {MEMORY_MISMATCH_3}"], [0, 1, 2, 3], 3),
    "dcgm4_runtime_error.json": ("error", [], [], 0),
}


def test_every_recorded_document_has_its_expected_verdict() -> None:
    assert sorted(p.name for p in GOLDEN.glob("*.json")) == sorted(GOLDEN_VERDICTS)


@pytest.mark.parametrize("name", sorted(GOLDEN_VERDICTS))
def test_a_recorded_document_reads_as_expected(name: str) -> None:
    result, failures, gpus, tests = GOLDEN_VERDICTS[name]
    parsed = parse_dcgmi_diag(golden(name))
    assert (parsed["result"], parsed["failures"], parsed["gpus"], parsed["tests"]) == (result, failures, gpus, tests)
    assert parsed["warnings"] == []
    assert (parsed["error"] is not None) == (result == "error")


def test_the_summary_names_the_command_and_what_it_found() -> None:
    passed = dcgmi_verdict(golden("dcgm4_pass_r2.json"), 2, 0)
    assert (passed["result"], passed["summary"]) == ("pass", "dcgmi diag -r 2: 4 GPUs, 3 tests pass")
    failed = dcgmi_verdict(golden("dcgm3_fail_memory_r2.json"), 2, 226)
    assert failed["result"] == "fail"
    assert failed["summary"] == f"dcgmi diag -r 2: 1 failure: GPU 1: GPU Memory: {MEMORY_MISMATCH_1}"
    assert failed["tool"] == "dcgmi"
    error = dcgmi_verdict(golden("dcgm4_runtime_error.json"), 1, 226)
    assert error["result"] == "error"
    assert error["summary"] == "dcgmi diag -r 1: Error: Diagnostic could not be run while DCGM is paused."


def test_the_same_runtime_error_reads_the_same_in_the_3x_shape() -> None:
    doc = {"DCGM GPU Diagnostic": {"version": "3.3.9", "runtime_error": "Error: requested test(s) were not found"}}
    parsed = parse_dcgmi_diag(doc)
    assert (parsed["result"], parsed["error"]) == ("error", "Error: requested test(s) were not found")


def v4(*tests: dict[str, Any]) -> dict[str, Any]:
    """A DCGM 4.x document of one category holding `tests`."""
    return {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": list(tests)}]}}


def gpu(entity: int, status: str, warning: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": entity, "status": status}
    if warning is not None:
        result["warnings"] = [{"warning": warning, "error_id": 1, "error_category": 0, "error_severity": 1}]
    return result


def test_an_error_of_the_test_alone_fails_it_for_all_gpus() -> None:
    """DCGM 4.x: the test summary holds the errors of no entity; its failure counts when no result has it."""
    summary = {"status": "Fail", "warnings": [{"warning": "Unable to add field watches to DCGM: timeout"}]}
    parsed = parse_dcgmi_diag(v4({"name": "diagnostic", "results": [gpu(0, "Pass")], "test_summary": summary}))
    assert parsed["result"] == "fail"
    assert parsed["failures"] == ["all GPUs: diagnostic: Unable to add field watches to DCGM: timeout"]


def test_a_warning_warns_and_an_unknown_status_never_passes_silently() -> None:
    warned = parse_dcgmi_diag(v4({"name": "pcie", "results": [gpu(0, "Pass"), gpu(1, "Warn", "slow link")]}))
    assert (warned["result"], warned["warnings"]) == ("warn", ["GPU 1: pcie: slow link"])
    odd = parse_dcgmi_diag(v4({"name": "pcie", "results": [gpu(0, "Pass"), gpu(1, "Inconclusive")]}))
    assert (odd["result"], odd["warnings"]) == ("warn", ["GPU 1: pcie: unknown status 'Inconclusive'"])
    missing = parse_dcgmi_diag(v4({"name": "pcie", "results": [{"entity_group": "GPU", "entity_id": 0}]}))
    assert missing["result"] == "warn"


def test_all_skipped_is_a_skip_and_some_skipped_is_a_pass() -> None:
    skipped = parse_dcgmi_diag(v4({"name": "memory", "results": [gpu(0, "Skip", "ECC is off"), gpu(1, "SKIP")]}))
    assert skipped["result"] == "skip"
    summary = dcgmi_verdict(v4({"name": "memory", "results": [gpu(0, "Skip", "ECC is off")]}), 1, 0)["summary"]
    assert summary == "dcgmi diag -r 1: every test was skipped: GPU 0: memory: ECC is off"
    some = parse_dcgmi_diag(v4({"name": "memory", "results": [gpu(0, "Skip"), gpu(1, "PASS")]}))
    assert some["result"] == "pass"


def test_a_result_for_several_or_no_gpus_is_named_so() -> None:
    doc = {
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {
                    "category": "Deployment",
                    "tests": [
                        {"name": "Inforom", "results": [{"status": "Fail", "warnings": [{"warning": "corrupt"}]}]},
                        {"name": "Denylist", "results": [{"gpu_ids": "0,1", "status": "FAIL", "warnings": ["x"]}]},
                        {"name": "NVML Library", "results": [None, {"gpu_id": "1", "status": "Pass"}]},
                    ],
                }
            ]
        }
    }
    parsed = parse_dcgmi_diag(doc)
    assert parsed["failures"] == ["all GPUs: Inforom: corrupt", "GPUs 0,1: Denylist: x"]
    assert parsed["gpus"] == [0, 1]


def test_passing_tests_with_a_failing_exit_status_warn() -> None:
    verdict = dcgmi_verdict(golden("dcgm4_pass_r2.json"), 2, 1)
    assert verdict["result"] == "warn"
    assert verdict["warnings"] == ["dcgmi exited with status 1 although every test passed"]


@pytest.mark.parametrize("doc", [[], {"something": 1}, {"DCGM Diagnostic": {"test_categories": []}}])
def test_a_document_without_results_is_an_error(doc: Any) -> None:
    assert parse_dcgmi_diag(doc)["result"] == "error"


def test_text_from_the_node_is_one_clean_bounded_line_and_the_lists_are_bounded() -> None:
    results = [gpu(n, "Fail", "bad\x1b[31m\tmemory\n" + "x" * 400) for n in range(40)]
    verdict = dcgmi_verdict(v4({"name": "memory", "results": results}), 1, 226)
    assert verdict["result"] == "fail"
    assert len(verdict["failures"]) == 32
    assert verdict["failures"][-1] == "... and 9 more failures"
    first = verdict["failures"][0]
    assert first.startswith("GPU 0: memory: bad[31m memory xxx") and first.endswith("...")
    assert len(first) == 300
    for text in [verdict["summary"], *verdict["failures"]]:
        assert len(text) <= 300
        assert not any(ord(ch) < 32 or ord(ch) == 127 for ch in text)


# -- the script, run as a node runs it ---------------------------------------------------------------------------


def sim_file(tmp_path: Path, gpus: int = 4, diag_seconds: float | None = None, **faults: str) -> Path:
    """A simulated-GPU file of `gpus` GPUs; `faults`: "gpu1": "Memory: ..." gives GPU 1 that diag_fault."""
    doc: dict[str, Any] = {"driver_version": "550.54.15", "gpus": []}
    for index in range(gpus):
        entry: dict[str, Any] = {"index": index, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}
        entry.update({"utilization": 0, "temperature": 40, "ecc_uncorrectable": 0, "healthy": True})
        if f"gpu{index}" in faults:
            entry["diag_fault"] = faults[f"gpu{index}"]
        doc["gpus"].append(entry)
    if diag_seconds is not None:
        doc["diag_seconds"] = diag_seconds
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def node_env(path: str, **extra: str) -> dict[str, str]:
    """The environment of the node's session: PATH as given, no simulated GPUs unless `extra` names them."""
    env = {k: v for k, v in os.environ.items() if k not in ("FTCONSOLE_SIM_GPUS", "PYTHONPATH")}
    env["PATH"] = path
    env.update(extra)
    return env


def fake_dcgmi(tmp_path: Path, body: str) -> str:
    """A folder holding an executable `dcgmi` shell script running `body`; returns the PATH to use."""
    folder = tmp_path / "bin"
    folder.mkdir()
    fake = folder / "dcgmi"
    fake.write_text("#!/bin/sh\n" + body, encoding="utf-8")
    fake.chmod(0o755)
    return f"{folder}:/usr/bin:/bin"


def run_script(
    params: dict[str, Any], env: dict[str, str], python: str = sys.executable
) -> tuple[dict[str, Any], float]:
    """The script's one document and the seconds it took, run as the scheduler runs it."""
    source = python_stdin_script(script("nodetest"), params)
    started = time.monotonic()
    done = subprocess.run(
        [python, "-"], input=source, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, cwd="/"
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    document = json.loads(lines[0])
    assert document["nodetest"] == 1
    return document, took


def only(document: dict[str, Any]) -> dict[str, Any]:
    [result] = document["results"]
    assert list(result) == ["test", "level", "result", "summary", "failures", "warnings", "tool", "took_s"]
    return result


def gpu_params(level: int = 1, timeout: float = 600) -> dict[str, Any]:
    return {"tests": {"gpu": {"level": level, "timeout": timeout}}}


def test_the_bundle_is_one_python38_script_of_the_stdlib() -> None:
    text = script("nodetest")
    assert modules(FOLDER, "nodetest") == ["agent_common", "nodetest"]
    tree = ast.parse(text, feature_version=(3, 8))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= set(sys.stdlib_module_names)
    assert "# bundled" not in text


def test_a_simulated_gpu_with_a_diag_fault_fails(tmp_path: Path) -> None:
    path = sim_file(tmp_path, gpu1="Memory: a memory mismatch under load")
    result = only(run_script(gpu_params(), node_env("/usr/bin:/bin", FTCONSOLE_SIM_GPUS=str(path)))[0])
    assert (result["test"], result["level"], result["result"], result["tool"]) == ("gpu", 1, "fail", "simulated")
    assert result["failures"] == ["GPU 1: Memory: a memory mismatch under load"]
    assert result["summary"] == "simulated diagnostics level 1: 1 failure: GPU 1: Memory: a memory mismatch under load"


def test_simulated_gpus_without_a_fault_pass(tmp_path: Path) -> None:
    path = sim_file(tmp_path, diag_seconds=0.2)
    result = only(run_script(gpu_params(level=3), node_env("/usr/bin:/bin", FTCONSOLE_SIM_GPUS=str(path)))[0])
    assert (result["result"], result["failures"], result["warnings"]) == ("pass", [], [])
    assert result["summary"] == "simulated diagnostics level 3: 4 GPUs pass"
    assert result["took_s"] >= 0.2


def test_a_simulated_test_past_its_timeout_is_an_error_at_the_timeout(tmp_path: Path) -> None:
    path = sim_file(tmp_path, diag_seconds=300)
    document, took = run_script(gpu_params(timeout=1), node_env("/usr/bin:/bin", FTCONSOLE_SIM_GPUS=str(path)))
    result = only(document)
    assert (result["result"], result["summary"]) == ("error", "simulated diagnostics level 1 ran past 1s")
    assert took < 30


def test_an_unreadable_simulated_file_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    result = only(run_script(gpu_params(), node_env("/usr/bin:/bin", FTCONSOLE_SIM_GPUS=str(missing)))[0])
    assert result["result"] == "error"
    assert result["summary"].startswith(f"cannot read simulated GPU file {missing}: ")


def test_a_failing_dcgmi_is_read_from_its_json_whatever_its_exit_status(tmp_path: Path) -> None:
    recorded = GOLDEN / "dcgm3_fail_memory_r2.json"
    body = f"echo 'dcgmi: starting' >&2\necho 'preamble'\ncat '{recorded}'\necho 'trailer'\nexit 226\n"
    result = only(run_script(gpu_params(level=2), node_env(fake_dcgmi(tmp_path, body)))[0])
    assert (result["result"], result["tool"], result["level"]) == ("fail", "dcgmi", 2)
    assert result["failures"] == [f"GPU 1: GPU Memory: {MEMORY_MISMATCH_1}"]
    assert result["summary"].startswith("dcgmi diag -r 2: 1 failure: GPU 1: GPU Memory: ")


def test_dcgmi_is_asked_for_the_level_in_json(tmp_path: Path) -> None:
    recorded = GOLDEN / "dcgm4_pass_r2.json"
    body = f"echo \"$@\" > '{tmp_path}/argv'\ncat '{recorded}'\n"
    result = only(run_script(gpu_params(level=4), node_env(fake_dcgmi(tmp_path, body)))[0])
    assert (result["result"], result["summary"]) == ("pass", "dcgmi diag -r 4: 4 GPUs, 3 tests pass")
    assert (tmp_path / "argv").read_text().split() == ["diag", "-r", "4", "-j"]


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, killed but not yet reaped by whoever adopted it, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_gone(pids: list[int], seconds: float = 5.0) -> list[int]:
    """The pids of `pids` still running after at most `seconds`."""
    end = time.monotonic() + seconds
    while any(alive(pid) for pid in pids) and time.monotonic() < end:
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def test_a_dcgmi_past_its_timeout_is_stopped_with_all_it_started(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    body = f"sleep 60 &\necho $! > '{pids}'\necho $$ >> '{pids}'\nwait\n"
    document, took = run_script(gpu_params(timeout=1), node_env(fake_dcgmi(tmp_path, body)))
    result = only(document)
    assert (result["result"], result["tool"]) == ("error", "dcgmi")
    assert result["summary"] == "dcgmi diag -r 1 ran past 1s"
    assert took < 10
    started = [int(line) for line in pids.read_text().split()]
    assert len(started) == 2
    assert wait_gone(started) == []


def test_a_dcgmi_that_ignores_sigterm_is_killed_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = tmp_path / "pids"
    body = f"trap '' TERM\nsleep 60 &\necho $! > '{pids}'\necho $$ >> '{pids}'\nwait\n"
    fake_dcgmi(tmp_path, body)
    monkeypatch.setattr(nodetest, "STOP_GRACE_S", 0.5)
    started_at = time.monotonic()
    verdict = nodetest.run_dcgmi_diag(str(tmp_path / "bin" / "dcgmi"), 1, 0.5)
    assert time.monotonic() - started_at < 10
    assert (verdict["result"], verdict["summary"]) == ("error", "dcgmi diag -r 1 ran past 0.5s")
    started = [int(line) for line in pids.read_text().split()]
    assert wait_gone(started) == []


def test_a_dcgmi_without_its_host_engine_is_an_error_naming_it(tmp_path: Path) -> None:
    body = f"echo '{CONNECTION_ERROR}'\nexit 255\n"
    result = only(run_script(gpu_params(), node_env(fake_dcgmi(tmp_path, body)))[0])
    assert (result["result"], result["tool"]) == ("error", "dcgmi")
    assert CONNECTION_ERROR in result["summary"]
    assert "nv-hostengine" in result["summary"]


def test_a_dcgmi_printing_no_json_is_an_error_with_its_first_line(tmp_path: Path) -> None:
    body = "echo '' >&2\necho 'libdcgm.so.4: cannot open shared object file' >&2\nexit 127\n"
    result = only(run_script(gpu_params(), node_env(fake_dcgmi(tmp_path, body)))[0])
    assert result["result"] == "error"
    assert result["summary"] == (
        "dcgmi diag -r 1 printed no result (exit status 127): libdcgm.so.4: cannot open shared object file"
    )


def test_no_dcgmi_and_no_simulated_gpus_is_a_skip(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = only(run_script(gpu_params(), node_env(str(empty)))[0])
    assert (result["result"], result["tool"], result["failures"]) == ("skip", None, [])
    assert result["summary"] == (
        "no dcgmi on this node (DCGM is not installed): only NVML's readings at rest are checked"
    )


def test_an_unknown_test_or_wrong_options_are_errors_and_the_rest_still_runs(tmp_path: Path) -> None:
    path = sim_file(tmp_path)
    params = {"tests": {"burn": {}, "gpu": {"level": 2}}}
    document, _ = run_script(params, node_env("/usr/bin:/bin", FTCONSOLE_SIM_GPUS=str(path)))
    burn, gpu_result = document["results"]
    assert (burn["test"], burn["result"], burn["level"]) == ("burn", "error", None)
    assert "'burn'" in burn["summary"]
    assert (gpu_result["test"], gpu_result["result"]) == ("gpu", "pass")
    for options, word in (({"level": 5}, "level"), ({"level": 1, "timeout": "soon"}, "timeout"), ([], "object")):
        result = only(run_script({"tests": {"gpu": options}}, node_env("/usr/bin:/bin"))[0])
        assert result["result"] == "error" and word in result["summary"], result


def test_the_defaults_run_the_gpu_test_at_level_1(tmp_path: Path) -> None:
    path = sim_file(tmp_path, gpus=2)
    result = only(run_script({}, node_env("/usr/bin:/bin", FTCONSOLE_SIM_GPUS=str(path)))[0])
    assert (result["test"], result["level"], result["result"]) == ("gpu", 1, "pass")


def test_a_plain_script_takes_its_params_from_argv(tmp_path: Path) -> None:
    path = sim_file(tmp_path, gpu0="Memory: bad")
    done = subprocess.run(
        [sys.executable, str(Path(nodetest.__file__)), json.dumps(gpu_params(level=2))],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=node_env(os.environ.get("PATH", "/usr/bin:/bin"), FTCONSOLE_SIM_GPUS=str(path)),
    )
    assert done.returncode == 0, done.stderr
    result = only(json.loads(done.stdout))
    assert (result["level"], result["result"], result["failures"]) == (2, "fail", ["GPU 0: Memory: bad"])


def test_the_script_runs_on_python38(tmp_path: Path) -> None:
    interpreter = python38()
    if interpreter is None:
        pytest.skip("no Python 3.8 interpreter on this machine")
    path = sim_file(tmp_path, gpu1="Memory: bad")
    result = only(run_script(gpu_params(), node_env("/usr/bin:/bin", FTCONSOLE_SIM_GPUS=str(path)), interpreter)[0])
    assert (result["result"], result["failures"]) == ("fail", ["GPU 1: Memory: bad"])
    recorded = GOLDEN / "dcgm4_fail_memory_r2.json"
    (tmp_path / "dcgm").mkdir()
    dcgm_path = fake_dcgmi(tmp_path / "dcgm", f"cat '{recorded}'\nexit 226\n")
    result = only(run_script(gpu_params(level=2), node_env(dcgm_path), interpreter)[0])
    assert (result["result"], result["failures"]) == ("fail", [f"GPU 3: memory: {MEMORY_MISMATCH_3}"])
