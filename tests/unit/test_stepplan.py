"""Steps (`ftconsole run`, decide/stepplan.py): which of a running job's nodes and GPUs a step gets, what each of its
ranks runs, and what it can never get."""

from __future__ import annotations

from typing import Any

import pytest

from ftconsole.scheduler.decide.jobs import Job, JobStatus, Run
from ftconsole.scheduler.decide.stepplan import JobStep, StepAsk, busy_gpus, pick, plan_step
from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.spec.jobspec import JobSpec

HOSTS = {"n1": "10.0.0.1", "n2": "10.0.0.2", "n3": "10.0.0.3"}


def job(**spec: Any) -> Job:
    fields = {"name": "alloc", "command": "sleep infinity", "mode": "pytorch", "nodes": 3, "gpus_per_node": 2} | spec
    return Job(id=7, name="alloc", owner="cy", uid=1000, spec=JobSpec.model_validate(fields), status=JobStatus.RUNNING,
               priority="normal", project="default", access="none", submitted=0.0, attempt=2)  # fmt: skip


RUNS = [Run(7, 2, rank, node, (0, 1), f"/home/cy/.ftconsole/runs/7/2/{rank}", True, "running")
        for rank, node in enumerate(("n1", "n2", "n3"))]  # fmt: skip


def step(number: int, ranks: dict[str, tuple[int, ...]], **over: Any) -> JobStep:
    return JobStep(7, number, 2, ("x",), "single", tuple(ranks.items()), "cy", 0.0, **over)


def test_a_step_takes_the_lowest_free_gpus_of_the_first_nodes_that_have_enough() -> None:
    busy = busy_gpus([step(1, {"n1": (0,), "n2": (0, 1)}), step(2, {"n3": (1,)}, state="succeeded"),
                      step(3, {"n3": (0, 1)}, overlap=True)])  # fmt: skip
    assert busy == {"n1": {0}, "n2": {0, 1}}  # ended and overlapping steps hold nothing
    picked = pick(StepAsk(("x",), "pytorch", nodes=2, gpus_per_node=1), RUNS, busy)
    assert [(r.node, g) for r, g in picked] == [("n1", (1,)), ("n3", (0,))]
    assert pick(StepAsk(("x",)), RUNS, busy)[0][1] == (0, 1)  # type: ignore[index]  # single: n3, all of it
    assert pick(StepAsk(("x",), "pytorch"), RUNS, busy) == (
        "waiting for 3 node(s) with all their GPUs free: running steps hold them"
    )
    every = pick(StepAsk(("x",), "pytorch", overlap=True), RUNS, busy)
    assert [g for _, g in every] == [(0, 1)] * 3  # type: ignore[misc]
    assert [g for _, g in pick(StepAsk(("x",), "pytorch", gpus_per_node=0), RUNS, busy)] == [()] * 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("ask", "spec", "said"),
    [
        (StepAsk(()), {}, "a step needs a command"),
        (StepAsk(("x",), "slurm"), {}, "unknown mode 'slurm'"),
        (StepAsk(("x",), "pytorch", nodes=4), {}, "has 3 node(s): a step runs on 1 to 3, not 4"),
        (StepAsk(("x",), "pytorch", nodes=0), {}, "not 0"),
        (StepAsk(("x",), nodes=2), {}, "mode single runs on one node, and this step is for 2"),
        (StepAsk(("x",), gpus_per_node=3), {}, "at most 2 GPU(s) on a node: a step takes 0 to 2 on each, not 3"),
        (StepAsk(("x",)), {"image": "nvcr.io/nvidia/pytorch:24.01-py3"}, "steps run on the nodes themselves"),
    ],
)
def test_what_a_job_can_never_give_is_refused(ask: StepAsk, spec: dict[str, Any], said: str) -> None:
    with pytest.raises(UsageError) as refused:
        ask.check(job(**spec), RUNS)
    assert said in str(refused.value)


def test_each_rank_runs_in_its_run_folder_with_the_steps_own_variables_and_files() -> None:
    ask = StepAsk(("python", "train.py", "--lr", "0.1"), "pytorch", nodes=2, gpus_per_node=1)
    picked = pick(ask, RUNS, {"n1": {0}})
    assert not isinstance(picked, str)
    first, second = plan_step(job(env={"DATA": "/data"}), 4, ask, picked, hosts=HOSTS, master_port=41000)
    assert (first.node, second.node) == ("n1", "n2") and (first.rank, second.rank) == (0, 1)
    assert first.run_dir == RUNS[0].run_dir and first.step_dir == RUNS[0].run_dir + "/steps/4"
    assert first.env["CUDA_VISIBLE_DEVICES"] == "1" and second.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert first.env["FT_STEP"] == "4" and first.env["MASTER_ADDR"] == "10.0.0.1"
    assert first.env["MASTER_PORT"] == "41000" and second.env["RANK"] == "1" and second.env["WORLD_SIZE"] == "2"
    assert first.env["FT_JOB_ID"] == "7" and first.env["FT_ATTEMPT"] == "2" and first.env["DATA"] == "/data"
    assert first.env["FT_HOSTFILE"] == first.step_dir + "/hostfile"  # the step's, in its folder
    assert "FT_OUTPUT_DIR" not in first.env  # the job's, from its env.json
    assert first.files["hostfile"] == "10.0.0.1 slots=1\n10.0.0.2 slots=1\n"
    assert first.argv[:2] == ("python", "-m") and "--node_rank=0" in first.argv and "--node_rank=1" in second.argv
    assert "--master_port=41000" in first.argv and first.argv[-3:] == ("train.py", "--lr", "0.1")
    assert first.launch and second.launch and first.workdir == "~"


def test_an_mpi_step_launches_on_its_first_node_with_its_own_hostfile() -> None:
    ask = StepAsk(("./allreduce",), "horovod", nodes=2)
    picked = pick(ask, RUNS, {})
    assert not isinstance(picked, str)
    first, second = plan_step(job(), 1, ask, picked, hosts=HOSTS, master_port=41000)
    assert first.launch and not second.launch
    assert first.env["OMPI_MCA_orte_default_hostfile"] == first.step_dir + "/hostfile"
    assert first.argv[:4] == ("mpirun", "--allow-run-as-root", "-np", "4")
