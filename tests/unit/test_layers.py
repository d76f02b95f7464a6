"""The scheduler's folders and their rules (docs/development.md, "The map"): what runs on a node, what decides and
what talks to the outside, each importing only what its place allows. Read from the sources (every import, those
inside functions and under TYPE_CHECKING too) and, for the pure folders, from what importing them loads."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from ftconsole.scheduler.node.bundle import FOLDER, MARK, PACKAGE, modules, script

ROOT = Path(__file__).resolve().parents[2]

# the layers, bottom up; each may import its own and those listed
MAY_IMPORT = {
    "base": {"base"},  # scheduler/errors.py, scheduler/failpoints.py
    "node": {"node"},
    "spec": {"spec", "node", "base"},
    "probes": {"probes", "base"},
    "decide": {"decide", "spec", "node", "probes", "base"},
    "ssh": {"ssh", "decide", "spec", "node", "probes", "base"},
    "store": {"store", "decide", "spec", "probes", "base"},
    "loop": {"loop", "ssh", "store", "decide", "spec", "node", "probes", "base"},  # scheduler/*.py
    "serve": {"serve", "loop", "ssh", "store", "decide", "spec", "node", "probes", "base"},
}
BASE = {"ftconsole.scheduler.errors", "ftconsole.scheduler.failpoints"}
FOLDERS = ("node", "spec", "decide", "ssh", "store", "serve")
# what a node is sent
PROGRAMS = ("supervisor", "agent", "container_exec", "sshcheck", "datacopy", "nodetest", "fabric")
# sent as a file of a run, not as a program: torch's trace hook, which runs in a job's own Python processes and
# imports torch there only once the job has (torch_hook.py)
FILES = {"torch_hook": {"torch"}}
SCHEDULER_SIDE = {"bundle"}  # the one module of node/ that is not sent: it builds the scripts


def module_files() -> dict[str, Path]:
    """ftconsole.scheduler.* and ftconsole.probes.* -> their files (the packages' own __init__ files too)."""
    out = {}
    for top in ("scheduler", "probes"):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(("ftconsole", *parts))
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = module_files()


def layer(name: str) -> str:
    if name in BASE or name == "ftconsole.scheduler":  # the package's own __init__: its docstring only
        return "base"
    if name.startswith("ftconsole.probes"):
        return "probes"
    parts = name.split(".")
    if len(parts) >= 3 and parts[2] in FOLDERS:
        return parts[2]
    return "loop"


def imports(name: str) -> list[tuple[int, str]]:
    """(line, module) of each ftconsole module `name` imports; `from PKG import MOD` counts as PKG.MOD."""
    path = MODULES[name]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("ftconsole.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("ftconsole."):
            module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.append((node.lineno, sub if sub in MODULES else module))
    return [(line, m) for line, m in found if m in MODULES]


def test_every_module_has_a_place_and_the_folders_say_what_lives_there() -> None:
    assert {layer(m) for m in MODULES} == set(MAY_IMPORT)
    for folder in FOLDERS:
        opening = ast.get_docstring(ast.parse((ROOT / "scheduler" / folder / "__init__.py").read_text()))
        assert opening and len(opening) > 100, f"scheduler/{folder}/__init__.py: say what lives here"


def test_every_import_runs_down_the_layers() -> None:
    wrong = []
    for name in MODULES:
        for line, imported in imports(name):
            if layer(imported) not in MAY_IMPORT[layer(name)]:
                path = MODULES[name].relative_to(ROOT)
                wrong.append(f"{path}:{line}: {layer(name)} imports {imported} ({layer(imported)})")
    assert wrong == []


# -- the node side -----------------------------------------------------------------------------------------------

NODE = sorted(p.stem for p in FOLDER.glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", NODE)
def test_a_node_module_is_python38_and_imports_only_the_stdlib_and_its_marked_siblings(name: str) -> None:
    text = (FOLDER / f"{name}.py").read_text(encoding="utf-8")
    tree = ast.parse(text, feature_version=(3, 8))
    lines = text.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                allowed = top in sys.stdlib_module_names or top == "pynvml" or top in FILES.get(name, ())
                assert allowed, f"{name}.py:{node.lineno}: {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            assert node.level == 0, f"{name}.py:{node.lineno}: a relative import"
            if module.startswith("ftconsole"):
                assert module.removeprefix(PACKAGE + ".") in NODE, f"{name}.py:{node.lineno}: {module} is not node side"
                assert MARK in lines[node.lineno - 1], f"{name}.py:{node.lineno}: a sibling import not marked {MARK!r}"
            elif module == "__future__":
                assert name in SCHEDULER_SIDE, f"{name}.py:{node.lineno}: a prepended PARAMS line would break it"
            else:
                top = module.split(".")[0]
                assert top in sys.stdlib_module_names or top in FILES.get(name, ()), (
                    f"{name}.py:{node.lineno}: {module}"
                )


@pytest.mark.parametrize("main", PROGRAMS)
def test_each_program_is_one_python38_script_of_the_stdlib(main: str) -> None:
    text = script(main)
    compile(text, main, "exec")
    tree = ast.parse(text, feature_version=(3, 8))
    assert not [line for line in text.splitlines() if line.rstrip().endswith(MARK)]
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported - set(sys.stdlib_module_names) <= {"pynvml"}


def test_the_folder_is_what_the_nodes_receive() -> None:
    sent = {m for main in PROGRAMS for m in modules(FOLDER, main, PACKAGE)}
    assert sorted(sent | SCHEDULER_SIDE | set(FILES)) == NODE


def _functions(path: Path) -> dict[str, str]:
    """name -> its body (docstring left out) as the ast dumps it, of each top-level function of more than a line
    (its arguments' defaults may differ: a copy is a copy)."""
    out = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef):
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            if len(body) > 1 or len(ast.dump(body[0])) > 300:
                out[node.name] = "".join(ast.dump(stmt) for stmt in body)
    return out


def test_no_helper_is_written_twice_on_the_node_side() -> None:
    """One copy of each helper (issue 27): no top-level name defined in two node modules (the bundles share one
    namespace), and no function of the node side written again, under any name, there or in the lab."""
    by_name: dict[str, list[str]] = defaultdict(list)
    by_body: dict[str, list[str]] = defaultdict(list)
    for name in NODE:
        if name in SCHEDULER_SIDE:
            continue
        for function, body in _functions(FOLDER / f"{name}.py").items():
            if function != "main":  # each program's entry
                by_name[function].append(name)
            by_body[body].append(f"{name}.{function}")
    for path in sorted((ROOT / "ftconsole" / "lab").glob("*.py")):
        for function, body in _functions(path).items():
            if body in by_body:
                by_body[body].append(f"lab/{path.stem}.{function}")
    assert {f: where for f, where in by_name.items() if len(where) > 1} == {}
    assert [where for where in by_body.values() if len(where) > 1] == []


# -- the pure folders --------------------------------------------------------------------------------------------

IO_LIBRARIES = ("asyncssh", "aiosqlite", "sqlite3", "asyncpg", "httpx", "prometheus_client", "textual")


def test_the_decisions_and_specs_import_no_io() -> None:
    """Importing every module of decide/ and spec/ loads no I/O library and no module of the seams or the loop."""
    names = sorted(m for m in MODULES if layer(m) in ("decide", "spec"))
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert "ftconsole.scheduler.decide.placement" in loaded and "ftconsole.scheduler.spec.jobspec" in loaded
    assert [m for m in loaded if m.split(".")[0] in IO_LIBRARIES] == []
    ours = [m for m in loaded if m in MODULES]
    assert [m for m in ours if layer(m) not in MAY_IMPORT["decide"]] == []
