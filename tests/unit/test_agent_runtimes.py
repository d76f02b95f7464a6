"""Container runtimes on a node, found by the probe agent run for real: fake runtimes (small sh scripts) on a
PATH of their own, a fake node tree for CDI specs, hooks and driver libraries; the decisions from tables."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from ftconsole.format import runtime_lines
from ftconsole.probes.results import ContainerRuntime, parse_runtimes
from ftconsole.scheduler.node import agent_runtimes as rt
from tests.unit.test_agent import agent_env, run_agent

NO_DAEMON = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
DOCKER_INFO = '{"ServerVersion":"28.2.2","Runtimes":{"runc":{},"nvidia":{"path":"nvidia-container-runtime"}},"CDISpecDirs":["/etc/cdi","/var/run/cdi"]}'  # noqa: E501
CDI_SPEC = 'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n- name: "0"\n'


def script(version: str, info: str = "", info_exit: int = 0, info_err: str = "") -> str:
    """A fake runtime: `--version` prints `version`; `info` prints `info` (stdout), `info_err` (stderr), exits."""
    return (
        "#!/bin/sh\n"
        f'case "$1" in\n  --version) echo {_sh(version)} ;;\n'
        f"  info) printf '%s' {_sh(info)}; printf '%s\\n' {_sh(info_err)} >&2; exit {info_exit} ;;\n"
        "esac\n"
    )


def _sh(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


SLEEPER = "#!/bin/sh\n/bin/sleep 30\n"  # its child keeps the output pipes open: the agent must not wait for it
FAILING = "#!/bin/sh\necho 'enroot: cannot read /etc/enroot/enroot.conf' >&2\nexit 3\n"
TOOL = "#!/bin/sh\nexit 0\n"


def node(tmp_path: Path, bins: dict[str, str], files: dict[str, str]) -> tuple[Path, Path]:
    """A PATH folder holding `bins` (name: script, or "-> other" for a link) and a node tree with `files`."""
    bin_dir, root = tmp_path / "bin", tmp_path / "root"
    bin_dir.mkdir()
    root.mkdir()
    for name, text in bins.items():
        if text.startswith("-> "):
            (bin_dir / name).symlink_to(text[3:])
            continue
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return bin_dir, root


def entry(name: str, version: str | None, **fields: Any) -> ContainerRuntime:
    return ContainerRuntime(name=name, path=None, version=version, **fields)


CASES = [
    pytest.param({}, {}, [], id="none"),
    pytest.param(
        {"podman": script("podman version 4.3.1", "{}")},
        {"etc/cdi/nvidia.yaml": CDI_SPEC},
        [entry("podman", "4.3.1", usable=True, gpus=True, gpus_via=("CDI",))],
        id="podman-cdi",
    ),
    pytest.param(
        {"podman": script("podman version 4.9.3", "{}")},
        {"etc/cdi/fpga.yaml": "kind: vendor.com/fpga\n", "var/run/cdi/gpu.json": '{"kind":"amd.com/gpu"}'},
        [entry("podman", "4.9.3", usable=True)],
        id="podman-cdi-without-nvidia",
    ),
    pytest.param(
        {"podman": script("podman version 4.3.1", "", 125, "Error: cannot set up namespace: newuidmap not found")},
        {"usr/share/containers/oci/hooks.d/oci-nvidia-hook.json": "{}"},
        [
            entry(
                "podman",
                "4.3.1",
                problem="podman info failed: Error: cannot set up namespace: newuidmap not found",
                gpus_via=("OCI hook",),
            )
        ],
        id="podman-info-fails",
    ),
    pytest.param(
        {"docker": script("Docker version 28.2.2, build e6534b4", '{"ServerErrors":["x"]}', 1, NO_DAEMON)},
        {"etc/cdi/nvidia.yaml": CDI_SPEC},
        [entry("docker", "28.2.2", problem=f"daemon not reachable: {NO_DAEMON}")],
        id="docker-without-daemon",
    ),
    pytest.param(
        {"docker": script("Docker version 28.2.2, build e6534b4", DOCKER_INFO), "nvidia-ctk": TOOL},
        {"var/run/cdi/nvidia.json": '{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","devices":[]}'},
        [entry("docker", "28.2.2", usable=True, gpus=True, gpus_via=("nvidia runtime", "--gpus (toolkit)", "CDI"))],
        id="docker-nvidia",
    ),
    pytest.param(
        {"apptainer": script("apptainer version 1.3.4"), "singularity": "-> apptainer", "nvidia-container-cli": TOOL},
        {},
        [entry("apptainer", "1.3.4", usable=True, gpus=True, gpus_via=("--nv",))],
        id="apptainer-nvccli-and-its-singularity-link",
    ),
    pytest.param(
        {"singularity": script("singularity-ce version 3.11.0-1.el8")},
        {"usr/lib64/libnvidia-ml.so.1": ""},
        [entry("singularity", "3.11.0-1.el8", usable=True, gpus=True, gpus_via=("--nv",))],
        id="singularity-driver-libraries",
    ),
    pytest.param(
        {"apptainer": script("apptainer version unknown-dev")},
        {},
        [entry("apptainer", "apptainer version unknown-dev", usable=True)],
        id="apptainer-unparsed-version-without-driver",
    ),
    pytest.param(
        {"enroot": script("3.4.1"), "nvidia-container-cli": TOOL},
        {"etc/enroot/hooks.d/98-nvidia.sh": "#!/bin/bash\n"},
        [entry("enroot", "3.4.1", usable=True, gpus=True, gpus_via=("nvidia hook",))],
        id="enroot-hook",
    ),
    pytest.param(
        {"enroot": script("3.4.1")},
        {"etc/enroot/hooks.d/98-nvidia.sh": "#!/bin/bash\n"},
        [entry("enroot", "3.4.1", usable=True)],
        id="enroot-hook-without-nvidia-container-cli",
    ),
    pytest.param(
        {"enroot": FAILING},
        {},
        [entry("enroot", None, problem="enroot --version failed: enroot: cannot read /etc/enroot/enroot.conf")],
        id="enroot-fails",
    ),
    pytest.param(
        {"podman": script("podman version 5.0.0", "{}"), "docker": script("Docker version 27.0.1", "{}")},
        {},
        [entry("podman", "5.0.0", usable=True), entry("docker", "27.0.1", usable=True)],
        id="two-in-order-without-gpus",
    ),
]


@pytest.mark.parametrize(("bins", "files", "expected"), CASES)
def test_runtimes_found_on_path(
    tmp_path: Path, bins: dict[str, str], files: dict[str, str], expected: list[ContainerRuntime]
) -> None:
    bin_dir, root = node(tmp_path, bins, files)
    report, doc = run_agent({"checks": [], "sysroot": str(root)}, env=agent_env(PATH=str(bin_dir)))
    assert [r.path for r in report.facts.runtimes] == [str(bin_dir / r.name) for r in expected]
    assert [(r.name, r.version, r.usable, r.problem, r.gpus, r.gpus_via) for r in report.facts.runtimes] == [
        (r.name, r.version, r.usable, r.problem, r.gpus, r.gpus_via) for r in expected
    ]
    assert doc["facts"]["runtimes"] == [r.to_json() for r in report.facts.runtimes]  # the report's shape


def test_enroot_hook_in_its_sysconf_dir(tmp_path: Path) -> None:
    bins = {"enroot": script("enroot 3.5.0"), "nvidia-container-cli": TOOL}
    bin_dir, root = node(tmp_path, bins, {"opt/enroot/etc/hooks.d/98-nvidia.sh": "#!/bin/bash\n"})
    env = agent_env(PATH=str(bin_dir), ENROOT_SYSCONF_PATH="/opt/enroot/etc")
    report, _ = run_agent({"checks": [], "sysroot": str(root)}, env=env)
    (enroot,) = report.facts.runtimes
    assert (enroot.version, enroot.gpus_via) == ("3.5.0", ("nvidia hook",))


def test_a_runtime_that_hangs_costs_its_share_of_the_deadline_and_no_more(tmp_path: Path) -> None:
    """podman's --version sleeps (with a child holding its output open): killed when the runtimes' share of the
    probe's time is spent, and docker, after it, is not run at all; the report still comes, in time."""
    bin_dir, root = node(tmp_path, {"podman": SLEEPER, "docker": script("Docker version 28.2.2", DOCKER_INFO)}, {})
    started = time.monotonic()
    report, _ = run_agent({"checks": ["load"], "sysroot": str(root), "timeout": 1}, env=agent_env(PATH=str(bin_dir)))
    assert time.monotonic() - started < 10
    podman, docker = report.facts.runtimes
    assert not podman.usable and (podman.problem or "").startswith("podman --version timed out after ")
    assert (docker.usable, docker.problem) == (False, "docker --version not run: the probe ran out of time")
    assert [c.name for c in report.checks] == ["load"]


