"""The value types of the cluster config and the job spec: durations (`30s`, `5m`, `12h`, `off` for a retention),
sizes (`64KiB`, `2GiB`, `off` for a cap), host addresses SSH can reach, and the unit a number is written in
(`Unit`, which the problems of a value name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

from ftconsole.scheduler.node.supervisor_output import MIN_OUTPUT_LIMIT

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """'90s', '5m', '12h', '1.5d', '250ms' or a bare number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 30s, 5m or 12h, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"expected a duration such as 30s, 5m or 12h, got {value!r}")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


def format_duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class Unit:
    """What a number is counted in, for the problems that quote a bound of it: put in a field's `Annotated[...]`
    (pydantic ignores it), read by `yamlfile` to say "must be at least 2s (a duration such as 30s, 5m, 2h)" rather
    than a bare 2. `suffix` is written after a bound; a duration's bounds are written as durations."""

    suffix: str = ""
    hint: str = ""
    duration: bool = False

    def show(self, value: float, *, hint: bool = True) -> str:
        """`value` in this unit (`hint`: with what such a value looks like)."""
        text = format_duration(float(value)) if self.duration else f"{value:g}{self.suffix}"
        return f"{text} ({self.hint})" if self.hint and hint else text


DURATION_HINT = "a duration such as 30s, 5m, 2h"
SECONDS = Unit(hint=DURATION_HINT, duration=True)
GB = Unit(" GB")
KB = Unit(" KB")
PERCENT = Unit("%")
CELSIUS = Unit(" °C")


def _positive(seconds: float) -> float:
    if seconds <= 0:
        raise ValueError("must be greater than 0")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration), SECONDS]
PositiveDuration = Annotated[Duration, AfterValidator(_positive)]


def _retention(value: Any) -> float:
    """A duration, or 0 / `off` (YAML may read `off` as false): keep forever."""
    if value is False or value is None or (isinstance(value, str) and value.strip().lower() in ("off", "never")):
        return 0.0
    return parse_duration(value)


RetentionDuration = Annotated[float, BeforeValidator(_retention), SECONDS]


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|[KMGT]?B|bytes?)?\s*$", re.IGNORECASE)
_SIZE_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}


def parse_size(value: Any) -> int:
    """'64KiB', '512M', '2GiB', '1.5G' (powers of 1024: K, Ki, KiB...), '2GB' (powers of 1000: KB, MB, GB, TB), or
    a bare number of bytes -> bytes."""
    hint = f"expected a size such as 64KiB, 512MiB or 2GiB, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(hint)
    if isinstance(value, int) and abs(value) > 1 << 62:
        raise ValueError(f"{value!r} is not a size this cluster can hold")
    if isinstance(value, int | float):
        number, unit = float(value), ""
    else:
        match = _SIZE.match(value)
        if not match:
            raise ValueError(hint)
        number, unit = float(match.group(1)), (match.group(2) or "").upper()
    if unit.startswith("BYTE") or unit == "B":
        unit = ""
    decimal = unit.endswith("B") and not unit.endswith("IB")
    base = 1000 if decimal else 1024
    size = number * base ** _SIZE_POWERS[unit[:1]]
    if size < 0:
        raise ValueError("a size cannot be negative")
    if size != size or size > 1 << 62:
        raise ValueError(f"{value!r} is not a size this cluster can hold")
    return int(size)


def format_size(size: int) -> str:
    """`size` bytes the way the docs write it: 64 KiB, 1.5 GiB, 100 bytes."""
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{round(size / factor, 2):g} {unit}"
    return f"{size} bytes"


def _cap_size(value: Any) -> int:
    """A size, or 0 / `off` (YAML may read `off` as false): no cap."""
    if value is False or value is None or (isinstance(value, str) and value.strip().lower() in ("off", "none")):
        return 0
    return parse_size(value)


def _output_limit(size: int) -> int:
    if 0 < size < MIN_OUTPUT_LIMIT:
        raise ValueError(f"must be at least {format_size(MIN_OUTPUT_LIMIT)}, or off (no limit)")
    return size


SIZE_HINT = "a size such as 64KiB, 512MiB, 2GiB"
BYTES = Unit(" bytes", hint=SIZE_HINT)
# a size, or 0 or off for none (a cap that caps nothing)
CapSize = Annotated[int, BeforeValidator(_cap_size), BYTES]
# the most a rank's output.log holds on its node (scheduler/node/supervisor_output.py); 0 or off: no limit
OutputLimit = Annotated[CapSize, AfterValidator(_output_limit)]


# A host name, an IPv4 address or an IPv6 address (bracketed or not, with an optional %zone). Anything else (a
# space, '@', '/', a leading '-' that ssh would read as an option) is no address SSH can reach.
_ADDRESS = re.compile(r"^(?!-)[A-Za-z0-9_.:%\[\]-]+$")


def check_no_user(text: str, key: str = "host") -> str:
    """`text` unless it has a user in it (`root@10.0.0.1`, as ssh takes it): ValueError saying where the user goes.
    Checked before the text is read as a node set, which would take '@' for a node group."""
    user, at, address = text.partition("@")
    if at:
        raise ValueError(
            f"{key} {text!r}: {key} takes an address only (a host name or IP address, or a node set of them, as "
            f"10.0.0.[1-4]); the user goes in this group's `user:` (or ssh.user for every node): "
            f"{key}: {address or '10.0.0.1'} with user: {user or 'root'}"
        )
    return text


def check_address(address: str, key: str = "host") -> str:
    """`address` if SSH can reach it as a host; ValueError naming `key` otherwise."""
    check_no_user(address, key)
    if not _ADDRESS.match(address):
        raise ValueError(
            f"{key} {address!r} is not a reachable address: give a host name or an IP address "
            "(letters, digits, '.', '-', '_', ':'; not starting with '-')"
        )
    return address
