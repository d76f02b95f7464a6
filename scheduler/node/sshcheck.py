"""The pre-launch SSH check: node side, standard library only, Python 3.8.

Run on a job's first node right before a launcher that starts the other ranks from there over SSH (DeepSpeed's
pdsh runner, mpirun, hydra), as ``python3 -c SOURCE ME TIMEOUT SETTINGS LAUNCHER NAME HOST [NAME HOST ...]``,
with the rank's environment (the launcher's own). It connects to every peer at once the way that launcher will
and runs ``true`` there, and exits 255 (ssh's own code for a connection failure) with one line on what to fix
and then one line per unreachable peer naming the pair (last: the run's error quotes the last line of output).

LAUNCHER is the launcher's name in messages, one of `LAUNCHERS` (another name: plain ``ssh HOST``). SETTINGS is
"" or a JSON object of what the launcher's command line says (``sshcheck_plan.ssh_check_settings``: ``skip``,
``program``, ``mca``, ``hydra``, ``pdsh``); the environment and the files are read here, on the node, where the
launcher reads them. How each launcher connects (found by running
them with a stand-in ssh: Open MPI 4.1, MPICH's hydra 4.0, pdsh 2.34):

mpirun (Open MPI)
    ``AGENT... [-x] ARGS... HOST``: AGENT the first entry of ``plm_rsh_agent`` (``ssh : rsh`` by default, entries
    split at ``:``, each at spaces) whose program is in PATH, ``-x`` after ssh (no X11) unless given, ARGS the
    words of ``plm_rsh_args`` (split at spaces, quotes kept: mpirun does not parse them). Each parameter (and
    ``plm``, which may pick a launcher without SSH) from, first found: the override file, mpirun's command line
    (``--mca``), the environment (``OMPI_MCA_``, ``PRTE_MCA_``), ``~/.openmpi/mca-params.conf``, the system
    file (``openmpi-mca-params.conf``) in Open MPI's sysconfdir (``$OPAL_SYSCONFDIR``, else ``etc`` beside the
    ``bin`` of mpirun or of ``$OPAL_PREFIX``, else ``/etc/openmpi``). Open MPI 5's names (``plm_ssh_agent``,
    ``plm_ssh_args``, ``~/.prrte``, ``prte-mca-params.conf``) are read too.
hydra (MPICH)
    ``EXEC [-x] EXTRA... HOST``: the launcher (``-launcher``) and its program (``-launcher-exec``) from, first
    found: mpiexec's command line, hydra's config file (``$HYDRA_CONFIG_FILE``, else ``~/.mpiexec.hydra.conf``,
    else ``mpiexec.hydra.conf`` in ``etc`` beside hydra's ``bin``), ``HYDRA_LAUNCHER``/``HYDRA_LAUNCHER_EXEC``,
    ``HYDRA_BOOTSTRAP``/``HYDRA_BOOTSTRAP_EXEC``; launcher ``ssh`` by default, its program the launcher's name.
    ``-x`` with ssh (``-X`` with ``-enable-x``, none with ``-disable-x``); EXTRA the words of
    ``HYDRA_LAUNCHER_EXTRA_ARGS``.
DeepSpeed's runner (pdsh)
    ``ssh -oConnectTimeout=T APPEND... ARGS...`` with ``%h`` (host), ``%u`` (user), ``%n`` (rank) in ARGS
    filled in: DeepSpeed sets ``PDSH_RCMD_TYPE=ssh`` (only pdsh's ``-R`` in ``--launcher_args`` beats it) and
    adds ``-p PORT`` of ``--ssh_port`` to ``PDSH_SSH_ARGS_APPEND``; ARGS is ``PDSH_SSH_ARGS`` (else
    ``-2 -a -x -l%u %h``, ``-l%u`` only for another user, ``-l`` of ``--launcher_args``), with ``-l%u`` and
    ``%h`` added where missing; T is pdsh's connect timeout (``-t``, ``PDSH_CONNECT_TIMEOUT``, 10 s).

ssh gets ``-o BatchMode=yes`` right after its name (the launchers run it with no terminal, where it cannot ask
either) and, where neither the launcher's options nor the user's ssh config (asked with ``ssh -G``) give one,
``-o ConnectTimeout=TIMEOUT`` right before the host: ssh takes the first value it reads of an option and reads
``~/.ssh/config`` after its command line, so the launcher's options, then the user's config, stand as they do for
the launcher. The deadline of a connection is its ConnectTimeout and GRACE seconds.
Another program (rsh, a wrapper script) is run as the launcher would run it, bounded by the same deadline. A way
the check cannot follow (pdsh's built-in rsh, hydra's slurm launcher, a missing agent, which the launcher reports
itself) is not checked: one line says why, exit 0. Never a refusal for a way the launcher does not take.
"""

