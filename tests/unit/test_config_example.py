"""The example config (`ftconsole config example`, ftconsole/data/cluster.example.yaml) against the config model,
so that it cannot go stale: every key of the model appears in it, and every value it shows is the key's true
default unless its comment says `default: X` (then X must be the default, and the value shown an example).

The example's own header states these rules; sections commented out at the left margin (`# metrics:`) are read
too, with their `# ` removed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
import yaml
from pydantic import BaseModel, TypeAdapter
from pydantic.fields import FieldInfo

from ftconsole.cli import main
from ftconsole.scheduler.spec import yamlfile
from ftconsole.scheduler.spec.config import ClusterConfig, PartialThresholds, Thresholds, load_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "ftconsole" / "data" / "cluster.example.yaml"
TEXT = EXAMPLE.read_text()
LINES = TEXT.splitlines()

# Per-pool thresholds take any key of probes.thresholds (the example says so); they are listed there once.
SAME_KEYS_AS = {"pools.*.thresholds": Thresholds}
_SECTION = re.compile(r"^# ([a-z_]+):(?:\s.*)?$")
_MARKER = re.compile(r"^default:\s*(?P<value>[^;]*)")


# -- reading the example ---------------------------------------------------------------------------------------


def commented_sections() -> list[tuple[str, list[str]]]:
    """(key, its lines uncommented) for each top-level section commented out at the left margin."""
    out: list[tuple[str, list[str]]] = []
    block: list[str] | None = None
    for line in LINES:
        start = _SECTION.match(line)
        if start and start.group(1) in ClusterConfig.model_fields:
            block = [line[2:]]
            out.append((start.group(1), block))
        elif block is not None and line.startswith("#  "):
            block.append(line[2:])
        else:
            block = None
    return out


def comment(line: str) -> str:
    """The comment of a YAML line ('' if none): what follows the first '#' after blank space."""
    found = re.search(r"(?:^|\s)#\s?(.*)$", line)
    return found.group(1).strip() if found else ""


def marker(line: str) -> Any:
    """The default a line's comment gives (`# default: X; ...`), or NO_MARKER."""
    found = _MARKER.match(comment(line))
    return yaml.safe_load(found.group("value")) if found else NO_MARKER


NO_MARKER = object()


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's type holds: itself, or in an Optional, a list or a dict."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in models_in(arg)]


def container(annotation: Any) -> str:
    """How a field holds its models: 'list', 'dict' or '' (the model itself, or None)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return next((c for a in typing.get_args(annotation) if (c := container(a))), "")
    if origin is list:
        return "list"
    return "dict" if origin is dict else ""


def model_paths(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every key of the model, as 'nodes[].host' or 'pools.*.description'."""
    for name, field in model.model_fields.items():
        path = prefix + name
        yield path
        if path in SAME_KEYS_AS:
            continue
        for sub in models_in(field.annotation):
            holder = container(field.annotation)
            yield from model_paths(sub, path + ("[]." if holder == "list" else ".*." if holder == "dict" else "."))


def validated(field: FieldInfo, value: Any) -> Any:
    """`value` as the field would read it (a duration to seconds, `unlimited` to -1:-1)."""
    kind: Any = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
    return TypeAdapter(kind).validate_python(value)


class Walk:
    """Walks the example's data beside the validated config: the keys it shows, and what is wrong with them."""

    def __init__(self, lines: list[str], marks: yamlfile.Marks) -> None:
        self.lines = lines
        self.marks = marks
        self.seen: set[str] = set()
        self.problems: list[str] = []

    def line(self, loc: tuple[Any, ...]) -> str:
        return self.lines[self.marks[loc] - 1]

    def model(self, model: BaseModel, raw: dict[str, Any], loc: tuple[Any, ...], path: str) -> None:
        for name, value in raw.items():
            field = type(model).model_fields[name]
            self.field(field, getattr(model, name), value, (*loc, name), path + name)

    def field(self, field: FieldInfo, value: Any, raw: Any, loc: tuple[Any, ...], path: str) -> None:
        self.seen.add(path)
        where = f"{EXAMPLE.name}:{self.marks[loc]}: {yamlfile.dotted(loc)}"
        shown = marker(self.line(loc))
        if field.is_required():
            if shown is not NO_MARKER:
                self.problems.append(f"{where}: a required key has no default, yet its comment gives one")
        elif shown is not NO_MARKER:
            default = field.get_default(call_default_factory=True)
            if validated(field, shown) != default:
                self.problems.append(f"{where}: the comment says default: {shown!r}; the model's is {default!r}")
            if value == default:
                self.problems.append(f"{where}: the value shown is the default: drop its `default:` comment")
        elif not isinstance(value, BaseModel) and value != field.get_default(call_default_factory=True):
            default = field.get_default(call_default_factory=True)
            self.problems.append(f"{where}: shows {raw!r} (read as {value!r}) but the default is {default!r}")
        if path in SAME_KEYS_AS:
            return
        holder = container(field.annotation)
        if isinstance(value, BaseModel) and isinstance(raw, dict):
            self.model(value, raw, loc, path + ".")
        elif holder == "list" and models_in(field.annotation):
            for i, (item, item_raw) in enumerate(zip(value, raw, strict=True)):
                self.model(item, item_raw, (*loc, i), path + "[].")
        elif holder == "dict" and models_in(field.annotation):
            for key, item_raw in raw.items():
                self.model(value[key], item_raw, (*loc, key), path + ".*.")


