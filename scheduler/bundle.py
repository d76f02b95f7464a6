"""One self-contained script from a node-side program split into modules (the run supervisor, `runs.py`).

A node runs what we send it with `python3 -`: it has no ftconsole to import. So a node-side module imports its
sibling modules with lines marked `# bundled` (`from ftconsole.scheduler.supervisor_files import _read_json  #
bundled`, the mark on the statement's first line), which keeps it importable here (tests, mypy), and `bundle()`
joins the sources: each imported module once, before what imports it (dependency order), the main module last,
with the marked import statements removed. The modules then share one namespace: names defined at the top of
two of them would clash (tests/unit/test_supervisor_bundle.py checks they do not).
"""

from __future__ import annotations

import ast
from pathlib import Path

MARK = "# bundled"
PACKAGE = "ftconsole.scheduler."


class BundleError(ValueError):
    """A node-side module that cannot be bundled: a marked line that is not a sibling import, or a cycle."""


def _bundled_imports(path: Path, source: str) -> list[tuple[str, int, int]]:
    """(module, first line, last line) of each marked import of a sibling module in `source` (lines 1-based)."""
    lines = source.splitlines()
    found: list[tuple[str, int, int]] = []
    for node in ast.parse(source, filename=str(path)).body:
        if not isinstance(node, ast.ImportFrom):
            continue
        marked = MARK in lines[node.lineno - 1]
        module = node.module or ""
        sibling = node.level == 0 and module.startswith(PACKAGE) and "." not in module[len(PACKAGE) :]
        if marked != sibling:
            raise BundleError(f"{path}:{node.lineno}: a sibling import marked {MARK!r} is all the bundle drops")
        if sibling:
            end = node.end_lineno or node.lineno
            found.append((module[len(PACKAGE) :], node.lineno, end))
    marked_lines = {n for n, line in enumerate(lines, 1) if line.rstrip().endswith(MARK)}
    dropped = {first for _, first, _ in found}
    if marked_lines - dropped:
        raise BundleError(f"{path}:{min(marked_lines - dropped)}: marked {MARK!r} but not a sibling import")
    return found


def modules(folder: Path, main: str) -> list[str]:
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
        for imported, _, _ in _bundled_imports(path, path.read_text(encoding="utf-8")):
            visit(imported)
        visiting.pop()
        order.append(name)

    visit(main)
    return order


def strip(path: Path, source: str) -> str:
    """`source` without its marked import statements (each whole, however many lines it spans)."""
    drop: set[int] = set()
    for _, first, last in _bundled_imports(path, source):
        drop.update(range(first, last + 1))
    return "".join(line for n, line in enumerate(source.splitlines(keepends=True), 1) if n not in drop)


def bundle(folder: Path, main: str) -> str:
    """The script of `main` (a module of `folder`): its modules' sources in dependency order, marks dropped."""
    parts = []
    for name in modules(folder, main):
        path = folder / f"{name}.py"
        parts.append(f"# -- {name}.py\n" + strip(path, path.read_text(encoding="utf-8")))
    return "\n\n".join(parts)
