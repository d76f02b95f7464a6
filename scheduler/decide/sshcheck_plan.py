"""The pre-launch SSH check as the scheduler plans it: rank 0's step before a launcher that starts the other ranks
from the first node over SSH (DeepSpeed's pdsh runner, mpirun, hydra). `ssh_check_argv` builds the step's argv
(`python3 -c SOURCE ...`, the node-side check being `scheduler/node/sshcheck.py`), with what the launcher's own command
line says of how it connects (`ssh_check_settings`); the rest (env, MCA files, ~/.ssh/config) the check reads on
the node. Pure; tested from tables (tests/unit/test_launcher.py, tests/unit/test_sshcheck.py)."""

from __future__ import annotations

import json
import posixpath
import shlex

from ftconsole.scheduler.decide.deepspeed import deepspeed_value
from ftconsole.scheduler.decide.launch_inputs import LaunchInput, RankLaunch
from ftconsole.scheduler.node.bundle import script
from ftconsole.scheduler.node.sshcheck import LAUNCHERS, MCA_NAMES, hydra_options
from ftconsole.scheduler.spec.command import is_mpi_launcher

SSH_CHECK_TIMEOUT = 5  # seconds: ssh's ConnectTimeout in the pre-launch check, where the launcher sets none

_MCA_OPTIONS = frozenset({"-mca", "--mca", "-gmca", "--gmca", "-prtemca", "--prtemca"})  # NAME VALUE
_HYDRA_PAIRS = frozenset({"-genv", "--genv", "-env", "--env"})  # hydra's options of two values
_FLAGS = frozenset(  # mpirun's and mpiexec's common options without a value (the program's start is found by them)
    {"--allow-run-as-root", "-allow-run-as-root", "--oversubscribe", "-oversubscribe", "--tag-output",
     "-tag-output", "--timestamp-output", "--report-bindings", "-report-bindings", "--display-map",
     "-display-map", "--use-hwthread-cpus", "-v", "--verbose", "-q", "--quiet", "-enable-x", "-disable-x",
     "-l", "-prepend-rank", "-verbose", "-info", "-print-all-exitcodes"}
)  # fmt: skip
_OPENMPI_NAMES = frozenset({"mpirun.openmpi", "mpiexec.openmpi", "orterun"})
_HYDRA_NAMES = frozenset({"mpirun.mpich", "mpiexec.mpich", "mpiexec.hydra"})


def ssh_check_argv(inp: LaunchInput, ranks: tuple[RankLaunch, ...]) -> tuple[str, ...] | None:
    """Rank 0's pre-launch SSH check, or None when no launcher starts ranks from the first node.

    Needed when rank 0 alone launches on a job of several nodes (deepspeed, mpirun, hydra). The peers are the
    other nodes (each host once); DeepSpeed's pdsh runner also reaches the first node itself over SSH, so it
    is checked too. The check connects as the launcher will (`scheduler/node/sshcheck.py`): what the launcher's
    command line says of that is its SETTINGS argument (`ssh_check_settings`), the rest it reads on the node.
    """
    if len(inp.nodes) < 2 or [r.rank for r in ranks if r.launch] != [0]:
        return None
    kind, settings = ssh_check_settings(inp.mode, ranks[0].argv)
    first = inp.nodes[0]
    itself = kind == "pdsh"
    peers: dict[str, str] = {}
    for node in inp.nodes if itself else inp.nodes[1:]:
        if node.host not in peers.values() and (itself or node.host != first.host):
            peers[node.name] = node.host
    if not peers:
        return None
    launcher = LAUNCHERS.get(kind, "the launcher")
    data = json.dumps(settings, sort_keys=True, separators=(",", ":")) if settings else ""
    pairs = [part for name, host in peers.items() for part in (name, host)]
    return ("python3", "-c", script("sshcheck"), first.name, str(SSH_CHECK_TIMEOUT), data, launcher, *pairs)