def walk_example() -> Walk:
    """The example as it is, then each section commented out in it, walked into one record."""
    loaded = load_config(EXAMPLE)
    data, marks = yamlfile.load(EXAMPLE)
    walk = Walk(LINES, marks)
    walk.model(loaded.cluster, data, (), "")
    for key, block in commented_sections():
        assert key not in data, f"{key} is both set and commented out in the example"
        block_data, block_marks = yamlfile.parse("\n".join(block), f"{EXAMPLE.name} (# {key})")
        assert list(block_data) == [key], f"the commented-out section {key} holds more than its own key"
        config = ClusterConfig.model_validate(block_data)
        section = Walk(block, block_marks)
        section.model(config, block_data, (), "")
        walk.seen |= section.seen
        walk.problems += section.problems
    return walk


# -- the tests -------------------------------------------------------------------------------------------------


def test_every_key_of_the_config_model_is_in_the_example() -> None:
    missing = sorted(set(model_paths(ClusterConfig)) - walk_example().seen)
    assert missing == [], f"keys of the config model missing from {EXAMPLE}: {', '.join(missing)}"


def test_every_value_in_the_example_is_the_default_or_says_which_is() -> None:
    assert walk_example().problems == []


def test_per_pool_thresholds_take_the_keys_of_probes_thresholds() -> None:
    # what lets the example list them once, under probes.thresholds
    assert list(PartialThresholds.model_fields) == list(Thresholds.model_fields)


def test_the_example_has_commented_out_sections_to_read() -> None:
    # the reader of commented-out sections finds them (else the tests above would pass on nothing)
    assert [key for key, _ in commented_sections()] == [
        "state",
        "projects",
        "quotas",
        "alertmanager",
        "metrics",
        "topology",
    ]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("  port: 22                # default: null; ssh.port", None),
        ("    pool: h100              # default: default", "default"),
        ("nodes:                      # default: []; a config without nodes", []),
        ("    labels:                 # default: {}; free pairs", {}),
        ('    description: x   # default: ""', ""),
        ("  port: null                # null: ~/.ssh/config's Port", NO_MARKER),
        ("  runtime: auto         # required here: auto, podman", NO_MARKER),
        ("  tick: 2s", NO_MARKER),
    ],
)
def test_the_default_marker(line: str, expected: Any) -> None:
    if expected is NO_MARKER:
        assert marker(line) is NO_MARKER
    else:
        assert marker(line) == expected


def test_config_example_prints_the_shipped_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "example"]) == 0
    assert capsys.readouterr().out == TEXT


def test_config_example_piped_into_config_check_passes(sock_dir: Path) -> None:
    cli = [sys.executable, "-m", "ftconsole.cli"]
    env = {"HOME": str(sock_dir), "PATH": "/usr/bin:/bin"}  # short: the default API socket is under it
    (sock_dir / ".ssh").mkdir()
    (sock_dir / ".ssh" / "known_hosts").touch()  # filled with ssh-keyscan, as the example says; strict needs it
    example = subprocess.run([*cli, "config", "example"], capture_output=True, env=env, timeout=60, check=True)
    check = subprocess.run(
        [*cli, "--config", "-", "config", "check"], input=example.stdout, capture_output=True, env=env, timeout=60
    )
    assert check.returncode == 0, check.stderr.decode()
    assert check.stdout.decode().startswith("/dev/stdin: ok (20 nodes in 2 pool(s): a100, h100)\n")


def test_config_check_of_the_lab_layout_says_what_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(ROOT / "config" / "lab.yaml"), "config", "check"]) == 2
    err = capsys.readouterr().err
    assert "lab.yaml: this is a lab layout" in err and "ftconsole config example" in err
