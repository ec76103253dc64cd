"""The Notification kind's spec: which events go to which webhook, signed how, retried how long.

Apart from llmgw.core.config.models so that file stays one concept per screen; models re-exports each name.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from llmgw.core.config.base import Duration, SecretRef, Strict

NotificationEvent = Literal[
    "revision_refused",
    "replica_failed",
    "node_lost",
    "budget_80",
    "budget_100",
    "canary_verdict",
    "weights_update",
]
NOTIFICATION_EVENTS: tuple[str, ...] = get_args(NotificationEvent)
NotificationFormat = Literal["json", "slack"]


class NotificationRetry(Strict):
    """How a failed delivery is retried: jittered exponential backoff from `backoff` up to `max_backoff`."""

    attempts: int = Field(8, ge=1, le=100, description="Attempts before the delivery is dead-lettered")
    backoff: Duration = Field("2s", description="Wait after the first failure; doubled after each one")
    max_backoff: Duration = Field("10m", description="The longest wait between two attempts")
    timeout: Duration = Field("10s", description="How long one attempt may take")


class NotificationSpec(Strict):
    """A webhook the controller calls when one of the selected events happens."""

    url: str = Field(description="The webhook's http(s) URL (no link-local or cloud metadata address)")
    secret: SecretRef | None = Field(
        None,
        description="The signing secret: every delivery carries X-Llmgw-Signature-256, the HMAC-SHA256 of "
        "`<timestamp>.<body>` under it (unset: deliveries are not signed)",
    )
    events: list[NotificationEvent] = Field(
        min_length=1,
        description="The events to send: revision_refused, replica_failed (also a crash loop: at most one "
        "message per model an hour), node_lost, budget_80 and budget_100 (a tenant's spend in its budget "
        "period, once per period), canary_verdict (a canary promoted or failed, with the revision it tried: "
        "what a CI sets a commit status from), weights_update (the controller's periodic check found a model's "
        "weights changed upstream, or could not ask its origin: docs/weights.md)",
    )
    format: NotificationFormat = Field(
        "json", description='json (llmgw\'s documented body) or slack (a Slack-compatible {"text": ...})'
    )
    retry: NotificationRetry = Field(default_factory=NotificationRetry)
