"""The run supervisor's bundle: supervisor.py and its node-side modules joined into the one script a node runs."""

from __future__ import annotations

import ast
import builtins
import dis
import sys
import types
from pathlib import Path

import pytest

from ftconsole.scheduler.node.bundle import FOLDER, MARK, BundleError, bundle, modules, strip
from ftconsole.scheduler.ssh import runs
from tests.unit.test_agent import imported_modules

SCHEDULER = FOLDER
NODE_MODULES = modules(SCHEDULER, "supervisor")


def source(name: str) -> str:
    return (SCHEDULER / f"{name}.py").read_text(encoding="utf-8")


def test_the_bundle_holds_every_supervisor_module_in_dependency_order() -> None:
    assert NODE_MODULES[-1] == "supervisor"
    assert sorted(NODE_MODULES) == sorted(
        [*(p.stem for p in SCHEDULER.glob("supervisor*.py")), "proc", "channel", "kernel_log"]
    )
    for at, name in enumerate(NODE_MODULES):
        tree = ast.parse(source(name))
        imported = {n.module.rsplit(".", 1)[1] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module
                    and n.module.startswith("ftconsole.")}  # fmt: skip
        assert imported <= set(NODE_MODULES[:at]), name
    assert runs.supervisor_source() == bundle(SCHEDULER, "supervisor")
    assert runs.supervisor_source() is runs.supervisor_source()  # built once


def test_the_bundle_compiles_without_marked_imports_and_as_python38() -> None:
    script = runs.supervisor_source()
    compile(script, "supervisor bundle", "exec")
    ast.parse(script, feature_version=(3, 8))
    assert not [line for line in script.splitlines() if line.rstrip().endswith(MARK)]
    assert "ftconsole" not in imported_modules(script)
    assert imported_modules(script) <= set(sys.stdlib_module_names)


@pytest.mark.parametrize("name", NODE_MODULES)
def test_a_node_side_module_imports_only_the_stdlib_and_bundled_modules(name: str) -> None:
    text = source(name)
    ast.parse(text, feature_version=(3, 8))
    assert "__future__" not in imported_modules(text), "a prepended PARAMS line would break it"
    assert imported_modules(text) - set(sys.stdlib_module_names) <= {"ftconsole"}
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            assert not [a.name for a in node.names if a.name.startswith("ftconsole")], f"{name}:{node.lineno}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ftconsole"):
            assert node.module in {f"ftconsole.scheduler.node.{m}" for m in NODE_MODULES if m != name}, node.module
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
            else:
                continue
            for symbol in defined:
                assert symbol not in where, f"{symbol} in {where.get(symbol)} and {name}"
                where[symbol] = name


def _globals_used(code: types.CodeType) -> set[str]:
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _globals_used(const)
    return names


def test_the_bundle_defines_every_name_the_actions_use() -> None:
    namespace: dict[str, object] = {"__name__": "supervisor_bundle"}  # not __main__: main() does not run
    exec(compile(runs.supervisor_source(), "supervisor bundle", "exec"), namespace)
    actions = namespace["ACTIONS"]
    assert isinstance(actions, dict)
    assert set(actions) == {
        "start",
        "prepare",
        "status",
        "stop",
        "port",
        "account",
        "read",
        "files",
        "signal",
        "processes",
        "leftovers",
        "shells",
        "channel",
    }
    seen: set[str] = set()
    todo = [*actions.values(), namespace["main"]]
    while todo:
        function = todo.pop()
        assert isinstance(function, types.FunctionType)
        for used in _globals_used(function.__code__) - seen:
            seen.add(used)
            assert used in namespace or hasattr(builtins, used), f"{function.__name__} uses {used}: not in the bundle"
            value = namespace.get(used)
            if isinstance(value, types.FunctionType):
                todo.append(value)
    assert {"_supervise", "_observe", "prune", "_scan", "_claim", "_write_json", "serve", "_look"} <= seen


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / f"{name}.py").write_text(text)
    return folder


P = "from ftconsole.scheduler.node."


def test_the_bundler_drops_marked_imports_whole_and_orders_by_dependency(tmp_path: Path) -> None:
    folder = write(tmp_path, {
        "a": "X = 1\n",
        "b": f"{P}a import X  {MARK}\n\nY = X + 1\n",
        "main": f"import os\n{P}b import (  {MARK}\n    Y,\n)\n{P}a import X  {MARK}\n\nZ = (X, Y, os.sep)\n",
    })  # fmt: skip
    assert modules(folder, "main") == ["a", "b", "main"]
    assert strip(folder / "main.py", (folder / "main.py").read_text()) == "import os\n\nZ = (X, Y, os.sep)\n"
    namespace: dict[str, object] = {}
    exec(bundle(folder, "main"), namespace)
    assert namespace["Z"] == (1, 2, "/")


@pytest.mark.parametrize(
    ("files", "why"),
    [
        ({"main": f"{P}a import X\n", "a": "X = 1\n"}, "sibling import marked"),  # would stay in the bundle
        ({"main": f"from os import sep  {MARK}\n"}, "sibling import marked"),  # would be dropped
        ({"main": f"Y = 1  {MARK}\n"}, "not a sibling import"),
        ({"main": f"{P}a import X  {MARK}\n", "a": f"{P}main import Y  {MARK}\nX = 1\n"}, "import cycle"),
    ],
)
def test_the_bundler_refuses_what_it_cannot_bundle(tmp_path: Path, files: dict[str, str], why: str) -> None:
    with pytest.raises(BundleError, match=why):
        bundle(write(tmp_path, files), "main")
