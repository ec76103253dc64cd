"""The admin API's answer for the controller's periodic check against the origin (`GET /api/v1/weights/updates`,
read by `llmgw model updates --last`): what each model's pinned files looked like there at the last check.
The check itself: llmgw.controller.loops.update_checks; what the answers mean: llmgw.core.plan.weight_updates."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmgw.core.api.admin_api import Answer

__all__ = ["UpdateChecksAnswer", "UpdateFileView", "UpdateView"]


class UpdateFileView(Answer):
    name: str
    size: int
    sha256: str


class UpdateView(Answer):
    model: str
    source: str = Field(description="org/name@revision, or the URL, as the repo pins it")
    state: Literal["current", "changed", "not checked"]
    detail: str = Field(description="Which files changed and where, or why it could not be checked")
    revision: str | None = Field(description="The origin's commit (null: not named, or a URL source)")
    changed: list[str] = Field(description="The files whose bytes differ at the origin")
    files: list[UpdateFileView] = Field(description="Every file as the origin has it now (when changed)")
    origin: str | None = Field(
        None,
        description="Which origin was asked and why that one: the registry the mirror's llmgw-origin.json records "
        "for the pinned revision, else the Cluster's mirror.origin (null: a URL source, asked at itself)",
    )


class UpdateChecksAnswer(Answer):
    check_every: str | None = Field(
        description="The applied Cluster's mirror.check_every (`off`: never); null: no revision is applied"
    )
    checked_at: float | None = Field(
        description="When the last check ended (seconds since the epoch); null: none since this controller "
        "began leading"
    )
    next_at: float | None = Field(
        description="When the next check is due; null: checks are off, or this controller does not lead"
    )
    updates: list[UpdateView] = Field(description="Each model's answer at the last check")
