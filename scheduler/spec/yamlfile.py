"""YAML files that remember where each value came from.

`load` returns the plain data and a map from key path (a tuple of keys and list indexes) to the 1-based line
of that key, so a validation error at ``("nodes", 2, "port")`` can name ``cluster.yaml:14``. Pydantic's
``ValidationError`` is turned into `Problem`s with `problems_from_validation`, in this project's words (pydantic's
own, "Input should be ...", never reach the user): the key's unit where it has one (`values.Unit`), the allowed
values of a choice, and the closest allowed key for a misspelt one. This is the one place both the cluster
config and job specs are validated (`validate`).
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from ftconsole.scheduler.errors import ConfigError, Problem
from ftconsole.scheduler.spec.values import Unit

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


def parse_all(text: str, file: str) -> tuple[Any, Marks, list[Problem]]:
    """Parse YAML text into its data, its marks and the problems found on the way (a duplicate key, an unsupported
    tag, a bad value: their values are left out or None), so that a caller can report them with the problems of
    validation. Raise ConfigError naming the line on a syntax error or a document that expands past MAX_VALUES
    values or MAX_DEPTH levels: nothing more can be read then."""
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
        return {}, {}, []
    builder = _Builder(file)
    try:
        data = builder.build(root, ())
    except _TooBig as exc:
        raise ConfigError([Problem(file, exc.line, dotted(exc.path), exc.message)]) from None
    return data, builder.marks, builder.problems


def parse(text: str, file: str) -> tuple[Any, Marks]:
    """Parse YAML text; raise ConfigError naming the line on a syntax error, a duplicate key, or a document that
    expands past MAX_VALUES values or MAX_DEPTH levels."""
    data, marks, problems = parse_all(text, file)
    if problems:
        raise ConfigError(problems)
    return data, marks


def read(path: Path) -> str:
    """A YAML file's text: it must be UTF-8 and at most MAX_FILE_BYTES long; ConfigError otherwise."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError([Problem(str(path), None, "", f"cannot read: {exc.strerror or exc}")]) from exc
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError([Problem(str(path), None, "", f"larger than {MAX_FILE_BYTES // 1024 // 1024} MiB")])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        problem = f"not UTF-8 text: byte offset {exc.start} (0x{raw[exc.start]:02x}) cannot be decoded"
        raise ConfigError([Problem(str(path), line, "", problem)]) from None


def load_all(path: Path) -> tuple[Any, Marks, list[Problem]]:
    """Read and parse a YAML file as `parse_all` does."""
    return parse_all(read(path), str(path))


def load(path: Path) -> tuple[Any, Marks]:
    """Read and parse a YAML file: it must be UTF-8 and at most MAX_FILE_BYTES long."""
    return parse(read(path), str(path))


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


def problems_from_validation(
    exc: ValidationError, file: str, marks: Marks, model: type[BaseModel] | None = None
) -> list[Problem]:
    """Each error of `exc` as a Problem in this project's words; `model`, the model validated, lets them name
    the key's unit and, for an unknown key, the closest allowed one."""
    problems = []
    for err in exc.errors(include_url=False):
        loc = tuple(part for part in err["loc"] if not (isinstance(part, str) and part.startswith("function-")))
        problems.append(Problem(file, line_of(marks, loc), dotted(loc), words(err, loc, model)))
    return problems


# -- pydantic's errors in our words ------------------------------------------------------------------------


def _options(annotation: Any) -> list[Any]:
    """The types a value of `annotation` may have: Annotated and unions unwrapped, None left out."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _options(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [t for arg in get_args(annotation) for t in _options(arg)]
    return [] if annotation is type(None) else [annotation]


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """A model's fields by the key written in YAML (the alias, where a field has one)."""
    return {info.alias or name: info for name, info in model.model_fields.items()}


