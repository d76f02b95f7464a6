"""How a node-side program leaves: its modules joined into one script (`script`), its parameters prepended
(`python_stdin_script`). The one file of this folder that runs only in the scheduler.

A node runs what we send it with `python3 -` (or `python3 -c`): it has no ftconsole to import. So a node-side
module imports its sibling modules with lines marked `# bundled` (`from ftconsole.scheduler.node.supervisor_files
import _read_json  # bundled`, the mark on the statement's first line), which keeps it importable here (tests,
mypy), and `bundle()` joins the sources: each imported module once, before what imports it (dependency order),
the main module last, with the marked import statements removed. The modules then share one namespace: names
defined at the top of two of them would clash (tests/unit/test_layers.py checks that no name is defined twice in
this folder).

The programs: the run supervisor (`supervisor`, sent by `scheduler.ssh.runs`), the probe agent (`agent`, by
`scheduler.ssh.probing`), the MPI hybrid model's container entry (`container_exec`, written by the launch plan),
the pre-launch SSH check (`sshcheck`) and the data copy (`datacopy`), both run as steps with `python3 -c`.
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

MARK = "# bundled"
FOLDER = Path(__file__).parent  # the node side: what this folder holds is what a node receives
PACKAGE = "ftconsole.scheduler.node"  # its package


class BundleError(ValueError):
    """A node-side module that cannot be bundled: a marked line that is not a sibling import, or a cycle."""


def _bundled_imports(path: Path, source: str, package: str) -> list[tuple[str, int, int]]:
    """(module, first line, last line) of each marked import of a sibling module in `source` (lines 1-based)."""
    prefix = package + "."
    lines = source.splitlines()
    found: list[tuple[str, int, int]] = []
    for node in ast.parse(source, filename=str(path)).body:
        if not isinstance(node, ast.ImportFrom):
            continue
        marked = MARK in lines[node.lineno - 1]
        module = node.module or ""
        sibling = node.level == 0 and module.startswith(prefix) and "." not in module[len(prefix) :]
        if marked != sibling:
            raise BundleError(f"{path}:{node.lineno}: a sibling import marked {MARK!r} is all the bundle drops")
        if sibling:
            end = node.end_lineno or node.lineno
            found.append((module[len(prefix) :], node.lineno, end))
    marked_lines = {n for n, line in enumerate(lines, 1) if line.rstrip().endswith(MARK)}
    dropped = {first for _, first, _ in found}
    if marked_lines - dropped:
        raise BundleError(f"{path}:{min(marked_lines - dropped)}: marked {MARK!r} but not a sibling import")
    return found


def modules(folder: Path, main: str, package: str = PACKAGE) -> list[str]:
    """The modules of `main`'s bundle, each after those it imports (marked imports only), `main` last."""
    order: list[str] = []
    visiting: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise BundleError(f"import cycle: {' -> '.join([*visiting, name])}")
        visiting.append(name)
        path = folder / f"{name}.py"
        for imported, _, _ in _bundled_imports(path, path.read_text(encoding="utf-8"), package):
            visit(imported)
        visiting.pop()
        order.append(name)

    visit(main)
    return order


def strip(path: Path, source: str, package: str = PACKAGE) -> str:
    """`source` without its marked import statements (each whole, however many lines it spans)."""
    drop: set[int] = set()
    for _, first, last in _bundled_imports(path, source, package):
        drop.update(range(first, last + 1))
    return "".join(line for n, line in enumerate(source.splitlines(keepends=True), 1) if n not in drop)


def bundle(folder: Path, main: str, package: str = PACKAGE) -> str:
    """The script of `main` (a module of `folder`, whose package is `package`): its modules' sources in
    dependency order, marks dropped."""
    parts = []
    for name in modules(folder, main, package):
        path = folder / f"{name}.py"
        parts.append(f"# -- {name}.py\n" + strip(path, path.read_text(encoding="utf-8"), package))
    return "\n\n".join(parts)


@functools.cache
def script(main: str) -> str:
    """The program `main` of this folder as the one script a node runs (built once)."""
    return bundle(FOLDER, main, PACKAGE)


def python_stdin_script(source: str, params: dict[str, object]) -> str:
    """A node-side program for `python3 -`, its parameters prepended as a Python string literal (no shell)."""
    return f"import json\nPARAMS = json.loads({json.dumps(params)!r})\n" + source
