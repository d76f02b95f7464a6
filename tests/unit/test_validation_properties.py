"""Property tests (issue 11): whatever a job spec or a config holds, validation raises only our own errors.

From YAML text, `parse_jobspec` and the config's validation raise only `ConfigError`, and each of its problems
names a line, and a key unless it is about the whole document. From JSON (the API's submit), `JobSpec.from_json`
raises only pydantic's `ValidationError`, which the engine turns into a `UsageError` (`engine._spec`).
Derandomized, with few examples and a deadline, so the suite stays fast and CI is never flaky.
"""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ftconsole.scheduler.errors import ConfigError
from ftconsole.scheduler.spec import yamlfile
from ftconsole.scheduler.spec.config import ClusterConfig
from ftconsole.scheduler.spec.jobspec import JobSpec, parse_jobspec

PROPERTY = settings(
    max_examples=100, deadline=2000, derandomize=True, suppress_health_check=[HealthCheck.too_slow], database=None
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", " ", "~", "30s", "5m", "-1", "gpu[1-4]", "a[", "*", "\x00", "very-urgent", "elastic"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def keyed(keys: list[str], value: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Mappings mostly of the model's own keys (so validation gets deep), some unknown ones."""
    return st.dictionaries(st.sampled_from(keys) | st.text(max_size=6), value, max_size=6)


job_keys = list(JobSpec.model_fields)
nested_job = keyed(
    ["retries", "max_restarts", "elastic", "min_nodes", "max_nodes", "before", "name", "command"], values
)
jobs = keyed(job_keys, st.one_of(values, nested_job, st.lists(nested_job, max_size=2)))

config_keys = list(ClusterConfig.model_fields)
node_group = keyed(["name", "host", "port", "user", "pool", "labels"], values)
nested_config = keyed(["user", "port", "interval", "tick", "socket", "group", "gpus_per_node", "thresholds"], values)
configs = keyed(config_keys, st.one_of(values, nested_config, st.lists(node_group, max_size=3)))


def dump(data: Any) -> str:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


def assert_located(err: ConfigError) -> None:
    assert err.problems
    for problem in err.problems:
        assert problem.line is not None, problem
        assert problem.path or "top level" in problem.message or problem.line == 1, problem


@PROPERTY
@given(jobs)
def test_job_yaml_raises_only_located_config_errors(data: dict[str, Any]) -> None:
    try:
        parse_jobspec(dump(data), "job.yaml")
    except ConfigError as err:
        assert_located(err)


@PROPERTY
@given(jobs)
def test_job_json_raises_only_validation_errors(data: dict[str, Any]) -> None:
    try:
        JobSpec.from_json(data)
    except ValidationError as err:
        assert all(e["loc"] or e["type"] for e in err.errors())


@PROPERTY
@given(configs)
def test_config_yaml_raises_only_located_config_errors(data: dict[str, Any]) -> None:
    text = dump(data)
    try:
        parsed, marks = yamlfile.parse(text, "cluster.yaml")
        cluster = yamlfile.validate(ClusterConfig, parsed, "cluster.yaml", marks)
        cluster.cross_problems()
        cluster.node_list()
    except ConfigError as err:
        assert_located(err)


@PROPERTY
@given(st.text(alphabet=st.sampled_from(list("ab: -[]{}&*!|>'\"#\n?,%@`\t\\0")), max_size=60))
def test_any_text_raises_only_config_errors(text: str) -> None:
    try:
        parse_jobspec(text, "job.yaml")
    except ConfigError as err:
        assert err.problems and all(p.file == "job.yaml" for p in err.problems)
