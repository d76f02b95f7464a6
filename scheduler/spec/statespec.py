"""The `state` section of the cluster config: the store on PostgreSQL, and the lease of the schedulers sharing it."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ftconsole.scheduler.spec.pgurl import redact
from ftconsole.scheduler.spec.values import Duration

LEASE_S = 10.0  # state.lease's default (scheduler.decide.leadership)
MIN_LEASE_S = 2.0


class StateSettings(BaseModel):
    """The store on a PostgreSQL server instead of SQLite in state_dir (docs/operations.md, State on PostgreSQL)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str  # postgresql://USER@HOST:PORT/DATABASE (a password: ~/.pgpass or $PGPASSWORD, not here)
    # several schedulers on one store: one leads, holding a lease it renews 4 times per lease; a standby takes it
    # within lease + 2 s of the leader's death (docs/operations.md, Two head nodes)
    lease: Duration = Field(LEASE_S, ge=MIN_LEASE_S)

    @model_validator(mode="before")
    @classmethod
    def _lease_needs_url(cls, value: Any) -> Any:
        if isinstance(value, dict) and "lease" in value and "url" not in value:
            raise ValueError(
                "lease is for several schedulers sharing a PostgreSQL store (state.url); the default store, "
                "SQLite in state_dir, has one scheduler and no lease: leave state out"
            )
        return value

    @field_validator("url", mode="before")
    @classmethod
    def _url(cls, value: Any) -> str:
        shape = "postgresql://USER@HOST:PORT/DATABASE"
        text = value.strip() if isinstance(value, str) else ""
        try:
            parts = urlsplit(text)
            parts.port  # noqa: B018 (parsing it: a port that is not a number raises)
        except ValueError as exc:
            raise ValueError(f"{redact(text)!r} is not a URL ({exc}); give {shape}") from None
        if parts.scheme not in ("postgresql", "postgres") or not parts.netloc + parts.query:
            raise ValueError(
                f"give a PostgreSQL URL, {shape}, not {redact(text) if text else value!r} (the default store, SQLite "
                "in state_dir, needs no "
                "url: leave state out)"
            )
        return text
