"""`probes.results.parse_report` on hand-written agent output: tables of documents and what they parse to."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ftconsole.probes.results import (
    AgentOutputError,
    CheckResult,
    CheckStatus,
    GPUInfo,
    NodeFacts,
    ProbeReport,
    parse_document,
    parse_report,
)

FACTS: dict[str, Any] = {
    "hostname": "gpu-07",
    "boot_id": "0f1e2d3c",
    "os": "Ubuntu 22.04.4 LTS",
    "kernel": "5.15.0-105-generic",
    "cpus": 96,
    "mem_total_mib": 2063731,
    "mem_available_mib": 1900000,
    "load1": 3.5,
    "python": "3.10.12",
    "driver_version": "550.54.15",
    "gpu_source": "nvml",
    "infiniband": True,
}


def check(name: Any = "dns", status: str = "pass", **extra: Any) -> dict[str, Any]:
    return {"name": name, "status": status, "value": 1, "threshold": 1, "unit": "names", "message": "ok", **extra}


def document(**overrides: Any) -> dict[str, Any]:
    doc = {
        "agent": 1,
        "duration_s": 0.12,
        "facts": FACTS,
        "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "temperature": 61, "processes": [4242]}],
        "checks": [check()],
    }
    doc.update(overrides)
    return doc


def line(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"))


# --- where the document is in the output ------------------------------------------------------------------------

OUTPUT_CASES = [
    pytest.param(line(document()), id="alone"),
    pytest.param(line(document()) + "\n", id="trailing-newline"),
    pytest.param("Welcome to Ubuntu 22.04.4 LTS\nLast login: Mon from 10.0.0.1\n" + line(document()), id="motd"),
    pytest.param("  {indented, not the document}\n" + line(document()) + "\nlogout\n", id="noise-after"),
    pytest.param(line(document(agent=1, duration_s=9.9)) + "\n" + line(document()), id="last-document-wins"),
]


@pytest.mark.parametrize("output", OUTPUT_CASES)
def test_document_found_among_noise(output: str) -> None:
    report = parse_report(output)
    assert report.facts == NodeFacts(**FACTS)
    assert report.duration_s == 0.12
    assert report.gpus == (GPUInfo(index=0, name="NVIDIA H100 80GB HBM3", temperature=61, processes=(4242,)),)
    assert report.checks == (CheckResult("dns", CheckStatus.PASS, 1, 1, "names", "ok"),)


ERROR_CASES = [
    # id, agent output, text the error message contains
    pytest.param("", "no JSON document; output was: (nothing)", id="empty"),
    pytest.param("bash: python3: command not found\n", "python3: command not found", id="no-python"),
    pytest.param("[1, 2, 3]", "no JSON document", id="json-list"),
    pytest.param('{"agent": 1, "facts": ', "invalid JSON", id="truncated"),
    pytest.param(line(document(agent=2)), "unknown agent protocol 2 (expected 1)", id="newer-protocol"),
    pytest.param(line(document(agent="1")), "unknown agent protocol '1'", id="protocol-as-string"),
    pytest.param(line({"facts": FACTS}), "unknown agent protocol None", id="not-the-agent"),
]


@pytest.mark.parametrize(("output", "text"), ERROR_CASES)
def test_not_an_agent_document(output: str, text: str) -> None:
    with pytest.raises(AgentOutputError) as raised:
        parse_report(output)
    assert text in str(raised.value)
    assert raised.value.title == "probe output"


# --- missing keys and wrong types read as "not available" -------------------------------------------------------

FACTS_CASES = [
    # id, facts in the document, facts parsed
    pytest.param({}, NodeFacts(), id="empty"),
    pytest.param({"hostname": "n1", "cpus": 8}, NodeFacts(hostname="n1", cpus=8), id="partial"),
    pytest.param(
        {"hostname": 5, "cpus": "8", "load1": True, "infiniband": "yes", "os": None, "mem_total_mib": [1]},
        NodeFacts(),
        id="wrong-types",
    ),
    pytest.param(
        {"cpus": 8.0, "load1": 2, "mem_total_mib": 1024.9},
        NodeFacts(cpus=8, load1=2, mem_total_mib=1024),
        id="numbers-coerced",
    ),
    pytest.param("not a dict", NodeFacts(), id="facts-not-a-dict"),
]


@pytest.mark.parametrize(("facts", "expected"), FACTS_CASES)
def test_facts(facts: Any, expected: NodeFacts) -> None:
    assert parse_document(document(facts=facts)).facts == expected


def test_missing_sections() -> None:
    report = parse_document({"agent": 1})
    assert report == ProbeReport(facts=NodeFacts(), gpus=(), checks=(), duration_s=None)


GPU_CASES = [
    # id, gpus in the document, gpus parsed
    pytest.param([], (), id="none"),
    pytest.param(None, (), id="null"),
    pytest.param([{}, {}], (GPUInfo(index=0), GPUInfo(index=1)), id="index-from-position"),
    pytest.param(["gpu0", {"index": 3}], (GPUInfo(index=3),), id="non-dict-skipped"),
    pytest.param(
        [{"index": 0, "temperature": "hot", "healthy": "yes", "ecc_uncorrectable": 1.0, "nvlink_down": True}],
        (GPUInfo(index=0, ecc_uncorrectable=1),),
        id="wrong-types",
    ),
    pytest.param([{"index": 0, "processes": [1, "2", True, 3.0, 4]}], (GPUInfo(index=0, processes=(1, 4)),), id="pids"),
    pytest.param(
        [{"index": 1, "retired_pages_pending": False, "remapped_rows_pending": True, "utilization": 97.5}],
        (GPUInfo(index=1, retired_pages_pending=False, remapped_rows_pending=True, utilization=97.5),),
        id="flags",
    ),
]


@pytest.mark.parametrize(("gpus", "expected"), GPU_CASES)
def test_gpus(gpus: Any, expected: tuple[GPUInfo, ...]) -> None:
    assert parse_document(document(gpus=gpus)).gpus == expected


CHECK_CASES = [
    # id, checks in the document, checks parsed
    pytest.param([check()], (CheckResult("dns", CheckStatus.PASS, 1, 1, "names", "ok"),), id="plain"),
    pytest.param(
        [{"name": "load"}],
        (CheckResult("load", CheckStatus.FAIL, message=("agent reported unknown status None: ")),),
        id="no-status",
    ),
    pytest.param(
        [check(status="broken", message="boom")],
        (CheckResult("dns", CheckStatus.FAIL, 1, 1, "names", "agent reported unknown status 'broken': boom"),),
        id="unknown-status",
    ),
    pytest.param([check(name=None), "dns", check(name=7)], (), id="no-name-skipped"),
    pytest.param(
        [check(value=True, threshold=[1], unit=None, message=3)],
        (CheckResult("dns", CheckStatus.PASS, "true", None, "", ""),),
        id="wrong-types",
    ),
    pytest.param(
        [check(name="ulimit", status="skip", value="nofile=1024", threshold="nofile>1000000")],
        (CheckResult("ulimit", CheckStatus.SKIP, "nofile=1024", "nofile>1000000", "names", "ok"),),
        id="string-values",
    ),
]


@pytest.mark.parametrize(("checks", "expected"), CHECK_CASES)
def test_checks(checks: Any, expected: tuple[CheckResult, ...]) -> None:
    assert parse_document(document(checks=checks)).checks == expected


# --- the report ---------------------------------------------------------------------------------------------------

WORST_CASES = [
    pytest.param([], CheckStatus.PASS, id="no-checks"),
    pytest.param(["skip", "skip"], CheckStatus.PASS, id="all-skipped"),
    pytest.param(["pass", "skip"], CheckStatus.PASS, id="pass"),
    pytest.param(["skip", "warn", "pass"], CheckStatus.WARN, id="warn"),
    pytest.param(["warn", "fail", "pass"], CheckStatus.FAIL, id="fail"),
    pytest.param(["fail", "warn"], CheckStatus.FAIL, id="fail-first"),
    pytest.param(["pass", "nonsense"], CheckStatus.FAIL, id="unknown-status-is-fail"),
]


@pytest.mark.parametrize(("statuses", "worst"), WORST_CASES)
def test_worst(statuses: list[str], worst: CheckStatus) -> None:
    checks = [check(name=f"c{i}", status=s) for i, s in enumerate(statuses)]
    assert parse_document(document(checks=checks)).worst == worst


def test_check_lookup() -> None:
    report = parse_document(document(checks=[check("dns"), check("load", "warn")]))
    found = report.check("load")
    assert found is not None and found.status == CheckStatus.WARN
    assert report.check("nvlink") is None


def test_to_json_round_trips() -> None:
    report = parse_report(line(document()))
    again = parse_document({"agent": 1, **report.to_json()})
    assert again == report
