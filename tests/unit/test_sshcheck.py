"""The pre-launch SSH check, node side (`scheduler/node/sshcheck.py`): how it connects the way each launcher will.

Tables of cases: a launcher, what its command line says (SETTINGS), its environment and files, in; the argv the
check runs for a peer, or why it does not run, out. The ways were taken from the launchers themselves, run with
a stand-in ssh (Open MPI 4.1, MPICH's hydra 4.0, pdsh 2.34). Every case runs in its own PATH, HOME and Open MPI
sysconfdir, so no file of this machine takes part.
"""

from __future__ import annotations

import ast
import os
import pwd
import sys
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.node import sshcheck
from ftconsole.scheduler.node.bundle import script
from ftconsole.scheduler.node.sshcheck import LAUNCHERS, Way, check, connection, way
from tests.unit.test_agent import imported_modules

OMPI, HYDRA, PDSH = LAUNCHERS["openmpi"], LAUNCHERS["hydra"], LAUNCHERS["pdsh"]
ME = pwd.getpwuid(os.getuid()).pw_name
BATCH = ["-o", "BatchMode=yes"]
OURS = ["-o", "ConnectTimeout=5"]
PROGRAMS = ("ssh", "rsh", "myssh", "mpirun", "mpiexec")  # stand-ins on the case's PATH


@pytest.fixture
def world(tmp_path: Path) -> dict[str, str]:
    """A PATH of stand-in programs (each records its argv), an empty HOME and Open MPI sysconfdir."""
    bin_dir, home, sysconf = tmp_path / "bin", tmp_path / "home", tmp_path / "sysconf"
    for folder in (bin_dir, home, sysconf):
        folder.mkdir()
    for name in PROGRAMS:
        program = bin_dir / name
        program.write_text('#!/bin/sh\necho "$@" >> "$0.calls"\nexit 0\n')
        program.chmod(0o755)
    return {"PATH": str(bin_dir), "HOME": str(home), "OPAL_SYSCONFDIR": str(sysconf)}


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if path.parent.name == "bin":
            path.chmod(0o755)


def argv_for(tmp_path: Path, world: dict[str, str], launcher: str, settings: dict[str, Any], env: dict[str, Any],
             files: dict[str, str]) -> list[str] | str:  # fmt: skip
    """The argv the check runs for host h2 (the second in the launcher's list), or why it does not run."""
    write(tmp_path, files)
    full = {**world, **{k: v.replace("TMP", str(tmp_path)) for k, v in env.items() if v is not None}}
    full = {k: v for k, v in full.items() if env.get(k, "") is not None}
    how = way(launcher, settings, full)
    return how if isinstance(how, str) else connection(how, "h2", 1, 5, full)[0]


# --- mpirun (Open MPI) -------------------------------------------------------------------------------------------

