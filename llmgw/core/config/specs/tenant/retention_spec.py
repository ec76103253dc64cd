"""A Project's content retention (issue 21): in its own module to keep models.py within its size."""

from __future__ import annotations

from pydantic import Field, field_validator

from llmgw.core.config.base import Duration, Strict
from llmgw.core.words import parse_duration

__all__ = ["ContentRetention"]


class ContentRetention(Strict):
    """What a project's requests may leave in the store besides their shape (docs/traffic.md). Off unless
    the project opts in: content is kept encrypted under the controller's content key and deleted at its TTL."""

    content: bool = Field(
        False,
        description="Keep the content its requests ask to be kept (Responses `store`, a shared cache); "
        "without it such requests are refused or served without keeping anything",
    )
    ttl: Duration = Field("7d", description="How long kept content lives before the controller deletes it")

    @field_validator("ttl")
    @classmethod
    def _positive_ttl(cls, value: str) -> str:
        if parse_duration(value) <= 0:
            raise ValueError(f"ttl must be longer than zero (got {value!r}; e.g. 7d)")
        return value
