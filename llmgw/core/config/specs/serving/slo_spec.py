"""A model's service objectives (`spec.slo`): time to first token at p90 and p99, time per output token at p99
and availability, for all of its traffic and per traffic class (a project's use of the model).

`llmgw bench` measures capacity against `ttft_p99_ms` and the autoscaler keeps it; `llmgw plan --simulate` and
`plan --suggest` hold the replay to every objective set here (docs/gitops.md, Suggested fleets). Apart from
llmgw.core.config.models so that file stays one concept per screen; models re-exports `Slo`.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from llmgw.core.config.base import Name, Strict

__all__ = ["OBJECTIVES", "Slo", "SloTargets"]

# The objectives' field names, in the order reports list them.
OBJECTIVES = ("ttft_p90_ms", "ttft_p99_ms", "tpot_p99_ms", "availability")


class SloTargets(Strict):
    """Service objectives; unset: no objective of that kind."""

    ttft_p90_ms: float | None = Field(
        None, gt=0, description="p90 time to first token the requests must stay under, in ms"
    )
    ttft_p99_ms: float | None = Field(
        None, gt=0, description="p99 time to first token the requests must stay under, in ms"
    )
    tpot_p99_ms: float | None = Field(
        None,
        gt=0,
        description="p99 time per output token (a request's decode time over its tokens after the first), in ms",
    )
    availability: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Share of requests served rather than refused (queue full, queue timeout, no replica), "
        "e.g. 0.999",
    )

    @model_validator(mode="after")
    def _p90_within_p99(self) -> SloTargets:
        p90, p99 = self.ttft_p90_ms, self.ttft_p99_ms
        if p90 is not None and p99 is not None and p90 > p99:
            raise ValueError(
                f"ttft_p90_ms {p90:g} is above ttft_p99_ms {p99:g}: nine in ten requests cannot need longer "
                f"than ninety-nine in a hundred (set ttft_p90_ms to at most {p99:g})"
            )
        return self

    def declared(self) -> dict[str, float]:
        """The objectives set, by field name, in OBJECTIVES order."""
        return {name: value for name in OBJECTIVES if (value := getattr(self, name)) is not None}


class Slo(SloTargets):
    """The model's objectives: what `llmgw bench` measures capacity against, the autoscaler keeps, and `plan`
    holds the replay to."""

    ttft_p99_ms: float = Field(gt=0, description="p99 time to first token a replica must stay under, in ms")
    projects: dict[Name, SloTargets] = Field(
        default_factory=dict,
        description="Per traffic class: a project's use of this model (its requests, by the Project's name) "
        "held to its own objectives, which replace the model's for what they set",
    )

    @model_validator(mode="after")
    def _projects_say_something(self) -> Slo:
        for name, targets in self.projects.items():
            if not targets.declared():
                raise ValueError(
                    f"projects.{name} sets no objective: give it at least one of {', '.join(OBJECTIVES)}, "
                    "or remove it (the model's own objectives apply)"
                )
            p90 = targets.ttft_p90_ms
            if p90 is not None and targets.ttft_p99_ms is None and p90 > self.ttft_p99_ms:
                raise ValueError(
                    f"projects.{name}.ttft_p90_ms {p90:g} is above the model's ttft_p99_ms "
                    f"{self.ttft_p99_ms:g}, which it keeps: set its own ttft_p99_ms or lower ttft_p90_ms"
                )
        return self

    def for_project(self, project: str | None) -> dict[str, float]:
        """The objectives a project's requests are held to: the model's, with the project's own in place."""
        own = self.projects.get(project) if project is not None else None
        return {**self.declared(), **(own.declared() if own is not None else {})}