Case = tuple[dict[str, Any], dict[str, Any], dict[str, str], list[str] | str]
OPENMPI_CASES: dict[str, Case] = {
    "default: ssh, -x, ours before the host": ({}, {}, {}, ["ssh", *BATCH, "-x", *OURS, "h2", "true"]),
    "plm_rsh_args of the environment, after -x, before ours": (
        {}, {"OMPI_MCA_plm_rsh_args": "-p 2222 -i /k -o UserKnownHostsFile=/kh"}, {},
        ["ssh", *BATCH, "-x", "-p", "2222", "-i", "/k", "-o", "UserKnownHostsFile=/kh", *OURS, "h2", "true"],
    ),
    "args split at spaces only, quotes kept, as mpirun does": (
        {}, {"OMPI_MCA_plm_rsh_args": '-o  "A B"\t-q'}, {},
        ["ssh", *BATCH, "-x", "-o", '"A', 'B"\t-q', *OURS, "h2", "true"],
    ),
    "their ConnectTimeout stands: none of ours": (
        {}, {"OMPI_MCA_plm_rsh_args": "-oConnectTimeout=20"}, {},
        ["ssh", *BATCH, "-x", "-oConnectTimeout=20", "h2", "true"],
    ),
    "the user's file": (
        {}, {}, {"home/.openmpi/mca-params.conf": "# mine\n  plm_rsh_args = -p 7777 \n"},
        ["ssh", *BATCH, "-x", "-p", "7777", *OURS, "h2", "true"],
    ),
    "a file's last line of a name wins, its value taken to the end of the line": (
        {}, {}, {"home/.openmpi/mca-params.conf": "plm_rsh_args = -p 1\nplm_rsh_args = '-p 2' # x\n"},
        ["ssh", *BATCH, "-x", "'-p", "2'", "#", "x", *OURS, "h2", "true"],
    ),
    "the user's file beats the system's, which still gives what the user's does not": (
        {}, {},
        {"home/.openmpi/mca-params.conf": "plm_rsh_args = -p 7777\n",
         "sysconf/openmpi-mca-params.conf": "plm_rsh_args = -p 3333\nplm_rsh_agent = rsh\n"},
        ["rsh", "-p", "7777", "h2", "true"],
    ),
    "the environment beats the user's file": (
        {}, {"OMPI_MCA_plm_rsh_args": "-p 1"}, {"home/.openmpi/mca-params.conf": "plm_rsh_args = -p 7777\n"},
        ["ssh", *BATCH, "-x", "-p", "1", *OURS, "h2", "true"],
    ),
    "mpirun's command line beats the environment": (
        {"mca": {"plm_rsh_args": "-p 6"}}, {"OMPI_MCA_plm_rsh_args": "-p 1"}, {},
        ["ssh", *BATCH, "-x", "-p", "6", *OURS, "h2", "true"],
    ),
    "the override file beats the command line": (
        {"mca": {"plm_rsh_args": "-p 6"}}, {}, {"sysconf/openmpi-mca-params-override.conf": "plm_rsh_args=-p 4\n"},
        ["ssh", *BATCH, "-x", "-p", "4", *OURS, "h2", "true"],
    ),
    "Open MPI 5's names": (
        {}, {"PRTE_MCA_plm_ssh_args": "-p 5"}, {}, ["ssh", *BATCH, "-x", "-p", "5", *OURS, "h2", "true"],
    ),
    "rsh first in the agent list": ({}, {"OMPI_MCA_plm_rsh_agent": "rsh -q : ssh"}, {}, ["rsh", "-q", "h2", "true"]),
    "the first agent found in PATH": (
        {}, {"OMPI_MCA_plm_rsh_agent": "nothere : ssh -v"}, {}, ["ssh", *BATCH, "-v", "-x", *OURS, "h2", "true"],
    ),
    "an agent with -X gets no -x": (
        {}, {"OMPI_MCA_orte_rsh_agent": "ssh -X"}, {}, ["ssh", *BATCH, "-X", *OURS, "h2", "true"],
    ),
    "another program is run as mpirun would, its args after it": (
        {}, {"OMPI_MCA_plm_rsh_agent": "TMP/bin/myssh --go", "OMPI_MCA_plm_rsh_args": "-p 9"}, {},
        ["TMP/bin/myssh", "--go", "-p", "9", "h2", "true"],
    ),
    "the system file beside mpirun's bin": (
        {"program": "TMP/opt/bin/mpirun"}, {"OPAL_SYSCONFDIR": None},
        {"opt/bin/mpirun": "", "opt/etc/openmpi-mca-params.conf": "plm_rsh_args = -p 8\n"},
        ["ssh", *BATCH, "-x", "-p", "8", *OURS, "h2", "true"],
    ),
    "no agent in PATH: mpirun says so itself": (
        {}, {"OMPI_MCA_plm_rsh_agent": "nothere"}, {}, "mpirun finds no agent of plm_rsh_agent 'nothere'",
    ),
    "plm without rsh: no SSH at all": ({}, {"OMPI_MCA_plm": "isolated"}, {}, "mpirun is told plm=isolated"),
    "plm excluding rsh": ({"mca": {"plm": "^rsh"}}, {}, {}, "mpirun is told plm=^rsh"),
    "plm picking rsh": ({}, {"OMPI_MCA_plm": "rsh"}, {}, ["ssh", *BATCH, "-x", *OURS, "h2", "true"]),
}  # fmt: skip


