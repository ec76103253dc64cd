"""A canary's share and the model checks' verdicts, for one request: which endpoints it must not use.

The decisions are llmgw_router.decisions.canary_route's and .capabilities'; this holds one request's draw
and needs across its attempts, and turns a capability refusal into its answer.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from llmgw.core.snapshot import Endpoint
from llmgw_router.decisions.canary_route import steered_away
from llmgw_router.decisions.capabilities import CHECKING_RETRY_AFTER_S, Refusal, needs_of, refusal
from llmgw_router.decisions.scheduler import RequestInfo
from llmgw_router.fleet.table import RoutingTable
from llmgw_router.server.errors import ApiError

__all__ = ["NO_STEERING", "Steering", "refused_error"]


class Steering:
    """A canary's share and the model checks' verdicts for one request (llmgw_router.decisions.canary_route); a
    request for a model with neither (most) skips it."""

    def __init__(self, specs: dict[str, list[Endpoint]], needs: frozenset[str], draw: float) -> None:
        self.specs, self.needs, self.draw = specs, needs, draw

    @classmethod
    def of(
        cls, table: RoutingTable, chain: tuple[str, ...], body: dict[str, Any], rng: random.Random
    ) -> Steering:
        # Images are a checked need only where a model of the chain declares vision (its check may have failed).
        vision, canary = table.steered(chain)
        needs = needs_of(body, vision=vision)
        if not needs and not canary:
            return NO_STEERING  # most requests: nothing to check, nothing to steer
        specs = {m: [ep.spec for ep in table.endpoints.get(m, ())] for m in chain} if needs or canary else {}
        refused = refusal(specs, table.models, chain, needs)
        if refused is not None:  # 503 while a check runs (retry soon helps), else 400 (an operator must act)
            raise refused_error(refused)
        return cls(specs, needs, rng.random() if canary else 1.0)

    def info(
        self, table: RoutingTable, chain: tuple[str, ...], headers: Any, info: RequestInfo, now: float
    ) -> RequestInfo:
        """`info` with the endpoints this attempt must not use added to its exclusions. Endpoints that
        cannot take it now (breaker open, not ready) count as failed: the other group serves instead."""
        if not self.specs:
            return info
        down = {
            ep.id
            for m in chain
            for ep in table.endpoints.get(m, ())
            if ep.spec.state != "ready" or ep.breaker.is_open(now)
        }
        away = steered_away(
            self.specs,
            table.models,
            chain,
            headers=headers,
            draw=self.draw,
            needs=self.needs,
            failed=info.exclude | down,
        )
        return dataclasses.replace(info, exclude=info.exclude | away)  # its prefix and project kept


NO_STEERING = Steering({}, frozenset(), 1.0)


def refused_error(refused: Refusal) -> ApiError:
    """A capability refusal in OpenAI's shape: 503 with Retry-After while a check that decides runs (asking
    again soon helps), else 400 (an operator must act, and the message says how)."""
    retry = {"Retry-After": str(CHECKING_RETRY_AFTER_S)} if refused.checking else None
    kind = "server_error" if refused.checking else "invalid_request_error"
    return ApiError(refused.status, refused.message, refused.code, kind, refused.param, retry)
