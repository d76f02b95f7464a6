"""data_prep (seed 003): the spec's checks, the cluster's rules at submit, the plan's data step, and the node-side
copy program (`scheduler/node/datacopy.py`)
run here on temporary folders: copy, skip, copy again, refuse, fail, keep."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ftconsole.scheduler.decide.jobplan import plan_job
from ftconsole.scheduler.decide.launcher import LaunchError, LaunchInput, NodeAssignment
from ftconsole.scheduler.decide.steps import StepKind
from ftconsole.scheduler.errors import ConfigError, UsageError
from ftconsole.scheduler.node.bundle import script
from ftconsole.scheduler.spec import yamlfile
from ftconsole.scheduler.spec.config import ClusterConfig, DataPrepSettings
from ftconsole.scheduler.spec.dataprep import DATA_STEP, check_admissible, node_params, preparing
from ftconsole.scheduler.spec.jobspec import JobSpec, parse_jobspec
from ftconsole.scheduler.ssh.runs import supervisor_script
from tests.unit.test_agent import python38

BASE = "name: j\ncommand: python3 train.py\n"
RUN_TIMEOUT = 60

# -- the spec ----------------------------------------------------------------------------------------------------


def _prep(*entries: str) -> str:
    return BASE + "data_prep:\n" + "".join(f"  - {e}\n" for e in entries)


REFUSED = [
    # (text, line, key path, message)
    (_prep("{from: shared/x, to: /local/x}"), 4, "data_prep[0].from", "must be an absolute path"),
    (_prep("{from: /shared/x, to: local/x}"), 4, "data_prep[0].to", "or start with ~/"),
    (_prep("{from: /shared/x, to: /local/../etc}"), 4, "data_prep[0].to", "without '..'"),
    (_prep("{from: /shared/x, to: /}"), 4, "data_prep[0].to", "/ is not a folder to copy into"),
    (_prep("{from: /shared/x, to: '~/'}"), 4, "data_prep[0].to", "~ is not a folder to copy into"),
    (_prep("{from: /shared/x, to: /shared/x/}"), 4, "data_prep[0].to", "is its own `from`"),
    (_prep("{from: /shared/x, to: /shared/x/local}"), 4, "data_prep[0].to", "lies inside its `from`"),
    (_prep("{from: /local/x/shared, to: /local/x}"), 4, "data_prep[0].to", "holds its `from`"),
    (_prep("{from: /s/x, to: ~/.ftconsole/x}"), 4, "data_prep[0].to", "over ftconsole's own folder ~/.ftconsole"),
    (_prep("{from: /s/x, to: '~/'}", "{from: /s/y, to: /l/y}"), 4, "data_prep[0].to", "not a folder to copy"),
    (_prep("{from: /s/x, to: /l/x}", "{from: /s/y, to: /l/x}"), 5, "data_prep[1].to", "is also data_prep[0].to"),
    (_prep("{from: /s/x, to: /l/x}", "{from: /s/y, to: /l/x/y}"), 5, "data_prep[1].to", "lies inside data_prep[0]"),
    (_prep("{from: /s/x, to: /l/x/y}", "{from: /s/y, to: /l/x}"), 5, "data_prep[1].to", "holds data_prep[0].to"),
    (_prep('{from: "/s/x", to: "/l/\\0x"}'), 4, "data_prep[0].to", "NUL"),
    (_prep("{from: /s/x}"), 4, "data_prep[0].to", "missing: this key is required"),
    (_prep("{from: /s/x, to: /l/x, mode: copy}"), 4, "data_prep[0].mode", "unknown key"),
    (BASE + "data_prep: []\n", 3, "data_prep", "at least 1 entry"),
    (_prep(*[f"{{from: /s/{i}, to: /l/{i}}}" for i in range(17)]), 3, "data_prep", "at most 16 entries"),
    (
        "name: j\nmode: horovod\nnodes: 2\ncommand: python3 t.py\ndata_prep: [{from: /s/x, to: /l/x}]\n",
        5,
        "data_prep",
        "in mode horovod, mpirun on the first node starts the ranks of the other nodes itself",
    ),
    (
        "name: j\nmode: pytorch-deepspeed\nnodes: 2\ncommand: deepspeed t.py\ndata_prep: [{from: /s/x, to: /l/x}]\n",
        5,
        "data_prep",
        "DeepSpeed's runner on the first node",
    ),
    (
        "name: j\nmode: mpich\ncommand: python3 t.py\nfault_tolerance: {elastic: {min_nodes: 1, max_nodes: 2}}\n"
        "data_prep: [{from: /s/x, to: /l/x}]\n",
        5,
        "data_prep",
        "in mode mpich, MPICH's mpirun (hydra)",
    ),
]


@pytest.mark.parametrize(("text", "line", "path", "message"), REFUSED)
def test_the_spec_refuses_with_the_key_path(text: str, line: int, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_jobspec(text, "job.yaml")
    problems = info.value.problems
    assert any(p.line == line and p.path == path and message in p.message for p in problems), problems
    data, _ = yamlfile.parse(text, "job.yaml")
    with pytest.raises(ValidationError):  # the server's own check, from JSON
        JobSpec.from_json(data)


ACCEPTED = [
    _prep("{from: /shared/imagenet, to: /local/imagenet}"),
    _prep("{from: ~/datasets/cifar, to: /nvme/me/cifar}", "{from: /shared/x, to: /nvme/me/x}"),
    _prep("{from: /shared/x, to: ~/local/x}"),
    _prep("{from: /l/x, to: /l/xy}"),  # a common prefix is not a folder inside another
    "name: j\nmode: horovod\ncommand: python3 t.py\ndata_prep: [{from: /s/x, to: /l/x}]\n",  # one node
    "name: j\nmode: pytorch\nnodes: 4\ncommand: python3 t.py\ndata_prep: [{from: /s/x, to: /l/x}]\n",
    "name: j\nmode: pytorch-deepspeed\nnodes: 2\ncommand: python3 t.py\ndata_prep: [{from: /s/x, to: /l/x}]\n",
]


@pytest.mark.parametrize("text", ACCEPTED)
def test_accepted_specs_round_trip(text: str) -> None:
    spec = parse_jobspec(text, "job.yaml")
    assert spec.data_prep
    assert spec.to_json()["data_prep"][0].keys() == {"from", "to"}
    assert JobSpec.from_json(spec.to_json()) == spec
    assert JobSpec.from_stored(spec.to_json()) == spec


def test_a_spec_without_data_prep_has_none() -> None:
    spec = parse_jobspec(BASE, "job.yaml")
    assert spec.data_prep is None and "data_prep" not in spec.to_json()


# -- the cluster's rules at submit -------------------------------------------------------------------------------

ROOTS = DataPrepSettings(roots=["/local", "/nvme/", "~/fast"])
ADMISSIBLE = [
    # (to, settings, run_root, refused with)
    ("/local/imagenet", ROOTS, "~/.ftconsole/runs", None),
    ("/nvme/a/b/c/d", ROOTS, "~/.ftconsole/runs", None),
    ("~/fast/x", ROOTS, "~/.ftconsole/runs", None),
    ("/local/x", DataPrepSettings(), "~/.ftconsole/runs", "this cluster names no node-local storage"),
    ("/scratch/x", ROOTS, "~/.ftconsole/runs", "is not inside this cluster's node-local storage"),
    ("/localx/y", ROOTS, "~/.ftconsole/runs", "is not inside"),
    ("/local/", ROOTS, "~/.ftconsole/runs", "is not inside"),  # the root itself
    ("/home/me/fast/x", ROOTS, "~/.ftconsole/runs", "is not inside"),  # ~ is the node's: not compared with /
    ("/nvme/a/b/c/d/e", ROOTS, "~/.ftconsole/runs", "lies 5 folders below /nvme: at most 4"),
    ("/local/alice/runs/x", ROOTS, "/local/{user}/runs", "over this cluster's run folders (/local/alice/runs)"),
    ("/local/alice", ROOTS, "/local/{user}/runs", "over this cluster's run folders"),
    ("/local/bob/runs", ROOTS, "/local/{user}/runs", None),  # another user's run root: not this job's
]


@pytest.mark.parametrize(("to", "settings", "run_root", "refused"), ADMISSIBLE)
def test_the_cluster_admits_only_folders_inside_its_roots(
    to: str, settings: DataPrepSettings, run_root: str, refused: str | None
) -> None:
    spec = JobSpec.from_json({"name": "j", "command": "true", "data_prep": [{"from": "/shared/x", "to": to}]})
    if refused is None:
        check_admissible(spec, settings, run_root=run_root, user="alice")
    else:
        with pytest.raises(UsageError, match=refused.replace("(", r"\(").replace(")", r"\)")):
            check_admissible(spec, settings, run_root=run_root, user="alice")


def test_a_job_without_data_prep_needs_no_roots() -> None:
    check_admissible(JobSpec.from_json({"name": "j", "command": "true"}), DataPrepSettings(), run_root="~", user="a")


@pytest.mark.parametrize(
    ("roots", "message"),
    [(["local"], "give an absolute folder"), (["/"], "the whole file system"), (["~"], "give an absolute folder"),
     (["~/"], "a home folder"), (["/a/../b"], "without '..'")],
)  # fmt: skip
def test_the_config_refuses_roots_that_are_no_storage(roots: list[str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ClusterConfig.model_validate({"data_prep": {"roots": roots}})


def test_the_config_defaults_to_no_roots_and_seven_days() -> None:
    settings = ClusterConfig().data_prep
    assert (settings.roots, settings.retention) == ([], 7 * 86400.0)
    off = ClusterConfig.model_validate({"data_prep": {"roots": ["/local/"], "retention": "off"}}).data_prep
    assert (off.roots, off.retention) == (["/local"], 0.0)


# -- the plan ----------------------------------------------------------------------------------------------------


def _base(mode: str, count: int) -> LaunchInput:
    nodes = tuple(NodeAssignment(f"n{i}", f"10.0.0.{i}", (0,)) for i in range(count))
    return LaunchInput(job_id="7", attempt=1, mode=mode, argv=(), env={}, workdir="~", nodes=nodes,
                       master_port=29500, run_root="/r")  # fmt: skip


def test_every_rank_prepares_its_data_first() -> None:
    spec = JobSpec.from_json(
        {"name": "j", "mode": "pytorch", "nodes": 2, "command": "python3 t.py", "hooks": {"before": "echo hi"},
         "data_prep": [{"from": "/s/x", "to": "/local/x"}]}
    )  # fmt: skip
    planned = plan_job(spec, _base("pytorch", 2), data_prep=DataPrepSettings(roots=["/local"], retention=60))
    for rank, steps in planned.steps.items():
        assert steps[0].kind is StepKind.DATA and steps[0].name == DATA_STEP
        assert steps[0].argv[:3] == ("python3", "-c", script("datacopy"))
        params = json.loads(steps[0].argv[3])
        assert params == {"sets": [{"from": "/s/x", "to": "/local/x"}], "run_dir": f"/r/7/1/{rank}",
                          "roots": ["/local"], "retention": 60.0, "progress": 5.0, "lock_wait": 3600.0}  # fmt: skip
    assert [s.kind for s in planned.steps[0]] == [StepKind.DATA, StepKind.BEFORE, StepKind.COMMAND]
    assert [s.kind for s in planned.steps[1]] == [StepKind.DATA, StepKind.COMMAND]
    without = plan_job(spec, _base("pytorch", 2))  # no settings given: nothing is cleaned up
    assert json.loads(without.steps[0][0].argv[3])["roots"] == []


def test_a_plan_whose_first_node_starts_the_others_is_refused() -> None:
    stored = JobSpec.from_stored(
        {"name": "j", "mode": "horovod", "nodes": 2, "command": "python3 t.py",
         "data_prep": [{"from": "/s/x", "to": "/local/x"}]}
    )  # fmt: skip
    with pytest.raises(LaunchError, match="data_prep needs every node to run its rank"):
        plan_job(stored, _base("horovod", 2))


def test_the_preparing_condition_names_the_ranks() -> None:
    assert preparing(2, []) is None
    assert preparing(2, [(1, "n1"), (0, "n0")]) == (
        "attempt 2: copying data sets to node-local storage (data_prep): rank 0 on n0, rank 1 on n1"
    )


# -- the node side, here -----------------------------------------------------------------------------------------


def _cp_only(tmp_path: Path) -> str:
    """A PATH with cp and no rsync."""
    folder = tmp_path / "bin-cp"
    folder.mkdir(exist_ok=True)
    cp = shutil.which("cp")
    assert cp is not None
    if not (folder / "cp").exists():
        (folder / "cp").symlink_to(cp)
    return str(folder)


def _with_rsync() -> str:
    if shutil.which("rsync") is None:
        pytest.skip("rsync is not installed here (apt-get install rsync)")
    return os.environ["PATH"]


def copy(
    params: dict[str, Any], path: str, python: str = sys.executable, user: int | None = None
) -> subprocess.CompletedProcess[str]:
    """The node-side program as the supervisor runs it: `python -c SOURCE PARAMS`, output as in output.log."""
    env = {**os.environ, "PATH": path}
    params = {"progress": 5, "run_dir": "", "roots": [], "retention": 0, **params}
    return subprocess.run([python, "-c", script("datacopy"), json.dumps(params)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=RUN_TIMEOUT, env=env, user=user,
                          cwd="/")  # fmt: skip


def _source(tmp_path: Path) -> Path:
    src = tmp_path / "shared" / "imagenet"
    (src / "train").mkdir(parents=True)
    (src / "train" / "a.bin").write_bytes(b"a" * 5000)
    (src / "labels.txt").write_text("cat\ndog\n")
    (src / "link").symlink_to("labels.txt")
    return src


def _tree(top: Path) -> dict[str, str | bytes]:
    return {
        str(p.relative_to(top)): (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "/")
        for p in sorted(top.rglob("*"))
        if p.name != ".ftconsole-data.json"
    }


@pytest.fixture(params=["cp", "rsync"])
def path(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return _cp_only(tmp_path) if request.param == "cp" else _with_rsync()


def test_copies_then_skips_then_copies_again_when_the_source_changes(tmp_path: Path, path: str) -> None:
    src, dst = _source(tmp_path), tmp_path / "local" / "imagenet"
    tool = "rsync" if "bin-cp" not in path else "cp"
    params = {
        "sets": [{"from": str(src), "to": str(dst)}],
        "run_dir": "/runs/1/1/0",
        "roots": [str(tmp_path / "local")],
    }
    first = copy(params, path)
    assert first.returncode == 0, first.stdout
    assert _tree(dst) == _tree(src) and (dst / "link").is_symlink()
    assert f"data_prep: copying {src} to {dst}: 2 files, 4.9 KiB ({tool})" in first.stdout
    assert f"data_prep: {dst}: copied 2 files, 4.9 KiB in " in first.stdout
    marker = json.loads((dst / ".ftconsole-data.json").read_text())
    assert (marker["state"], marker["files"], marker["bytes"], marker["runs"]) == ("ready", 2, 5008, ["/runs/1/1/0"])
    assert [p.name for p in dst.parent.iterdir()] == ["imagenet", ".imagenet.ftconsole-lock"] or sorted(
        p.name for p in dst.parent.iterdir()
    ) == [".imagenet.ftconsole-lock", "imagenet"]  # no temporary folder left

    again = copy({**params, "run_dir": "/runs/2/1/0"}, path)
    assert again.returncode == 0, again.stdout
    assert f"data_prep: {dst}: up to date: 2 files, 4.9 KiB, skipped" in again.stdout
    assert "copying" not in again.stdout
    assert json.loads((dst / ".ftconsole-data.json").read_text())["runs"] == ["/runs/1/1/0", "/runs/2/1/0"]

    (src / "labels.txt").write_text("cat\ndog\nbird\n")  # another size
    (src / "train" / "a.bin").unlink()
    (dst / "stray").write_text("left by someone")  # gone after the copy (rsync --delete, or a fresh copy)
    changed = copy(params, path)
    assert changed.returncode == 0, changed.stdout
    assert f"copying {src} to {dst}: 1 files" in changed.stdout
    assert _tree(dst) == _tree(src)

    (dst / "labels.txt").write_text("edited on the node!!")  # the copy changed, not the source: copied again
    fixed = copy(params, path)
    assert "changed since it was prepared: copying again" in fixed.stdout, fixed.stdout
    assert _tree(dst) == _tree(src)


def test_refuses_a_folder_it_did_not_make(tmp_path: Path, path: str) -> None:
    src, dst = _source(tmp_path), tmp_path / "local" / "imagenet"
    dst.mkdir(parents=True)
    (dst / "precious").write_text("mine")
    done = copy({"sets": [{"from": str(src), "to": str(dst)}]}, path)
    assert done.returncode == 1
    assert done.stdout.strip().splitlines()[-1] == (
        f"data_prep: {dst} exists and was not made by data_prep: refusing to overwrite it (remove it by hand, or "
        "choose another `to`)"
    )
    assert _tree(dst) == {"precious": b"mine"}
    (dst / "precious").unlink()
    dst.rmdir()
    dst.symlink_to(src)  # a link, even to a folder of ours, is never written through
    done = copy({"sets": [{"from": str(src), "to": str(dst)}]}, path)
    assert done.returncode == 1 and "is a symbolic link: refusing to write through it" in done.stdout


def test_a_missing_source_fails_with_its_reason(tmp_path: Path, path: str) -> None:
    dst = tmp_path / "local" / "x"
    done = copy({"sets": [{"from": str(tmp_path / "nope"), "to": str(dst)}]}, path)
    assert done.returncode == 1
    assert done.stdout.strip().splitlines()[-1] == f"data_prep: source {tmp_path / 'nope'}: No such file or directory"
    assert not dst.exists()


def test_a_failing_copy_fails_with_the_tools_words_and_leaves_nothing_half_done(tmp_path: Path, path: str) -> None:
    """A file the account may not read: as root (who reads everything), the copy runs as uid 65534."""
    user, python = None, sys.executable
    if os.geteuid() == 0:  # pytest's tmp_path is root's alone: a folder every account may enter
        user, python = 65534, "/usr/bin/python3"
        if not os.access(python, os.X_OK):
            pytest.skip("no system Python for uid 65534")
        tmp_path = Path(tempfile.mkdtemp(prefix="ft-dataprep-", dir="/tmp"))
        tmp_path.chmod(0o755)
        if "bin-cp" in path:
            path = _cp_only(tmp_path)
            Path(path).chmod(0o755)
    try:
        src, dst = _source(tmp_path), tmp_path / "local" / "imagenet"
        dst.parent.mkdir()
        if user is not None:
            os.chown(dst.parent, user, -1)
        (src / "train" / "a.bin").chmod(0)
        done = copy({"sets": [{"from": str(src), "to": str(dst)}]}, path, python=python, user=user)
        assert done.returncode != 0
        assert "Permission denied" in done.stdout.strip().splitlines()[-1], done.stdout
        assert done.stdout.strip().splitlines()[-1].startswith(f"data_prep: copying {src} to {dst} failed: ")
        assert not dst.exists() and not [p for p in dst.parent.iterdir() if "tmp" in p.name]
    finally:
        if user is not None:
            shutil.rmtree(tmp_path, ignore_errors=True)


def test_a_failing_copy_as_root_fails_with_the_tools_words(tmp_path: Path) -> None:
    """As root no permission stops a read: a fake cp that fails as a full disk does stands in for it."""
    src, dst = _source(tmp_path), tmp_path / "local" / "imagenet"
    fake = tmp_path / "bin-fail"
    fake.mkdir()
    (fake / "cp").write_text("#!/bin/sh\necho \"cp: error writing '$5/a.bin': No space left on device\" >&2\nexit 1\n")
    (fake / "cp").chmod(0o755)
    done = copy({"sets": [{"from": str(src), "to": str(dst)}]}, str(fake))
    assert done.returncode == 1
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith(f"data_prep: copying {src} to {dst} failed: cp exited with code 1: cp: error writing")
    assert last.endswith("No space left on device")
    assert not dst.exists() and [p.name for p in dst.parent.iterdir()] == [".imagenet.ftconsole-lock"]


def test_progress_lines_while_a_slow_copy_runs(tmp_path: Path) -> None:
    src, dst = _source(tmp_path), tmp_path / "local" / "imagenet"
    slow = tmp_path / "bin-slow"
    slow.mkdir()
    (slow / "cp").write_text(f'#!/bin/sh\n{shutil.which("sleep")} 1.5\nexec {shutil.which("cp")} "$@"\n')
    (slow / "cp").chmod(0o755)
    done = copy({"sets": [{"from": str(src), "to": str(dst)}], "progress": 0.3}, str(slow))
    assert done.returncode == 0, done.stdout
    progress = [ln for ln in done.stdout.splitlines() if " of 4.9 KiB copied (" in ln]
    assert len(progress) >= 2, done.stdout
    assert _tree(dst) == _tree(src)


def test_outside_the_roots_once_links_are_followed_is_refused(tmp_path: Path) -> None:
    src, roots = _source(tmp_path), tmp_path / "local"
    roots.mkdir()
    (roots / "escape").symlink_to(tmp_path)  # /local/escape/x is really <tmp>/x
    done = copy({"sets": [{"from": str(src), "to": str(roots / "escape" / "x")}], "roots": [str(roots)]},
                _cp_only(tmp_path))  # fmt: skip
    assert done.returncode == 1 and "is not inside this cluster's data_prep.roots" in done.stdout
    assert not (tmp_path / "x").exists()


def test_two_preparations_of_one_folder_take_turns(tmp_path: Path, path: str) -> None:
    src, dst = _source(tmp_path), tmp_path / "local" / "imagenet"
    for i in range(200):
        (src / f"f{i}").write_bytes(os.urandom(2000))
    params = {"sets": [{"from": str(src), "to": str(dst)}]}
    results: list[subprocess.CompletedProcess[str]] = []
    threads = [threading.Thread(target=lambda: results.append(copy(params, path))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RUN_TIMEOUT)
    assert [r.returncode for r in results] == [0, 0], [r.stdout for r in results]
    said = "".join(r.stdout for r in results)
    assert said.count("copied 202 files") == 1 and said.count("up to date: 202 files") == 1, said
    assert _tree(dst) == _tree(src)


def test_a_killed_copy_leaves_nothing_taken_for_good(tmp_path: Path) -> None:
    """SIGTERM (a stop) during a fresh copy: the temporary folder goes, DST never appears."""
    src, dst = _source(tmp_path), tmp_path / "local" / "imagenet"
    slow = tmp_path / "bin-slow"
    slow.mkdir()
    (slow / "cp").write_text(f'#!/bin/sh\n{shutil.which("cp")} "$@" && exec {shutil.which("sleep")} 30\n')
    (slow / "cp").chmod(0o755)
    params = {"sets": [{"from": str(src), "to": str(dst)}], "progress": 5, "run_dir": "", "roots": [], "retention": 0}
    proc = subprocess.Popen([sys.executable, "-c", script("datacopy"), json.dumps(params)], env={**os.environ,
                            "PATH": str(slow)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 10
    while not [p for p in dst.parent.glob(".imagenet.ftconsole-tmp-*") if (p / "labels.txt").exists()]:
        assert time.monotonic() < deadline, "the copy never started"
        time.sleep(0.05)
    os.killpg(proc.pid, 15)  # as the supervisor stops a step: its whole process group
    out, _ = proc.communicate(timeout=RUN_TIMEOUT)
    assert proc.returncode == 128 + 15 and out.strip().endswith("data_prep: stopped"), out
    assert not dst.exists() and not list(dst.parent.glob(".imagenet.ftconsole-tmp-*"))


def test_leftovers_of_a_killed_copy_are_cleaned_by_the_next(tmp_path: Path, path: str) -> None:
    src, dst = _source(tmp_path), tmp_path / "local" / "imagenet"
    left = dst.parent / ".imagenet.ftconsole-tmp-999999"
    left.mkdir(parents=True)
    (left / ".ftconsole-data.json").write_text(json.dumps({"by": "ftconsole data_prep", "state": "copying"}))
    (left / "half").write_text("x")
    dst.mkdir()  # a DST whose in-place copy was killed: ours, state copying
    (dst / ".ftconsole-data.json").write_text(json.dumps({"by": "ftconsole data_prep", "state": "copying"}))
    (dst / "half").write_text("x")
    done = copy({"sets": [{"from": str(src), "to": str(dst)}]}, path)
    assert done.returncode == 0, done.stdout
    assert not left.exists() and _tree(dst) == _tree(src)


# -- keeping -----------------------------------------------------------------------------------------------------


def _prepared(folder: Path, used: float, runs: list[str] | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "data").write_text("x")
    marker = {"by": "ftconsole data_prep", "state": "ready", "used": used, "prepared": used, "runs": runs or []}
    (folder / ".ftconsole-data.json").write_text(json.dumps(marker))
    return folder


def test_expired_data_sets_are_removed_and_nothing_else(tmp_path: Path) -> None:
    src, root, now = _source(tmp_path), tmp_path / "local", time.time()
    day = 86400
    old = _prepared(root / "team" / "old", now - 8 * day)
    fresh = _prepared(root / "fresh", now - 1 * day)
    deep = _prepared(root / "a" / "b" / "c" / "d" / "e", now - 30 * day)  # deeper than a data_prep may be
    foreign = root / "scratch"  # no marker: never touched
    foreign.mkdir(parents=True)
    (foreign / "keep").write_text("x")
    elsewhere = _prepared(tmp_path / "other" / "old", now - 30 * day)  # not under the roots
    ended = tmp_path / "runs" / "ended"
    ended.mkdir(parents=True)
    (ended / "status.json").write_text(json.dumps({"state": "exited", "ended": now - 2 * day}))
    used_lately = _prepared(root / "used-lately", now - 30 * day, [str(ended)])  # its run ended 2 days ago
    live = tmp_path / "runs" / "live"
    live.mkdir()
    me = os.getpid()
    with open(f"/proc/{me}/stat") as fh:
        started = int(fh.read().rsplit(")", 1)[1].split()[19])
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    status = {"state": "running", "boot_id": boot, "supervisor_pid": me, "supervisor_start": started}
    (live / "status.json").write_text(json.dumps(status))
    in_use = _prepared(root / "in-use", now - 30 * day, [str(live)])  # a run that used it still runs
    target = root / "new"
    done = copy({"sets": [{"from": str(src), "to": str(target)}], "roots": [str(root)], "retention": 7 * day},
                _cp_only(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stdout
    assert f"data_prep: removed {old}: last used 8d ago, data_prep.retention is 7d" in done.stdout
    assert not old.exists() and not list(old.parent.glob(".old.ftconsole-*"))
    assert fresh.exists() and deep.exists() and foreign.exists() and elsewhere.exists()
    assert used_lately.exists() and in_use.exists() and target.exists()
    again = copy({"sets": [{"from": str(src), "to": str(target)}], "roots": [str(root)], "retention": 0},
                 _cp_only(tmp_path))  # fmt: skip
    assert "removed" not in again.stdout  # retention 0 (off): kept until removed by hand


# -- on Python 3.8, and through the supervisor ---------------------------------------------------------------------


def test_the_copy_runs_on_python38(tmp_path: Path) -> None:
    python = python38()
    if python is None:
        pytest.skip("no Python 3.8 interpreter on this machine")
    src, dst = _source(tmp_path), tmp_path / "local" / "imagenet"
    for path in (_cp_only(tmp_path), os.environ["PATH"]):
        done = copy({"sets": [{"from": str(src), "to": str(dst)}]}, path, python=python)
        assert done.returncode == 0, done.stdout
    assert "up to date" in done.stdout and _tree(dst) == _tree(src)


def _supervise(params: dict[str, object]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-"], input=supervisor_script(params), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _ended(run_dir: Path) -> dict[str, Any]:
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        status = _supervise({"action": "status", "run_dirs": [str(run_dir)]})["runs"][0]["status"]
        if status["state"] not in ("starting", "running"):
            return dict(status)
        time.sleep(0.05)
    raise AssertionError("the run did not end")


def test_a_failing_data_step_ends_the_run_with_its_last_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    params = node_params(
        JobSpec.from_json({"name": "j", "command": "true", "data_prep": [{"from": str(missing), "to": "/l/x"}]})
        .data_prep or [], str(tmp_path / "run"), None,
    )  # fmt: skip
    steps = [
        # argv[0] is replaced by the supervisor's own interpreter: this one does not exist
        {"kind": "data", "name": DATA_STEP, "argv": ["no-such-python", "-c", script("datacopy"), params], "env": {}},
        {"kind": "command", "name": "command", "argv": ["sh", "-c", "echo command ran"], "env": {}},
    ]
    run_dir = tmp_path / "run"
    _supervise({"action": "start", "run_dir": str(run_dir), "argv": ["true"], "env": {}, "workdir": str(tmp_path),
                "steps": steps})  # fmt: skip
    status = _ended(run_dir)
    assert (status["state"], status["exit_code"], status["step"]) == ("exited", 1, DATA_STEP)
    assert status["error"] == f"data prep exited with code 1: data_prep: source {missing}: No such file or directory"
    log = (run_dir / "output.log").read_text()
    assert log.startswith("== ftconsole: data prep ==\n") and "command ran" not in log


# -- a destination or a lock someone else made (issue 26) --------------------------------------------------------

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")


def _chown_tree(top: Path, uid: int) -> None:
    for p in [top, *top.rglob("*")]:
        os.chown(p, uid, uid, follow_symlinks=False)


def _forged(src: Path, dst: Path) -> bytes:
    """DST made by someone else to pass for a good copy of SRC: every file the same size and mtime, one with other
    bytes, and a `ready` marker with SRC's manifest. The forged bytes."""
    from ftconsole.scheduler.node import datacopy

    shutil.copytree(src, dst, symlinks=True)  # copy2: sizes and mtimes kept
    target = dst / "train" / "a.bin"
    st = target.stat()
    forged = b"F" * st.st_size
    target.write_bytes(forged)
    os.utime(target, (st.st_atime, st.st_mtime))
    marker = {"by": "ftconsole data_prep", "state": "ready", "digest": datacopy.manifest(str(src))[0]}
    (dst / ".ftconsole-data.json").write_text(json.dumps(marker))
    assert datacopy.manifest(str(dst))[0] == marker["digest"]  # it would pass for up to date
    return forged


