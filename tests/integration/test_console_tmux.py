"""The real program in a real terminal: `ftconsole` in tmux, driven with send-keys, read with capture-pane.

The lab runs as its own background process (`ftconsole lab up`); the console runs the scheduler embedded.
The test switches views, filters, opens a node's debug shell (the app suspends, the system `ssh -t` runs on the
terminal, the app comes back when it exits), moves over the cluster map and opens a node from it, reads the
timeline of two jobs submitted from another terminal, and quits, checking what is on the screen at each step.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed (apt-get install tmux)")

FTCONSOLE = [sys.executable, "-c", "import sys; from ftconsole.cli import main; sys.exit(main())"]


class Tmux:
    def __init__(self, socket: Path) -> None:
        self.socket = socket

    def __call__(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-S", str(self.socket), *args], capture_output=True, text=True, timeout=10)
        return done.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "console")

    def wait(self, *texts: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if all(t in screen for t in texts):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {texts!r} on the screen:\n{screen}")

    def keys(self, *keys: str) -> None:
        self("send-keys", "-t", "console", *keys)

    def start(self, command: str, width: int, height: int) -> None:
        """`command` in a window of `width` x `height`, in colour (NO_COLOR dropped), as session "console"."""
        env = {**os.environ, "TERM": "xterm-256color"}
        env.pop("NO_COLOR", None)
        started = subprocess.run(
            ["tmux", "-S", str(self.socket), "new-session", "-d", "-s", "console", "-x", str(width), "-y", str(height),
             command], env=env, capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr

    def quit(self) -> None:
        """`q`, then the session must end within 20 s."""
        self.keys("q")
        deadline = time.monotonic() + 20
        while "console" in self("list-sessions") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "console" not in self("list-sessions"), self.screen()


@pytest.fixture
def lab_config(tmp_path: Path) -> Iterator[Path]:
    lab_dir = Path(os.environ["FTCONSOLE_LAB_DIR"])
    up = subprocess.run([*FTCONSOLE, "lab", "up", "--dir", str(lab_dir), "--nodes", "2"], capture_output=True,
                        text=True, timeout=120)  # fmt: skip
    assert up.returncode == 0, up.stderr
    try:
        yield lab_dir / "cluster.yaml"
    finally:
        subprocess.run([*FTCONSOLE, "lab", "down", "--dir", str(lab_dir)], capture_output=True, timeout=60)


def test_console_in_a_real_terminal(tmp_path: Path, lab_config: Path) -> None:
    tmux = Tmux(tmp_path / "tmux.sock")
    tmux.start(" ".join([*(f"'{a}'" for a in FTCONSOLE), "--config", str(lab_config)]), 180, 40)
    try:
        screen = tmux.wait("Jobs", "scheduler embedded", "q Quit")
        tmux.keys("2")
        screen = tmux.wait("Nodes", "lab01", "lab02", "healthy")
        tmux.keys("/")
        time.sleep(0.5)
        tmux.keys("lab02", "Enter")
        screen = tmux.wait("1 of 2")
        assert "lab01" not in screen.split("1 of 2", 1)[1]

        tmux.keys("s")  # the debug shell on lab02: the app gives the terminal to ssh -t
        tmux.wait("lab02", "exit")
        tmux.keys("echo marker-$((6*7))", "Enter")
        screen = tmux.wait("marker-42")
        tmux.keys("exit", "Enter")
        screen = tmux.wait("Nodes", "1 of 2", "q Quit")  # the app is back, as it was
        assert "marker-42" not in screen

        tmux.keys("Escape")  # clears the filter
        deadline = time.monotonic() + 10
        while "1 of 2" in tmux.screen() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "lab01" in tmux.screen() and "1 of 2" not in tmux.screen()
        tmux.keys("1")
        tmux.wait("Jobs", "0 jobs")

        tmux.keys("6")  # the map: a small cluster's nodes by name, a cell per GPU
        screen = tmux.wait("Map", "2 nodes ·", "lab01 ", "lab02 ", "lab02  ·  healthy")  # a100 comes first
        tmux.keys("Right")  # the cursor to the next node: the line under the map follows it
        tmux.wait("lab01  ·  healthy")
        tmux.keys("Enter")  # its screen
        tmux.wait("Checks", "gpu-check", "pool h100")
        tmux.keys("Escape")
        tmux.wait("Map", "lab01  ·  healthy")

        # the timeline: a job running on lab01 (the only node with 8 GPUs) until its hour is up, and one
        # expected to start when it ends, both submitted from another terminal
        ids = [submit(lab_config, tmp_path, name, limit) for name, limit in (("first-in-line", "1h"),
                                                                               ("next-in-line", "30m"))]  # fmt: skip
        try:
            tmux.keys("7")
            tmux.wait("Timeline", "1 running · 1 expected", "next-in-line", timeout=60)
            tmux.wait("first-in-line (", "running on lab01; its time limit ends it at")
            tmux.keys("Enter")  # the running job's screen, then its Curves tab (`3`)
            tmux.wait("first-in-line", "running", "Overview", "Curves")
            tmux.keys("3")
            tmux.wait("rank 0 on lab01, GPUs 0,1,2,3,4,5,6,7", "util", "mem")
            tmux.keys("Escape")
            tmux.wait("Timeline", "first-in-line (")
            tmux.keys("Down")
            tmux.wait("next-in-line (", "expected from", "on lab01")
            tmux.keys("Enter")  # the job's screen
            tmux.wait("next-in-line", "queued", "Overview")
            tmux.keys("Escape")
            tmux.wait("Timeline", "next-in-line (")
            tmux.keys("8")  # the shares: no fair share in the lab's config, so the sums, with the job that runs
            tmux.wait("Shares", "fair share off (scheduler.fairshare)", "projects", "users", "  root")
        finally:
            subprocess.run([*FTCONSOLE, "--config", str(lab_config), "stop", *ids], capture_output=True, timeout=60)
        tmux.quit()
    finally:
        tmux("kill-server")


def submit(config: Path, folder: Path, name: str, limit: str) -> str:
    """A job of 8 GPUs sleeping under `limit`, submitted with the CLI; its id."""
    spec = folder / f"{name}.yaml"
    spec.write_text(f"name: {name}\ncommand: sleep 600\ngpus_per_node: 8\nmax_runtime: {limit}\n")
    done = subprocess.run([*FTCONSOLE, "--config", str(config), "submit", str(spec)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-1] if done.stdout.split() else ""


def test_the_map_of_1000_nodes_in_a_real_terminal(tmp_path: Path) -> None:
    """The bench's size in a real 200x50 terminal: 1,000 nodes of 8 GPUs (fixed data, the app itself) on one screen,
    both pools' headers in sight, and the cursor sent to the last node with `end`."""
    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "map.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(root)!r})\n"
        "from pathlib import Path\n"
        "from ftconsole.tui.app import ConsoleApp\n"
        "from tests.console_data import NOW, ManyNodesClient, fixed_config\n"
        f"app = ConsoleApp(fixed_config(Path({str(tmp_path)!r})), client=ManyNodesClient(1000), clock=lambda: NOW,\n"
        "                 refresh_s=3600, view='map')\n"
        "app.run()\n"
    )
    tmux = Tmux(tmp_path / "tmux.sock")
    tmux.start(f"'{sys.executable}' '{script}'", 200, 50)
    try:
        screen = tmux.wait("1000 nodes · 8000 GPUs", "infer · 8x H100", "train · 8x H100", "node0000  ·")
        assert "▀" in screen  # half blocks: two GPUs a cell
        tmux.keys("End")
        tmux.wait("node0999  ·", "infer · 8x H100", "train · 8x H100")  # the last node; the map did not scroll
        tmux.quit()
    finally:
        tmux("kill-server")


