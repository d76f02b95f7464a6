"""`ftconsole completion bash|zsh`: scripts made from the parser, checked by the shells themselves (`bash -n`,
`zsh -n`), then run: the completion function is called on a table of command lines, as the shell calls it
(bash: COMP_WORDS and COMP_CWORD; zsh: words and CURRENT, with its completion builtins stubbed to print what
they are given)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ftconsole import completion
from ftconsole.cli import build_parser, main

TIMEOUT = 30
ZSH = shutil.which("zsh")
needs_zsh = pytest.mark.skipif(ZSH is None, reason="zsh is not installed (Debian: zsh)")


def subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub


def commands_of(*path: str) -> list[str]:
    """The subcommands the parser has after `ftconsole PATH...` (others may add some: read, not listed)."""
    parser = build_parser()
    for name in path:
        parser = subparsers(parser).choices[name]
    return list(subparsers(parser).choices)


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both scripts, as `ftconsole completion SHELL` prints them, written to files; a folder to complete in."""
    folder = tmp_path_factory.mktemp("completion")
    out = {}
    for shell in completion.SHELLS:
        done = subprocess.run(
            [sys.executable, "-m", "ftconsole.cli", "completion", shell], capture_output=True, text=True,
            timeout=TIMEOUT, check=True,
        )  # fmt: skip
        out[shell] = folder / f"ftconsole.{shell}"
        out[shell].write_text(done.stdout)
    work = folder / "work"
    (work / "runs").mkdir(parents=True)
    (work / "job.yaml").touch()
    out["work"] = work
    return out


def test_the_scripts_name_every_command(scripts: dict[str, Path]) -> None:
    commands = commands_of()
    assert {"submit", "jobs", "config", "lab", "completion"} <= set(commands)
    for shell in completion.SHELLS:
        text = scripts[shell].read_text()
        assert all(name in text for name in commands), shell
        # a command added to the parser is in the script: it is read from the parser, not from a list
        parser = build_parser()
        added = subparsers(parser).add_parser("brand-new", help="added by a test")
        added.add_argument("--brand-flag", action="store_true")
        again = completion.script(parser, shell)
        assert "brand-new" in again and "--brand-flag" in again


def test_bash_reads_the_script() -> None:
    bash = shutil.which("bash")
    assert bash is not None  # the tests run on Linux, where bash is
    done = subprocess.run([bash, "-n", "-c", completion.script(build_parser(), "bash")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@needs_zsh
def test_zsh_reads_the_script(scripts: dict[str, Path]) -> None:
    assert ZSH is not None
    done = subprocess.run([ZSH, "-n", str(scripts["zsh"])], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    # sourced after compinit, or found in fpath as _ftconsole: either way it completes ftconsole
    fpath = scripts["zsh"].parent / "fpath"
    fpath.mkdir(exist_ok=True)
    shutil.copy(scripts["zsh"], fpath / "_ftconsole")
    for setup in (f"compinit -u -D; source {scripts['zsh']}", f"fpath=({fpath} $fpath); compinit -u -D"):
        code = f"autoload -Uz compinit; {setup}; print -r -- $_comps[ftconsole]"
        done = subprocess.run(
            [ZSH, "-f", "-c", code], capture_output=True, text=True, timeout=TIMEOUT, env={"HOME": str(fpath)}
        )
        assert done.stdout.strip() == "_ftconsole", (setup, done.stdout, done.stderr)


# (the command line typed so far, the candidates offered, each shell alike); "FILES": the folder's file names
CASES = [
    ("ftconsole su", ["submit"]),
    ("ftconsole ", commands_of()),
    ("ftconsole config ", commands_of("config")),  # check, example, systemd...
    ("ftconsole config check --j", ["--json"]),
    ("ftconsole jobs --st", ["--start", "--state", "--status"]),
    ("ftconsole -c cluster.yaml jobs --js", ["--json"]),
    ("ftconsole jobs --owner alice --exp", ["--expand"]),
    ("ftconsole priority 12 ", ["normal", "urgent", "very-urgent"]),
    ("ftconsole priority ", []),  # a job id: nothing is looked up
    ("ftconsole alerts ", ["ack", "resolve"]),
    ("ftconsole alerts ack ", []),
    ("ftconsole usage --by ", ["user", "project"]),
    ("ftconsole completion ", ["bash", "zsh"]),
    ("ftconsole lab ", commands_of("lab")),  # up, down, status, fault
    ("ftconsole lab up --sh", ["--shared-home"]),
    ("ftconsole state b", ["backup"]),
    ("ftconsole --config ", "FILES"),
    ("ftconsole submit ", "FILES"),
    ("ftconsole lab up --dir ", "DIRS"),
]


def expected(candidates: list[str] | str, work: Path) -> list[str]:
    if candidates == "FILES":
        return sorted(p.name for p in work.iterdir())
    if candidates == "DIRS":
        return sorted(p.name for p in work.iterdir() if p.is_dir())
    return sorted(candidates)


BASH_CALL = """
source {script}
COMP_WORDS=({words})
COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))
_ftconsole
printf '%s\\n' "${{COMPREPLY[@]}}"
"""


@pytest.mark.parametrize(("line", "candidates"), CASES, ids=[c[0] for c in CASES])
def test_bash_completes(scripts: dict[str, Path], line: str, candidates: list[str] | str) -> None:
    words = " ".join(f"'{w}'" for w in [*line.split(), *([""] if line.endswith(" ") else [])])
    code = BASH_CALL.format(script=scripts["bash"], words=words)
    done = subprocess.run(["bash", "-c", code], cwd=scripts["work"], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert sorted(w.rstrip("/") for w in done.stdout.split()) == expected(candidates, scripts["work"])


# zsh's completion builtins, stubbed: each prints the candidates it would offer, one a line; _files lists the
# folder as zsh would (-/: folders only)
ZSH_CALL = """
compdef() {{ : }}
_describe() {{ local -a entries; entries=(${{(P)${{@[-1]}}}}); print -rl -- ${{entries%%:*}} }}
compadd() {{ [[ $1 == -- ]] && shift; print -rl -- "$@" }}
_files() {{ if [[ $1 == -/ ]]; then print -rl -- *(/); else print -rl -- *; fi }}
source {script}
words=({words})
CURRENT=$#words
_ftconsole
true
"""


@needs_zsh
@pytest.mark.parametrize(("line", "candidates"), CASES, ids=[c[0] for c in CASES])
def test_zsh_completes(scripts: dict[str, Path], line: str, candidates: list[str] | str) -> None:
    assert ZSH is not None
    words = " ".join(f"'{w}'" for w in [*line.split(), *([""] if line.endswith(" ") else [])])
    code = ZSH_CALL.format(script=scripts["zsh"], words=words)
    done = subprocess.run([ZSH, "-f", "-c", code], cwd=scripts["work"], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    cur = line.split()[-1] if not line.endswith(" ") else ""
    offered = sorted(w for w in done.stdout.split() if w.startswith(cur))  # zsh filters by the prefix itself
    assert offered == expected(candidates, scripts["work"])


def test_completion_needs_a_known_shell(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "fish"]) == 2
    assert "argument shell: invalid choice: 'fish' (choose from 'bash', 'zsh')" in capsys.readouterr().err


def test_descriptions_are_one_short_line() -> None:
    assert completion.describe("cluster config (default: $FTCONSOLE_CONFIG, else ...)") == "cluster config"
    assert completion.describe("resize an elastic job;\n  more") == "resize an elastic job"
    long = completion.describe("word " * 40)
    assert len(long) == completion.DESCRIPTION_CHARS and long.endswith("...")
