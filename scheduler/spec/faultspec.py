"""The job spec's `fault_tolerance:` key: restarts in place, resubmits, checkpoint resume, elastic resizing and
seed 002's strategies, with the checks that tie them together (each strategy needs its budget, each budget its
strategy). Pure code; `jobspec.JobSpec` holds a `FaultTolerance`, and `jobchecks.cross_problems` runs
`fault_problems`."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from ftconsole.scheduler.spec.config import Duration, PositiveDuration
from ftconsole.scheduler.spec.specbase import Loc, Strict, Text, as_int, given, is_off, mapping, unique


class Strategy(StrEnum):
    """Seed 002's recovery strategies, tried in the order a job lists them (`fault_tolerance.strategies`)."""

    RECOVER_IN_PLACE = "recover-in-place"  # a new attempt on the same nodes (healthy hardware only)
    RECOVER = "recover"  # a new placement, the faulty nodes isolated and left out
    DUMP = "dump"  # the ranks still running get the checkpoint signal and its grace period before a stop
    EXIT = "exit"  # the job ends `error`; nothing after it is tried


def _catchable_signal(value: str) -> str:
    name = value if value.startswith("SIG") else "SIG" + value
    if name not in _CHECKPOINT_SIGNALS:
        raise ValueError(f"{value!r} is not a signal a job can catch to save a checkpoint: use one of "
                         f"{', '.join(sorted(_CHECKPOINT_SIGNALS))}")  # fmt: skip
    return name


_CHECKPOINT_SIGNALS = frozenset({"SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"})


class CheckpointResume(Strict):
    """On a hardware fault, signal the job to save a checkpoint, wait `grace_period`, reschedule it (at most
    `max_resumes` times); `dir` is FT_CHECKPOINT_DIR (default: `<output>/checkpoints`, else a folder in the
    user's home on each node)."""

    max_resumes: int = Field(ge=0)
    grace_period: Duration = 30.0
    signal: Annotated[str, AfterValidator(_catchable_signal)] = "SIGUSR1"
    dir: Text | None = None


class Elastic(Strict):
    """Start on as few as `min_nodes` when not all `nodes` are free, and grow back to the job's size once they
    are (`grow`, on by default); `scale` resizes it from `min_nodes` to `max_nodes` (default: `nodes`)."""

    min_nodes: int = Field(ge=1, strict=True)
    max_nodes: int | None = Field(None, ge=1, strict=True)
    grow: bool = True


class Preflight(Strict):
    """Checks right before an attempt's first start, on the nodes placed for it (with `fault_tolerance.retries`,
    the probe's items always run): `bandwidth` adds the fabric between them (the pool's `node_tests.fabric`). A
    node that fails is swapped for a spare with a resubmit: isolated where two partners saw it slow, else only left
    out of the job (`Recoverer._bandwidth`)."""

    bandwidth: bool = False


class FaultTolerance(Strict):
    """`retries`: pre-check and resubmit (0 = neither); fault restart (`max_restarts`, `restart_exit_codes`)
    or `checkpoint_resume`, not both; `elastic` resizing."""

    retries: int = Field(0, ge=0, le=3)
    max_restarts: int | None = Field(None, ge=0)
    restart_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] | None = None
    # the n-th restart in place waits restart_backoff * 2^(n-1) after the failure (at most MAX_BACKOFF_S)
    restart_backoff: Duration = 0.0
    # restarts (in place or requeued) are allowed this long after the first failure (seed 004's restartTimeLimit)
    restart_time_limit: PositiveDuration | None = None
    checkpoint_resume: CheckpointResume | None = None
    elastic: Elastic | None = None
    strategies: Annotated[list[Strategy], AfterValidator(unique)] | None = Field(None, min_length=1)

    @property
    def plan(self) -> tuple[Strategy, ...]:
        """The strategies to try, in order: `strategies`, or what the other keys ask for."""
        if self.strategies is not None:
            return tuple(self.strategies)
        out = [Strategy.DUMP] if self.checkpoint_resume is not None else []
        if self.max_restarts is not None:
            out.append(Strategy.RECOVER_IN_PLACE)
        if self.retries or self.checkpoint_resume is not None or self.elastic is not None:
            out.append(Strategy.RECOVER)
        return tuple(out)


# -- checks across keys (on the raw YAML data; see jobchecks.cross_problems) ----------------------------------


