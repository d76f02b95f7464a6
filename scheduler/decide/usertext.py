"""Text a job's user wrote, made safe to keep and to show (issue 40, part 7).

A run's status.json (`error`, `step`, `signal`, what a scan of its output found), the names in a rank's stack and
its processes' command lines are the job user's words: they reach the store, the CLI, the console and the
notifications. A terminal takes some characters as commands: ESC starts a sequence that sets a window's title,
clears the screen, moves the cursor or writes to the clipboard (OSC 52); a C1 control (0x9b is CSI) does the
same in one byte on some terminals. `clean` drops every control character but newline and tab, and with ESC (and
CSI) the introducer of every escape sequence: what is left of one (`]0;title`, `[2J`) is plain text. Pure; tested
from tables (tests/unit/test_usertext.py).
"""

from __future__ import annotations

import re
from typing import Any

# C0 controls but tab (0x09) and newline (0x0a), DEL, C1 controls (0x80-0x9f)
CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text: str) -> str:
    """`text` without control characters (newline and tab stay)."""
    return CONTROLS.sub("", text)


def clean_json(value: Any) -> Any:
    """A JSON value with `clean` applied to every string in it, keys too; other values as they are."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, list):
        return [clean_json(v) for v in value]
    if isinstance(value, dict):
        return {clean(k) if isinstance(k, str) else k: clean_json(v) for k, v in value.items()}
    return value
