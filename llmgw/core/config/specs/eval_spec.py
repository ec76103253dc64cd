"""The EvalSuite kind's spec (prompts with checks and a pass threshold) and a Model's canary rollout block.

Apart from llmgw.core.config.models so that file stays one concept per screen; models re-exports each name.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, model_validator

from llmgw.core.config.base import Duration, Name, Strict


class NumberCheck(Strict):
    """The first number in the answer is `value`, within `tolerance` (absolute)."""

    value: float = Field(description="The number the answer must give")
    tolerance: float = Field(0.0, ge=0, description="How far from `value` it may be (absolute)")


class JudgeCheck(Strict):
    """Another model reads the answer and says PASS or FAIL against the criteria."""

    criteria: str = Field(min_length=1, description="What a right answer does, in words the judge reads")
    model: str | None = Field(None, description="The judge model (default: the suite's `judge`)")


class EvalCheck(Strict):
    """How one answer is judged: exactly one of the checks."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        json_schema_extra={
            "oneOf": [{"required": [k]} for k in ("contains", "regex", "json_schema", "number", "judge")]
        },
    )

    contains: str | None = Field(None, description="The answer contains this text")
    ignore_case: bool = Field(False, description="`contains` and `regex` ignore case")
    regex: str | None = Field(None, description="The answer matches this regular expression (search)")
    json_schema: dict[str, Any] | None = Field(
        None, description="The answer is a JSON document valid against this JSON Schema"
    )
    number: NumberCheck | None = Field(
        None, description="The answer's first number is this, within tolerance"
    )
    judge: JudgeCheck | None = Field(None, description="A judge model's verdict")

    @model_validator(mode="after")
    def _exactly_one(self) -> EvalCheck:
        given = [self.contains, self.regex, self.json_schema, self.number, self.judge]
        if sum(x is not None for x in given) != 1:
            raise ValueError("a check takes exactly one of contains, regex, json_schema, number or judge")
        return self


class EvalCase(Strict):
    """One prompt and the check its answer must pass."""

    name: Name = Field(description="Name of the case, unique within the suite")
    prompt: str = Field(min_length=1, description="The user message sent")
    system: str | None = Field(None, description="A system message sent before it")
    max_tokens: int = Field(64, ge=1, description="Longest answer asked for")
    response_format: dict[str, Any] | None = Field(
        None, description="Sent as the request's response_format (e.g. a json_schema to answer in)"
    )
    check: EvalCheck


class EvalSuiteSpec(Strict):
    """Prompts with checks; the suite passes when at least `pass_threshold` of its cases pass."""

    cases: list[EvalCase] = Field(min_length=1, description="The cases, run in order")
    pass_threshold: float = Field(
        1.0, ge=0, le=1, description="Fraction of the cases that must pass (1: every one)"
    )
    judge: str | None = Field(None, description="Model that judges `judge` checks (a Model in this repo)")
    timeout: Duration = Field("60s", description="Longest wait for one answer")


class CanaryGates(Strict):
    """What a canary must show before it is promoted, compared with the stable replicas."""

    max_error_rate: float = Field(
        0.05,
        ge=0,
        le=1,
        description="How much the canary's error rate (5xx, unreachable) may exceed the stable replicas'",
    )
    max_ttft_ratio: float | None = Field(
        1.5, gt=0, description="Canary p99 TTFT over the stable replicas' at most this (unset: not gated)"
    )
    min_requests: int = Field(
        20, ge=0, description="Requests the canary must have answered before its error rate is judged"
    )
    evals: list[Name] = Field(
        default_factory=list, description="EvalSuites run against a canary replica; each must pass"
    )


class CanarySpec(Strict):
    """New replicas take a share of traffic (by weight, or by a header) until the gates decide."""

    weight: int | None = Field(
        None, ge=0, le=100, description="Percent of the model's requests sent to the canary replicas"
    )
    header: str | None = Field(
        None,
        pattern=r"^[a-z0-9-]+$",
        description="A request carrying this header (any value) goes to the canary (internal testers)",
    )
    duration: Duration = Field("5m", description="How long the canary serves before the gates decide")
    gates: CanaryGates = Field(default_factory=CanaryGates)