# --- the decisions, from tables -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "version"),
    [
        ("podman version 4.3.1\n", "4.3.1"),
        ("Docker version 28.2.2, build e6534b4\n", "28.2.2"),
        ("apptainer version 1.3.4-1.el8\n", "1.3.4-1.el8"),
        ("singularity-ce version 3.11.0+22-g0a7ae0a.\n", "3.11.0+22-g0a7ae0a"),
        ("\n3.4.1\n", "3.4.1"),
        ("apptainer version unknown\n", "apptainer version unknown"),
        ("", None),
        (None, None),
    ],
)
def test_parse_version(output: str | None, version: str | None) -> None:
    assert rt.parse_version(output) == version


HOST = {"cdi_specs": [], "toolkit": [], "oci_hooks": [], "driver": False, "enroot_hook": False}


@pytest.mark.parametrize(
    ("name", "host", "info", "via"),
    [
        ("podman", {}, {}, []),
        ("podman", {"cdi_specs": ["/etc/cdi/nvidia.yaml"], "oci_hooks": ["/h"]}, {}, ["CDI", "OCI hook"]),
        ("docker", {"cdi_specs": ["/etc/cdi/nvidia.yaml"]}, {}, []),  # CDI not enabled in the daemon
        ("docker", {"cdi_specs": ["/etc/cdi/nvidia.yaml"]}, {"CDISpecDirs": ["/etc/cdi"]}, ["CDI"]),
        (
            "docker",
            {"toolkit": ["nvidia-container-cli"]},
            {"Runtimes": {"nvidia": {}}},
            ["nvidia runtime", "--gpus (toolkit)"],
        ),
        ("docker", {}, {"Runtimes": None}, []),
        ("apptainer", {"driver": True}, {}, ["--nv"]),
        ("singularity", {"toolkit": ["nvidia-ctk"]}, {}, []),  # --nv needs nvidia-container-cli or the driver
        ("enroot", {"enroot_hook": True}, {}, []),
        ("enroot", {"enroot_hook": True, "toolkit": ["nvidia-container-cli"]}, {}, ["nvidia hook"]),
        ("enroot", {"toolkit": ["nvidia-container-cli"]}, {}, []),
    ],
)
def test_gpus_via(name: str, host: dict[str, Any], info: dict[str, Any], via: list[str]) -> None:
    assert rt.gpus_via(name, {**HOST, **host}, info) == via


