"""The probe agent's bundle: agent.py and its node-side modules (agent_*.py) joined into the one script a node
runs, checked as the supervisor's is (test_supervisor_bundle.py)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ftconsole.probes.results import ALL_CHECKS, parse_report
from ftconsole.scheduler.node.bundle import FOLDER, MARK, bundle, modules
from ftconsole.scheduler.ssh.probing import agent_script, agent_source
from tests.unit.test_agent import agent_env, imported_modules, python38

PROBES = FOLDER
PACKAGE = "ftconsole.scheduler.node"
NODE_MODULES = modules(PROBES, "agent", PACKAGE)


def source(name: str) -> str:
    return (PROBES / f"{name}.py").read_text(encoding="utf-8")


def test_the_bundle_holds_every_agent_module_in_dependency_order() -> None:
    assert NODE_MODULES[-1] == "agent"
    assert sorted(NODE_MODULES) == sorted([*(p.stem for p in PROBES.glob("agent*.py")), "proc"])
    assert NODE_MODULES.index("agent_common") < min(
        NODE_MODULES.index("agent_gpus"), NODE_MODULES.index("agent_runtimes")
    )
    assert agent_source() == bundle(PROBES, "agent", PACKAGE)
    assert agent_source() is agent_source()  # built once


def test_the_bundle_compiles_without_marked_imports_and_as_python38() -> None:
    script = agent_source()
    compile(script, "agent bundle", "exec")
    ast.parse(script, feature_version=(3, 8))
    assert not [line for line in script.splitlines() if line.rstrip().endswith(MARK)]
    assert "ftconsole" not in imported_modules(script)
    assert imported_modules(script) - set(sys.stdlib_module_names) <= {"pynvml"}


@pytest.mark.parametrize("name", NODE_MODULES)
def test_an_agent_module_imports_only_the_stdlib_and_bundled_modules(name: str) -> None:
    text = source(name)
    ast.parse(text, feature_version=(3, 8))
    assert "__future__" not in imported_modules(text), "a prepended PARAMS line would break it"
    assert imported_modules(text) - set(sys.stdlib_module_names) <= {"ftconsole", "pynvml"}
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            assert not [a.name for a in node.names if a.name.startswith("ftconsole")], f"{name}:{node.lineno}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ftconsole"):
            assert node.module in {f"{PACKAGE}.{m}" for m in NODE_MODULES if m != name}, node.module
            assert node.col_offset == 0 and MARK in lines[node.lineno - 1], f"{name}:{node.lineno}: not marked"


def test_the_bundled_modules_define_each_name_once() -> None:
    """The bundle is one namespace: a name defined at the top of two modules would be the later one's in all."""
    where: dict[str, str] = {}
    for name in NODE_MODULES:
        for node in ast.parse(source(name)).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                defined = [node.name]
            elif isinstance(node, ast.Assign):
                defined = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                defined = [node.target.id]
            else:
                continue
            for symbol in defined:
                assert symbol not in where, f"{symbol} in {where.get(symbol)} and {name}"
                where[symbol] = name


def test_the_bundle_runs_on_python38_and_prints_a_report(tmp_path: Path) -> None:
    """The script exactly as the console sends it (PARAMS line and bundle), under Python 3.8, outside the
    repository (nothing of ftconsole to import): one report, every check, runtimes found on its PATH."""
    python = python38()
    if python is None:
        pytest.skip("no Python 3.8 interpreter on this machine")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "enroot").write_text("#!/bin/sh\necho 3.4.1\n")
    (bin_dir / "enroot").chmod(0o755)
    sim = tmp_path / "gpus.json"
    sim.write_text(json.dumps({"driver_version": "550.54.15", "gpus": [{"index": 0, "name": "H100", "healthy": True}]}))
    env = agent_env(PATH=str(bin_dir), FTCONSOLE_SIM_GPUS=str(sim))
    script = agent_script({"cache_dir": str(tmp_path), "sysroot": str(tmp_path)})
    done = subprocess.run([python, "-"], input=script, capture_output=True, text=True, timeout=30, env=env,
                          cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1
    report = parse_report(done.stdout)
    assert report.facts.python is not None and report.facts.python.startswith("3.8.")
    assert [c.name for c in report.checks] == list(ALL_CHECKS)
    assert not any(c.message.startswith("check crashed") for c in report.checks)
    assert report.facts.gpu_source == "sim" and len(report.gpus) == 1
    assert [(r.name, r.version, r.usable) for r in report.facts.runtimes] == [("enroot", "3.4.1", True)]
