"""Where a request goes: its fallback chain, the endpoint picked and claimed, and its place in the admission
queue, whether its model is busy or has no replica yet (an on-demand load, a scale-up).

The chain is the published one (the controller's catalog resolved the aliases and followed it transitively),
minus what this request may not use. Picking is `scheduler.schedule` over the live endpoint records, and the
claim (inflight + 1) happens in the same step of the event loop as the choice.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from llmgw.core.snapshot import PublishedModel
from llmgw_router.decisions import breaker as brk
from llmgw_router.decisions.fairqueue import Band, band_of
from llmgw_router.decisions.scheduler import Decision, RequestInfo, schedule
from llmgw_router.fleet.metrics import RouterMetrics
from llmgw_router.fleet.ports import ControllerCallbacks
from llmgw_router.fleet.table import LiveEndpoint, RoutingTable
from llmgw_router.options import RouterOptions
from llmgw_router.routing.admission import DEFAULT_BAND, Admission
from llmgw_router.routing.peering import peer_chain
from llmgw_router.routing.prefix_routing import PrefixRouting
from llmgw_router.server.errors import ApiError

__all__ = ["Forwarding", "Picked", "Place", "fallback_chain", "place_of"]

log = logging.getLogger(__name__)

_LOAD_REQUEST_INTERVAL = 10.0  # seconds between two asks to load the same on-demand model


@dataclass(frozen=True, slots=True)
class Place:
    """Where a request stands in a queue: its project (the fair-share key), its band and its share."""

    project: str = ""
    band: Band = DEFAULT_BAND
    share: float = 1.0


def place_of(table: RoutingTable, project: str | None, canonical: str) -> Place:
    """The band is the asked-for model's class rank, then the project's priority; the share is the project's.
    A project the tenants do not name (a keys file without tenants) is still its own fair-share key."""
    if project is None:
        return Place(band=band_of(table.models[canonical].class_rank, 0))
    spec = table.snapshot.tenants.projects.get(project)
    priority, share = (spec.priority, spec.share) if spec is not None else (0, 1.0)
    return Place(project, band_of(table.models[canonical].class_rank, priority), share)


@dataclass(frozen=True, slots=True)
class Picked:
    endpoint: LiveEndpoint  # claimed: release it when the request is done with it
    served: str  # the model it serves: the one asked for or a fallback
    decision: Decision
    queued_s: float = 0.0  # time spent waiting in the admission line (0: there was room at once)


def fallback_chain(
    table: RoutingTable,
    canonical: str,
    kind: str,
    project: str | None,
    fits: Callable[[PublishedModel], bool],
) -> tuple[str, ...]:
    """The requested model, then its fallback chain as published, minus every model this request cannot use:
    one `project` may not use (a full allowed model must never hand its traffic to a model the project was
    not given), one without the capability, one whose context cannot hold the request (`fits`), a peer's it may
    not reach now (routing.peering). `project` is None when no tenants apply (auth disabled, or a snapshot
    without tenants)."""
    chain = [canonical]
    for fb in table.models[canonical].fallbacks:
        m = table.models.get(fb)
        if m is None or fb in chain or kind not in m.capabilities or not fits(m):
            continue
        if project is not None and not table.allowed(project, fb, fb):
            continue
        chain.append(fb)
    if table.peered:  # without the peers' models it may not reach now; the asked-for one refused saying why
        return peer_chain(table, canonical, tuple(chain), project)
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
        self.prefix = PrefixRouting()
        self._load_requested: dict[str, float] = {}
        # Places depend only on the snapshot: computed once per (project, model) and table.
        self._places: dict[tuple[str | None, str], Place] = {}
        self._places_table: RoutingTable | None = None

    def place(self, table: RoutingTable, project: str | None, canonical: str) -> Place:
        """`place_of`, memoised for the current table (the request path asks the same few questions)."""
        if table is not self._places_table or len(self._places) > 100_000:
            self._places, self._places_table = {}, table
        key = (project, canonical)
        found = self._places.get(key)
        if found is None:
            found = self._places[key] = place_of(table, project, canonical)
        return found

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
        # Set in place, not copied (dataclasses.replace cost more than the rest of this line's work): each
        # request builds its own RequestInfo, and the counter is read only by the schedule below.
        info.rr_counter = rr
        policy = table.policy_for(model)
        if info.prefix is not None:
            self.prefix.annotate(cands, endpoints, info.prefix, policy, info.project, now)
        decision = schedule(cands, policy, info, self.rng)
        if decision.endpoint is None:
            return None
        index = next(i for i, c in enumerate(cands) if c.id == decision.endpoint)
        chosen, ep = cands[index], endpoints[index]
        # A session's target, or a holder of the prompt's prefix, is forwarded even when full: the scheduler
        # bounds that queue (scheduler.py).
        unusable = chosen.full or (chosen.stale and not take_stale)
        if need_room and unusable and chosen.id != decision.session_target and not decision.prefix_holder:
            return None
        ok, ep.breaker = brk.allow(ep.breaker, now, self.options.breaker)
        if not ok:
            return None
        ep.inflight += 1
        if info.prefix is not None:
            self.prefix.placed(ep, info.prefix, policy, info.project, now)
        self.metrics.load.claimed(ep.id)
        self.metrics.count(self.metrics.decisions, (model, decision.winning_scorer))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("decision for %s: %s", model, decision.rationale())
        return ep, decision

    def release(self, ep: LiveEndpoint, model: str) -> None:
        ep.inflight -= 1
        self.metrics.load.released(ep.id)
        self.admission.notify(model)

    def failed(self, ep: LiveEndpoint, reason: str) -> None:
        ep.breaker = brk.on_failure(ep.breaker, self.clock(), self.options.breaker)
        self.metrics.load.answered(ep.id, ok=False)
        log.warning("endpoint %s (%s) failed: %s", ep.id, ep.spec.model, reason)

    def succeeded(self, ep: LiveEndpoint) -> None:
        ep.breaker = brk.on_success(ep.breaker)
        self.metrics.load.answered(ep.id, ok=True)

    def schedulable(self, table: RoutingTable, model: str, exclude: frozenset[str] = frozenset()) -> bool:
        """Has `model` an endpoint that is ready, not broken open, and not one this request failed on?"""
        now = self.clock()
        return any(
            ep.spec.state == "ready" and not ep.breaker.is_open(now) and ep.id not in exclude
            for ep in table.endpoints.get(model, ())
        )

    @staticmethod
    def starting(table: RoutingTable, model: str) -> bool:
        """Has `model` a replica on its way (a load or a scale-up): counted by the controller, or an endpoint
        published `starting`?"""
        published = table.models.get(model)
        if published is not None and published.starting > 0:
            return True
        return any(ep.spec.state == "starting" for ep in table.endpoints.get(model, ()))

    # ------------------------------------------------------------------ the walk down the chain

    async def pick(
        self,
        table: RoutingTable,
        canonical: str,
        chain: tuple[str, ...],
        info: RequestInfo,
        place: Place | None = None,
    ) -> Picked:
        """An endpoint of the first model in `chain` with room now and nobody waiting for it; else a place in
        the queue of the first that has endpoints at all; else in the queue of the first that is loading (on
        demand, or a replica starting); else 503."""
        place = place or Place()
        # `chain` holds only models the request may use, so a load is never asked for a model the project
        # was not given. `on_demand` is the catalog's: a `min 0, max 0` model is parked and never waited on.
        on_demand = [m for m in chain if table.models[m].on_demand and not self.schedulable(table, m)]
        for m in on_demand:
            self._ask_load(m)
        # Nobody passes a queue: a model with waiters is left to them (fair shares and bands decide there).
        free = [m for m in chain if not self.admission.queued(m)]
        for take_stale in (False, True):
            # First a model in the chain with room now; then one whose load is unknown (stale metrics) but
            # with slots free by our count.
            for m in free:
                got = self.claim(table, m, info, need_room=True, take_stale=take_stale)
                if got is not None:
                    self.admission.admitted(m, place.project, place.share)
                    return self._picked(canonical, m, got)
        for m in chain:  # then wait in line for the first that has endpoints at all
            if self.schedulable(table, m, info.exclude):
                return await self._queued_pick(table, canonical, m, info, place)
        for m in chain:  # then for the first one on its way
            if m in on_demand or self.starting(table, m):
                return await self._queued_pick(table, canonical, m, info, place)
        names = ", ".join(f"`{m}`" for m in chain)
        raise ApiError(
            503,
            f"No endpoint can serve {names} right now.",
            "model_unavailable",
            "server_error",
            headers={"Retry-After": "5"},
        )

    def _loading(self, table: RoutingTable, model: str) -> bool:
        """Is `model` being loaded: a replica starting, or on demand with none ready (a load was asked)?"""
        if self.starting(table, model):
            return True
        published = table.models.get(model)
        return published is not None and published.on_demand and not self.schedulable(table, model)

    def load_hold(self, table: RoutingTable, model: str) -> float:
        """How long a request waits for `model` to load: `--on-demand-wait` when given, else 1.5 x the measured
        load time + 5 s, else `router.admission.load_timeout`."""
        if self.options.on_demand_wait is not None:
            return self.options.on_demand_wait
        measured = table.models[model].load_seconds
        return table.load_timeout if measured is None else 1.5 * measured + 5.0

    async def _wait_in_line(
        self, table: RoutingTable, model: str, info: RequestInfo, place: Place
    ) -> tuple[LiveEndpoint, Decision]:
        cell: list[tuple[LiveEndpoint, Decision]] = []

        def has_room() -> bool:
            # The table of now, not of the request's start: a snapshot may have brought the replica.
            now = self._table()
            if now is None or model not in now.models:
                return False
            got = self.claim(now, model, info, need_room=True, take_stale=True)
            if got is not None:
                cell.append(got)
            return got is not None

        def expired() -> ApiError | None:
            now = self._table()
            return self._still_loading(model) if now is not None and self._loading(now, model) else None

        hold = table.admission_timeout
        if self._loading(table, model):
            ready = self.schedulable(table, model)  # a scale-up of a busy model: its replicas serve meanwhile
            hold = max(hold, self.load_hold(table, model)) if ready else self.load_hold(table, model)
        await self.admission.wait(
            model,
            has_room,
            hold,
            project=place.project,
            band=place.band,
            share=place.share,
            expired=expired,
        )
        return cell[0]

    async def _queued_pick(
        self, table: RoutingTable, canonical: str, model: str, info: RequestInfo, place: Place
    ) -> Picked:
        queued = time.monotonic()
        got = await self._wait_in_line(table, model, info, place)
        return self._picked(canonical, model, got, time.monotonic() - queued)

    def _picked(
        self, canonical: str, served: str, got: tuple[LiveEndpoint, Decision], queued_s: float = 0.0
    ) -> Picked:
        if served != canonical:
            self.metrics.fallbacks.labels(canonical, served).inc()
        return Picked(got[0], served, got[1], queued_s)

    def _ask_load(self, model: str) -> None:
        now = self.clock()
        if now - self._load_requested.get(model, -1e18) >= _LOAD_REQUEST_INTERVAL:
            self._load_requested[model] = now
            log.info("asking the controller to load on-demand model %s", model)
            self.controller.request_load(model)

    def _still_loading(self, model: str) -> ApiError:
        """503 model_loading; Retry-After is what is left of the measured load time, else the default."""
        retry = self.options.loading_retry_after
        table = self._table()
        measured = table.models[model].load_seconds if table is not None and model in table.models else None
        asked = self._load_requested.get(model)
        if measured is not None and asked is not None and (left := asked + measured - self.clock()) > 0:
            retry = max(1, math.ceil(left))
        busy = table is not None and self.schedulable(table, model)
        what = "is busy and its next replica is not ready yet" if busy else "has no replica ready yet"
        return ApiError(
            503,
            f"model is loading: `{model}` {what}; retry in {retry} s.",
            "model_loading",
            "server_error",
            headers={"Retry-After": str(retry)},
        )