def test_a_runtime_that_is_not_usable_gives_no_gpus() -> None:
    host = {**HOST, "cdi_specs": ["/etc/cdi/nvidia.yaml"]}
    seen = {"version": "podman version 4.3.1", "info": None, "problem": "podman info failed: x"}
    assert rt.runtime_entry("podman", "/usr/bin/podman", seen, host) == {
        "name": "podman", "path": "/usr/bin/podman", "version": "4.3.1", "usable": False,
        "problem": "podman info failed: x", "gpus": False, "gpus_via": ["CDI"],
    }  # fmt: skip


# --- the console side: parsing and the lines people read ------------------------------------------------------


def test_parse_runtimes_keeps_what_it_can_read() -> None:
    raw = [
        {"name": "podman", "path": "/usr/bin/podman", "version": "4.3.1", "usable": True, "problem": None,
         "gpus": True, "gpus_via": ["CDI", 7]},
        {"name": "docker", "version": 28, "usable": "yes", "gpus": 1},
        {"path": "/nameless"},
        "enroot",
    ]  # fmt: skip
    assert parse_runtimes(raw) == (
        ContainerRuntime("podman", "/usr/bin/podman", "4.3.1", True, None, True, ("CDI",)),
        ContainerRuntime("docker"),
    )
    assert parse_runtimes(None) == parse_runtimes({"podman": {}}) == ()


