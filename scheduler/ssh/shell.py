"""The debug terminal: the system `ssh` argv for a shell on a node, or in a job's run folder, built as data.

`ftconsole shell JOB [--rank N] [--attempt A] | NODE` execs the argv; the console suspends itself and runs
it. Nothing here runs a process: `ssh_options` reads the config (and whether the ssh config file exists),
the rest are pure functions of the config, the job as `show` returns it, and the node's state.

The ssh client gets the scheduler's own settings (`scheduler.ssh.SSHPool`): the same known_hosts with host
keys verified (`StrictHostKeyChecking=yes`, or `accept-new` under `host_key_policy: accept-new`; a changed
key is refused either way), the same identity file, ssh config file, user and port, so `ftconsole shell`
reaches exactly the hosts the scheduler reaches and no other.

The remote command is one string in which every value (run folder, banner, command, interpreter, user) is
quoted with `shlex.quote`; the job's env is not sent at all: a stdlib-only Python snippet (3.8) reads the run
folder's `env.json` on the node, as the run supervisor does, and execs the shell with it. Like every remote
command of the scheduler, it assumes a POSIX login shell on the node.

As whom: the run folder and its env.json are the job's user's, who may have put anything in them (`PATH`,
`LD_PRELOAD`, `BASH_ENV`...). So under `run_as: submitter` the snippet first becomes the job's user, exactly as
the job's supervisor does (the supervisor's `become`, copied in), whoever logged in: root switches, another
login goes through `sudo -n -u USER`, and only then is the folder touched. Whatever the mode, env.json is
loaded only when it is the shell's own uid's (or root's) file. Nothing a user wrote runs with another user's
rights.
"""

from __future__ import annotations

import inspect
import math
import os
import pwd
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ftconsole.scheduler.errors import NotFound, UsageError
from ftconsole.scheduler.node import supervisor
from ftconsole.scheduler.spec.config import LoadedConfig, Node, SchedulerSettings
from ftconsole.scheduler.ssh.transport import ssh_files


class Asks(Protocol):
    """What `shell_target` needs of a client (`scheduler.serve.client.Client`, a layer above): its calls."""

    async def call(self, op: str, **args: Any) -> Any: ...


# Exit status of the remote side when the run folder (or $HOME) is not there; a command's own passes through.
NO_FOLDER_EXIT = 2