@needs_root
def test_a_destination_another_account_made_with_a_forged_marker_is_refused_never_trusted(
    tmp_path: Path, path: str
) -> None:
    src, dst = _source(tmp_path), tmp_path / "local" / "imagenet"
    forged = _forged(src, dst)
    _chown_tree(dst, NOBODY)
    done = copy({"sets": [{"from": str(src), "to": str(dst)}]}, path)
    assert done.returncode == 1, done.stdout
    assert done.stdout.strip().splitlines()[-1] == (
        f"data_prep: {dst} belongs to uid {NOBODY} (nobody), not to uid 0 (root) that this run runs as: refusing "
        "to trust it or write into it (remove it, or choose another `to`)"
    )
    assert "up to date" not in done.stdout and (dst / "train" / "a.bin").read_bytes() == forged  # nor written
    assert dst.stat().st_uid == NOBODY


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("folder", "{dst} may be written by others (mode 0777)"),
        ("marker", "{dst}/.ftconsole-data.json may be written by others (mode 0666)"),
        ("marker-owner", "{dst}/.ftconsole-data.json belongs to uid 65534 (nobody)"),
    ],
)
def test_a_destination_or_marker_others_may_write_is_refused(tmp_path: Path, how: str, says: str) -> None:
    if how == "marker-owner" and os.geteuid() != 0:
        pytest.skip("giving a file to another uid needs root")
    src, dst = _source(tmp_path), tmp_path / "local" / "imagenet"
    forged = _forged(src, dst)
    if how == "folder":
        dst.chmod(0o777)  # anyone could have put a marker and files in it
    elif how == "marker":
        (dst / ".ftconsole-data.json").chmod(0o666)
    else:
        os.chown(dst / ".ftconsole-data.json", NOBODY, NOBODY)
    done = copy({"sets": [{"from": str(src), "to": str(dst)}]}, _cp_only(tmp_path))
    assert done.returncode == 1, done.stdout
    assert says.format(dst=dst) in done.stdout.strip().splitlines()[-1]
    assert "refusing to trust it or write into it" in done.stdout
    assert (dst / "train" / "a.bin").read_bytes() == forged


