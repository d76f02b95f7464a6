"""Small text formatters shared by the CLI and the console."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def gpu_summary(gpus: Sequence[dict[str, Any]]) -> str:
    if not gpus:
        return "-"
    names = {g.get("name") or "?" for g in gpus}
    name = names.pop() if len(names) == 1 else "mixed"
    short = name.replace("NVIDIA ", "")
    return f"{len(gpus)}x {short}"