@pytest.mark.parametrize(
    ("facts", "lines"),
    [
        (None, []),
        ({"os": "Debian"}, []),  # a report stored before runtimes were probed: unknown, not none
        ({"os": "Debian", "runtimes": []}, ["container runtimes: none found"]),
        (
            {"runtimes": [
                {"name": "podman", "version": "4.3.1", "usable": True, "gpus": True, "gpus_via": ["CDI"]},
                {"name": "docker", "version": "28.2.2", "usable": False,
                 "problem": f"daemon not reachable: {NO_DAEMON}"},
                {"name": "enroot", "version": "3.4.1", "usable": True},
                {"name": "apptainer", "usable": False},
            ]},
            [
                "container runtime podman 4.3.1, GPUs: CDI",
                f"container runtime docker 28.2.2: daemon not reachable: {NO_DAEMON}",
                "container runtime enroot 3.4.1, no GPUs",
                "container runtime apptainer: not usable",
            ],
        ),
    ],
)  # fmt: skip
def test_runtime_lines(facts: dict[str, Any] | None, lines: list[str]) -> None:
    assert runtime_lines(facts) == lines


# --- the last reading, kept on the node -------------------------------------------------------------------------


def counting(version: str, calls: Path) -> str:
    """A fake podman that appends each call's first argument to `calls`."""
    return f'#!/bin/sh\necho "$1" >> {calls}\n' + script(version, '{"host": {}}').split("\n", 1)[1]


def test_the_last_reading_is_reused_while_young_and_nothing_it_depends_on_changed(tmp_path: Path, monkeypatch) -> None:
    calls, cache = tmp_path / "calls", tmp_path / "home" / ".ftconsole" / "probe" / "runtimes.json"
    bin_dir, root = node(tmp_path, {"podman": counting("podman version 4.3.1", calls)}, {})
    monkeypatch.setenv("PATH", str(bin_dir))

    def read(max_age: float = 300.0) -> list[dict[str, Any]]:
        return rt.read_runtimes(str(root), rt.Deadline(10.0), max_age, str(cache))

    def runs() -> int:
        return calls.read_text().count("info") if calls.exists() else 0

    first = read()
    assert first[0]["version"] == "4.3.1" and first[0]["usable"] and runs() == 1
    assert cache.stat().st_mode & 0o777 == 0o600
    assert read() == first and runs() == 1  # kept: podman info not run again
    assert read(max_age=0) == first and runs() == 2  # an operator's probe reads anew
    monkeypatch.setenv("CONTAINERS_CONF", "/elsewhere.conf")
    read()
    assert runs() == 3  # another configuration: read anew
    (root / "etc" / "cdi").mkdir(parents=True)
    (root / "etc" / "cdi" / "nvidia.yaml").write_text(CDI_SPEC)
    assert read()[0]["gpus_via"] == ["CDI"] and runs() == 4  # a new CDI spec: read anew
    (bin_dir / "podman").write_text(counting("podman version 5.0.0", calls))  # an upgrade
    assert read()[0]["version"] == "5.0.0" and runs() == 5
    doc = json.loads(cache.read_text())
    doc["at"] -= 301
    cache.write_text(json.dumps(doc))
    read()
    assert runs() == 6  # too old


def test_a_home_that_cannot_keep_the_reading_reads_every_time(tmp_path: Path, monkeypatch) -> None:
    calls = tmp_path / "calls"
    bin_dir, root = node(tmp_path, {"podman": counting("podman version 4.3.1", calls)}, {})
    monkeypatch.setenv("PATH", str(bin_dir))
    (tmp_path / "file").write_text("")
    cache = str(tmp_path / "file" / "probe" / "runtimes.json")  # under a file: cannot be made
    for _ in range(2):
        assert rt.read_runtimes(str(root), rt.Deadline(10.0), 300.0, cache)[0]["usable"]
    assert calls.read_text().count("info") == 2
