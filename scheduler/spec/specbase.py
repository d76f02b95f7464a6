"""What the job spec's modules share (`jobspec`, `faultspec`, `detectspec`): the strict model base, small
field types, and the helpers of the checks across keys, which read raw (unvalidated) YAML data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict

Loc = tuple[Any, ...]
"""A key path in the job's YAML, as (key, key, index, ...)."""


class Strict(BaseModel):
    """Unknown keys are errors; a validated spec does not change."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


T = TypeVar("T")


def unique(values: list[T]) -> list[T]:
    """`values` if no entry repeats; one pass over them (issue 40: a count per entry took 61 s for 80,000)."""
    seen: set[T] = set()
    repeated: set[str] = set()
    for value in values:
        if value in seen:
            repeated.add(str(value))
        seen.add(value)
    if repeated:
        shown = sorted(repeated)
        more = f" and {len(shown) - 10:,} more" if len(shown) > 10 else ""
        raise ValueError(f"each entry must be unique: {', '.join(shown[:10])}{more} given more than once")
    return values


Text = Annotated[str, AfterValidator(not_blank)]


def given(data: Mapping[str, Any], key: str) -> bool:
    return data.get(key) is not None


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def is_off(value: Any) -> bool:
    """`off` as YAML may write it: a bare off reads as false."""
    return value is False or (isinstance(value, str) and value.strip().lower() == "off")
