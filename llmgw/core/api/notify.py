"""Notifications, decided: which webhooks an event goes to, what is sent, how it is signed, when a failed
delivery is tried again, and when a budget threshold is news. Pure: values in, values out; the clock's
reading and the jitter's random draw are parameters. The controller's `notifier` does the I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from llmgw.core.config.models import NotificationSpec
from llmgw.core.words import parse_duration

__all__ = [
    "BUDGET_THRESHOLDS",
    "DELIVERY_HEADER",
    "EVENT_HEADER",
    "MAX_ERROR_CHARS",
    "REPLICA_FAILED_EVERY_S",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "Attempt",
    "BudgetReading",
    "Dead",
    "Delivered",
    "NotifyEvent",
    "RetryAt",
    "after_attempt",
    "backoff_s",
    "budget_events",
    "classify",
    "dedupe_mark",
    "render",
    "signature",
    "targets",
    "verify",
]

SIGNATURE_HEADER = "X-Llmgw-Signature-256"
TIMESTAMP_HEADER = "X-Llmgw-Timestamp"
EVENT_HEADER = "X-Llmgw-Event"
DELIVERY_HEADER = "X-Llmgw-Delivery"
BUDGET_THRESHOLDS: tuple[tuple[int, str], ...] = ((80, "budget_80"), (100, "budget_100"))
# One message per model an hour for replica failures: a crash loop is one message, not one per crash.
REPLICA_FAILED_EVERY_S = 3600.0
MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class NotifyEvent:
    """Something that happened that a Notification may select. `fields` are event-specific facts (the
    model, the tenant, the spend), sent as they are in the json payload."""

    kind: str
    object: str
    message: str
    time: float
    cluster: str = ""
    fields: Mapping[str, Any] = field(default_factory=dict)


def targets(notifications: Mapping[str, NotificationSpec], kind: str) -> list[str]:
    """The names of the Notifications that select `kind`, sorted."""
    return sorted(name for name, spec in notifications.items() if kind in spec.events)


def dedupe_mark(event: NotifyEvent) -> str | None:
    """The key under which this event is announced at most once, or None (every one is news).

    A replica failure is marked per model and hour, so a crash loop (a new replica failing after each
    backoff) says so once an hour. Budget events carry their own mark (tenant, threshold, window)."""
    if event.kind == "replica_failed":
        model = str(event.fields.get("model") or event.object)
        return f"replica_failed:{model}:{int(event.time // REPLICA_FAILED_EVERY_S)}"
    mark = event.fields.get("mark")
    return str(mark) if mark is not None else None


def weights_update_mark(model: str, message: str, now: float) -> str:
    """A weights_update is announced once a day per model and news, whichever controller leads: a new leader's
    first check says again what the last one said (its answers are kept in memory), and that is no news."""
    digest = hashlib.sha256(message.encode()).hexdigest()[:16]
    return f"weights_update:{model}:{digest}:{int(now // 86400)}"


def render(fmt: str, event: NotifyEvent, delivery_id: str) -> str:
    """The body sent for `event`: llmgw's json (documented in docs/operations.md) or Slack's {"text"}."""
    if fmt == "slack":
        where = f"[{event.cluster}] " if event.cluster else ""
        return json.dumps({"text": f"{where}{event.kind.replace('_', ' ')}: {event.object}: {event.message}"})
    body = {
        "version": 1,
        "id": delivery_id,
        "event": event.kind,
        "object": event.object,
        "message": event.message,
        "time": event.time,
        "cluster": event.cluster,
        "fields": dict(event.fields),
    }
    return json.dumps(body, sort_keys=True, default=str)


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """`sha256=HEX`: the HMAC-SHA256 of `<timestamp>.<body>` under the secret. The timestamp is signed with
    the body so a receiver that refuses old timestamps cannot be fed a captured delivery again."""
    mac = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify(secret: bytes, timestamp: str, body: bytes, header: str, now: float, tolerance_s: float) -> bool:
    """The receiver's check (a test and the docs' example use it): signature matches, timestamp is fresh."""
    try:
        ts = int(timestamp)
    except ValueError:
        return False
    if abs(now - ts) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, ts, body).encode(), header.strip().encode())


# ------------------------------------------------------------------------------------------------ retries


@dataclass(frozen=True)
class Attempt:
    """How one delivery attempt ended: an HTTP status, or an error before any (timeout, refused, DNS)."""

    status: int | None
    error: str = ""


@dataclass(frozen=True)
class Delivered:
    pass


@dataclass(frozen=True)
class RetryAt:
    at: float
    error: str


@dataclass(frozen=True)
class Dead:
    error: str


Verdict = Delivered | RetryAt | Dead


def classify(attempt: Attempt) -> Literal["delivered", "retry", "final"]:
    """2xx delivered; 5xx, 408, 429 and no answer at all retried; any other 4xx (and 3xx, which is not
    followed) is final: the receiver said it will never take this body."""
    status = attempt.status
    if status is None:
        return "retry"
    if 200 <= status < 300:
        return "delivered"
    if status >= 500 or status in (408, 429):
        return "retry"
    return "final"


def backoff_s(spec: NotificationSpec, failures: int, draw: float) -> float:
    """The wait after the `failures`-th failure (1-based): `backoff` doubled each time up to `max_backoff`,
    then "full jitter" between half and all of it (`draw` in [0, 1)), so receivers coming back are not hit by
    every controller's retries at the same instant."""
    first = parse_duration(spec.retry.backoff)
    ceiling = parse_duration(spec.retry.max_backoff)
    full = min(ceiling, first * 2 ** max(0, failures - 1))
    return float(full * (0.5 + 0.5 * draw))


