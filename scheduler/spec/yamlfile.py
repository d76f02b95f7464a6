"""YAML files that remember where each value came from.

`load` returns the plain data and a map from key path (a tuple of keys and list indexes) to the 1-based line
of that key, so a validation error at ``("nodes", 2, "port")`` can name ``cluster.yaml:14``. Pydantic's
``ValidationError`` is turned into `Problem`s with `problems_from_validation`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from ftconsole.scheduler.errors import ConfigError, Problem

Marks = dict[tuple[Any, ...], int]


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (a silent override is a classic config bug)."""


# Bounds on what one document may cost to read. Aliases let a few hundred bytes stand for billions of values (the
# "billion laughs" bomb): the tree is built by walking the composed nodes, each alias walked again, so the walk
# counts every value it builds and stops at MAX_VALUES. 100,000 values is some 20 times a large real file (a
# config of 2,000 node groups, a job with 10,000 env entries) and is built in about a tenth of a second, so a
# bomb is refused well within a second. MAX_DEPTH bounds nesting (real files nest 4 or 5 levels) before Python's
# own recursion limit would; MAX_FILE_BYTES bounds what is read at all (a job file or config is some kilobytes).
MAX_VALUES = 100_000
MAX_DEPTH = 64
MAX_FILE_BYTES = 4 * 1024 * 1024


_PLAIN_COLLECTIONS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


class _TooBig(Exception):
    def __init__(self, line: int, path: tuple[Any, ...], message: str) -> None:
        super().__init__(message)
        self.line = line
        self.path = path
        self.message = message


class _Builder:
    """Builds plain data from composed YAML nodes, recording each key's line and every problem found."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.marks: Marks = {}
        self.problems: list[Problem] = []
        self.values = 0
        self._constructor = _Loader("")
        self._open: set[int] = set()  # ids of the collections being built: an alias to one is a cycle

    def scalar(self, node: yaml.Node, path: tuple[Any, ...]) -> Any:
        try:
            return self._constructor.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, OverflowError) as exc:  # an unknown tag, a date such as 2024-13-45
            reason = exc.problem if isinstance(exc, yaml.MarkedYAMLError) and exc.problem else str(exc)
            self.problems.append(Problem(self.file, node.start_mark.line + 1, dotted(path), f"bad value: {reason}"))
            return None

    def build(self, node: yaml.Node, path: tuple[Any, ...]) -> Any:
        line = node.start_mark.line + 1
        self.marks.setdefault(path, line)
        self.values += 1
        if self.values > MAX_VALUES:
            raise _TooBig(line, path, f"the document expands to more than {MAX_VALUES} values (aliases?)")
        if len(path) > MAX_DEPTH:
            raise _TooBig(line, path, f"nested more than {MAX_DEPTH} levels deep")
        if not isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            return self.scalar(node, path)
        if node.tag not in _PLAIN_COLLECTIONS:  # a tag the builder would drop silently (!custom, !!set)
            where = dotted(path)
            self.problems.append(Problem(self.file, line, where, f"bad value: unsupported tag {node.tag!r}"))
            return None
        if id(node) in self._open:
            raise _TooBig(line, path, "an alias refers to a value that contains it (a cycle)")
        self._open.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
            return self._mapping(node, path)
        finally:
            self._open.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, path: tuple[Any, ...]) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                self.problems.append(Problem(self.file, line, dotted(path), "'<<' merge keys are not supported"))
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.append(Problem(self.file, line, dotted(path), "a key must be a plain value"))
                continue
            key = self.scalar(key_node, path)
            child = (*path, key)
            if key in out:
                self.problems.append(
                    Problem(self.file, line, dotted(child), "duplicate key (an earlier one is overridden)")
                )
            self.marks[child] = line
            out[key] = self.build(value_node, child)
        return out


def parse(text: str, file: str) -> tuple[Any, Marks]:
    """Parse YAML text; raise ConfigError naming the line on a syntax error, a duplicate key, or a document that
    expands past MAX_VALUES values or MAX_DEPTH levels."""
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError([Problem(file, line, "", f"YAML syntax: {exc.problem or exc}")]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError([Problem(file, None, "", f"YAML syntax: {exc}")]) from exc
    except RecursionError:  # the composer recurses once per level of nesting
        raise ConfigError([Problem(file, None, "", f"nested more than {MAX_DEPTH} levels deep")]) from None
    if root is None:
        return {}, {}
    builder = _Builder(file)
    try:
        data = builder.build(root, ())
    except _TooBig as exc:
        raise ConfigError([Problem(file, exc.line, dotted(exc.path), exc.message)]) from None
    if builder.problems:
        raise ConfigError(builder.problems)
    return data, builder.marks


def load(path: Path) -> tuple[Any, Marks]:
    """Read and parse a YAML file: it must be UTF-8 and at most MAX_FILE_BYTES long."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError([Problem(str(path), None, "", f"cannot read: {exc.strerror or exc}")]) from exc
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError([Problem(str(path), None, "", f"larger than {MAX_FILE_BYTES // 1024 // 1024} MiB")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        problem = f"not UTF-8 text: byte offset {exc.start} (0x{raw[exc.start]:02x}) cannot be decoded"
        raise ConfigError([Problem(str(path), line, "", problem)]) from None
    return parse(text, str(path))


def dotted(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            part = str(part) or "''"  # an empty key is still a key the reader must find
            out += f".{part}" if out else part
    return out


def line_of(marks: Marks, path: tuple[Any, ...]) -> int | None:
    """The line of the deepest known prefix of `path`."""
    for end in range(len(path), -1, -1):
        line = marks.get(tuple(path[:end]))
        if line is not None:
            return line
    return None


def problems_from_validation(exc: ValidationError, file: str, marks: Marks) -> list[Problem]:
    problems = []
    for err in exc.errors(include_url=False):
        loc = tuple(part for part in err["loc"] if not (isinstance(part, str) and part.startswith("function-")))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif msg.startswith("Value error, "):
            msg = msg.removeprefix("Value error, ")
        elif msg.startswith("Assertion failed, "):
            msg = msg.removeprefix("Assertion failed, ")
        problems.append(Problem(file, line_of(marks, loc), dotted(loc), msg))
    return problems


M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], data: Any, file: str, marks: Marks) -> M:
    """Validate `data` as `model`, raising ConfigError with every problem located by file and line."""
    if not isinstance(data, Mapping):
        raise ConfigError([Problem(file, 1, "", "expected a mapping of keys at the top level")])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, file, marks)) from exc
