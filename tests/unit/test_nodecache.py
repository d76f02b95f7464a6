"""The supervisor kept on the node by its hash (scheduler.ssh.nodecache): the first call sends it whole and stores it,
the next ones send only the loader; a copy that is missing or changed is never run, and is sent again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftconsole.scheduler.spec.config import Node
from ftconsole.scheduler.ssh import nodecache
from ftconsole.scheduler.ssh.probing import agent_source
from ftconsole.scheduler.ssh.runs import supervisor_source
from ftconsole.scheduler.ssh.transport import CommandResult
from tests.unit.test_agent import python38

PORT = {"action": "port"}


def call(home: Path, cached: bool, python: str = sys.executable) -> list[str]:
    script = nodecache.script("supervisor", supervisor_source(), PORT, cached=cached)
    done = subprocess.run([python, "-"], input=script, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "HOME": str(home)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def stored(home: Path) -> Path:
    return home / ".ftconsole" / "lib" / f"supervisor-{nodecache.digest(supervisor_source())}.py"


@pytest.mark.parametrize("interpreter", ["this", "python3.8"])
def test_sent_whole_once_then_only_the_loader(tmp_path: Path, interpreter: str) -> None:
    python = sys.executable if interpreter == "this" else python38()
    if python is None:
        pytest.skip("no Python 3.8 interpreter on this machine")
    assert call(tmp_path, cached=True, python=python) == [nodecache.MISSING]  # nothing there yet: nothing runs
    first = call(tmp_path, cached=False, python=python)
    assert first[0] == nodecache.STORED and json.loads(first[1])["port"] > 0
    assert stored(tmp_path).read_text() == supervisor_source()
    assert (stored(tmp_path).stat().st_mode & 0o777, (tmp_path / ".ftconsole").stat().st_mode & 0o777) == (0o600, 0o700)
    again = call(tmp_path, cached=True, python=python)
    assert len(again) == 1 and json.loads(again[0])["port"] > 0
    small = nodecache.script("supervisor", supervisor_source(), PORT, cached=True)
    assert len(small) < 2500 < 60_000 < len(supervisor_source())  # what a status read costs now, and before


def test_a_changed_copy_is_never_run_and_is_replaced(tmp_path: Path) -> None:
    call(tmp_path, cached=False)
    stored(tmp_path).write_text('print(\'{"supervisor": 2, "port": 1}\')\n')  # not the bytes the hash names
    assert call(tmp_path, cached=True) == [nodecache.MISSING]
    assert call(tmp_path, cached=False)[0] == nodecache.STORED
    assert stored(tmp_path).read_text() == supervisor_source()


def test_a_home_that_cannot_be_written_still_runs_it_whole(tmp_path: Path) -> None:
    home = tmp_path / "ro"
    home.mkdir()
    (home / ".ftconsole").write_text("a file where the folder would go")
    lines = call(home, cached=False)
    assert nodecache.STORED not in lines and json.loads(lines[-1])["port"] > 0


def test_other_versions_are_removed_once_stale(tmp_path: Path) -> None:
    folder = tmp_path / ".ftconsole" / "lib"
    folder.mkdir(parents=True)
    old, recent = folder / ("supervisor-" + "0" * 64 + ".py"), folder / ("supervisor-" + "1" * 64 + ".py")
    for path in (old, recent):
        path.write_text("x")
    week = time.time() - nodecache.STALE_S - 60
    os.utime(old, (week, week))
    call(tmp_path, cached=False)
    assert sorted(p.name for p in folder.iterdir()) == sorted([recent.name, stored(tmp_path).name])


class LocalTransport:
    """Runs the program here with `python3 -` under a given HOME, as a node would; records what was sent."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.sent: list[int] = []

    async def run(self, node: Node, argv: list[str], *, input: str, timeout: float) -> CommandResult:
        self.sent.append(len(input))
        done = subprocess.run([sys.executable, "-"], input=input, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "HOME": str(self.home)})  # fmt: skip
        return CommandResult(node.name, tuple(argv), done.returncode, None, done.stdout, done.stderr, 0.0)


async def test_run_keeps_track_of_what_each_node_holds(tmp_path: Path) -> None:
    transport = LocalTransport(tmp_path)
    node = Node(name=f"n{os.getpid()}", host="127.0.0.9", port=None, user=None, pool="default")
    source = agent_source()

    async def probe() -> dict:
        result = await nodecache.run(transport, node, ["python3", "-"], name="agent", source=source,
                                     params={"checks": ["os"], "timeout": 5.0}, timeout=30)  # fmt: skip
        assert nodecache.STORED not in result.stdout
        return json.loads(result.stdout.splitlines()[-1])

    first, second = await probe(), await probe()
    assert first["facts"]["os"] and second["facts"]["os"]
    assert transport.sent[0] > 10_000 > 2_500 > transport.sent[1]  # whole once, then the loader
    (tmp_path / ".ftconsole" / "lib" / f"agent-{nodecache.digest(source)}.py").unlink()  # the node lost it
    assert (await probe())["facts"]["os"]
    assert transport.sent[2] < 2_500 < 10_000 < transport.sent[3]  # told it is missing: sent whole at once
    assert transport.sent[4:] == []
