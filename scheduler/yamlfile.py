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


def _scalar(node: yaml.Node) -> Any:
    return _Loader("").construct_object(node, deep=True)


def _construct(node: yaml.Node, path: tuple[Any, ...], marks: Marks, file: str, problems: list[Problem]) -> Any:
    marks.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node)
            if key_node.tag == "tag:yaml.org,2002:merge":
                problems.append(
                    Problem(file, key_node.start_mark.line + 1, dotted(path), "'<<' merge keys are not supported")
                )
                continue
            child = (*path, key)
            if key in out:
                problems.append(
                    Problem(
                        file,
                        key_node.start_mark.line + 1,
                        dotted(child),
                        "duplicate key (an earlier one is overridden)",
                    )
                )
            marks[child] = key_node.start_mark.line + 1
            out[key] = _construct(value_node, child, marks, file, problems)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, (*path, i), marks, file, problems) for i, item in enumerate(node.value)]
    return _scalar(node)


def parse(text: str, file: str) -> tuple[Any, Marks]:
    """Parse YAML text; raise ConfigError naming the line on a syntax error or duplicate key."""
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError([Problem(file, line, "", f"YAML syntax: {exc.problem or exc}")]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError([Problem(file, None, "", f"YAML syntax: {exc}")]) from exc
    if root is None:
        return {}, {}
    marks: Marks = {}
    problems: list[Problem] = []
    data = _construct(root, (), marks, file, problems)
    if problems:
        raise ConfigError(problems)
    return data, marks


def load(path: Path) -> tuple[Any, Marks]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([Problem(str(path), None, "", f"cannot read: {exc.strerror or exc}")]) from exc
    return parse(text, str(path))


def dotted(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
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