@needs_root
def test_an_entry_of_our_copy_others_could_change_makes_a_fresh_copy(tmp_path: Path, path: str) -> None:
    """Our copy, with a folder in it others may write (its source's mode, copied by an earlier ftconsole) and a
    file put there by another account, same size and mtime: the copy is not trusted but made again, afresh."""
    src, dst = _source(tmp_path), tmp_path / "local" / "imagenet"
    params = {"sets": [{"from": str(src), "to": str(dst)}]}
    assert copy(params, path).returncode == 0
    (dst / "train").chmod(0o777)
    target = dst / "train" / "a.bin"
    st = target.stat()
    target.unlink()
    target.write_bytes(b"F" * st.st_size)
    os.utime(target, (st.st_atime, st.st_mtime))
    os.chown(target, NOBODY, NOBODY)
    done = copy(params, path)
    assert done.returncode == 0, done.stdout
    assert f"data_prep: {dst}: {dst / 'train'} may be written by others (mode 0777): copying it again, afresh" in (
        done.stdout
    )
    assert "up to date" not in done.stdout and _tree(dst) == _tree(src)
    assert target.stat().st_uid == 0 and (dst / "train").stat().st_mode & 0o777 == 0o755


def test_a_copy_is_never_writable_by_others_whatever_its_source_allows(tmp_path: Path, path: str) -> None:
    src, dst = _source(tmp_path), tmp_path / "local" / "imagenet"
    (src / "train").chmod(0o777)
    (src / "labels.txt").chmod(0o666)
    params = {"sets": [{"from": str(src), "to": str(dst)}]}
    assert copy(params, path).returncode == 0
    modes = {str(p.relative_to(dst)): p.lstat().st_mode & 0o777 for p in [dst, *dst.rglob("*")] if not p.is_symlink()}
    assert modes["train"] == 0o755 and modes["labels.txt"] == 0o644
    assert not [name for name, mode in modes.items() if mode & 0o022], modes
    again = copy(params, path)  # and it is its own again: kept, not copied
    assert "up to date" in again.stdout, again.stdout