# Node side, Python 3.8, stdlib only, run as `python3 -c BOOT SNIPPET run_dir banner gone user python via
# [command]` (BOOT execs its first argument, so a sudo hop can start the same snippet again). `gone`: what to say
# when the run folder is not there (whether retention removed it, and when). `user`: the job's user (run_as:
# submitter), or "" (ssh_user: the job ran as the SSH account). `via`: "" at first; the login's name once sudo
# started the snippet again as the user.
#
# First the snippet becomes the job's user, with the run supervisor's own `become()` (its source is copied in
# below): root switches for good (initgroups, setgid, setuid); another login is switched by `sudo -n -u USER --
# PYTHON` (the sudoers rule the scheduler needs for its jobs), or refused with what sudo said. Only then is
# anything of the run folder touched, so nothing a user wrote runs with another user's rights. env.json is
# loaded only when it is a regular file of this uid (or root's); otherwise the session's env as it is, with a
# line that says why. The env is the run's: the session's environment (cleaned up by `become` as for the job)
# with env.json over it, values starting with "~/" expanded (supervisor_steps.py `_child_env`). Without a
# command: the banner and as whom the shell runs on stderr, then an interactive (not login: a profile would
# reset PATH) shell, $SHELL (not nologin or false) or bash or sh. With one: `sh -c COMMAND`, its exit status
# passed through, after one line on stderr when the shell runs as another user than the login.
BOOT = "import sys; exec(sys.argv[1])"
JOB_MAIN = """\
def say(text):
    sys.stderr.write("ftconsole: %s\\n" % text)
    sys.stderr.flush()


def via_sudo(user, python, login):
    sudo = ["sudo", "-n", "-u", user, "--", python, "-c"]
    try:
        probe = subprocess.run(sudo + [""], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, timeout=30)
        said = " ".join(probe.stderr.decode(errors="replace").split()) or "exit %d" % probe.returncode
        said = None if probe.returncode == 0 else said
    except (OSError, subprocess.SubprocessError) as exc:
        said = str(exc)
    if said is not None:
        say("this run folder is %s's, the job's user; this login (%s) is not root and may not run %s as %s "
            "through sudo without a password (sudo said: %s)" % (user, login, python, user, said))
        sys.exit(NO_FOLDER_EXIT)
    os.execvp("sudo", sudo + [BOOT] + sys.argv[1:7] + [login] + sys.argv[8:])


def load_env(path, uid):
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, encoding="utf-8") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("it is not a regular file")
        if st.st_uid not in (uid, 0):
            raise ValueError("it is uid %d's, and this shell runs as uid %d: a user's env never runs with "
                             "another user's rights" % (st.st_uid, uid))
        return json.load(fh)


run_dir, banner, gone, user, python, via = sys.argv[2:8]
command = sys.argv[8:]
login = via or _account_name()
if user:
    refused = become(user)
    if refused is not None and "no_account" in refused:
        say("user %s, the job's, has no account on this node: no shell in its run folder" % user)
        sys.exit(NO_FOLDER_EXIT)
    if refused is not None:
        if via:
            say("sudo did not make this shell %s's" % user)
            sys.exit(NO_FOLDER_EXIT)
        via_sudo(user, python, login)
uid, me = os.geteuid(), _account_name()
as_whom = "%s (uid %d)" % (me, uid)
if user:
    as_whom += ", the job's user" + (", not as %s" % login if login != me else "")
run_dir = os.path.abspath(os.path.expanduser(run_dir))
if not os.path.isdir(run_dir):
    say("no run folder %s on this node (or it is not yours to enter)%s" % (run_dir, gone))
    sys.exit(NO_FOLDER_EXIT)
if not os.access(run_dir, os.R_OK | os.X_OK):
    say("run folder %s is not yours to enter (it belongs to the user of the job)" % run_dir)
    sys.exit(NO_FOLDER_EXIT)
if not command:
    os.write(2, os.fsencode(banner) + b"\\n")
    say("this shell runs as " + as_whom)
elif login != me:
    say("running as " + as_whom)
env = dict(os.environ)
try:
    for key, value in load_env(os.path.join(run_dir, "env.json"), uid).items():
        value = str(value)
        env[str(key)] = os.path.expanduser(value) if value.startswith("~/") else value
except (OSError, ValueError, AttributeError) as exc:
    say("env.json not loaded (%s): the session env as it is" % exc)
os.chdir(run_dir)
env["PWD"] = run_dir
env.pop("OLDPWD", None)
if command:
    os.execve("/bin/sh", ["sh", "-c", command[0]], env)
shell = os.environ.get("SHELL") or ""
usable = shell.startswith("/") and os.access(shell, os.X_OK)
if not usable or os.path.basename(shell) in ("nologin", "false"):
    shell = "/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh"
os.execve(shell, [shell, "-i"], env)
"""


def _job_snippet() -> str:
    """The node-side program: stdlib imports, the supervisor's `become` (one copy of the switch), then JOB_MAIN."""
    parts = [
        "import contextlib, json, os, pwd, stat, subprocess, sys",
        f"BOOT = {BOOT!r}",
        f"NO_FOLDER_EXIT = {NO_FOLDER_EXIT}",
        f"_NOT_THE_USERS = {supervisor._NOT_THE_USERS!r}",
        inspect.getsource(supervisor._account_name),
        inspect.getsource(supervisor.become),
        JOB_MAIN,
    ]
    return "\n\n".join(part.strip("\n") + "\n" for part in parts)


JOB_SNIPPET = _job_snippet()

# POSIX sh. Without a command: the banner on stderr, then a login shell in $HOME (sshd starts sessions in the
# account's home from the password database, which $HOME may override). With one: `sh -c COMMAND` in $HOME.
NODE_INTERACTIVE = 'printf "%s\\n" "$1" >&2; cd "$HOME" || exit EXIT; exec "${SHELL:-/bin/sh}" -l'.replace(
    "EXIT", str(NO_FOLDER_EXIT)
)
NODE_COMMAND = 'cd "$HOME" || exit EXIT; exec /bin/sh -c "$1"'.replace("EXIT", str(NO_FOLDER_EXIT))


