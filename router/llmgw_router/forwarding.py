"""Where a request goes: its fallback chain, the endpoint picked and claimed, the wait in line, and the wait
for an on-demand model to load.

The chain is the published one (the controller's catalog resolved the aliases and followed it transitively),
minus what this request may not use. Picking is `scheduler.schedule` over the live endpoint records, and the
claim (inflight + 1) happens in the same step of the event loop as the choice.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

from llmgw.core.snapshot import PublishedModel
from llmgw_router import breaker as brk
from llmgw_router.admission import Admission
from llmgw_router.errors import ApiError
from llmgw_router.metrics import RouterMetrics
from llmgw_router.options import RouterOptions
from llmgw_router.ports import ControllerCallbacks
from llmgw_router.scheduler import Decision, RequestInfo, schedule
from llmgw_router.state import LiveEndpoint, RoutingTable

__all__ = ["Forwarding", "Picked", "fallback_chain"]

log = logging.getLogger(__name__)

_LOAD_REQUEST_INTERVAL = 10.0  # seconds between two asks to load the same on-demand model


@dataclass(frozen=True, slots=True)
class Picked:
    endpoint: LiveEndpoint  # claimed: release it when the request is done with it
    served: str  # the model it serves: the one asked for or a fallback
    decision: Decision


def fallback_chain(
    table: RoutingTable,
    canonical: str,
    kind: str,
    project: str | None,
    fits: Callable[[PublishedModel], bool],
) -> tuple[str, ...]:
    """The requested model, then its fallback chain as published, minus every model this request cannot use:
    one `project` may not use (a full allowed model must never hand its traffic to a model the project was
    not given), one without the capability, one whose context cannot hold the request (`fits`). `project` is
    None when no tenants apply (auth disabled, or a snapshot without tenants)."""
    chain = [canonical]
    for fb in table.models[canonical].fallbacks:
        m = table.models.get(fb)
        if m is None or fb in chain or kind not in m.capabilities or not fits(m):
            continue
        if project is not None and not table.allowed(project, fb, fb):
            continue
        chain.append(fb)
    return tuple(chain)


class Forwarding:
    """Picks and claims endpoints for one router process; holds the round-robin positions and the on-demand
    asks. `table` reads the service's current routing table (a new one per snapshot)."""

    def __init__(
        self,
        table: Callable[[], RoutingTable | None],
        admission: Admission,
        metrics: RouterMetrics,
        options: RouterOptions,
        controller: ControllerCallbacks,
        clock: Callable[[], float],
        rng: random.Random,
    ) -> None:
        self._table = table
        self.admission = admission
        self.metrics = metrics
        self.options = options
        self.controller = controller
        self.clock = clock
        self.rng = rng
        self._rr: dict[str, int] = {}
        self._load_requested: dict[str, float] = {}
        self._snapshot_changed = asyncio.Event()

    def snapshot_applied(self) -> None:
        """Wake every request waiting for an on-demand load: the new table may have its replica."""
        self._snapshot_changed.set()
        self._snapshot_changed = asyncio.Event()

    # ------------------------------------------------------------------ claim and release

    def claim(
        self, table: RoutingTable, model: str, info: RequestInfo, need_room: bool, take_stale: bool = False
    ) -> tuple[LiveEndpoint, Decision] | None:
        """Schedule among `model`'s endpoints and take the chosen one (inflight + 1). No await inside: the
        choice and the claim happen in one step of the event loop.

        `need_room` refuses a full endpoint, and a stale one (its metrics unknown) unless `take_stale`: the
        first walk down the chain prefers a model whose load is known, the second and a request waiting in
        line take a stale endpoint that has slots free by this router's own count, since unknown is not full
        (an engine whose metrics page broke would otherwise never be served again)."""
        endpoints = table.endpoints.get(model, ())
        if not endpoints:
            return None
        now = self.clock()
        rr = self._rr.get(model, 0)
        self._rr[model] = rr + 1
        cands = [ep.candidate(now, table.stale_after) for ep in endpoints]
        info = RequestInfo(info.session_key, info.exclude, rr)
        decision = schedule(cands, table.policy_for(model), info, self.rng)
        if decision.endpoint is None:
            return None
        index = next(i for i, c in enumerate(cands) if c.id == decision.endpoint)
        chosen, ep = cands[index], endpoints[index]
        # A session's target is forwarded even when full: the scheduler bounds that queue (scheduler.py).
        unusable = chosen.full or (chosen.stale and not take_stale)
        if need_room and unusable and chosen.id != decision.session_target:
            return None
        ok, ep.breaker = brk.allow(ep.breaker, now, self.options.breaker)
        if not ok:
            return None
        ep.inflight += 1
        self.metrics.count(self.metrics.decisions, (model, decision.winning_scorer))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("decision for %s: %s", model, decision.rationale())
        return ep, decision

    def release(self, ep: LiveEndpoint, model: str) -> None:
        ep.inflight -= 1
        self.admission.notify(model)

    def failed(self, ep: LiveEndpoint, reason: str) -> None:
        ep.breaker = brk.on_failure(ep.breaker, self.clock(), self.options.breaker)
        log.warning("endpoint %s (%s) failed: %s", ep.id, ep.spec.model, reason)

    def succeeded(self, ep: LiveEndpoint) -> None:
        ep.breaker = brk.on_success(ep.breaker)

    def schedulable(self, table: RoutingTable, model: str, exclude: frozenset[str] = frozenset()) -> bool:
        """Has `model` an endpoint that is ready, not broken open, and not one this request failed on?"""
        now = self.clock()
        return any(
            ep.spec.state == "ready" and not ep.breaker.is_open(now) and ep.id not in exclude
            for ep in table.endpoints.get(model, ())
        )

    # ------------------------------------------------------------------ the walk down the chain

    async def pick(
        self, table: RoutingTable, canonical: str, chain: tuple[str, ...], info: RequestInfo
    ) -> Picked:
        """An endpoint of the first model in `chain` with room now; else a place in line at the first that
        has endpoints at all; else the wait for an on-demand load; else 503."""
        # `chain` holds only models the request may use, so a load is never asked for a model the project
        # was not given. `on_demand` is the catalog's: a `min 0, max 0` model is parked and never waited on.
        on_demand = [m for m in chain if table.models[m].on_demand and not self.schedulable(table, m)]
        for m in on_demand:
            self._ask_load(m)
        for m in chain:  # first choice: a model in the chain with room now
            got = self.claim(table, m, info, need_room=True)
            if got is not None:
                return self._picked(canonical, m, got)
        for m in chain:  # then one whose load is unknown (stale metrics) but with slots free by our count
            got = self.claim(table, m, info, need_room=True, take_stale=True)
            if got is not None:
                return self._picked(canonical, m, got)
        for m in chain:  # then wait in line for the first that has endpoints at all
            if self.schedulable(table, m, info.exclude):
                return self._picked(canonical, m, await self._wait_in_line(table, m, info))
        if on_demand:
            return await self._wait_for_load(canonical, on_demand, info)
        names = ", ".join(f"`{m}`" for m in chain)
        raise ApiError(
            503,
            f"No endpoint can serve {names} right now.",
            "model_unavailable",
            "server_error",
            headers={"Retry-After": "5"},
        )

    async def _wait_in_line(
        self, table: RoutingTable, model: str, info: RequestInfo
    ) -> tuple[LiveEndpoint, Decision]:
        cell: list[tuple[LiveEndpoint, Decision]] = []

        def has_room() -> bool:
            got = self.claim(table, model, info, need_room=True, take_stale=True)
            if got is not None:
                cell.append(got)
            return got is not None

        await self.admission.wait(model, has_room, table.admission_timeout)
        return cell[0]

    def _picked(self, canonical: str, served: str, got: tuple[LiveEndpoint, Decision]) -> Picked:
        if served != canonical:
            self.metrics.fallbacks.labels(canonical, served).inc()
        return Picked(got[0], served, got[1])

    def _ask_load(self, model: str) -> None:
        now = self.clock()
        if now - self._load_requested.get(model, -1e18) >= _LOAD_REQUEST_INTERVAL:
            self._load_requested[model] = now
            log.info("asking the controller to load on-demand model %s", model)
            self.controller.request_load(model)

    async def _wait_for_load(self, canonical: str, models: list[str], info: RequestInfo) -> Picked:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.on_demand_wait
        while (remaining := deadline - loop.time()) > 0:
            changed = self._snapshot_changed
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                break
            table = self._table()
            assert table is not None
            for m in models:
                got = self.claim(table, m, info, need_room=False) if m in table.models else None
                if got is not None:
                    return self._picked(canonical, m, got)
        retry = self.options.loading_retry_after
        raise ApiError(
            503,
            f"model is loading: `{models[0]}` has no replica yet; retry in {retry} s.",
            "model_loading",
            "server_error",
            headers={"Retry-After": str(retry)},
        )