def after_attempt(
    spec: NotificationSpec, attempts: int, attempt: Attempt, now: float, draw: float
) -> Verdict:
    """What follows attempt number `attempts` (1-based) of a delivery."""
    outcome = classify(attempt)
    if outcome == "delivered":
        return Delivered()
    error = (attempt.error or f"HTTP {attempt.status}")[:MAX_ERROR_CHARS]
    if outcome == "final":
        return Dead(f"{error} (a 4xx other than 408/429 is not retried)")
    if attempts >= spec.retry.attempts:
        return Dead(f"{error} (gave up after {attempts} attempt(s))")
    return RetryAt(now + backoff_s(spec, attempts, draw), error)


# ------------------------------------------------------------------------------------------------ budgets


@dataclass(frozen=True)
class BudgetReading:
    """One tenant's spend in its budget window, as the store's usage says."""

    level: str  # project, team or org
    name: str
    amount: float
    spent: float
    window_start: float
    window_end: float


def budget_events(reading: BudgetReading, now: float, cluster: str = "") -> list[NotifyEvent]:
    """The thresholds (80%, 100%) this reading has reached, each with the mark that makes it news once per
    window. A budget of 0 has reached both as soon as anything is spent."""
    if reading.spent <= 0 and reading.amount > 0:
        return []
    share = reading.spent / reading.amount if reading.amount > 0 else float("inf")
    out = []
    for percent, kind in BUDGET_THRESHOLDS:
        if share * 100 >= percent:
            mark = f"{kind}:{reading.level}:{reading.name}:{reading.window_start:.0f}"
            message = (
                f"{reading.level} {reading.name} has spent {reading.spent:.6g} of its budget of "
                f"{reading.amount:g} ({min(share, 999.0) * 100:.0f}%) in the period ending {reading.window_end:.0f}"
            )
            fields: dict[str, object] = {
                "mark": mark,
                "level": reading.level,
                "tenant": reading.name,
                "spent": reading.spent,
                "budget": reading.amount,
                "percent": percent,
                "window_start": reading.window_start,
                "window_end": reading.window_end,
            }
            out.append(NotifyEvent(kind, f"{reading.level}/{reading.name}", message, now, cluster, fields))
    return out