@pytest.mark.parametrize("case", OPENMPI_CASES)
def test_openmpi_way(case: str, tmp_path: Path, world: dict[str, str]) -> None:
    settings, env, files, expected = OPENMPI_CASES[case]
    got = argv_for(tmp_path, world, OMPI, _tmp(settings, tmp_path), env, files)
    _expect(got, expected, tmp_path)


# --- hydra (MPICH) -----------------------------------------------------------------------------------------------

HYDRA_CASES: dict[str, Case] = {
    "default: ssh -x": ({}, {}, {}, ["ssh", *BATCH, "-x", *OURS, "h2", "true"]),
    "HYDRA_LAUNCHER=rsh": ({}, {"HYDRA_LAUNCHER": "rsh"}, {}, ["rsh", "h2", "true"]),
    "the old name HYDRA_BOOTSTRAP": ({}, {"HYDRA_BOOTSTRAP": "rsh"}, {}, ["rsh", "h2", "true"]),
    "HYDRA_LAUNCHER beats HYDRA_BOOTSTRAP": (
        {}, {"HYDRA_LAUNCHER": "ssh", "HYDRA_BOOTSTRAP": "rsh"}, {}, ["ssh", *BATCH, "-x", *OURS, "h2", "true"],
    ),
    "the launcher's program: -x for the ssh launcher, run as hydra would": (
        {}, {"HYDRA_LAUNCHER_EXEC": "myssh"}, {}, ["myssh", "-x", "h2", "true"],
    ),
    "extra args after -x": (
        {}, {"HYDRA_LAUNCHER_EXTRA_ARGS": "-p 2222  -i /k"}, {},
        ["ssh", *BATCH, "-x", "-p", "2222", "-i", "/k", *OURS, "h2", "true"],
    ),
    "extra args with rsh too": (
        {}, {"HYDRA_LAUNCHER": "rsh", "HYDRA_LAUNCHER_EXTRA_ARGS": "-p 2222"}, {}, ["rsh", "-p", "2222", "h2", "true"],
    ),
    "the home config file beats the environment": (
        {}, {"HYDRA_LAUNCHER": "ssh"}, {"home/.mpiexec.hydra.conf": "# mine\n-launcher rsh # here\n"},
        ["rsh", "h2", "true"],
    ),
    "HYDRA_CONFIG_FILE rather than the home file": (
        {}, {"HYDRA_CONFIG_FILE": "TMP/h.conf"},
        {"home/.mpiexec.hydra.conf": "-launcher rsh\n", "h.conf": "-launcher-exec=myssh\n"},
        ["myssh", "-x", "h2", "true"],
    ),
    "the config file beside hydra's bin": ({}, {}, {"etc/mpiexec.hydra.conf": "-launcher rsh"}, ["rsh", "h2", "true"]),
    "the command line beats the config file": (
        {"hydra": {"launcher": "ssh"}}, {}, {"home/.mpiexec.hydra.conf": "-launcher rsh\n"},
        ["ssh", *BATCH, "-x", *OURS, "h2", "true"],
    ),
    "-disable-x": ({"hydra": {"x": ""}}, {}, {}, ["ssh", *BATCH, *OURS, "h2", "true"]),
    "-enable-x": ({}, {}, {"home/.mpiexec.hydra.conf": "--enable-x"}, ["ssh", *BATCH, "-X", *OURS, "h2", "true"]),
    "the slurm launcher: no SSH": ({}, {"HYDRA_LAUNCHER": "slurm"}, {}, "hydra is told to use its slurm launcher"),
    "the fork launcher: every rank here": ({"hydra": {"launcher": "fork"}}, {}, {}, "hydra is told to use its fork"),
    "a launcher program not in PATH": (
        {}, {"HYDRA_LAUNCHER_EXEC": "nothere"}, {}, "hydra's launcher program nothere is not in PATH",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", HYDRA_CASES)
def test_hydra_way(case: str, tmp_path: Path, world: dict[str, str]) -> None:
    settings, env, files, expected = HYDRA_CASES[case]
    got = argv_for(tmp_path, world, HYDRA, settings, env, files)
    _expect(got, expected, tmp_path)


@pytest.mark.parametrize(
    ("words", "options"),
    [
        (["-launcher", "rsh", "-launcher-exec", "/x"], {"launcher": "rsh", "launcher-exec": "/x"}),
        (["--bootstrap=rsh", "-bootstrap-exec=/x"], {"launcher": "rsh", "launcher-exec": "/x"}),
        (["-genv", "-launcher", "rsh", "-launcher", "ssh", "-launcher", "rsh"], {"launcher": "ssh"}),
        (["-enable-x", "-disable-x"], {"x": ""}),
        (["-n", "4", "-launcher"], {}),
    ],
)
def test_hydra_options(words: list[str], options: dict[str, str]) -> None:
    assert sshcheck.hydra_options(words) == options


# --- DeepSpeed's runner (pdsh) -----------------------------------------------------------------------------------

PDSH_SSH = ["ssh", *BATCH, "-oConnectTimeout=10"]
PDSH_CASES: dict[str, tuple[dict[str, str], dict[str, str], list[str] | str]] = {
    "default: pdsh's timeout first, -2 -a -x, no -l for oneself": ({}, {}, [*PDSH_SSH, "-2", "-a", "-x", "h2", "true"]),
    "--ssh_port: -p appended, before the standard args": (
        {"port": "2222"}, {}, [*PDSH_SSH, "-p", "2222", "-2", "-a", "-x", "h2", "true"],
    ),
    "PDSH_SSH_ARGS_APPEND first: its -p beats --ssh_port's": (
        {"port": "2222"}, {"PDSH_SSH_ARGS_APPEND": "-p 2200 -i /k"},
        [*PDSH_SSH, "-p", "2200", "-i", "/k", "-p", "2222", "-2", "-a", "-x", "h2", "true"],
    ),
    "PDSH_SSH_ARGS with %u and %h": (
        {}, {"PDSH_SSH_ARGS": "-q %u@%h"}, [*PDSH_SSH, "-q", f"{ME}@h2", "true"],
    ),
    "PDSH_SSH_ARGS without %h: the host appended": ({}, {"PDSH_SSH_ARGS": "-q"}, [*PDSH_SSH, "-q", "h2", "true"]),
    "PDSH_SSH_ARGS empty": ({}, {"PDSH_SSH_ARGS": ""}, [*PDSH_SSH, "h2", "true"]),
    "another user: -l%u added": ({"user": "bob"}, {"PDSH_SSH_ARGS": "-q"}, [*PDSH_SSH, "-q", "-lbob", "h2", "true"]),
    "another user, standard args": ({"user": "bob"}, {}, [*PDSH_SSH, "-2", "-a", "-x", "-lbob", "h2", "true"]),
    "%n is the rank, %% a percent": (
        {}, {"PDSH_SSH_ARGS": "-p %n -oX=%% %h"}, [*PDSH_SSH, "-p", "1", "-oX=%", "h2", "true"],
    ),
    "PDSH_CONNECT_TIMEOUT": (
        {}, {"PDSH_CONNECT_TIMEOUT": "3"}, ["ssh", *BATCH, "-oConnectTimeout=3", "-2", "-a", "-x", "h2", "true"],
    ),
    "-t of --launcher_args beats PDSH_CONNECT_TIMEOUT": (
        {"timeout": "7"}, {"PDSH_CONNECT_TIMEOUT": "3"},
        ["ssh", *BATCH, "-oConnectTimeout=7", "-2", "-a", "-x", "h2", "true"],
    ),
    "-t 0: no timeout of pdsh's, ours before the host": (
        {"timeout": "0"}, {}, ["ssh", *BATCH, "-2", "-a", "-x", *OURS, "h2", "true"],
    ),
    "PDSH_RCMD_TYPE is DeepSpeed's ssh whatever the environment says": (
        {}, {"PDSH_RCMD_TYPE": "rsh"}, [*PDSH_SSH, "-2", "-a", "-x", "h2", "true"],
    ),
    "-R rsh of --launcher_args: pdsh's own rsh": ({"rcmd": "rsh"}, {}, "pdsh is told -R rsh"),
    "-R exec": ({"rcmd": "exec"}, {}, "pdsh is told -R exec"),
}  # fmt: skip


@pytest.mark.parametrize("case", PDSH_CASES)
def test_pdsh_way(case: str, tmp_path: Path, world: dict[str, str]) -> None:
    pdsh, env, expected = PDSH_CASES[case]
    got = argv_for(tmp_path, world, PDSH, {"pdsh": pdsh} if pdsh else {}, env, {})
    _expect(got, expected, tmp_path)


# --- any launcher ------------------------------------------------------------------------------------------------


def test_another_launcher_name_gets_plain_ssh_and_a_skip_is_a_skip(world: dict[str, str]) -> None:
    how = way("the launcher", {}, world)
    assert isinstance(how, Way) and connection(how, "h2", 0, 5, world) == (["ssh", *BATCH, *OURS, "h2", "true"], 5)
    assert way(OMPI, {"skip": "horovodrun checks SSH itself"}, world) == "horovodrun checks SSH itself"


@pytest.mark.parametrize(
    ("env", "config", "timeout", "ours"),
    [
        ({}, "", 5, True),
        ({}, "connecttimeout none", 5, True),
        ({}, "user me\nconnecttimeout 30", 30, False),  # the user's ssh config: none of ours over it
        ({"OMPI_MCA_plm_rsh_args": "-o ConnectTimeout=30"}, "connecttimeout 30", 30, False),
        ({"OMPI_MCA_plm_rsh_args": "-oconnecttimeout=12 -o ConnectTimeout=40"}, "", 12, False),  # the first
        ({"OMPI_MCA_plm_rsh_args": "-o connecttimeout 12"}, "", 5, True),  # "-o connecttimeout" then "12"
        ({"OMPI_MCA_plm_rsh_agent": "rsh"}, "connecttimeout 30", 5, False),  # not ssh: our deadline
    ],
)
def test_the_deadline_follows_the_connect_timeout_ssh_uses(
    tmp_path: Path, world: dict[str, str], env: dict[str, str], config: str, timeout: int, ours: bool
) -> None:
    """ssh's ConnectTimeout: the launcher's options', else the user's ssh config's (``ssh -G``, asked with the
    same options and host), else ours; the connection's deadline follows it."""
    ssh = tmp_path / "bin" / "ssh"
    ssh.write_text(f'#!/bin/sh\necho "$@" >> "$0.calls"\n[ "$1" = -G ] && printf "{config}\\n"\nexit 0\n')
    how = way(OMPI, {}, {**world, **env})
    assert isinstance(how, Way)
    argv, seconds = connection(how, "h2", 0, 5, {**world, **env})
    assert seconds == timeout
    assert ("ConnectTimeout=5" in argv) is ours
    if how.ssh and how.timeout is None:
        asked = (tmp_path / "bin" / "ssh.calls").read_text().splitlines()
        assert asked == [" ".join(["-G", *argv[1:-1]]).replace(" -o ConnectTimeout=5", "")]


# --- the check, run -----------------------------------------------------------------------------------------------


def test_check_connects_as_mpirun_and_names_the_pair_that_fails(
    tmp_path: Path, world: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    ssh = tmp_path / "bin" / "ssh"
    ssh.write_text('#!/bin/sh\necho "$@" >> "$0.calls"\n'
                   'case "$*" in *10.0.0.3*) echo "Connection refused" >&2; exit 255;; esac\nexit 0\n')  # fmt: skip
    env = {**world, "OMPI_MCA_plm_rsh_args": "-p 2222 -i /k"}
    peers = [("n2", "10.0.0.2"), ("n3", "10.0.0.3")]
    assert check("n1", 5, {}, OMPI, peers, env) == 255
    calls = sorted(c for c in (tmp_path / "bin" / "ssh.calls").read_text().splitlines() if not c.startswith("-G"))
    assert calls == [f"-o BatchMode=yes -x -p 2222 -i /k -o ConnectTimeout=5 10.0.0.{i} true" for i in (2, 3)]
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "ftconsole: ssh check: n1 cannot reach n3 (10.0.0.3) by SSH without a prompt: " \
                      "Connection refused (ssh exit 255)"  # fmt: skip
    assert err[0].startswith(
        f"ftconsole: mpirun (OpenMPI) starts this job's ranks from n1 over SSH as {ME}; fix it on the nodes, then "
        "resubmit: on n1, 'ssh -o BatchMode=yes -x -p 2222 -i /k -o ConnectTimeout=5 HOST true' "
        "(plm_rsh_args from OMPI_MCA_plm_rsh_args) must work for HOST in 10.0.0.3 with no prompt"
    )


def test_check_passes_and_says_how(world: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    env = {**world, "PDSH_SSH_ARGS_APPEND": "-i /k"}
    assert check("n1", 5, {"pdsh": {"port": "2222"}}, PDSH, [("n1", "10.0.0.1"), ("n2", "10.0.0.2")], env) == 0
    assert capsys.readouterr().out == (
        "ftconsole: ssh check: n1 reaches n1, n2 by SSH as DeepSpeed's runner (pdsh) does: ssh -o BatchMode=yes "
        "-oConnectTimeout=10 -i /k -p 2222 -2 -a -x HOST true (PDSH_SSH_ARGS_APPEND; -p from deepspeed --ssh_port)\n"
    )


def test_check_runs_another_agent_as_the_launcher_would(
    tmp_path: Path, world: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    rsh = tmp_path / "bin" / "rsh"
    rsh.write_text('#!/bin/sh\necho "$@" >> "$0.calls"\necho "rsh: no" >&2\nexit 1\n')
    assert check("n1", 5, {}, HYDRA, [("n2", "10.0.0.2")], {**world, "HYDRA_LAUNCHER": "rsh"}) == 255
    assert (tmp_path / "bin" / "rsh.calls").read_text() == "10.0.0.2 true\n"
    err = capsys.readouterr().err
    assert "'rsh HOST true' (the launcher from HYDRA_LAUNCHER) must work" in err and "authorized_keys" not in err
    assert err.splitlines()[-1].endswith("cannot reach n2 (10.0.0.2) by SSH without a prompt: rsh: no (rsh exit 1)")


def test_check_that_cannot_follow_the_launcher_says_why_and_passes(
    world: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert check("n1", 5, {}, HYDRA, [("n2", "10.0.0.2")], {**world, "HYDRA_LAUNCHER": "slurm"}) == 0
    assert capsys.readouterr().out == (
        "ftconsole: ssh check: not run: hydra is told to use its slurm launcher (HYDRA_LAUNCHER), not a remote shell\n"
    )


def test_check_gives_up_on_a_peer_that_does_not_answer(
    tmp_path: Path, world: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sshcheck, "GRACE", 0)
    (tmp_path / "bin" / "ssh").write_text("#!/bin/sh\nexec /bin/sleep 30\n")
    assert check("n1", 1, {}, OMPI, [("n2", "10.0.0.2")], world) == 255
    assert capsys.readouterr().err.splitlines()[-1].endswith("n2 (10.0.0.2) by SSH without a prompt: "
                                                              "no answer within 1s")  # fmt: skip


def test_main_reads_the_arguments_as_the_launcher_planned_them(
    world: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in world.items():
        monkeypatch.setenv(key, value)
    assert sshcheck.main(["n1", "5", '{"skip": "why"}', OMPI, "n2", "10.0.0.2"]) == 0
    assert capsys.readouterr().out == "ftconsole: ssh check: not run: why\n"


def test_the_check_is_python38_and_stdlib_only() -> None:
    source = script("sshcheck")
    ast.parse(source, feature_version=(3, 8))
    assert imported_modules(source) <= set(sys.stdlib_module_names)


# --- helpers -------------------------------------------------------------------------------------------------------


def _tmp(settings: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    return {k: v.replace("TMP", str(tmp_path)) if isinstance(v, str) else v for k, v in settings.items()}


def _expect(got: list[str] | str, expected: list[str] | str, tmp_path: Path) -> None:
    if isinstance(expected, str):
        assert isinstance(got, str) and got.startswith(expected), got
    else:
        assert got == [w.replace("TMP", str(tmp_path)) for w in expected]
