"""The Guardrail kind's spec: which checks a request's input and its answer go through, what happens when one
trips, and where the guardrail is attached in the tenant tree.

Apart from llmgw.core.config.models so that file stays one concept per screen; models re-exports each name.
The checks themselves (and the Llama Guard prompt and answer) are llmgw.core.evals.guardrails.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmgw.core.config.base import Duration, Name, Strict

GuardStage = Literal["input", "output"]
GuardMode = Literal["block", "redact", "warn"]
GuardFailure = Literal["open", "closed"]
PiiKind = Literal["email", "phone", "card", "national_id"]
_INPUT_ONLY: list[GuardStage] = ["input"]
HAZARD_CODES: tuple[str, ...] = tuple(f"S{i}" for i in range(1, 15))
HazardCode = Literal["S1", "S2", "S3", "S4", "S5", "S6", "S7", "S8", "S9", "S10", "S11", "S12", "S13", "S14"]


class GuardJudge(Strict):
    """A judge model asked, in Llama Guard 3's prompt format, whether the text is safe."""

    model: str = Field(description="A catalog model with `role: guard` (a name or an alias)")
    categories: list[HazardCode] | None = Field(
        None,
        description="Hazard categories that trip the guardrail (unset: all of S1-S14); a verdict naming "
        "only others is recorded, not acted on",
    )
    timeout: Duration = Field("5s", description="How long the judge may take before it counts as unavailable")


class GuardAttach(Strict):
    """Where the guardrail applies: a request is checked by every guardrail attached to its project, the
    project's team or organization, or the model it asks for."""

    organizations: list[Name] = Field(default_factory=list, description="Every project beneath these")
    teams: list[Name] = Field(default_factory=list, description="Every project of these teams")
    projects: list[Name] = Field(default_factory=list, description="These projects")
    models: list[str] = Field(
        default_factory=list, description="Requests for these models (names or aliases)"
    )


class GuardrailSpec(Strict):
    """Deterministic checks and an optional judge, run on the input, the output or both."""

    stages: list[GuardStage] = Field(
        default_factory=lambda: _INPUT_ONLY.copy(),
        min_length=1,
        description="Check the prompt, the answer, or both",
    )
    mode: GuardMode = Field(
        "block",
        description="block: refuse with a 400 naming the rule (a stream is cut); redact: replace what the "
        "PII, regex and keyword checks match before the engine sees it (the other checks block); warn: "
        "serve and record the verdict",
    )
    attach: GuardAttach = Field(default_factory=GuardAttach)
    regex: list[str] = Field(default_factory=list, description="Python regular expressions that trip it")
    keywords: list[str] = Field(
        default_factory=list, description="Words or phrases that trip it (whole words, any case)"
    )
    pii: list[PiiKind] = Field(
        default_factory=list, description="PII shapes: email, phone, card (Luhn-checked), national_id"
    )
    max_prompt_chars: int | None = Field(
        None, ge=1, description="Longest prompt text taken, in characters (input only; unset: no bound)"
    )
    blocked_topics: dict[Name, list[str]] = Field(
        default_factory=dict,
        description="Topics by name, each with the phrases that mark it; a refusal names the topic",
    )
    judge: GuardJudge | None = Field(None, description="A judge model (Llama Guard 3's format)")
    on_judge_error: GuardFailure = Field(
        "closed",
        description="When the judge cannot answer: closed refuses the request (503), open serves it and "
        "records that it was not judged",
    )
    window_chars: int = Field(
        256,
        ge=16,
        le=65536,
        description="A streamed answer is checked on its newest this many characters plus each new piece "
        "(a match may span pieces); longer matches than this are not seen in a stream",
    )
