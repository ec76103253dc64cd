"""A trace replayed against a fleet in virtual time: the router's own pure decisions, engines as models.

Discrete events on a clock the replay advances itself (no asyncio, no sleeping): arrivals from the trace in
order, and each request's end. Every arrival takes the router's path for a request with no fallback:

- a model with no replica in the fleet: refused `unavailable` (the router's 503);
- nobody waiting for the model: `scheduler.schedule` over its replicas' candidates (in flight, slots, weight,
  the request's session key), and a chosen endpoint that is full and not the session's target means no room;
- no room: a place in the model's `fairqueue.FairQueue` (bands, fair shares, FIFO), unless the model's queue
  or the whole queue is full (refused `queue_full`); a place held past the admission timeout is refused
  `queue_timeout`;
- each end frees a slot and the queue's first entry schedules again, then the next, until one finds no room
  (admission.py's wake-up chain, without the asyncio).

Each replica's engine model (`llmgw.core.capacity.engine_model`) runs as an `llmgw.core.capacity.engine_run.EngineRun`: a request's
first token and end come from the sequences on its replica as they change (a prefill that arrives later stalls
the ones decoding, on an engine whose prefills hold the replica). The replica's readings are exact (the real router reads them from a scrape a moment old), and
a higher band never displaces a waiting lower one from a full queue: the replay refuses the newcomer.

Lives in the router, beside the decisions it runs: `llmgw.core` may not import the router, and the replay must
run the router's code, not a copy of it. It is held to the pure modules' contract (pyproject.toml).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmgw.core.capacity.bench import percentile
from llmgw.core.capacity.engine_model import EngineModel
from llmgw.core.capacity.engine_run import EngineRun
from llmgw.core.config.models import RoutingPolicySpec
from llmgw.core.traffic.trace import TracedRequest
from llmgw_router.decisions.fairqueue import Band, Entry, FairQueue, band_of
from llmgw_router.decisions.scheduler import Candidate, RequestInfo, schedule

__all__ = [
    "REFUSALS",
    "ModelOutcome",
    "Outcome",
    "Replay",
    "SimFleet",
    "SimReplica",
    "replay",
]

REFUSALS = ("queue_full", "queue_timeout", "unavailable")
_END, _TIMEOUT = 0, 1  # at one instant, ends go first: a slot freed then is there for the timeout's check


@dataclass(frozen=True, slots=True)
class SimReplica:
    id: str
    model: str
    engine: EngineModel
    slots: int | None  # what the router is told (the profile's slots); None: it never counts the replica full
    weight: float = 1.0


@dataclass(frozen=True)
class SimFleet:
    """A fleet as the replay sees it: replicas, each model's routing policy, and the admission settings."""

    replicas: tuple[SimReplica, ...]
    policies: Mapping[str, RoutingPolicySpec] = field(default_factory=dict)  # absent: the default policy
    queue_size: int = 256
    model_queue_size: int = 128
    queue_timeout_s: float = 30.0
    class_ranks: Mapping[str, int] = field(default_factory=dict)  # model -> its class rank (absent: unranked)
    projects: Mapping[str, tuple[int, float]] = field(default_factory=dict)  # project -> (priority, share)


@dataclass(slots=True)
class Outcome:
    """What became of one request: served (with its TTFT as the client saw it) or refused, once."""

    index: int
    model: str
    replica: str | None = None
    ttft_ms: float | None = None
    waited_ms: float = 0.0
    refused: str | None = None
    tpot_ms: float | None = None  # time per output token after the first (None: one token, or not served)


@dataclass(frozen=True, slots=True)
class ModelOutcome:
    model: str
    requests: int
    served: int
    refused: Mapping[str, int]
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    utilization: float | None  # busy slot-seconds over capacity-seconds of its replicas; None: no replica

    @property
    def refused_total(self) -> int:
        return sum(self.refused.values())


@dataclass(frozen=True)
class Replay:
    outcomes: tuple[Outcome, ...]
    models: Mapping[str, ModelOutcome]
    busy_by_bucket: tuple[float, ...]  # slot-seconds busy across the fleet per `bucket_s`
    capacity_slots: int  # the fleet's capacity in concurrent sequences
    bucket_s: float


