"""The Cluster's `spec.plan`: what `llmgw plan` checks beyond the diff (now: `--simulate`'s regression gate).

Apart from llmgw.core.config.models so that file stays one concept per screen; models re-exports each name.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from llmgw.core.config.base import Strict

Percent = Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+)?%$", description="A percentage, e.g. 20%")]


class SimulateSettings(Strict):
    """When `llmgw plan --simulate` calls the planned fleet a regression (exit code 3): per model, against the
    current fleet replaying the same trace."""

    max_p99_ttft_increase: Percent = Field(
        "20%", description="The planned fleet's p99 TTFT may be at most this much above the current's"
    )
    max_refusals_increase: Percent = Field(
        "1%",
        description="The planned fleet may refuse (queue full, queue timeout, no replica) at most this share "
        "of a model's requests more than the current fleet does, in percentage points",
    )


class PlanSettings(Strict):
    """What `llmgw plan` checks beyond the diff."""

    simulate: SimulateSettings = Field(
        default_factory=SimulateSettings, description="Thresholds of `plan --simulate`'s regression gate"
    )