def bench_console(tmp_path: Path, view: str) -> Tmux:
    """The console on the console bench's synthetic cluster (1,000 nodes, 10,000 jobs), on `view`, in a real
    200x50 terminal."""
    root = Path(__file__).resolve().parents[2]
    script = tmp_path / f"{view}.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(root)!r})\n"
        "from pathlib import Path\n"
        "from bench.console import SyntheticCluster\n"
        "from ftconsole.tui.app import ConsoleApp\n"
        "from tests.console_data import fixed_config\n"
        "source = SyntheticCluster(1000, 10000, 1)\n"
        f"app = ConsoleApp(fixed_config(Path({str(tmp_path)!r})), client=source, clock=lambda: source.now,\n"
        f"                 refresh_s=3600, view={view!r})\n"
        "app.run()\n"
    )
    tmux = Tmux(tmp_path / "tmux.sock")
    tmux.start(f"'{sys.executable}' '{script}'", 200, 50)
    return tmux


def test_the_jobs_and_nodes_of_the_bench_in_a_real_terminal(tmp_path: Path) -> None:
    """The console bench's cluster (1,000 nodes, 10,000 jobs) in a real 200x50 terminal: the Jobs view's counts,
    a filter that leaves only its matches on screen and goes with escape, then the Nodes view to its last node."""
    tmux = bench_console(tmp_path, "jobs")
    try:
        tmux.wait("Jobs", "2000 running · 6000 queued · 10000 jobs", "RUNTIME/MAX", timeout=90)
        tmux.keys("/")
        time.sleep(0.5)
        tmux.keys("speech-dpo", "Enter")
        screen = tmux.wait("/speech-dpo/ ", " of 10000")
        rows = [line for line in screen.splitlines()[3:] if line.strip()[:1].isdigit()]
        assert rows and all("speech-dpo" in line for line in rows), rows
        tmux.keys("Escape")  # the filter goes: from the title and from the bar
        screen = tmux.wait("/ filters the view")
        assert "/speech-dpo/" not in screen
        tmux.keys("2")
        tmux.wait("Nodes", "1000 nodes", "UTIL HISTORY")
        tmux.keys("End")
        tmux.wait("gpu1000 ")
        tmux.quit()
    finally:
        tmux("kill-server")