import contextlib
import json
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import time

GRACE = 5  # seconds past ssh's ConnectTimeout before a peer that has not answered counts as failed
PDSH_CONNECT_TIMEOUT = 10  # pdsh's default -t

LAUNCHERS = {  # how a launcher connects -> its name in messages (the LAUNCHER argument)
    "openmpi": "mpirun (OpenMPI)",
    "hydra": "MPICH's mpirun (hydra)",
    "pdsh": "DeepSpeed's runner (pdsh)",
}
_KINDS = {name: kind for kind, name in LAUNCHERS.items()}

_OMPI_AGENT = ("plm_rsh_agent", "plm_ssh_agent", "orte_rsh_agent", "pls_rsh_agent")
_OMPI_ARGS = ("plm_rsh_args", "plm_ssh_args")
MCA_NAMES = frozenset(("plm", *_OMPI_AGENT, *_OMPI_ARGS))  # the MCA parameters that choose mpirun's way
_HYDRA_LAUNCHERS = ("ssh", "rsh")  # hydra's launchers that reach a host by a remote shell (fork stays local)


class Way:
    """How a launcher reaches a host: `argv` before the host (`template`: pdsh's, with %h %u %n inside), where
    its settings came from (for messages); for ssh, the ConnectTimeout the launcher gives (`timeout`), else where
    ours would go (`ours_at`: right before the host)."""

    def __init__(self, argv, origin, template=False, user="", timeout=None, ours_at=None):
        self.argv, self.origin, self.template, self.user = argv, origin, template, user
        self.timeout, self.ours_at = timeout, ours_at

    def command(self, host, rank=0, ours=None):
        """The argv that runs ``true`` on `host` (`rank`: its place in the launcher's host list, pdsh's %n),
        with ``-o ConnectTimeout=OURS`` where the way has room for it."""
        argv = list(self.argv)
        if ours is not None and self.ours_at is not None:
            argv[self.ours_at : self.ours_at] = ["-o", "ConnectTimeout=%d" % ours]
        if self.template:
            return [_pdsh_format(a, host, self.user, rank) for a in argv] + ["true"]
        return [*argv, host, "true"]

    @property
    def ssh(self):
        return os.path.basename(self.argv[0]) == "ssh"


def way(launcher, settings, env):
    """How `launcher` (a name of LAUNCHERS) will connect, with `settings` (the SETTINGS object) and `env` (the
    launcher's environment): a Way, or a str saying why the check cannot follow it."""
    if settings.get("skip"):
        return str(settings["skip"])
    kind = _KINDS.get(launcher)
    if kind == "openmpi":
        found = _openmpi(settings, env)
    elif kind == "hydra":
        found = _hydra(settings, env)
    elif kind == "pdsh":
        found = _pdsh(settings, env)
    else:
        found = (["ssh"], [], "")
    if isinstance(found, str):
        return found
    argv, origin, user = found
    template = kind == "pdsh"
    if os.path.basename(argv[0]) != "ssh":
        return Way(argv, origin, template, user)
    argv = [argv[0], "-o", "BatchMode=yes", *argv[1:]]
    given = _ssh_timeout(argv)
    if given is not None:
        return Way(argv, origin, template, user, timeout=given)
    host_at = next((i for i, a in enumerate(argv) if "%h" in a), len(argv)) if template else len(argv)
    return Way(argv, origin, template, user, ours_at=host_at)


def connection(how, host, rank, timeout, env):
    """The argv that reaches `host` and the seconds its connection may take: ssh's ConnectTimeout, the
    launcher's, else the one of the user's ssh config for that host (``ssh -G``, which connects nowhere), else
    ours (`timeout`, added right before the host); `timeout` for another program."""
    if how.ours_at is None:
        return how.command(host, rank), how.timeout or timeout
    configured = _configured_timeout(how.command(host, rank)[:-1], env)
    if configured is not None:
        return how.command(host, rank), configured
    return how.command(host, rank, ours=timeout), timeout


# --- Open MPI ----------------------------------------------------------------------------------------------------


