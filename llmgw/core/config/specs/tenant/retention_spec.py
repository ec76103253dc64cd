"""A Project's content retention (issue 21): in its own module to keep models.py within its size."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from llmgw.core.config.base import Duration, Strict
from llmgw.core.words import parse_duration

__all__ = ["BodyRetention", "ContentRetention"]


class BodyRetention(Strict):
    """Request and answer bodies kept for `llmgw request ID --body` and `--replay MODEL` (docs/tenancy.md)."""

    share: float = Field(
        gt=0, le=1, description="Share of the project's requests whose bodies are kept (1: every one)"
    )
    max_bytes: int = Field(
        65536,
        ge=256,
        description="Longest request or answer body kept, in bytes; a longer one is kept cut at this size "
        "and said to be cut",
    )
    redact: bool = Field(
        True,
        description="Kept bodies have what the project's guardrails' PII rules find replaced by their "
        "placeholders, whatever those rules do to the request itself",
    )


class ContentRetention(Strict):
    """What a project's requests may leave in the store besides their shape (docs/traffic.md). Off unless
    the project opts in: content is kept encrypted under the controller's content key and deleted at its TTL."""

    content: bool = Field(
        False,
        description="Keep the content its requests ask to be kept (Responses `store`, a shared cache); "
        "without it such requests are refused or served without keeping anything",
    )
    ttl: Duration = Field("7d", description="How long kept content lives before the controller deletes it")
    bodies: BodyRetention | None = Field(
        None, description="Keep a share of its requests' and answers' bodies (needs `content: true`)"
    )

    @model_validator(mode="after")
    def _bodies_are_content(self) -> ContentRetention:
        if self.bodies is not None and not self.content:
            raise ValueError("bodies are kept content: set `content: true` beside `bodies`")
        return self

    @field_validator("ttl")
    @classmethod
    def _positive_ttl(cls, value: str) -> str:
        if parse_duration(value) <= 0:
            raise ValueError(f"ttl must be longer than zero (got {value!r}; e.g. 7d)")
        return value
