"""The fast evaluator: what a pool of `n` replicas of one profile does with an hour's demand, in closed form, so
the search can afford to ask it of every configuration. The replay (`plan --simulate`'s, the router's own
decisions in virtual time) then confirms the few the search proposes.

For one model in one period, with its replicas' engine model (llmgw.core.capacity.engine_model):

- each replica completes `mu = requests_per_s(prompt, completion)` per second with its slots full, so the pool's
  `n x slots` slots each serve a request in `slots / mu` seconds; the router's queue in front of them is an
  M/M/c queue, and Erlang's C formula gives the chance a request waits for a slot and the tail of that wait;
- a request's time to first token is its own prefill (its class's p90 or p99 prompt, beside the sequences the
  replica holds on average), plus the wait behind other prompts' exclusive prefills (the engine model's
  `exclusive` share: the replica does nothing else meanwhile; exponential tail), plus its wait for a slot;
- its time per output token is the gap at the replica's p99 concurrency (mean plus 2.33 standard deviations of
  a Poisson count, at most the slots), plus the exclusive prefills of the requests arriving at its replica while
  it decodes (their p99 count, spread over its tokens);
- availability is the share that does not wait past the admission timeout (a full queue is not modelled).

Every figure is an estimate of a model fitted to a bench (or assumed where nothing was measured); more replicas
never make one worse, which the search's dominance pruning relies on. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmgw.core.capacity.engine_model import EngineModel
from llmgw.core.suggest.demand import ClassDemand, Demand

__all__ = ["Estimate", "Need", "Row", "erlang_c", "estimate", "misses", "needed", "pool_rows"]

SATURATED = 0.999  # a pool busier than this never drains its queue: every latency figure is unbounded


@dataclass(frozen=True, slots=True)
class Estimate:
    """What one class of requests sees from a pool in one period; `inf` for a pool that cannot keep up."""

    ttft_p90_ms: float
    ttft_p99_ms: float
    tpot_p99_ms: float
    availability: float
    utilization: float

    def figure(self, objective: str) -> float:
        return float(getattr(self, objective))


def erlang_c(servers: int, offered: float) -> float:
    """The chance an arrival waits in an M/M/c queue with `servers` and `offered` erlangs (< servers)."""
    if offered <= 0:
        return 0.0
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered * blocking / (k + offered * blocking)
    return servers * blocking / (servers - offered * (1 - blocking))


def _wait_s(p_wait: float, drain_per_s: float, q: float) -> float:
    """The q-quantile of the wait for a slot: P(W > t) = p_wait * exp(-drain * t)."""
    if p_wait <= 1 - q or drain_per_s <= 0:
        return 0.0
    return math.log(p_wait / (1 - q)) / drain_per_s


def _tpot_p99(gap_ms: float, stall_ms: float, per_replica: float, completion: float) -> float:
    """A p99 request's time per output token: its gaps, plus the exclusive prefills of the requests that
    arrive at its replica while it decodes (a Poisson count; its p99 by the normal approximation)."""
    tokens = max(completion - 1, 1.0)
    arrivals = per_replica * tokens * gap_ms / 1000.0
    stalls = arrivals + 2.33 * math.sqrt(arrivals)
    return gap_ms + stalls * stall_ms / tokens


def estimate(
    engine: EngineModel, slots: int, replicas: int, demand: Demand, cls: ClassDemand, timeout_s: float
) -> Estimate:
    """One class's figures from `replicas` replicas of `slots` slots serving the model's whole demand."""
    mu = engine.requests_per_s(round(demand.prompt_mean), round(demand.completion_mean))
    per_replica = demand.rate_per_s / max(replicas, 1)
    rho = per_replica / mu if mu > 0 else math.inf
    if replicas < 1 or rho >= SATURATED:
        unbounded = math.inf
        return Estimate(unbounded, unbounded, unbounded, min(1.0, 1.0 / rho) if rho > 0 else 0.0, rho)
    servers = replicas * slots
    service_s = slots / mu
    p_wait = erlang_c(servers, demand.rate_per_s * service_s)
    drain = servers / service_s - demand.rate_per_s
    in_flight = max(1.0, rho * slots)
    mean_prefill = engine.prefill_ms(round(demand.prompt_mean), round(in_flight) - 1)
    held = min(0.95, per_replica * engine.exclusive * mean_prefill / 1000.0)
    behind = held / (1 - held) * engine.exclusive * mean_prefill

    def ttft(prompt: float, q: float) -> float:
        own = engine.prefill_ms(round(prompt), round(in_flight) - 1)
        return own + behind * math.log(1 / (1 - q)) + 1000.0 * _wait_s(p_wait, drain, q)

    busiest = min(float(slots), in_flight + 2.33 * math.sqrt(in_flight))
    gap = engine.itl(math.ceil(busiest))
    return Estimate(
        ttft(cls.prompt_p90, 0.9),
        ttft(cls.prompt_p99, 0.99),
        _tpot_p99(gap, engine.exclusive * mean_prefill, per_replica, cls.completion_mean),
        1.0 - p_wait * math.exp(-drain * timeout_s),
        rho,
    )


def misses(figures: Estimate, targets: Mapping[str, float]) -> list[str]:
    """Each objective the figures miss, in words (`ttft_p99_ms 1240 > 800`); a pool that cannot keep up misses
    even where nothing is declared."""
    if math.isinf(figures.ttft_p99_ms):
        return [f"utilization {figures.utilization:.2f}: the replicas cannot keep up"]
    out = []
    for objective, target in targets.items():
        value = figures.figure(objective)
        missed = value < target if objective == "availability" else value > target
        if missed:
            out.append(f"{objective} {value:.4g} {'<' if objective == 'availability' else '>'} {target:g}")
    return out


@dataclass(frozen=True, slots=True)
class Need:
    """The fewest replicas that meet every class's objectives in one period; `replicas` None: not even the
    most searched do, and `short` says what the largest pool still misses."""

    period: int
    replicas: int | None
    short: tuple[str, ...] = ()


Row = Mapping[str, Estimate]  # by project: what its class sees from n replicas


def pool_rows(
    engine: EngineModel, slots: int, demand: Demand, most: int, timeout_s: float
) -> tuple[Row, ...]:
    """Every class's figures from 1 to `most` replicas (index n-1)."""
    return tuple(
        {c.project: estimate(engine, slots, n, demand, c, timeout_s) for c in demand.classes}
        for n in range(1, most + 1)
    )


def needed(period: int, rows: Sequence[Row], targets: Mapping[str, Mapping[str, float]]) -> Need:
    """The fewest replicas whose row meets `targets` (by project) for every class."""
    missed: list[str] = []
    for n, row in enumerate(rows, 1):
        missed = [f"{p}: {m}" for p, fig in row.items() for m in misses(fig, targets.get(p, {}))]
        if not missed:
            return Need(period, n)
    return Need(period, None, tuple(missed))