def _openmpi(settings, env):
    params = _mca_params(settings, env)
    plm = params.get("plm")
    if plm is not None and not _selects(plm[0], ("rsh", "ssh")):
        return "mpirun is told plm=%s (%s): it starts the ranks without SSH" % (plm[0], plm[1])
    agent, agent_from = params.get("plm_rsh_agent", ("ssh : rsh", ""))
    path = env.get("PATH", os.defpath)
    words = None
    for entry in agent.split(":"):
        entry_words = [w for w in entry.strip().split(" ") if w]
        if entry_words and shutil.which(entry_words[0], path=path):
            words = entry_words
            break
    if words is None:
        where = " (%s)" % agent_from if agent_from else ""
        return "mpirun finds no agent of plm_rsh_agent '%s'%s in PATH; it will say so itself" % (agent, where)
    argv = list(words)
    if os.path.basename(argv[0]) == "ssh" and not any(a.lower() == "-x" for a in argv[1:]):
        argv.append("-x")
    args = params.get("plm_rsh_args", ("", ""))[0]
    argv += [w for w in args.split(" ") if w]
    origin = ["%s from %s" % (name, params[name][1]) for name in ("plm_rsh_agent", "plm_rsh_args") if name in params]
    return argv, origin, ""


def _mca_params(settings, env):
    """The parameters mpirun reads that choose its way, each as (value, where it came from), by precedence."""
    home = _home(env)
    sysconf = _ompi_sysconfdir(str(settings.get("program") or "mpirun"), env)
    layers = []
    if sysconf:
        layers.append(_mca_file(os.path.join(sysconf, "openmpi-mca-params-override.conf")))
    given = settings.get("mca") or {}
    layers.append({str(k): (str(v), "mpirun's command line") for k, v in given.items()})
    for prefix in ("OMPI_MCA_", "PRTE_MCA_"):
        layers.append({k[len(prefix) :]: (v, k) for k, v in env.items() if k.startswith(prefix)})
    files = [os.path.join(home, ".openmpi", "mca-params.conf"), os.path.join(home, ".prrte", "mca-params.conf")]
    if sysconf:
        files += [os.path.join(sysconf, "openmpi-mca-params.conf"), os.path.join(sysconf, "prte-mca-params.conf")]
    layers += [_mca_file(path) for path in files]
    found = {}
    for key, names in (("plm", ("plm",)), ("plm_rsh_agent", _OMPI_AGENT), ("plm_rsh_args", _OMPI_ARGS)):
        for layer in layers:
            hit = next((layer[n] for n in names if n in layer), None)
            if hit is not None:
                found[key] = hit
                break
    return found


