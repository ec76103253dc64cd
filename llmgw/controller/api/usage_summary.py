"""`GET /api/v1/usage/summary?window=7d` (scope plan): the usage summary `llmgw plan` joins its changes with.

Scope plan, unlike the per-request and per-key usage (admin): it is totals per project, model and tenant, with
no key, no tag and no request, which is what a pull request's reviewer is shown anyway, and a plan token is
the one a CI job holds. The window is a duration (default 7d, at most 90d); the summary carries the measured
capacities too, so `plan --save-state` writes all that a plan without the cluster needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from aiohttp import web

from llmgw.controller.api.guard import error, require_parts
from llmgw.core.words import parse_duration
from llmgw.store import StoreError
from llmgw.store.store import Store
from llmgw.store.usage.usage_summary import read_usage_summary

__all__ = ["DEFAULT_WINDOW", "MAX_WINDOW_S", "PARTS", "UsageParts", "usage_summary"]


class UsageParts(Protocol):
    """What the usage reads read: the store, and the wall clock (a window ends now)."""

    @property
    def store(self) -> Store: ...

    @property
    def wall(self) -> Callable[[], float]: ...


PARTS: web.AppKey[UsageParts] = web.AppKey("usage_summary_parts")

DEFAULT_WINDOW = "7d"
MAX_WINDOW_S = 90 * 86400.0


async def usage_summary(request: web.Request) -> web.Response:
    c = require_parts(request, "plan", PARTS)
    text = request.query.get("window", DEFAULT_WINDOW)
    try:
        window_s = parse_duration(text, positive=True)
    except ValueError as exc:
        return error(400, f"window={text!r}: {exc}")
    if window_s > MAX_WINDOW_S:
        return error(400, f"window={text!r}: at most 90d (a plan judges against recent traffic)")
    until = c.wall()
    try:
        summary = await read_usage_summary(c.store, since=until - window_s, until=until)
    except StoreError as exc:
        return error(503, f"the store is unavailable: {exc}")
    return web.json_response(summary.model_dump(mode="json"))
