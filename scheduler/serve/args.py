"""The API's arguments as the ops read them (`daemon.Operations`, `pictures.PictureOps`)."""

from __future__ import annotations

import math
from typing import Any

from ftconsole.scheduler.errors import UsageError


def time_arg(args: dict[str, Any], key: str) -> float | None:
    """A time argument (seconds since the epoch), or None where not given."""
    value = args.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"{key}: seconds since the epoch, not {value!r}")
    return float(value)