def _mca_file(path):
    """An MCA parameter file: ``name = value`` lines (the value to the end of the line, quotes kept, as Open MPI
    reads it), ``#`` comment lines; the last line of a name wins. A missing or unreadable file is empty."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return {}
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, value = line.split("=", 1)
        values[name.strip()] = (value.strip(), path)
    return values


def _ompi_sysconfdir(program, env):
    if env.get("OPAL_SYSCONFDIR"):
        return env["OPAL_SYSCONFDIR"]
    places = []
    if env.get("OPAL_PREFIX"):
        places.append(os.path.join(env["OPAL_PREFIX"], "etc"))
    places += [_etc_beside(program, env), "/etc/openmpi"]
    names = ("openmpi-mca-params.conf", "prte-mca-params.conf")
    return next((p for p in places if p and any(os.path.isfile(os.path.join(p, n)) for n in names)), None)


def _selects(value, names):
    """Does an MCA component selection (``a,b`` or ``^a,b``) allow any of `names`?"""
    exclude = value.startswith("^")
    listed = {n.strip() for n in value.lstrip("^").split(",") if n.strip()}
    return not listed & set(names) if exclude else bool(listed & set(names))


# --- hydra -------------------------------------------------------------------------------------------------------


def _hydra(settings, env):
    given = settings.get("hydra") or {}
    conf, conf_path = _hydra_config(str(settings.get("program") or "mpirun"), env)

    def pick(key, names):
        if key in given:
            return str(given[key]), "mpiexec's command line"
        if key in conf:
            return conf[key], conf_path
        for name in names:
            if env.get(name):
                return env[name], name
        return None, None

    launcher, launcher_from = pick("launcher", ("HYDRA_LAUNCHER", "HYDRA_BOOTSTRAP"))
    launcher = launcher or "ssh"
    if launcher == "fork":
        return "hydra is told to use its fork launcher (%s): it starts every rank on this node" % launcher_from
    if launcher not in _HYDRA_LAUNCHERS:
        return "hydra is told to use its %s launcher (%s), not a remote shell" % (launcher, launcher_from)
    program, program_from = pick("launcher-exec", ("HYDRA_LAUNCHER_EXEC", "HYDRA_BOOTSTRAP_EXEC"))
    program = program or launcher
    if not shutil.which(program, path=env.get("PATH", os.defpath)):
        return "hydra's launcher program %s is not in PATH; hydra will say so itself" % program
    x = given.get("x", conf.get("x", "-x"))
    argv = [program] + ([x] if launcher == "ssh" and x else [])
    argv += [w for w in env.get("HYDRA_LAUNCHER_EXTRA_ARGS", "").split(" ") if w]
    origin = ["the launcher from %s" % launcher_from] if launcher_from else []
    origin += ["its program from %s" % program_from] if program_from else []
    origin += ["HYDRA_LAUNCHER_EXTRA_ARGS"] if env.get("HYDRA_LAUNCHER_EXTRA_ARGS", "").strip() else []
    return argv, origin, ""


def hydra_options(words):
    """Hydra's options of a way to connect among `words` (mpiexec's, or its config file's): a dict with
    ``launcher``, ``launcher-exec`` (``-bootstrap``, ``-bootstrap-exec`` are their old names) and ``x`` (``-X``
    with ``-enable-x``, "" with ``-disable-x``); one or two dashes, the value after ``=`` or as the next word
    (``-genv``/``-env`` take two)."""
    names = {"launcher": "launcher", "bootstrap": "launcher", "launcher-exec": "launcher-exec",
             "bootstrap-exec": "launcher-exec"}  # fmt: skip
    found = {}
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-"):
            continue
        name, glued, value = word.lstrip("-").partition("=")
        if name in ("genv", "env"):  # NAME VALUE
            i += 2
        elif name in ("enable-x", "disable-x"):
            found["x"] = "-X" if name == "enable-x" else ""
        elif name in names:
            if not glued:
                if i >= len(words):
                    break
                value, i = words[i], i + 1
            found.setdefault(names[name], value)  # hydra refuses a second one: the first stands
    return found


def _hydra_config(program, env):
    """Hydra's config file (options as on mpiexec's command line, ``#`` comments): its options and its path."""
    path = env.get("HYDRA_CONFIG_FILE")
    if not path:
        places = [os.path.join(_home(env), ".mpiexec.hydra.conf")]
        etc = _etc_beside(program, env)
        places += [os.path.join(etc, "mpiexec.hydra.conf")] if etc else []
        path = next((p for p in places if os.path.isfile(p)), None)
    if not path:
        return {}, None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            words = [w for line in f for w in line.split("#", 1)[0].split()]
    except OSError:
        return {}, None
    return hydra_options(words), path


# --- pdsh (DeepSpeed's runner) -----------------------------------------------------------------------------------


def _pdsh(settings, env):
    given = settings.get("pdsh") or {}
    rcmd = str(given.get("rcmd") or "ssh")  # DeepSpeed's runner sets PDSH_RCMD_TYPE=ssh over the environment's
    if rcmd != "ssh":
        return "pdsh is told -R %s (--launcher_args): its own remote shell, which the check cannot imitate" % rcmd
    local = _local_user()
    user = str(given.get("user") or local)
    limit = _int(given.get("timeout"), _int(env.get("PDSH_CONNECT_TIMEOUT"), PDSH_CONNECT_TIMEOUT))
    append = env.get("PDSH_SSH_ARGS_APPEND", "")
    origin = ["PDSH_SSH_ARGS_APPEND"] if append.strip() else []
    if given.get("port"):
        append += " -p %s" % given["port"]  # as DeepSpeed's runner adds its --ssh_port
        origin.append("-p from deepspeed --ssh_port")
    args = env.get("PDSH_SSH_ARGS")
    if args is None:
        words = ["-2", "-a", "-x"] + (["-l%u"] if user != local else []) + ["%h"]
    else:
        origin.append("PDSH_SSH_ARGS")
        words = [w for w in args.split(" ") if w]
        words += ["-l%u"] if user != local and not any("%u" in w for w in words) else []
        words += ["%h"] if not any("%h" in w for w in words) else []
    argv = ["ssh"] + (["-oConnectTimeout=%d" % limit] if limit > 0 else [])
    return argv + [w for w in append.split(" ") if w] + words, origin, user


def _pdsh_format(word, host, user, rank):
    out, i = [], 0
    while i < len(word):
        if word[i] == "%" and i + 1 < len(word):
            code = word[i + 1]
            out.append({"h": host, "u": user, "n": str(rank), "%": "%"}.get(code, "%" + code))
            i += 2
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


# --- helpers -----------------------------------------------------------------------------------------------------