def _elastic_problems(data: Mapping[str, Any], elastic: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    loc: Loc = ("fault_tolerance", "elastic")
    if data.get("mode", "single") == "single":
        return [(loc, "elastic needs a distributed mode (mode single runs on one node)")]
    nodes = as_int(data.get("nodes", 1))
    low, high = as_int(elastic.get("min_nodes")), as_int(elastic.get("max_nodes"))
    if nodes is None:
        return []
    out: list[tuple[Loc, str]] = []
    if low is not None and low > nodes:
        out.append(((*loc, "min_nodes"), f"min_nodes ({low}) must not exceed nodes ({nodes})"))
    if high is not None and high < nodes:
        out.append(((*loc, "max_nodes"), f"max_nodes ({high}) must be at least nodes ({nodes})"))
    return out


def fault_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    ft = mapping(data.get("fault_tolerance"))
    out: list[tuple[Loc, str]] = []
    if data.get("hang_action") == "restart":
        if not (given(ft, "max_restarts") or as_int(ft.get("retries"))):
            why = "hang_action restart needs fault_tolerance.max_restarts or retries: the restarts it may use"
            out.append((("hang_action",), why))
        hang = data.get("hang_detect")
        if is_off(hang) or hang == 0 or str(hang).strip() == "0":
            out.append((("hang_action",), "hang_action restart with hang_detect off: no hang is ever seen"))
    if given(ft, "checkpoint_resume") and (given(ft, "max_restarts") or given(ft, "restart_exit_codes")):
        out.append(
            (
                ("fault_tolerance", "checkpoint_resume"),
                "fault restart (max_restarts) and checkpoint resume are mutually exclusive: choose one",
            )
        )
    where = mapping(ft.get("checkpoint_resume")).get("dir")
    if isinstance(where, str) and not (where.startswith("/") or where.startswith("~/")):
        out.append(
            (
                ("fault_tolerance", "checkpoint_resume", "dir"),
                f"{where!r} is relative, and every attempt may start elsewhere: give an absolute path or ~/...",
            )
        )
    strategies = ft.get("strategies")
    if isinstance(strategies, list):
        out.extend(_strategy_problems(ft, [str(x) for x in strategies]))
    elif given(ft, "restart_exit_codes") and not given(ft, "max_restarts"):
        out.append(
            (("fault_tolerance", "restart_exit_codes"), "restart_exit_codes needs max_restarts (how many restarts)")
        )
    restarts = given(ft, "max_restarts") or as_int(ft.get("retries"))
    for key in ("restart_backoff", "restart_time_limit"):
        if ft.get(key) and not restarts:  # restart_backoff 0 (the default) asks nothing
            why = "how long a restart waits" if key == "restart_backoff" else "how long restarts are allowed"
            out.append((("fault_tolerance", key), f"{key} ({why}) needs max_restarts or retries: nothing restarts"))
    if given(ft, "elastic"):
        out.extend(_elastic_problems(data, mapping(ft["elastic"])))
    if mapping(data.get("preflight")).get("bandwidth") is True:
        out.extend(_bandwidth_problems(data, ft))
    return out


def _bandwidth_problems(data: Mapping[str, Any], ft: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    loc: Loc = ("preflight", "bandwidth")
    nodes = as_int(data.get("nodes", 1))
    if data.get("mode", "single") == "single" or (nodes is not None and nodes < 2):
        return [(loc, "the bandwidth check measures the fabric between a job's nodes: it needs nodes: 2 or more")]
    if not as_int(ft.get("retries")):
        return [(loc, "a node that fails the bandwidth check is swapped for a spare with a resubmit: set "
                      "fault_tolerance.retries (1 to 3)")]  # fmt: skip
    return []


def _strategy_problems(ft: Mapping[str, Any], listed: list[str]) -> list[tuple[Loc, str]]:
    """Each strategy listed needs its budget, and each budget given needs its strategy: nothing is accepted
    and then never used."""
    loc: Loc = ("fault_tolerance", "strategies")
    out: list[tuple[Loc, str]] = []
    if Strategy.EXIT in listed and listed.index(Strategy.EXIT) < len(listed) - 1:
        later = ", ".join(listed[listed.index(Strategy.EXIT) + 1 :])
        out.append(((*loc, listed.index(Strategy.EXIT)), f"exit ends the job: {later} after it would never be tried"))
    needs = {
        Strategy.RECOVER_IN_PLACE: ("max_restarts", given(ft, "max_restarts"), "how many restarts in place"),
        Strategy.RECOVER: (
            "retries",
            bool(as_int(ft.get("retries"))) or given(ft, "checkpoint_resume") or given(ft, "elastic"),
            "how many resubmits; or checkpoint_resume's max_resumes, or elastic",
        ),
        Strategy.DUMP: ("checkpoint_resume", given(ft, "checkpoint_resume"), "its signal and grace_period"),
    }
    for strategy, (key, has, why) in needs.items():
        if strategy in listed and not has:
            out.append(((*loc, listed.index(strategy)), f"{strategy} needs {key} ({why})"))
    budgets = {
        "max_restarts": (given(ft, "max_restarts"), Strategy.RECOVER_IN_PLACE),
        "retries": (bool(as_int(ft.get("retries"))), Strategy.RECOVER),
        "checkpoint_resume": (given(ft, "checkpoint_resume"), Strategy.DUMP),
    }
    for key, (has, strategy) in budgets.items():
        if has and strategy not in listed:
            out.append((("fault_tolerance", key), f"{key} is used by {strategy}, which strategies does not list"))
    if as_int(mapping(ft.get("checkpoint_resume")).get("max_resumes")) and Strategy.RECOVER not in listed:
        where: Loc = ("fault_tolerance", "checkpoint_resume", "max_resumes")
        out.append((where, "max_resumes counts resumes elsewhere, which is recover: strategies does not list it"))
    return out
