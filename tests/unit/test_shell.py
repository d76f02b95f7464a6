"""The debug terminal's ssh argv and remote commands (scheduler/ssh/shell.py), from tables of cases.

The remote commands are also run here, by a local `sh -c` standing in for the node's login shell, so hostile
run folders, banners, commands and env values are seen to arrive literally.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.errors import NotFound, UsageError
from ftconsole.scheduler.node import supervisor
from ftconsole.scheduler.spec.config import ClusterConfig, LoadedConfig, Node
from ftconsole.scheduler.ssh.shell import (
    BOOT,
    JOB_SNIPPET,
    NO_FOLDER_EXIT,
    ShellTarget,
    SshOptions,
    is_job_id,
    job_banner,
    job_remote_command,
    job_shell,
    node_banner,
    node_remote_command,
    node_shell,
    pick_run,
    shell_target,
    ssh_argv,
    ssh_options,
    ssh_path,
)

HOSTILE = [
    "with space",
    'it\'s "quoted"',
    "$(touch PWNED)",
    "`touch PWNED`",
    "a;b|c&d>e<f",
    "tab\there",
    "new\nline",
    "back\\slash",
    "${HOME}",
    "-n",
    "ünïcødé",
]


def loaded(tmp_path: Path, **cluster: Any) -> LoadedConfig:
    data: dict[str, Any] = {
        "ssh": {"config_file": None, "known_hosts": "keys/known_hosts", "identity_file": "keys/id"},
        "nodes": [
            {"name": "gpu[01-02]", "host": "10.0.0.[1-2]", "port": 2201},
            {"name": "cpu01", "user": "ops"},
        ],
    }
    data.update(cluster)
    return LoadedConfig(cluster=ClusterConfig.model_validate(data), file=tmp_path / "cluster.yaml")


def opts(**fields: Any) -> SshOptions:
    return SshOptions(**{"known_hosts": Path("/k/known_hosts"), **fields})


BASE = [
    "ssh",
    "-t",
    "-F",
    "none",
    "-o",
    "StrictHostKeyChecking=yes",
    "-o",
    "UserKnownHostsFile=/k/known_hosts",
    "-o",
    "GlobalKnownHostsFile=/dev/null",
    "-o",
    "ConnectTimeout=10",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "ServerAliveInterval=15",
]


@pytest.mark.parametrize(
    ("options", "node", "tty", "expected"),
    [
        (opts(), Node("n1", "n1", None, None, "default"), True, [*BASE, "--", "n1", "CMD"]),
        (
            opts(),
            Node("n1", "10.0.0.1", 2222, "root", "default"),
            True,
            [*BASE, "-p", "2222", "-l", "root", "--", "10.0.0.1", "CMD"],
        ),
        (
            opts(identity_file=Path("/k/id_ed25519")),
            Node("n1", "h", None, "alice", "default"),
            False,
            ["ssh", "-T", *BASE[2:], "-o", "IdentityFile=/k/id_ed25519", "-l", "alice", "--", "h", "CMD"],
        ),
        (
            opts(host_key_policy="accept-new", config_file=Path("/k/ssh config"), keepalive_interval=0),
            Node("n1", "-oProxyCommand=x", 22, None, "default"),
            True,
            [
                "ssh",
                "-t",
                "-F",
                '"/k/ssh config"',
                "-o",
                "StrictHostKeyChecking=accept-new",
                *BASE[6:14],
                "-p",
                "22",
                "--",
                "-oProxyCommand=x",  # after `--`: a host, never an option
                "CMD",
            ],
        ),
        (
            opts(connect_timeout=0.5, keepalive_interval=2.5),
            Node("n1", "h", None, None, "default"),
            True,
            [*BASE[:11], "ConnectTimeout=1", "-o", "LogLevel=ERROR", "-o", "ServerAliveInterval=3", "--", "h", "CMD"],
        ),
    ],
)
def test_ssh_argv(options: SshOptions, node: Node, tty: bool, expected: list[str]) -> None:
    assert ssh_argv(options, node, "CMD", tty=tty) == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/k/known_hosts", "/k/known_hosts"),
        ("/k/100%/id", "/k/100%%/id"),
        ("/k/a b/id", '"/k/a b/id"'),
        ('/k/a"b/id', '"/k/a\\"b/id"'),
        ("/k/a\\b", '"/k/a\\\\b"'),
    ],
)
def test_ssh_path(path: str, expected: str) -> None:
    assert ssh_path(Path(path)) == expected


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client")
@pytest.mark.parametrize("name", ["plain", "with space", "100%", 'q"uote'])
def test_ssh_reads_the_paths_back_literally(tmp_path: Path, name: str) -> None:
    folder = tmp_path / name
    folder.mkdir()
    options = opts(known_hosts=folder / "known_hosts", identity_file=folder / "id")
    argv = ssh_argv(options, Node("n1", "h.example", 2201, "bob", "default"), "true", tty=False)
    out = subprocess.run(["ssh", "-G", *argv[1:-1]], capture_output=True, text=True, timeout=30, check=True).stdout
    settings = [line.split(" ", 1) for line in out.splitlines()]
    seen = {k: v for k, v in settings}
    assert seen["hostname"] == "h.example" and seen["port"] == "2201" and seen["user"] == "bob"
    assert seen["userknownhostsfile"] == str(folder / "known_hosts")  # shown after % expansion
    # identityfile is shown before % expansion, which turns %% back into %
    assert [v for k, v in settings if k == "identityfile"] == [str(folder / "id").replace("%", "%%")]
    assert seen["stricthostkeychecking"] in ("true", "yes")
    assert seen["globalknownhostsfile"] == "/dev/null"


def test_ssh_options_mirror_the_scheduler(tmp_path: Path) -> None:
    options = ssh_options(loaded(tmp_path, scheduler={"run_as": "ssh_user"}))
    assert options.known_hosts == tmp_path / "keys/known_hosts"
    assert options.identity_file == tmp_path / "keys/id"
    assert options.config_file is None
    missing = ssh_options(loaded(tmp_path, ssh={"config_file": "nope/config"}))
    assert missing.config_file is None  # as SSHPool.from_config: a missing file is not read
    (tmp_path / "ssh_config").write_text("")
    present = ssh_options(loaded(tmp_path, ssh={"config_file": "ssh_config", "host_key_policy": "accept-new"}))
    assert present.config_file == tmp_path / "ssh_config" and present.host_key_policy == "accept-new"
    assert present.identity_file is None and present.known_hosts == Path(os.path.expanduser("~/.ssh/known_hosts"))


def test_under_run_as_submitter_the_shell_is_the_callers_own(tmp_path: Path) -> None:
    """The caller logs in as themselves (not as the node's configured user), with the scheduler's key and
    known_hosts only when they may read them."""
    me = pwd.getpwuid(os.getuid()).pw_name
    (tmp_path / "keys").mkdir()
    options = ssh_options(loaded(tmp_path))
    assert options.login == me and options.identity_file is None  # keys/id does not exist: not theirs to use
    (tmp_path / "keys/id").write_text("key")
    assert ssh_options(loaded(tmp_path)).identity_file == tmp_path / "keys/id"
    node = Node(name="cpu01", host="cpu01", port=None, user="ops", pool="default")
    argv = ssh_argv(options, node, "CMD", tty=False)
    assert argv[-5:-3] == ["-l", me] and "UserKnownHostsFile=/dev/null" not in argv
    assert "GlobalKnownHostsFile=/dev/null" not in argv  # keys/known_hosts is missing: ssh's own files
    (tmp_path / "keys/known_hosts").write_text("")
    argv = ssh_argv(ssh_options(loaded(tmp_path)), node, "CMD", tty=False)
    assert f"UserKnownHostsFile={tmp_path}/keys/known_hosts" in argv
    assert argv[2:4] == ["-F", "none"]  # no ssh config file in the config: none read, as the scheduler reads none


def test_a_caller_who_may_not_read_the_ssh_config_file_gets_their_own(tmp_path: Path, monkeypatch) -> None:
    """Under run_as: submitter, the scheduler's ssh config file where the caller may read it, else the caller's own
    files (no -F: ~/.ssh/config, /etc/ssh/ssh_config): `-F` of a file they cannot read makes ssh fail outright."""
    (tmp_path / "ssh_config").write_text("ServerAliveCountMax 3\n")
    node = Node(name="cpu01", host="cpu01", port=None, user="ops", pool="default")
    config = loaded(tmp_path, ssh={"config_file": "ssh_config"})
    argv = ssh_argv(ssh_options(config), node, "CMD", tty=False)
    assert argv[2:4] == ["-F", str(tmp_path / "ssh_config")]
    private = str(tmp_path / "ssh_config")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != private and real_access(path, mode))
    options = ssh_options(config)
    assert options.own_config and options.config_file is None
    argv = ssh_argv(options, node, "CMD", tty=False)
    assert "-F" not in argv and argv[:2] == ["ssh", "-T"]
    # the scheduler's own account (run_as: ssh_user) reads it, as the scheduler does
    # in a folder the caller may not enter: there, not theirs to read (Path.exists raised, or from 3.14 says False)
    real_stat = Path.stat
    monkeypatch.setattr(os, "access", real_access)

    def stat(path: Path, **kwargs: Any) -> os.stat_result:
        if str(path) == private:
            raise PermissionError(13, "Permission denied", private)
        return real_stat(path, **kwargs)

    monkeypatch.setattr(Path, "stat", stat)
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != private and real_access(path, mode))
    options = ssh_options(config)
    assert options.own_config and "-F" not in ssh_argv(options, node, "CMD", tty=False)
    monkeypatch.undo()
    mine = loaded(tmp_path, ssh={"config_file": "ssh_config"}, scheduler={"run_as": "ssh_user"})
    assert not ssh_options(mine).own_config and ssh_options(mine).config_file == tmp_path / "ssh_config"


@pytest.mark.parametrize(
    ("target", "job"),
    [("12", True), ("0", True), ("node01", False), ("12a", False), ("gpu[01]", False), ("١٢", False), ("", False)],
)
def test_is_job_id(target: str, job: bool) -> None:
    assert is_job_id(target) is job


# -- choosing the run --------------------------------------------------------------------------------------


def run(attempt: int, rank: int, node: str = "gpu01", state: str = "running", **fields: Any) -> dict[str, Any]:
    doc = {
        "attempt": attempt,
        "rank": rank,
        "node": node,
        "run_dir": f"/h/.ftconsole/runs/7/{attempt}/{rank}",
        "state": state,
        "exit_code": None,
        "signal": None,
    }
    return {**doc, **fields}


def job(*attempts: list[dict[str, Any]], status: str = "running") -> dict[str, Any]:
    return {
        "id": 7,
        "name": "llama",
        "status": status,
        "attempts": [{"number": i + 1, "runs": runs} for i, runs in enumerate(attempts)],
    }


TWO = job([run(1, 0), run(1, 1, "gpu02")], [run(2, 0, "gpu02"), run(2, 1, "gpu01"), run(2, 2, "cpu01")])


@pytest.mark.parametrize(
    ("rank", "attempt", "expected"),
    [
        (None, None, (2, 0, "gpu02")),
        (1, None, (2, 1, "gpu01")),
        (2, None, (2, 2, "cpu01")),
        (1, 1, (1, 1, "gpu02")),
        (None, 1, (1, 0, "gpu01")),
    ],
)
def test_pick_run(rank: int | None, attempt: int | None, expected: tuple[int, int, str]) -> None:
    chosen = pick_run(TWO, rank=rank, attempt=attempt)
    assert (chosen["attempt"], chosen["rank"], chosen["node"]) == expected


@pytest.mark.parametrize(
    ("shown", "rank", "attempt", "error", "message"),
    [
        (job(status="queued"), None, None, UsageError, "job 7 is queued and has no run yet"),
        (TWO, 3, None, NotFound, "job 7 attempt 2 has no rank 3 (ranks: [0, 1, 2])"),
        (TWO, None, 5, NotFound, "job 7 has no attempt 5 (attempts: [1, 2])"),
        (TWO, 2, 1, NotFound, "job 7 attempt 1 has no rank 2 (ranks: [0, 1])"),
        (job([run(1, 0, state="intent")]), 0, None, UsageError, "job 7 rank 0 is being started"),
    ],
)
def test_pick_run_refuses(
    shown: dict[str, Any], rank: int | None, attempt: int | None, error: type, message: str
) -> None:
    with pytest.raises(error) as caught:
        pick_run(shown, rank=rank, attempt=attempt)
    assert message in str(caught.value)
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(
    ("the_run", "expected"),
    [
        (
            run(2, 1),
            "ftconsole: job 7 (llama, running) attempt 2 rank 1 (running) on gpu01:/h/.ftconsole/runs/7/2/1 - env of "
            "the run loaded; exit to return",
        ),
        (run(1, 0, state="exited", exit_code=3), "attempt 1 rank 0 (exited with code 3) on gpu01:"),
        (run(1, 0, state="exited", exit_code=None, signal="SIGKILL"), "(exited, SIGKILL)"),
        (run(1, 0, state="prepared"), "(prepared)"),
    ],
)
def test_job_banner(the_run: dict[str, Any], expected: str) -> None:
    assert expected in job_banner(TWO, the_run)


@pytest.mark.parametrize(
    ("state", "reasons", "expected"),
    [
        (None, (), "ftconsole: node gpu01 - login shell in $HOME; exit to return"),
        ("healthy", (), "ftconsole: node gpu01 (healthy) - login shell in $HOME; exit to return"),
        ("degraded", ("gpu-temperature warn", "load warn"), "node gpu01 (degraded: gpu-temperature warn; load warn) -"),
    ],
)
def test_node_banner(state: str | None, reasons: tuple[str, ...], expected: str) -> None:
    assert expected in node_banner("gpu01", state, reasons)


def test_job_shell_and_node_shell(tmp_path: Path) -> None:
    cfg = loaded(tmp_path, scheduler={"run_as": "ssh_user"})
    target = job_shell(cfg, TWO, rank=1)
    assert target.node == "gpu01" and "rank 1" in target.banner
    assert target.argv[1] == "-t" and target.argv[-2:-1] == ["10.0.0.1"] and "2201" in target.argv
    remote = shlex.split(target.argv[-1])
    assert remote[:5] == ["exec", "python3", "-c", BOOT, JOB_SNIPPET]
    assert remote[5:7] == ["/h/.ftconsole/runs/7/2/1", target.banner]
    assert remote[8:] == ["", "python3", ""]  # (what to say when the folder is gone) no user to switch to: ssh_user
    with_command = job_shell(cfg, TWO, rank=2, command="echo hi")
    assert with_command.argv[1] == "-T" and with_command.argv[-2] == "cpu01"
    assert with_command.argv[-5:-3] == ["-l", "ops"]
    assert shlex.split(with_command.argv[-1])[-1] == "echo hi"
    gone = job([run(1, 0, node="gpu99")])
    with pytest.raises(NotFound, match="node gpu99 of job 7 rank 0 is not in"):
        job_shell(cfg, gone)

    node = node_shell(cfg, "gpu02", state="drained", reasons=["maintenance"])
    assert node == ShellTarget(argv=node.argv, banner=node_banner("gpu02", "drained", ["maintenance"]), node="gpu02")
    assert node.argv[-2] == "10.0.0.2" and shlex.split(node.argv[-1])[-1] == node.banner
    with pytest.raises(NotFound, match="no node 'gpu03'") as caught:
        node_shell(cfg, "gpu03")
    assert caught.value.exit_code == 2


class FakeClient:
    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call(self, op: str, **args: Any) -> Any:
        self.calls.append((op, args))
        return self.answers[op]


async def test_shell_target_asks_the_client(tmp_path: Path) -> None:
    cfg = loaded(tmp_path)
    client = FakeClient({"show": TWO, "nodes": [{"name": "cpu01", "state": "degraded", "reasons": ["load warn"]}]})
    by_job = await shell_target(client, cfg, "7", rank=1, attempt=1)
    assert (by_job.node, client.calls[-1]) == ("gpu02", ("show", {"job": 7}))
    by_node = await shell_target(client, cfg, "cpu01", command="uptime")
    assert client.calls[-1] == ("nodes", {"nodeset": "cpu01"})
    assert by_node.banner == node_banner("cpu01", "degraded", ["load warn"])
    with pytest.raises(UsageError, match="--rank and --attempt are for a job"):
        await shell_target(client, cfg, "cpu01", rank=1)
    with pytest.raises(NotFound):
        await shell_target(client, cfg, "nosuch")
    assert len(client.calls) == 2  # an unknown node is refused before asking the scheduler


# -- the remote commands, run by a local sh as the node's login shell would ------------------------------------


def remote(
    command: str, *, home: Path, stdin: str | None = None, shell: str = "/bin/sh"
) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "SHELL": shell, "ENV": "", "PS1": "$ "}
    return subprocess.run(
        ["/bin/sh", "-c", command],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd="/",
    )


@pytest.fixture
def hostile_run(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    run_dir = tmp_path / 'it\'s a $(touch PWNED) `run` "dir"' / "7" / "1"
    run_dir.mkdir(parents=True)
    env = {f"V{i}": value for i, value in enumerate(HOSTILE)}
    env["TILDE"] = "~/data"
    (run_dir / "env.json").write_text(json.dumps(env))
    return run_dir, env


def test_job_command_arrives_literally(tmp_path: Path, hostile_run: tuple[Path, dict[str, str]]) -> None:
    run_dir, _ = hostile_run
    names = [f"V{i}" for i in range(len(HOSTILE))]
    # each value on its own line, NUL-separated so values with newlines come back whole
    command = "pwd; for v in " + " ".join(names) + ' TILDE; do eval "printf \'%s\\0\' \\"\\$$v\\""; done'
    banner = "job 7 $(touch PWNED) `x` 'q' \"dq\""
    done = remote(
        job_remote_command(str(run_dir), banner=banner, command=command, python=sys.executable), home=tmp_path
    )
    assert done.returncode == 0, done.stderr
    cwd, rest = done.stdout.split("\n", 1)
    assert cwd == str(run_dir)
    values = rest.split("\0")[:-1]
    assert values == [*HOSTILE, f"{tmp_path}/data"]
    assert done.stderr == ""  # no banner with --command
    assert not list(tmp_path.rglob("PWNED")) and not Path("/PWNED").exists()


def test_job_command_exit_status_and_missing_folder(tmp_path: Path, hostile_run: tuple[Path, dict[str, str]]) -> None:
    run_dir, _ = hostile_run
    failed = remote(
        job_remote_command(str(run_dir), banner="b", command="exit 7", python=sys.executable), home=tmp_path
    )
    assert failed.returncode == 7
    missing = remote(
        job_remote_command(str(tmp_path / "gone"), banner="b", command="true", python=sys.executable), home=tmp_path
    )
    assert missing.returncode == NO_FOLDER_EXIT
    assert f"ftconsole: no run folder {tmp_path}/gone on this node" in missing.stderr
    (run_dir / "env.json").write_text("not json")
    broken = remote(job_remote_command(str(run_dir), banner="b", command="pwd", python=sys.executable), home=tmp_path)
    assert broken.returncode == 0 and broken.stdout == f"{run_dir}\n"
    assert "env.json not loaded" in broken.stderr


def test_job_interactive_shell(tmp_path: Path, hostile_run: tuple[Path, dict[str, str]]) -> None:
    run_dir, _ = hostile_run
    banner = "ftconsole: job 7 `touch PWNED` $(id)"
    done = remote(
        job_remote_command(str(run_dir), banner=banner, python=sys.executable),
        home=tmp_path,
        stdin='pwd\nprintf "%s|" "$V0" "$V2"; echo\nexit 3\n',
    )
    assert done.returncode == 3
    assert done.stdout == f"{run_dir}\nwith space|$(touch PWNED)|\n"
    assert done.stderr.startswith(banner + "\n")
    assert not list(tmp_path.rglob("PWNED"))


def test_node_commands(tmp_path: Path) -> None:
    home = tmp_path / "home $(touch PWNED) 'q'"
    home.mkdir()
    command = "pwd; printf '%s\\n' \"$1\" 'a b'"
    done = remote(node_remote_command(banner="unused", command=command), home=home)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{home}\n\na b\n", "")
    banner = node_banner("gpu01 `touch PWNED`", "healthy")
    shell = remote(node_remote_command(banner=banner), home=home, stdin="pwd\necho marker-$((6*7))\nexit 5\n")
    assert shell.returncode == 5
    assert shell.stdout.splitlines()[-2:] == [str(home), "marker-42"]
    assert shell.stderr.startswith(banner + "\n")
    gone = remote(node_remote_command(banner="b", command="true"), home=tmp_path / "nope")
    assert gone.returncode == NO_FOLDER_EXIT
    assert not list(tmp_path.rglob("PWNED"))


def test_the_banner_of_a_job_in_an_image_names_the_ranks_container() -> None:
    in_image = {**TWO, "spec": {"image": "nvcr.io/nvidia/pytorch:24.05-py3"}}
    in_image["attempts"] = [{**a, "token": f"tok{a['number']}"} for a in TWO["attempts"]]
    banner = job_banner(in_image, run(2, 1))
    assert banner.splitlines()[1] == (
        "ftconsole: the rank runs in container ft-tok2-r1 of nvcr.io/nvidia/pytorch:24.05-py3 (its runtime's "
        "`exec -it ft-tok2-r1 sh` enters it while it runs)"
    )
    assert "\n" not in job_banner(TWO, run(2, 1))  # no image: as before


def test_the_banner_of_an_mpi_job_in_an_image_names_its_processes_containers() -> None:
    hybrid = {**TWO, "spec": {"image": "img:1", "mode": "horovod"}}
    hybrid["attempts"] = [{**a, "token": f"tok{a['number']}"} for a in TWO["attempts"]]
    assert job_banner(hybrid, run(2, 1)).splitlines()[1] == (
        "ftconsole: mpirun starts each MPI process in a container of img:1 of its own, ft-tok2-p<MPI rank> (its "
        "runtime's `ps --filter name=ft-tok2-` lists this node's; `exec -it NAME sh` enters one while it runs)"
    )


# -- as whom: the job's user, never the login's rights with the user's env -------------------------------------


def test_the_job_snippet_is_python_38_and_switches_users_with_the_supervisors_own_become() -> None:
    ast.parse(JOB_SNIPPET, feature_version=(3, 8))
    assert inspect.getsource(supervisor.become) in JOB_SNIPPET  # one copy of the switch: the job's own


@pytest.mark.parametrize(("run_as", "user"), [("submitter", "ann"), ("ssh_user", "")])
def test_a_jobs_shell_is_its_owners_under_run_as_submitter(tmp_path: Path, run_as: str, user: str) -> None:
    target = job_shell(loaded(tmp_path, scheduler={"run_as": run_as}), {**TWO, "owner": "ann"}, command="id")
    assert shlex.split(target.argv[-1])[8:] == [user, "python3", "", "id"]


NOBODY = 65534


@pytest.fixture
def others_run() -> Iterator[Path]:
    """A run folder of uid 65534 (nobody) with its env.json, in a folder every user may reach."""
    if os.geteuid() != 0:
        pytest.skip("a run folder of another uid needs root")
    top = Path(tempfile.mkdtemp(prefix="ftconsole-shell-", dir="/tmp"))
    try:
        top.chmod(0o755)
        run_dir = top / "7" / "1"
        run_dir.mkdir(parents=True)
        (run_dir / "env.json").write_text(json.dumps({"MARK": "the user's", "PATH": f"{top}/bin:/usr/bin:/bin"}))
        for path in (top / "7", run_dir, run_dir / "env.json"):
            os.chown(path, NOBODY, NOBODY)
        (top / "7").chmod(0o755)
        run_dir.chmod(0o700)
        yield run_dir
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_root_enters_another_users_run_folder_as_that_user(tmp_path: Path, others_run: Path) -> None:
    name = pwd.getpwuid(NOBODY).pw_name
    command = 'id -u; umask; echo "$MARK|$HOME|$USER|$PATH"'
    remote_command = job_remote_command(str(others_run), banner="b", command=command, python=sys.executable, user=name)
    done = remote(remote_command, home=tmp_path)
    home = pwd.getpwuid(NOBODY).pw_dir
    assert (done.returncode, done.stdout) == (
        0,
        f"{NOBODY}\n0077\nthe user's|{home}|{name}|{others_run.parent.parent}/bin:/usr/bin:/bin\n",
    )
    assert done.stderr == f"ftconsole: running as {name} (uid {NOBODY}), the job's user, not as root\n"
    shell = remote(
        job_remote_command(str(others_run), banner="hello", python=sys.executable, user=name),
        home=tmp_path,
        stdin="id -u\nexit 4\n",
    )
    assert (shell.returncode, shell.stdout) == (4, f"{NOBODY}\n")
    assert shell.stderr.startswith(
        f"hello\nftconsole: this shell runs as {name} (uid {NOBODY}), the job's user, not as root\n"
    )
    ghost = remote(
        job_remote_command(
            str(others_run), banner="b", command="id -u", python=sys.executable, user="ftconsole-no-such-user"
        ),
        home=tmp_path,
    )
    assert (ghost.returncode, ghost.stdout) == (NO_FOLDER_EXIT, "")
    assert "user ftconsole-no-such-user, the job's, has no account on this node" in ghost.stderr


def test_an_env_json_of_another_uid_is_never_loaded_into_a_shell_that_does_not_run_as_that_uid(
    tmp_path: Path, others_run: Path
) -> None:
    """No user to switch to (run_as: ssh_user, or an older scheduler): root reads the folder, not the env."""
    done = remote(
        job_remote_command(str(others_run), banner="b", command='id -u; echo "[$MARK]"', python=sys.executable),
        home=tmp_path,
    )
    assert (done.returncode, done.stdout) == (0, "0\n[]\n")
    assert done.stderr == (
        f"ftconsole: env.json not loaded (it is uid {NOBODY}'s, and this shell runs as uid 0: a user's env never "
        "runs with another user's rights): the session env as it is\n"
    )
    (others_run / "env.json").unlink()
    os.mkfifo(others_run / "env.json")  # opened for reading, a FIFO would block until someone writes
    fifo = remote(job_remote_command(str(others_run), banner="b", command="true", python=sys.executable), home=tmp_path)
    assert fifo.returncode == 0 and "env.json not loaded (it is not a regular file)" in fifo.stderr