@dataclass(slots=True)
class _Live:
    spec: SimReplica
    candidate: Candidate  # kept and updated in place: building a model's candidates per request costs more
    run: EngineRun
    busy_ms: float = 0.0
    version: int = 0  # of its next event in the heap: an older one is stale
    started: dict[int, float] = field(default_factory=dict)  # request index -> when it started, in s

    @property
    def inflight(self) -> int:
        return self.candidate.inflight

    def add(self, n: int) -> None:
        c = self.candidate
        c.inflight += n
        c.running = float(c.inflight)


class _Sim:
    def __init__(
        self, fleet: SimFleet, requests: Sequence[TracedRequest], seed: int, bucket_s: float, horizon: float
    ) -> None:
        self.fleet = fleet
        self.requests = requests
        self.rng = random.Random(seed)
        self.default_policy = RoutingPolicySpec()
        self.by_model: dict[str, list[_Live]] = {}
        self.candidates: dict[str, list[Candidate]] = {}
        for r in fleet.replicas:
            cand = Candidate(r.id, running=0.0, waiting=0.0, slots=r.slots, weight=r.weight)
            self.by_model.setdefault(r.model, []).append(_Live(r, cand, EngineRun(r.engine)))
            self.candidates.setdefault(r.model, []).append(cand)
        self.index = {m: {c.id: i for i, c in enumerate(cs)} for m, cs in self.candidates.items()}
        self.queues: dict[str, FairQueue[int]] = {}
        self.depth = 0
        self.rr: dict[str, int] = {}
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.outcomes = [Outcome(i, r.model) for i, r in enumerate(requests)]
        self.bucket_s = bucket_s
        self.horizon = horizon
        self.busy = [0.0] * (int(horizon / bucket_s) + 2)

    def push(self, at: float, kind: int, what: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, kind, self.seq, what))

    def place(self, request: TracedRequest) -> tuple[Band, float]:
        priority, share = self.fleet.projects.get(request.project, (0, 1.0))
        return band_of(self.fleet.class_ranks.get(request.model), priority), share

    def claim(self, index: int, now: float) -> bool:
        """Schedule request `index` among its model's replicas; start it when the choice has room."""
        request = self.requests[index]
        live = self.by_model[request.model]
        rr = self.rr.get(request.model, 0)
        self.rr[request.model] = rr + 1
        cands = self.candidates[request.model]
        policy = self.fleet.policies.get(request.model, self.default_policy)
        decision = schedule(cands, policy, RequestInfo(request.prefix, rr_counter=rr), self.rng)
        if decision.endpoint is None:
            return False
        at = self.index[request.model][decision.endpoint]
        if cands[at].full and decision.endpoint != decision.session_target and not decision.prefix_holder:
            return False
        self.start(index, live[at], now)
        return True

    def start(self, index: int, lv: _Live, now: float) -> None:
        request = self.requests[index]
        lv.add(1)
        out = self.outcomes[index]
        out.replica = lv.spec.id
        out.waited_ms = (now - request.t) * 1000.0
        lv.started[index] = now
        lv.run.add(now * 1000.0, index, request.prompt_tokens, request.completion_tokens)
        self.drain(lv)

    def drain(self, lv: _Live) -> None:
        """Act on what the replica's run did (first tokens, ends), then put its next event in the heap."""
        while events := lv.run.take():
            for event in events:
                if event.kind == "first":
                    self.outcomes[event.key].ttft_ms = event.at_ms - self.requests[event.key].t * 1000.0
                else:
                    self.finish(lv, event.key, event.at_ms / 1000.0)
        lv.version += 1
        at = lv.run.next_ms()
        if at is not None:
            self.push(at / 1000.0, _END, (lv, lv.version))

    def finish(self, lv: _Live, index: int, now: float) -> None:
        begun = lv.started.pop(index)
        out, request = self.outcomes[index], self.requests[index]
        if out.ttft_ms is not None and request.completion_tokens > 1:
            decode_ms = now * 1000.0 - (request.t * 1000.0 + out.ttft_ms)
            out.tpot_ms = decode_ms / (request.completion_tokens - 1)
        # Utilization is over the trace's span: a backlog served after its end counts up to the end only.
        lv.busy_ms += max(0.0, min(now, self.horizon) - begun) * 1000.0
        self.account(begun, now - begun)
        self.end(lv, now)

    def account(self, start: float, seconds: float) -> None:
        """Spread one request's busy time over the buckets it spans."""
        end, b = start + seconds, int(start / self.bucket_s)
        while start < end and b < len(self.busy):
            edge = min(end, (b + 1) * self.bucket_s)
            self.busy[b] += edge - start
            start, b = edge, b + 1

    def arrive(self, index: int, now: float) -> None:
        request = self.requests[index]
        if not self.by_model.get(request.model):
            self.outcomes[index].refused = "unavailable"
            return
        queue = self.queues.setdefault(request.model, FairQueue())
        band, share = self.place(request)
        if not queue and self.claim(index, now):
            queue.charge(request.project, share)
            return
        if len(queue) >= self.fleet.model_queue_size or self.depth >= self.fleet.queue_size:
            self.outcomes[index].refused = "queue_full"
            return
        entry = queue.push(index, request.project, band, share)
        self.depth += 1
        self.push(now + self.fleet.queue_timeout_s, _TIMEOUT, entry)

    def end(self, lv: _Live, now: float) -> None:
        lv.add(-1)
        queue = self.queues.get(lv.spec.model)
        while queue:
            entry = queue.first()
            if entry is None or not self.claim(entry.item, now):
                break
            queue.served(entry)
            self.depth -= 1

    def expire(self, entry: Entry[int]) -> None:
        out = self.outcomes[entry.item]
        if out.replica is not None:
            return  # served before its deadline
        self.queues[out.model].remove(entry)
        self.depth -= 1
        out.refused = "queue_timeout"

    def run(self) -> None:
        events = self.events
        for index, request in enumerate(self.requests):
            while events and events[0][0] <= request.t:
                self.step()
            self.arrive(index, request.t)
        while events:
            self.step()

    def step(self) -> None:
        at, kind, _, what = heapq.heappop(self.events)
        if kind == _END:
            assert isinstance(what, tuple)
            lv, version = what
            if version == lv.version:
                lv.run.advance(at * 1000.0)
                self.drain(lv)
        else:
            assert isinstance(what, Entry)
            self.expire(what)


