"""The console's screens as pictures for the README and docs/console.md: Textual's own screenshots (SVG), of the
fixed data the snapshot tests use (tests/console_data.py) at a fixed clock, so a picture changes only when the
console's look does.

    make screenshots            # writes docs/images/console-*.svg
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "images"

from ftconsole.tui.app import ConsoleApp  # noqa: E402
from tests.console_data import NOW, FixedClient, ManyNodesClient, fixed_config  # noqa: E402


async def _job_curves(app: ConsoleApp, pilot: Any) -> None:
    from textual.widgets import TabbedContent

    app.open_job(101)
    await pilot.pause(0.3)
    app.screen.query_one(TabbedContent).active = "curves"
    await pilot.pause(0.5)


async def _node(app: ConsoleApp, pilot: Any) -> None:
    app.open_node("gpu03")
    await pilot.pause(0.5)
    app.screen.query_one("#curves-text").scroll_visible(animate=False)
    await pilot.pause(0.3)


async def _keys(app: ConsoleApp, pilot: Any, keys: list[str]) -> None:
    await pilot.press(*keys)
    await pilot.pause(0.3)


# name -> (client, terminal size, first view, what to do before the picture)
SHOTS: dict[str, tuple[Any, tuple[int, int], str, Callable[[ConsoleApp, Any], Awaitable[None]] | None]] = {
    "map-300-nodes": (ManyNodesClient(300), (150, 36), "map", None),
    "map": (FixedClient(), (120, 14), "map", None),
    "jobs": (FixedClient(), (160, 16), "jobs", None),
    "timeline": (FixedClient(), (160, 14), "timeline", None),
    "shares": (FixedClient(), (150, 12), "shares", None),
    "job-curves": (FixedClient(), (120, 24), "jobs", _job_curves),
    "node": (FixedClient(), (120, 50), "nodes", _node),
}


async def shoot(name: str, folder: Path) -> Path:
    client, size, view, then = SHOTS[name]
    app = ConsoleApp(fixed_config(folder), client=client, clock=lambda: NOW, refresh_s=3600, view=view)
    async with app.run_test(size=size) as pilot:
        app.sub_title = "cluster.yaml"
        await app.refresh_data("jobs", "nodes", "alerts", "events", "cluster", "reservations", "job_util", "forecast",
                               "shares")  # fmt: skip
        await pilot.pause(0.3)
        if then is not None:
            await then(app, pilot)
        path = OUT / f"console-{name}.svg"
        app.save_screenshot(path.name, str(OUT))
        return path


async def main() -> int:
    os.environ.pop("NO_COLOR", None)  # colour: the pictures show what a terminal shows
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ft-shots-") as tmp:
        for name in SHOTS:
            folder = Path(tmp) / name
            folder.mkdir()
            path = await shoot(name, folder)
            print(f"{path.relative_to(ROOT)}  {path.stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