def test_the_timeline_of_10000_jobs_in_a_real_terminal(tmp_path: Path) -> None:
    """The console bench's cluster (1,000 nodes, 10,000 jobs, its synthetic forecast: 500 expected, the rest
    past the queue depth) in a real 200x50 terminal: pools with their rows, the cursor sent to the last row (and
    the count of the jobs past the queue depth after it), and a zoom out."""
    tmux = bench_console(tmp_path, "timeline")
    try:
        screen = tmux.wait("Timeline", " running · 500 expected · ", "pool infer", "┊", timeout=90)
        assert "█" in screen and "▒" in screen
        last = ("no expected start  ", "more queued jobs: waiting: behind the first 500 jobs")
        for _ in range(5):  # the last row, and the line after it: the jobs past the queue depth, counted. A key
            tmux.keys("End")  # pressed while a busy machine still draws the first updates may be lost: again
            with contextlib.suppress(AssertionError):
                tmux.wait(*last, timeout=6)
                break
        else:
            tmux.wait(*last, timeout=6)
        title = next(line for line in tmux.screen().splitlines() if "Timeline" in line)
        tmux.keys("[")  # zoom out: more time a column
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            now = next(line for line in tmux.screen().splitlines() if "Timeline" in line)
            if now.split(" a column")[0] != title.split(" a column")[0]:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the zoom did not change the time a column: {title}")
        tmux.quit()
    finally:
        tmux("kill-server")


def test_the_shares_of_10000_jobs_in_a_real_terminal(tmp_path: Path) -> None:
    """The console bench's cluster (1,000 nodes, 10,000 jobs of 40 users in 6 projects, its synthetic shares) in
    a real 200x50 terminal: every project and user, the bars of use against due."""
    tmux = bench_console(tmp_path, "shares")
    try:
        screen = tmux.wait("Shares", "fair share per project, then user", "projects", "  llm", "  vision", timeout=90)
        assert "│" in screen and "x " in screen  # the bars, with their ratios
        tmux.keys("End")  # the last user
        tmux.wait("users", "  user")
        tmux.quit()
    finally:
        tmux("kill-server")