def test_a_lock_held_too_long_is_given_up_with_who_holds_it(tmp_path: Path) -> None:
    """Anyone who could open the lock file could hold it forever: the wait is bounded (lock_wait), and the
    message names the holder."""
    src, dst = _source(tmp_path), tmp_path / "local" / "imagenet"
    dst.parent.mkdir()
    lock = dst.parent / ".imagenet.ftconsole-lock"
    fd = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)
        started = time.monotonic()
        done = copy({"sets": [{"from": str(src), "to": str(dst)}], "lock_wait": 1}, _cp_only(tmp_path))
        took = time.monotonic() - started
    finally:
        os.close(fd)
    assert done.returncode == 1 and took < 15, (took, done.stdout)
    me = f"uid {os.geteuid()} ({__import__('pwd').getpwuid(os.geteuid()).pw_name})"
    assert done.stdout.strip().splitlines() == [
        f"data_prep: {dst}: another data_prep on this node is preparing it: waiting for it (at most 1.0 s)",
        f"data_prep: {dst}: gave up waiting for its lock {lock} after 1.0 s: held by pid {os.getpid()} of {me}",
    ]
    assert not dst.exists()
    assert lock.stat().st_mode & 0o777 == 0o600  # from now on no other account may open it, nor hold it
    assert copy({"sets": [{"from": str(src), "to": str(dst)}]}, _cp_only(tmp_path)).returncode == 0