@dataclass(frozen=True)
class ShellTarget:
    """What to run for a debug shell: the ssh argv, the banner it prints first, the node it reaches."""

    argv: list[str]
    banner: str
    node: str


@dataclass(frozen=True)
class SshOptions:
    """The scheduler's ssh settings, resolved to the paths the system ssh client gets."""

    known_hosts: Path
    host_key_policy: str = "strict"
    identity_file: Path | None = None
    config_file: Path | None = None  # None: no ssh config file (`-F none`), as the scheduler then reads none
    connect_timeout: float = 10.0
    keepalive_interval: float = 15.0
    python: str = "python3"
    # whom ssh logs in as: None, the node's configured user; under run_as: submitter, the caller (see ssh_options)
    login: str | None = None
    # the caller's own ssh config files (no -F): a caller who may not read the scheduler's (see ssh_options)
    own_config: bool = False


def ssh_options(loaded: LoadedConfig) -> SshOptions:
    """The options of `SSHPool.from_config`: relative paths resolved against the config file.

    Under `scheduler.run_as: submitter` a debug shell is the caller's own, as the job is: ssh logs in as the
    caller (the local user), with the config's identity file and known_hosts only when the caller may read
    them (the scheduler's own key is not theirs: their keys and agent then, and ssh's own known_hosts files,
    host keys still verified); likewise its ssh config file, else their own (~/.ssh/config, /etc/ssh/ssh_config:
    where their jump host is)."""
    s = loaded.cluster.ssh
    known, identity, config_file = ssh_files(loaded)
    login = None
    own_config = False
    if loaded.cluster.scheduler.run_as == "submitter":
        login = _local_user()
        identity = identity if identity is not None and os.access(identity, os.R_OK) else None
        if config_file is not None and not os.access(config_file, os.R_OK):
            config_file, own_config = None, True
    return SshOptions(
        known_hosts=known,
        host_key_policy=s.host_key_policy,
        identity_file=identity,
        config_file=config_file,
        connect_timeout=s.connect_timeout,
        keepalive_interval=s.keepalive_interval,
        python=s.python,
        login=login,
        own_config=own_config,
    )


def _local_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def ssh_path(path: Path) -> str:
    """A path as ssh's config parser reads it back literally: '%' doubled (tokens), quoted when it has blanks."""
    text = str(path).replace("%", "%%")
    if any(c.isspace() or c in "\"'\\" for c in text):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def ssh_argv(options: SshOptions, node: Node, remote_command: str, *, tty: bool) -> list[str]:
    """The system ssh client's argv for `remote_command` on `node`; `tty`: a pseudo-terminal (-t) or not (-T)."""
    known: list[str] = []  # the scheduler's known_hosts; a caller who may not read it: ssh's own files
    if options.login is None or os.access(options.known_hosts, os.R_OK):
        known = ["-o", f"UserKnownHostsFile={ssh_path(options.known_hosts)}", "-o", "GlobalKnownHostsFile=/dev/null"]
    config = ssh_path(options.config_file) if options.config_file is not None else "none"
    argv = [
        "ssh",
        "-t" if tty else "-T",
        *(() if options.own_config else ("-F", config)),
        "-o",
        "StrictHostKeyChecking=" + ("accept-new" if options.host_key_policy == "accept-new" else "yes"),
        *known,
        "-o",
        f"ConnectTimeout={max(1, math.ceil(options.connect_timeout))}",
        "-o",
        "LogLevel=ERROR",
    ]
    if options.keepalive_interval > 0:
        argv += ["-o", f"ServerAliveInterval={max(1, math.ceil(options.keepalive_interval))}"]
    if options.identity_file is not None:
        argv += ["-o", f"IdentityFile={ssh_path(options.identity_file)}"]  # -i would take quotes literally
    if node.port is not None:
        argv += ["-p", str(node.port)]
    login = options.login or node.user
    if login:
        argv += ["-l", login]
    return [*argv, "--", node.host, remote_command]


# -- remote commands -------------------------------------------------------------------------------------