def _step(annotation: Any, part: Any) -> tuple[Any, FieldInfo | None] | None:
    """The annotation one key or index down from `annotation`, and the field when a model's key; None: lost."""
    for option in _options(annotation):
        origin, args = get_origin(option), get_args(option)
        if _is_model(option) and isinstance(part, str) and part in _fields(option):
            info = _fields(option)[part]
            return info.annotation, info
        if origin in (dict, Mapping) and len(args) == 2 and isinstance(part, str):
            return args[1], None
        if origin in (list, tuple, set, frozenset) and args and isinstance(part, int):
            return args[0], None
    named = [o for o in _options(annotation) if getattr(o, "__name__", None) == part]  # a union's tag
    return (named[0], None) if named else None


def _walk(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> tuple[Any, FieldInfo | None] | None:
    """The annotation at `loc` in `model` and, when its last key is a model's, that field; None: not found."""
    if model is None:
        return None
    found: tuple[Any, FieldInfo | None] = (model, None)
    for part in loc:
        step = _step(found[0], part)
        if step is None:
            return None
        found = step
    return found


def _unit(found: tuple[Any, FieldInfo | None] | None) -> Unit | None:
    if found is None:
        return None
    annotation, info = found
    metadata = list(info.metadata) if info is not None else []
    for option in [annotation, *_options(annotation)]:
        if get_origin(option) is Annotated:
            metadata += get_args(option)[1:]
    return next((m for m in metadata if isinstance(m, Unit)), None)


def _kind(value: Any) -> str:
    """What a YAML value is, in words."""
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"text ({value!r})" if len(value) <= 40 else "text"
    if isinstance(value, Mapping):
        return "a mapping of keys"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


# at most this many allowed keys are listed with an unknown key's problem
FEW_KEYS = 12


def _unknown_key(loc: tuple[Any, ...], model: type[BaseModel] | None) -> str:
    found = _walk(model, loc[:-1])
    models = [o for o in _options(found[0]) if _is_model(o)] if found is not None else []
    if not models or not loc or not isinstance(loc[-1], str):
        return "unknown key"
    allowed = [key for m in models for key in _fields(m)]
    close = difflib.get_close_matches(loc[-1], allowed, n=1, cutoff=0.6)
    out = "unknown key" + (f": did you mean {close[0]!r}?" if close else "")
    if len(allowed) <= FEW_KEYS:
        out += f" (allowed here: {', '.join(allowed)})"
    return out


def _quoted_hint(key: str, value: Any) -> str:
    shown = str(value).lower() if isinstance(value, bool) else str(value)
    return f'quote it: `{key}: "{shown}"`'


def _choices(expected: str) -> str:
    """pydantic's "'a', 'b' or 'c'" as "a, b, c"."""
    found = re.findall(r"'((?:[^'\\]|\\.)*)'", expected)
    return ", ".join(found) if found else expected


# pydantic's error types that need no more than the value given ({kind}: what it is, in words) and the error's
# context (its ctx: {min_length}, {max_length}, {pattern})
SAYS = {
    "int_type": "must be a whole number, not {kind}",
    "int_parsing": "must be a whole number, not {kind}",
    "int_from_float": "must be a whole number, not {kind}",
    "int_parsing_size": "must be a whole number, not {kind}",
    "float_type": "must be a number, not {kind}",
    "float_parsing": "must be a number, not {kind}",
    "finite_number": "must be a number, not {kind}",
    "bool_type": "must be true or false, not {kind}",
    "bool_parsing": "must be true or false, not {kind}",
    "model_type": "must be a mapping of keys (or left out), not {kind}",
    "model_attributes_type": "must be a mapping of keys (or left out), not {kind}",
    "dataclass_type": "must be a mapping of keys (or left out), not {kind}",
    "dict_type": "must be a mapping of keys (key: value), not {kind}",
    "list_type": "must be a list, as [a, b], not {kind}",
    "tuple_type": "must be a list, as [a, b], not {kind}",
    "set_type": "must be a list, as [a, b], not {kind}",
    "frozen_set_type": "must be a list, as [a, b], not {kind}",
    "too_long": "must have at most {max_length} entries",
    "string_too_long": "must be at most {max_length} characters long",
    "string_pattern_mismatch": "must match the pattern {pattern}",
    "none_required": "must be left empty",
    "missing": "missing: this key is required",
}
# a bound of a number: (what it is, its name in the error's context)
BOUNDS = {
    "greater_than_equal": ("at least", "ge"),
    "greater_than": ("greater than", "gt"),
    "less_than_equal": ("at most", "le"),
    "less_than": ("less than", "lt"),
}


def words(err: ErrorDetails, loc: tuple[Any, ...], model: type[BaseModel] | None = None) -> str:
    """One pydantic error as this project says it: `SAYS`, `BOUNDS` with the key's unit, and the few that need
    more; an error of our own validators (a ValueError's text) as it is."""
    kind, ctx, given = err["type"], err.get("ctx") or {}, err.get("input")
    if kind in SAYS:
        return SAYS[kind].format(kind=_kind(given), **{k: ctx.get(k) for k in ("min_length", "max_length", "pattern")})
    if kind == "extra_forbidden":
        return _unknown_key(loc, model)
    if kind in BOUNDS:
        unit = _unit(_walk(model, loc)) or Unit()
        what, name = BOUNDS[kind]
        bound = unit.show(ctx[name]) if isinstance(ctx.get(name), int | float) else str(ctx.get(name))
        number = isinstance(given, int | float) and not isinstance(given, bool)
        return f"must be {what} {bound}, not {unit.show(given, hint=False) if number else repr(given)}"
    if kind == "string_type" and isinstance(given, bool | int | float):  # YAML read it as a boolean or a number
        key = next((str(part) for part in reversed(loc) if isinstance(part, str)), "key")
        what = "a boolean" if isinstance(given, bool) else "a number"
        return f"must be text ({_quoted_hint(key, given)}), not {what}"
    if kind == "string_type":
        return f"must be text, not {_kind(given)}"
    if kind in ("literal_error", "enum"):
        return f"must be one of: {_choices(str(ctx.get('expected', '')))}; not {given!r}"
    if kind in ("too_short", "string_too_short"):
        least = int(ctx.get("min_length", 1))
        if kind == "too_short":
            return f"must have at least {least} entr{'y' if least == 1 else 'ies'}"
        return "must not be empty" if least <= 1 else f"must be at least {least} characters long"
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return msg


def _section(annotation: Any) -> bool:
    """Whether `annotation` is a section (a model), a map or a list, of which None cannot be a value."""
    options = _options(annotation)
    none_ok = len(options) < len(get_args(annotation)) if get_origin(annotation) in (Union, types.UnionType) else False
    shapes = [o for o in options if _is_model(o) or get_origin(o) in (dict, list, Mapping)]
    return bool(shapes) and not none_ok and annotation is not Any


def empty_as_default(annotation: Any, data: Any) -> Any:
    """`data` with each section written empty (`ssh:` and nothing under it: YAML's null) taken as its defaults:
    left out where a model's key has a default, {} where it is a map's value."""
    for option in _options(annotation):
        if _is_model(option) and isinstance(data, Mapping):
            fields = _fields(option)
            out = {}
            for key, value in data.items():
                info = fields.get(key) if isinstance(key, str) else None
                if info is None:
                    out[key] = value
                elif value is None and not info.is_required() and _section(info.annotation):
                    continue
                else:
                    out[key] = empty_as_default(info.annotation, value)
            return out
        args = get_args(option)
        if get_origin(option) in (dict, Mapping) and len(args) == 2 and isinstance(data, Mapping):
            inner = args[1]
            empty_model = any(_is_model(o) for o in _options(inner)) and _section(inner)
            return {k: {} if v is None and empty_model else empty_as_default(inner, v) for k, v in data.items()}
        if get_origin(option) is list and args and isinstance(data, list):
            return [empty_as_default(args[0], item) for item in data]
    return data


M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], data: Any, file: str, marks: Marks) -> M:
    """Validate `data` as `model`, raising ConfigError with every problem located by file and line. A section
    written empty (`ssh:` alone) means its defaults."""
    if not isinstance(data, Mapping):
        raise ConfigError([Problem(file, 1, "", f"expected a mapping of keys at the top level, not {_kind(data)}")])
    try:
        return model.model_validate(empty_as_default(model, data))
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, file, marks, model)) from exc