def _ssh_timeout(argv):
    """The ConnectTimeout ssh will use among `argv`'s ``-o`` options (the first one), or None."""
    for i, word in enumerate(argv):
        if word == "-o" and i + 1 < len(argv):
            option = argv[i + 1]
        elif word.startswith("-o") and len(word) > 2:
            option = word[2:]
        else:
            continue
        key, _, value = option.replace("=", " ", 1).partition(" ")
        if key.strip().lower() == "connecttimeout":
            return _int(value.strip(), None)
    return None


def _configured_timeout(argv, env):
    """The ConnectTimeout ssh's config files give for the connection of `argv` (``ssh -G``), or None."""
    try:
        done = subprocess.run([argv[0], "-G", *argv[1:]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env, timeout=GRACE or 1)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    for line in done.stdout.decode("utf-8", "replace").splitlines() if done.returncode == 0 else []:
        key, _, value = line.partition(" ")
        if key.lower() == "connecttimeout":
            return _int(value, None)
    return None


def _etc_beside(program, env):
    """``etc`` beside the ``bin`` folder of `program` found in PATH (symbolic links followed), or None."""
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    return os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(found))), "etc") if found else None


def _stop(proc):
    """Kill a connection that did not answer and what it started (its session: a ProxyCommand), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=GRACE or 1)  # closes its pipe


def _home(env):
    return env.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir


def _local_user():
    return pwd.getpwuid(os.getuid()).pw_name


def _int(value, default):
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


# --- the check ---------------------------------------------------------------------------------------------------


def check(me, timeout, settings, launcher, peers, env=None):
    """Exit status: 0 when every peer answers (or the check cannot follow the launcher's way: one line says
    why), else 255 after the lines on stderr (see the module docstring)."""
    env = dict(os.environ if env is None else env)
    how = way(launcher, settings, env)
    if isinstance(how, str):
        print("ftconsole: ssh check: not run: %s" % how)
        return 0
    procs, ours = [], False
    for rank, (name, host) in enumerate(peers):
        argv, seconds = connection(how, host, rank, timeout, env)
        ours = ours or len(argv) > len(how.command(host, rank))
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    env=env, start_new_session=True)  # fmt: skip
        except OSError as exc:
            sys.stderr.write("ftconsole: ssh check: cannot run %s on %s: %s\n" % (how.argv[0], me, exc))
            return 255
        procs.append((name, host, proc, time.monotonic() + seconds + GRACE, seconds + GRACE))
    failed = []
    for name, host, proc, deadline, allowed in procs:
        try:
            err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))[1]
        except subprocess.TimeoutExpired:
            _stop(proc)
            failed.append((name, host, "no answer within %ds" % allowed))
            continue
        if proc.returncode != 0:
            lines = [ln.strip() for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
            last = lines[-1] if lines else "no message"
            failed.append((name, host, "%s (%s exit %d)" % (last, os.path.basename(how.argv[0]), proc.returncode)))
    shown = shlex.join(how.command("HOST", ours=timeout if ours else None))
    settings_note = " (%s)" % "; ".join(how.origin) if how.origin else ""
    if not failed:
        print("ftconsole: ssh check: %s reaches %s by SSH as %s does: %s%s"
              % (me, ", ".join(n for n, _ in peers), launcher, shown, settings_note))  # fmt: skip
        return 0
    hosts = " ".join(sorted({host for _, host, _ in failed}))
    user = _local_user()
    fix = (
        "%s's key allowed in ~/.ssh/authorized_keys on each of them (ssh-copy-id), their host keys in %s's "
        "~/.ssh/known_hosts (ssh-keyscan), and the user %s existing on every node" % (user, user, user)
        if how.ssh
        else "%s's way in allowed on each of them" % user
    )
    sys.stderr.write(
        "ftconsole: %s starts this job's ranks from %s over SSH as %s; fix it on the nodes, then resubmit: on %s, "
        "'%s'%s must work for HOST in %s with no prompt: %s (docs/jobs.md, node-to-node SSH)\n"
        % (launcher, me, user, me, shown, settings_note, hosts, fix)
    )
    for name, host, why in failed:  # last: the run's error quotes the last line, which names a pair
        target = "itself" if name == me else name
        sys.stderr.write(
            "ftconsole: ssh check: %s cannot reach %s (%s) by SSH without a prompt: %s\n" % (me, target, host, why)
        )
    return 255


def main(argv):
    me, timeout, launcher = argv[0], int(argv[1]), argv[3]
    settings = json.loads(argv[2]) if argv[2] else {}
    peers = list(zip(argv[4::2], argv[5::2]))  # noqa: B905  (Python 3.8)
    return check(me, timeout, settings if isinstance(settings, dict) else {}, launcher, peers)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