def _summaries(sim: _Sim, horizon: float) -> dict[str, ModelOutcome]:
    per: dict[str, list[Outcome]] = {}
    for out in sim.outcomes:
        per.setdefault(out.model, []).append(out)
    for model in sim.by_model:
        per.setdefault(model, [])
    models: dict[str, ModelOutcome] = {}
    for model, outs in sorted(per.items()):
        ttfts = [o.ttft_ms for o in outs if o.ttft_ms is not None]
        refused = {reason: sum(1 for o in outs if o.refused == reason) for reason in REFUSALS}
        live = sim.by_model.get(model, [])
        capacity_ms = sum(lv.spec.engine.capacity for lv in live) * horizon * 1000.0
        util = sum(lv.busy_ms for lv in live) / capacity_ms if live and capacity_ms > 0 else None
        models[model] = ModelOutcome(
            model, len(outs), len(ttfts), refused, percentile(ttfts, 0.5), percentile(ttfts, 0.99), util
        )
    return models


def replay(
    fleet: SimFleet,
    requests: Sequence[TracedRequest],
    *,
    seed: int = 0,
    duration_s: float | None = None,
    bucket_s: float = 60.0,
) -> Replay:
    """Replay `requests` (in arrival order) against `fleet`. Utilization is over `duration_s` (default: up to
    the last arrival, at least one second); `bucket_s` sizes the busy-time histogram."""
    last = requests[-1].t if requests else 0.0
    horizon = max(duration_s if duration_s else last, 1.0)
    sim = _Sim(fleet, requests, seed, bucket_s, horizon)
    sim.run()
    capacity = sum(r.engine.capacity for r in fleet.replicas)
    return Replay(tuple(sim.outcomes), _summaries(sim, horizon), tuple(sim.busy), capacity, bucket_s)
