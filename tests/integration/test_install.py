"""The install as README.md's "Install on a cluster" writes it, tried from outside the source tree: a wheel
built with `python -m build`, installed with pip into a fresh venv, then the first commands of a new operator
(`--version`, `config example` into ~/.config, `config check`, a `submit` with no scheduler serving).

To stay fast and offline the wheel is built without build isolation (the dev venv has setuptools, setuptools-scm
and build, from the dev extras), and the fresh venv borrows the dev venv's dependencies through a .pth file, so pip
installs the wheel alone (`--no-deps`). Nothing else of the dev venv is visible: ftconsole itself comes from
the wheel (checked). The copy has no git history, so the build is told the version git gives this checkout
(what a build from the repository gets), and `--version` of the install must print it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER_FOLDERS = tuple(f"ftconsole/scheduler/{d}" for d in ("node", "spec", "decide", "ssh", "store", "serve"))
SOURCES = ("pyproject.toml", "README.md", "ftconsole", "scheduler", "probes")  # what the build reads
TIMEOUT = 120


def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False, **kwargs)


@pytest.fixture(scope="module")
def source_version() -> str:
    """The version setuptools-scm makes of this checkout (pyproject.toml's fallback where it has no git)."""
    made = run([sys.executable, "-m", "setuptools_scm"], cwd=ROOT)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, source_version: str) -> tuple[Path, Path]:
    """(a copy of the sources, the wheel built from it): the build writes nothing into the source tree."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
            shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=ignore)  # ftconsole/scheduler: a link
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    argv = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(src)]
    build = run(argv, cwd=src, env={**os.environ, "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_FTCONSOLE": source_version})
    assert build.returncode == 0, f"python -m build failed (make venv installs it):\n{build.stdout}\n{build.stderr}"
    (wheel,) = dist.glob("ftconsole-*.whl")
    assert wheel.name.startswith(f"ftconsole-{source_version}-"), wheel.name
    return src, wheel


@pytest.fixture(scope="module")
def venv(built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv outside the source tree with the wheel installed; its dependencies are the dev venv's."""
    _, wheel = built
    venv = tmp_path_factory.mktemp("venv")
    made = run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    (site / "dev-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)]
    installed = run(pip, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert installed.returncode == 0, f"{installed.stdout}\n{installed.stderr}"
    return venv


@pytest.fixture
def operator(venv: Path, tmp_path: Path, sock_dir: Path) -> tuple[Path, dict[str, str]]:
    """A working folder outside the source tree, and the environment of a user whose home is a fresh one (short:
    the default API socket is under it)."""
    home, work = sock_dir / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {"HOME": str(home), "PATH": f"{venv / 'bin'}:/usr/bin:/bin", "LANG": "C.UTF-8", "TERM": "dumb"}
    return work, env


def test_the_wheel_holds_every_module_and_data_file(built: tuple[Path, Path]) -> None:
    src, wheel = built
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in (
        "ftconsole",
        "ftconsole/scheduler",
        "ftconsole/probes",
        "ftconsole/tui",
        "ftconsole/lab",
        *SCHEDULER_FOLDERS,
    ):
        modules = {f"{folder}/{p.name}" for p in (src / folder).glob("*.py")}
        assert modules and modules <= names, f"{folder}: {sorted(modules - names)} missing from {wheel.name}"
    data = {"ftconsole/data/cluster.example.yaml", "ftconsole/data/ftconsole.service"}
    demo = {f"ftconsole/lab/demo_jobs/{p.name}" for p in (src / "ftconsole/lab/demo_jobs").glob("*.yaml")}
    assert data | demo <= names


def test_installed_ftconsole_runs_from_outside_the_source_tree(
    venv: Path, operator: tuple[Path, dict[str, str]], source_version: str
) -> None:
    work, env = operator
    ft = str(venv / "bin" / "ftconsole")

    def cli(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return run([ft, *args], cwd=work, env=env, **kwargs)

    where = run([str(venv / "bin" / "python"), "-c", "import ftconsole; print(ftconsole.__file__)"], cwd=work, env=env)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr  # the wheel's, not the source tree's
    assert cli("--version").stdout == f"ftconsole {source_version}\n"  # the build's, naming the commit

    # no config yet: the error says where one is looked for and how to make one
    missing = cli("jobs")
    assert missing.returncode == 2 and "ftconsole config example" in missing.stderr, missing.stderr

    # README, 3: the nodes' host keys in ~/.ssh/known_hosts (no node to scan here: the file, empty); without it,
    # config check refuses the example's host_key_policy: strict
    known = Path(env["HOME"]) / ".ssh" / "known_hosts"
    known.parent.mkdir(mode=0o700)
    known.write_text("")
    # README, 4: ftconsole config example > ~/.config/ftconsole/cluster.yaml, then config check
    config = Path(env["HOME"]) / ".config" / "ftconsole" / "cluster.yaml"
    config.parent.mkdir(parents=True)
    example = cli("config", "example")
    assert example.returncode == 0 and "state_dir:" in example.stdout
    config.write_text(example.stdout)
    checked = cli("config", "check")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith(f"{config}: ok (20 nodes in 2 pool(s): a100, h100)\n")
    piped = cli("--config", "-", "config", "check", input=example.stdout)
    assert piped.returncode == 0 and piped.stdout.startswith("/dev/stdin: ok"), piped.stderr

    # the systemd unit, for this install
    unit = cli("config", "systemd").stdout
    assert f"ExecStart={ft} --config {config} serve\n" in unit and "[Install]" in unit

    # a job with no scheduler serving: refused, saying why and how to start one; nothing queued
    job = work / "hello.yaml"
    job.write_text("name: hello\ncommand: echo hello\n")
    state = Path(env["HOME"]) / ".local" / "state" / "ftconsole"
    for wait in ([], ["--wait"]):
        refused = cli("submit", str(job), *wait)
        assert refused.returncode == 3 and refused.stdout == ""
        assert f"no scheduler is serving {state} (nothing answers on {state / 'ftconsole.sock'})" in refused.stderr
        assert "`ftconsole serve`" in refused.stderr and "--local" in refused.stderr
    listed = cli("jobs", "--json")
    assert listed.returncode == 0 and listed.stdout.strip() == "[]", listed.stderr