@needs_root
def test_a_lock_file_another_account_made_or_a_link_is_refused(tmp_path: Path) -> None:
    src, dst = _source(tmp_path), tmp_path / "local" / "imagenet"
    dst.parent.mkdir()
    lock = dst.parent / ".imagenet.ftconsole-lock"
    lock.touch()
    os.chown(lock, NOBODY, NOBODY)
    done = copy({"sets": [{"from": str(src), "to": str(dst)}]}, _cp_only(tmp_path))
    assert done.returncode == 1
    assert done.stdout.strip().splitlines()[-1] == (
        f"data_prep: the lock {lock} belongs to uid {NOBODY} (nobody), not to uid 0 (root) that this run runs as: "
        "refusing to use it (its owner may remove it)"
    )
    lock.unlink()
    elsewhere = tmp_path / "elsewhere"
    lock.symlink_to(elsewhere)
    done = copy({"sets": [{"from": str(src), "to": str(dst)}]}, _cp_only(tmp_path))
    assert done.returncode == 1 and "is a symbolic link: refusing to use it as a lock" in done.stdout
    assert not elsewhere.exists() and not dst.exists()


@needs_root
def test_leftovers_of_another_account_are_left_alone(tmp_path: Path) -> None:
    src, dst = _source(tmp_path), tmp_path / "local" / "imagenet"
    theirs = dst.parent / ".imagenet.ftconsole-tmp-999999"
    theirs.mkdir(parents=True)
    (theirs / ".ftconsole-data.json").write_text(json.dumps({"by": "ftconsole data_prep", "state": "copying"}))
    _chown_tree(theirs, NOBODY)
    done = copy({"sets": [{"from": str(src), "to": str(dst)}]}, _cp_only(tmp_path))
    assert done.returncode == 0, done.stdout
    assert theirs.exists() and _tree(dst) == _tree(src)