def job_remote_command(
    run_dir: str,
    *,
    banner: str,
    command: str | None = None,
    python: str = "python3",
    gone: str = "",
    user: str = "",
) -> str:
    """Start in `run_dir` with the run's env, as `user` (the job's; "": as the login): an interactive shell after
    `banner`, or `sh -c command`; `gone` is added to the message when the folder is not there."""
    argv = ["exec", python, "-c", BOOT, JOB_SNIPPET, run_dir, banner, gone, user, python, ""]
    if command is not None:
        argv.append(command)
    return shlex.join(argv)


def node_remote_command(*, banner: str, command: str | None = None) -> str:
    """A login shell in $HOME after `banner`, or `sh -c command` there."""
    if command is None:
        return shlex.join(["exec", "/bin/sh", "-c", NODE_INTERACTIVE, "sh", banner])
    return shlex.join(["exec", "/bin/sh", "-c", NODE_COMMAND, "sh", command])


# -- choosing the target ---------------------------------------------------------------------------------


def is_job_id(target: str) -> bool:
    """An all-digits target is a job id; anything else is a node name."""
    return target.isascii() and target.isdigit()


def find_node(loaded: LoadedConfig, name: str) -> Node:
    nodes = {n.name: n for n in loaded.cluster.node_list()}
    node = nodes.get(name)
    if node is None:
        raise NotFound(f"no node {name!r} in {loaded.file} (a job id is all digits)")
    return node


def pick_run(job: dict[str, Any], *, rank: int | None = None, attempt: int | None = None) -> dict[str, Any]:
    """The run of `rank` (default 0) in `attempt` (default: the latest) of a job as `show` returns it."""
    rank = 0 if rank is None else rank
    attempts = {a["number"]: a for a in job["attempts"]}
    if not attempts:
        raise UsageError(f"job {job['id']} is {job['status']} and has no run yet: nothing to open a shell in")
    number = max(attempts) if attempt is None else attempt
    if number not in attempts:
        raise NotFound(f"job {job['id']} has no attempt {number} (attempts: {sorted(attempts)})")
    runs = {r["rank"]: r for r in attempts[number]["runs"]}
    if rank not in runs:
        raise NotFound(f"job {job['id']} attempt {number} has no rank {rank} (ranks: {sorted(runs)})")
    run = runs[rank]
    if run["state"] == "intent":
        raise UsageError(f"job {job['id']} rank {rank} is being started: try again in a moment")
    return dict(run)


def _run_state(run: dict[str, Any]) -> str:
    if run["state"] != "exited":
        return str(run["state"])
    return f"exited, {run['signal']}" if run["signal"] else f"exited with code {run['exit_code']}"


def kept_until(job: dict[str, Any], run: dict[str, Any], settings: SchedulerSettings) -> tuple[float | None, str]:
    """Until when the run's folder stays on its node at least (None: no end known), and what keeps it: for the
    job's last attempt `env_until` of `show` (a failed job's debug retention, or run retention), for an
    earlier one its end plus `scheduler.run_retention`."""
    debug = job.get("debug") or {}
    if run["attempt"] == job.get("attempt") and "env_until" in job:
        until = job["env_until"]
        failed = until is not None and until == debug.get("kept_until")
        kept_by = "debug.retention, as the job failed" if failed else "scheduler.run_retention"
        return until, kept_by
    ended = {a["number"]: a.get("ended") for a in job.get("attempts") or []}.get(run["attempt"])
    if ended is None or not settings.run_retention:
        return None, "scheduler.run_retention"
    return ended + settings.run_retention, "scheduler.run_retention"


def gone_message(job: dict[str, Any], run: dict[str, Any], settings: SchedulerSettings, now: float) -> str:
    """What the node adds when the run folder is not there: whether retention removed it, and when."""
    until, kept_by = kept_until(job, run, settings)
    if until is None:
        return ""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(until))
    if now >= until:
        return (
            f"\nftconsole: the environment of job {job['id']} attempt {run['attempt']} is gone: it was kept until "
            f"{when} ({kept_by}), and ended runs are removed after that"
        )
    return f"\nftconsole: it should be kept until {when} ({kept_by}): it was never made there, or was removed by hand"


HYBRID_MODES = ("horovod", "mpich")  # on several nodes, with an image: the MPI hybrid model


