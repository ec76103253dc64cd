"""The admin API's suggested fleets (`POST /api/v1/suggestions`, `GET /api/v1/suggestions`): what
`llmgw plan --suggest --post` sends (llmgw.core.suggest.render.document makes it) and the console's plan page
draws: the candidates replayed for the busiest hour, each with its cost per hour and its worst p99 TTFT as a
share of its objective, and the report as `plan --suggest` prints it. docs/gitops.md, Suggested fleets."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llmgw.core.api.admin_api import Answer

__all__ = ["PostedSuggestion", "SuggestedCandidate", "SuggestionBody", "SuggestionsAnswer"]

MAX_CANDIDATES = 16
MAX_TEXT = 200_000


class SuggestedCandidate(BaseModel):
    """One configuration replayed: the suggestion (`chosen`) or a runner-up."""

    model_config = ConfigDict(extra="forbid", strict=True)  # "5.6" is no cost, 1 no yes
    name: str = Field(min_length=1, max_length=64, description="suggested, runner-up 1, ...")
    configuration: str = Field(
        min_length=1, max_length=2000, description="Each model's profile and replicas at the busiest hour"
    )
    chosen: bool = Field(description="This is the suggested fleet")
    cost_per_hour: float = Field(ge=0, description="In the body's currency, on average over the trace")
    ttft_p99_ms: float | None = Field(ge=0, description="The worst p99 TTFT in the replay; null: none served")
    ttft_share: float | None = Field(
        ge=0, description="That TTFT as a share of its objective (1: on it); null: no TTFT objective"
    )
    tpot_p99_ms: float | None = Field(ge=0, description="The worst p99 time per output token in the replay")
    availability: float | None = Field(ge=0, le=1, description="The worst share of requests served")
    met: bool = Field(description="Every objective held in the replay, its whole interval within it")
    missed: list[str] = Field(max_length=64, description="The objectives missed, with their figures")
    undecided: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="The objectives whose interval straddles them (neither met nor missed)",
    )
    ttft_p99_low_ms: float | None = Field(
        default=None, ge=0, description="The p99 TTFT's interval over the bench's passes; absent: no spread"
    )
    ttft_p99_high_ms: float | None = Field(default=None, ge=0, description="Its upper bound")
    ttft_share_low: float | None = Field(default=None, ge=0, description="The share's interval, lower bound")
    ttft_share_high: float | None = Field(default=None, ge=0, description="Its upper bound")


class SuggestionBody(BaseModel):
    """A `plan --suggest` run, as `--post` sends it."""

    model_config = ConfigDict(extra="forbid", strict=True)
    revision: str = Field(
        min_length=1, max_length=200, description="The repo revision the search was made on"
    )
    objective: Literal["cost", "latency"]
    currency: str = Field(min_length=1, max_length=16)
    busiest_hour: int = Field(
        ge=0, strict=False, description="The trace's hour the candidates were replayed for"
    )
    found: bool = Field(description="A configuration met every objective in the search and in the replay")
    method: str = Field(max_length=2000, description="exhaustive or heuristic, the space and the bound")
    replay: str = Field(max_length=2000, description="What was replayed: the trace, the hour, the seed")
    candidates: list[SuggestedCandidate] = Field(max_length=MAX_CANDIDATES)
    text: str = Field(max_length=MAX_TEXT, description="The report as `plan --suggest` prints it")

    @field_validator("busiest_hour", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        # JSON's 9.0 is the integer 9 (as JSON Schema has it); "9" and true are not numbers.
        if isinstance(value, str | bool):
            raise ValueError("the hour is a whole number, not a string or a boolean")
        return value


class PostedSuggestion(Answer):
    suggestion: SuggestionBody
    posted_at: float = Field(description="When the controller got it (seconds since the epoch)")
    posted_by: str = Field(description="The name of the admin token that posted it")


class SuggestionsAnswer(Answer):
    suggestions: list[PostedSuggestion] = Field(
        description="The newest first, one per revision, the last 20 revisions; kept in the store"
    )