def ssh_check_settings(mode: str, argv: tuple[str, ...]) -> tuple[str, dict[str, object]]:
    """How the launcher rank 0 runs (`argv`, in `mode`) connects: its kind (a key of `sshcheck.LAUNCHERS`) and
    what its command line says of that (empty when nothing), or ``{"skip": reason}`` where it checks by itself.

    deepspeed: ``--ssh_port`` and pdsh's ``-R``, ``-l``, ``-t`` in ``--launcher_args``; another ``--launcher``
    than pdsh is not checked. horovodrun checks SSH itself (its ``--ssh-port``, ``--ssh-identity-file``) before
    it starts anything. mpirun (Open MPI; horovod mode, or an Open MPI launcher name): the ``--mca`` options of
    the parameters that choose its way. hydra (mpich mode, or an MPICH launcher name): ``-launcher``,
    ``-launcher-exec``, ``-enable-x``/``-disable-x``. ``program``: the launcher's argv[0] when not ``mpirun``
    (its installation's configuration files are found beside it).
    """
    name = posixpath.basename(argv[0])
    if mode == "pytorch-deepspeed":
        return "pdsh", _deepspeed_ssh(argv)
    if name == "horovodrun":
        reason = "horovodrun checks SSH to every host itself (its --ssh-port, --ssh-identity-file) before it starts"
        return "openmpi", {"skip": reason}
    hydra = name in _HYDRA_NAMES or (mode == "mpich" and name not in _OPENMPI_NAMES)
    words = _option_words(argv, _HYDRA_PAIRS if hydra else _MCA_OPTIONS)
    settings: dict[str, object] = {}
    if hydra:
        options = hydra_options(words)
        if options:
            settings["hydra"] = options
    else:
        mca: dict[str, str] = {}
        for i, word in enumerate(words[:-2]):
            if word in _MCA_OPTIONS and words[i + 1] in MCA_NAMES:
                mca.setdefault(words[i + 1], words[i + 2])
        if mca:
            settings["mca"] = mca

    if argv[0] != "mpirun" and is_mpi_launcher(argv):
        settings["program"] = argv[0]
    return ("hydra" if hydra else "openmpi"), settings


def _deepspeed_ssh(argv: tuple[str, ...]) -> dict[str, object]:
    launcher = deepspeed_value(argv, "--launcher") or "pdsh"
    if launcher != "pdsh":
        return {"skip": f"DeepSpeed's runner starts the ranks with --launcher {launcher}; the check follows pdsh only"}
    pdsh: dict[str, str] = {}
    try:
        words = shlex.split(deepspeed_value(argv, "--launcher_args") or "")
    except ValueError:  # DeepSpeed's runner splits them the same way: it fails before connecting anywhere
        words = []
    for option, key in (("-R", "rcmd"), ("-l", "user"), ("-t", "timeout")):
        for i, word in enumerate(words):
            if word == option and i + 1 < len(words):
                pdsh.setdefault(key, words[i + 1])
            elif word.startswith(option) and len(word) > len(option):
                pdsh.setdefault(key, word[len(option) :])
    port = deepspeed_value(argv, "--ssh_port")
    if port:
        pdsh["port"] = port
    return {"pdsh": pdsh} if pdsh else {}


def _option_words(argv: tuple[str, ...], pairs: frozenset[str]) -> list[str]:
    """The words of a launcher's command line before its program: an option, then maybe its value (two after
    one of `pairs`); a bare word that follows a value, or follows nothing, is the program. (An option of
    `_FLAGS` takes no value; after an unknown one without a value, the program's first word passes for its value
    and the scan ends one word later.)"""
    words: list[str] = []
    i, value_may_follow = 1, False
    while i < len(argv):
        word = argv[i]
        if word in pairs:
            words += argv[i : i + 3]
            i, value_may_follow = i + 3, False
            continue
        if word.startswith("-"):
            value_may_follow = word not in _FLAGS and "=" not in word
        elif value_may_follow:
            value_may_follow = False
        else:
            break
        words.append(word)
        i += 1
    return words