def job_banner(job: dict[str, Any], run: dict[str, Any]) -> str:
    text = (
        f"ftconsole: job {job['id']} ({job['name']}, {job['status']}) attempt {run['attempt']} rank {run['rank']} "
        f"({_run_state(run)}) on {run['node']}:{run['run_dir']} - env of the run loaded; exit to return"
    )
    spec = job.get("spec") or {}
    image = spec.get("image")
    attempt: dict[str, Any] = next((a for a in job.get("attempts") or () if a.get("number") == run["attempt"]), {})
    token = attempt.get("token")
    if image and token and spec.get("mode") in HYBRID_MODES and len(attempt.get("runs") or ()) > 1:
        text += (  # the MPI hybrid model (scheduler/node/container_exec.py): one container per MPI process
            f"\nftconsole: mpirun starts each MPI process in a container of {image} of its own, "
            f"ft-{token}-p<MPI rank> (its runtime's `ps --filter name=ft-{token}-` lists this node's; "
            "`exec -it NAME sh` enters one while it runs)"
        )
    elif image and token:  # this shell is on the node: say where the rank itself runs
        text += (
            f"\nftconsole: the rank runs in container ft-{token}-r{run['rank']} of {image} (its runtime's "
            f"`exec -it ft-{token}-r{run['rank']} sh` enters it while it runs)"
        )
    return text


def node_banner(node: str, state: str | None = None, reasons: Sequence[str] = ()) -> str:
    how = "" if state is None else f" ({state}{': ' + '; '.join(reasons) if reasons else ''})"
    return f"ftconsole: node {node}{how} - login shell in $HOME; exit to return"


def job_shell(
    loaded: LoadedConfig,
    job: dict[str, Any],
    *,
    rank: int | None = None,
    attempt: int | None = None,
    command: str | None = None,
    options: SshOptions | None = None,
) -> ShellTarget:
    """The shell in the run folder of a job (`show`'s JSON) rank's run, with its env."""
    run = pick_run(job, rank=rank, attempt=attempt)
    nodes = {n.name: n for n in loaded.cluster.node_list()}
    node = nodes.get(run["node"])
    if node is None:
        raise NotFound(f"node {run['node']} of job {job['id']} rank {run['rank']} is not in {loaded.file} any more")
    options = options or ssh_options(loaded)
    banner = job_banner(job, run)
    gone = gone_message(job, run, loaded.cluster.scheduler, time.time())
    user = str(job.get("owner") or "") if loaded.cluster.scheduler.run_as == "submitter" else ""
    remote = job_remote_command(
        run["run_dir"], banner=banner, command=command, python=options.python, gone=gone, user=user
    )
    return ShellTarget(argv=ssh_argv(options, node, remote, tty=command is None), banner=banner, node=node.name)


def node_shell(
    loaded: LoadedConfig,
    node_name: str,
    *,
    state: str | None = None,
    reasons: Sequence[str] = (),
    command: str | None = None,
    options: SshOptions | None = None,
) -> ShellTarget:
    """A login shell in $HOME on a configured node (NotFound for a name not in the config)."""
    node = find_node(loaded, node_name)
    options = options or ssh_options(loaded)
    banner = node_banner(node.name, state, reasons)
    remote = node_remote_command(banner=banner, command=command)
    return ShellTarget(argv=ssh_argv(options, node, remote, tty=command is None), banner=banner, node=node.name)


async def shell_target(
    client: Asks,
    loaded: LoadedConfig,
    target: str,
    *,
    rank: int | None = None,
    attempt: int | None = None,
    command: str | None = None,
) -> ShellTarget:
    """A job id (all digits: `show` through the client) or a node name (its state through `nodes`)."""
    if is_job_id(target):
        job = await client.call("show", job=int(target))
        return job_shell(loaded, job, rank=rank, attempt=attempt, command=command)
    if rank is not None or attempt is not None:
        raise UsageError(f"--rank and --attempt are for a job, and {target!r} is a node name")
    find_node(loaded, target)  # NotFound before asking the scheduler
    views = await client.call("nodes", nodeset=target)
    view = views[0] if views else {}
    return node_shell(loaded, target, state=view.get("state"), reasons=view.get("reasons") or (), command=command)
