"""The pass conditions of the node checks (`probes.thresholds`, and a pool's `pools.NAME.thresholds` over them).

Each value is checked where it is read, so that `load_config` refuses what no check could use: sizes and limits
not below 0, a percentage from 0 to 100, and each warn level below its fail level (`WARN_FAIL`), also where a
pool's overrides meet the cluster's values (`warn_fail_problem`, which ClusterConfig's checks across keys run).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ftconsole.scheduler.spec.values import CELSIUS, GB, KB, PERCENT

# (warn, fail) keys: a value at or over `warn` degrades a node, at or over `fail` fails it, so warn < fail
WARN_FAIL = (("gpu_temp_warn_c", "gpu_temp_fail_c"),)

Gigabytes = Annotated[float, Field(ge=0), GB]
Kilobytes = Annotated[int, Field(ge=0), KB]
Count = Annotated[int, Field(ge=0)]
Celsius = Annotated[float, CELSIUS]
Percent = Annotated[float, Field(ge=0, le=100), PERCENT]
PerCpu = Annotated[float, Field(ge=0)]
PerSecond = Annotated[float, Field(gt=0)]


def warn_fail_problem(values: dict[str, Any], fail: str) -> str | None:
    """Why the warn level paired with `fail` (WARN_FAIL) is not below it in `values`, or None."""
    warn = next(w for w, f in WARN_FAIL if f == fail)
    if values.get(warn) is None or values.get(fail) is None or values[warn] < values[fail]:
        return None
    return f"{fail} ({values[fail]:g}) must be above {warn} ({values[warn]:g}): a node warns before it fails"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator(*(fail for _, fail in WARN_FAIL), check_fields=False)
    @classmethod
    def _fail_above_warn(cls, value: float | None, info: ValidationInfo) -> float | None:
        assert info.field_name is not None
        problem = warn_fail_problem({**info.data, info.field_name: value}, info.field_name)
        if problem is not None:
            raise ValueError(problem)
        return value


class Thresholds(_Strict):
    """Pass conditions of the checks; defaults are seed 000's."""

    # a warn level given alone meets its fail level's default: checked too
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    disk_root_gb: Gigabytes = 32.0
    disk_shm_gb: Gigabytes = 1.0
    disk_cache_gb: Gigabytes = 32.0
    ulimit_memlock_kb: Kilobytes = 16000
    ulimit_nofile: Count = 1_000_000
    ulimit_stack_kb: Kilobytes = 8000
    ulimit_nproc: Count = 1_000_000
    gpus_expected: int | None = Field(None, ge=0)
    gpu_temp_warn_c: Celsius = 85.0
    gpu_temp_fail_c: Celsius = 95.0
    mem_available_warn_pct: Percent = 5.0
    load_warn_per_cpu: PerCpu = 2.0
    # NVLink errors (replays, recoveries, CRC) per second on a GPU since the last probe: DCGM's limit for CRC errors
    nvlink_error_rate_warn: PerSecond = 100.0


class PartialThresholds(_Strict):
    """Per-pool overrides: only the keys given replace the cluster-wide values."""

    disk_root_gb: Gigabytes | None = None
    disk_shm_gb: Gigabytes | None = None
    disk_cache_gb: Gigabytes | None = None
    ulimit_memlock_kb: Kilobytes | None = None
    ulimit_nofile: Count | None = None
    ulimit_stack_kb: Kilobytes | None = None
    ulimit_nproc: Count | None = None
    gpus_expected: int | None = Field(None, ge=0)
    gpu_temp_warn_c: Celsius | None = None
    gpu_temp_fail_c: Celsius | None = None
    mem_available_warn_pct: Percent | None = None
    load_warn_per_cpu: PerCpu | None = None
    nvlink_error_rate_warn: PerSecond | None = None
