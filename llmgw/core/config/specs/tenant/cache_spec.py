"""A project's response cache: opt-in, how long an answer is reused, how much of the router's memory it may
hold, and what a reused answer is charged.

Apart from llmgw.core.config.models so that file stays one concept per screen; models re-exports the name.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from llmgw.core.config.base import Duration, Strict
from llmgw.core.words import parse_duration

__all__ = ["ResponseCacheSpec"]


class ResponseCacheSpec(Strict):
    """Exact-match reuse of this project's answers, held in each router's memory (never shared with another
    project, nor between routers)."""

    ttl: Duration = Field(description="How long a stored answer is reused, e.g. 10m (at least 1s)")
    max_bytes: int = Field(
        64 * 1024 * 1024,
        ge=64 * 1024,
        le=64 * 1024 * 1024 * 1024,
        description="The most answer bytes this project's cache holds in one router; least recently used go",
    )
    max_entry_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        description="An answer larger than this is not stored (at most max_bytes)",
    )
    hit_charge: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="The fraction of the stored answer's tokens and cost a reuse is charged: 0 free, 1 in full",
    )
    models: list[str] | None = Field(
        None,
        description="Models whose answers are cached: names or globs (unset: every model the project may use)",
    )

    @model_validator(mode="after")
    def _entry_fits(self) -> ResponseCacheSpec:
        if self.max_entry_bytes > self.max_bytes:
            raise ValueError(
                f"max_entry_bytes ({self.max_entry_bytes}) is larger than max_bytes ({self.max_bytes}); "
                "an answer must fit in the cache (make max_entry_bytes at most max_bytes)"
            )
        if parse_duration(self.ttl) < 1.0:
            raise ValueError(f"ttl {self.ttl} is under a second; write at least 1s")
        return self
