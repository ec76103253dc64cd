"""Choose an endpoint for one request: filter -> score -> pick. Pure: candidates and a policy in, a Decision out.

A strategy is only a RoutingPolicy's scorer weights and picker; chat, batch and long-context traffic run the
same code with different weights. Every Decision carries its rationale (each scorer's value per endpoint and
how many endpoints each filter dropped), because tuning weights without it is guesswork.

Stale endpoints (not scraped lately) count as saturated: they are dropped while a fresh one remains and score
as full otherwise. Unknown readings (never scraped yet, KV not published) score neutral, never as idle.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmgw.core.config.models import RoutingPolicySpec
from llmgw_router.decisions.prefix import PrefixKey
from llmgw_router.decisions.prefix_spill import SPILL, prefix_scores, spill_key

__all__ = [
    "KV_PENALTY",
    "SCORERS",
    "Candidate",
    "Decision",
    "EndpointScore",
    "RequestInfo",
    "bounded_load_target",
    "schedule",
]

SCORERS = ("queue", "kv", "inflight", "load", "weight", "session", "prefix")
# Above the KV ceiling an endpoint is about to preempt or refuse sequences: worse than any other reading.
KV_PENALTY = -10.0
_NEUTRAL = 0.5


# Not frozen: built on every request, and a frozen dataclass costs about three times as much to construct
# (object.__setattr__ per field). Nothing mutates these after construction.
@dataclass(slots=True)
class Candidate:
    id: str
    inflight: int = 0  # requests this router has in flight to it
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    slots: int | None = None
    weight: float = 1.0
    ready: bool = True
    breaker_open: bool = False
    stale: bool = False
    # The share of the prompt's leading blocks this endpoint holds, and who said so: "precise" (its engine's
    # KV events), "approx" (what this router sent it) or None (no prefix scoring for this request).
    prefix: float = 0.0
    prefix_source: str | None = None
    # The last of the prompt's leading blocks its engine said it stored (a BlockStored hash): what "precise"
    # rests on, named in the rationale. None: it holds none, or the source is approximate.
    prefix_hash: int | None = None

    @property
    def full(self) -> bool:
        return self.slots is not None and self.inflight >= self.slots


@dataclass(slots=True)
class RequestInfo:
    session_key: str | None = None
    exclude: frozenset[str] = frozenset()  # endpoints this request already failed on
    rr_counter: int = 0  # the caller's round-robin position for this model
    prefix: PrefixKey | None = None  # the prompt's blocks, when the policy weighs prefixes
    project: str = ""  # whose prompt: the approximate index and the cache salt are per project


@dataclass(slots=True)
class EndpointScore:
    id: str
    scores: dict[str, float]
    total: float


@dataclass(slots=True)
class Decision:
    endpoint: str | None
    picker: str
    winning_scorer: str
    scores: tuple[EndpointScore, ...] = ()
    dropped: dict[str, int] = field(default_factory=dict)
    session_target: str | None = None
    prefix_sources: tuple[tuple[str, str], ...] = ()  # (endpoint, "precise" | "approx") when prefix-scored
    # The endpoint holds the prompt's prefix within the prefix load bound: forwarded even when full, as a
    # session's target is (the engine queues it briefly instead of another replica prefilling it all).
    prefix_holder: bool = False
    prefix_hashes: tuple[tuple[str, int], ...] = ()  # (endpoint, the last block hash it holds) when precise

    def rationale(self) -> str:
        """One line for a debug header or a log: the choice, what decided it, scores, filters."""
        parts = [f"endpoint={self.endpoint}", f"picker={self.picker}", f"by={self.winning_scorer}"]
        if self.session_target is not None:
            parts.append(f"session_target={self.session_target}")
        if self.prefix_sources:
            parts.append("prefix_by=" + ",".join(f"{ep}:{src}" for ep, src in self.prefix_sources))
        if self.prefix_hashes:
            parts.append("prefix_held=" + ",".join(f"{ep}:{h}" for ep, h in self.prefix_hashes))
        for s in self.scores:
            inner = ",".join(f"{k}:{v:.3g}" for k, v in s.scores.items())
            parts.append(f"{s.id}={s.total:.3g}[{inner}]")
        parts.extend(f"dropped_{k}={v}" for k, v in self.dropped.items() if v)
        return "; ".join(parts)


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def bounded_load_target(key: str, loads: Sequence[tuple[str, int]], load_bound: float) -> str | None:
    """Consistent hashing with bounded load: the first endpoint in the key's rendezvous order whose load,
    with this request added, stays within ceil(load_bound * mean) (the mean also counting this request).

    Rendezvous (highest-random-weight) hashing moves only the keys of an endpoint that came or went. Some
    endpoint always has room: the least loaded one is at most floor(total/n) < ceil(bound*(total+1)/n).
    """
    if not loads:
        return None
    total = sum(load for _, load in loads) + 1
    ceiling = math.ceil(load_bound * total / len(loads))
    order = sorted(loads, key=lambda item: _hash64(f"{key}\x00{item[0]}"), reverse=True)
    for endpoint, load in order:
        if load + 1 <= ceiling:
            return endpoint
    return order[0][0]  # unreachable by the argument above; kept so the function is total


def _filter(cands: Sequence[Candidate], info: RequestInfo) -> tuple[list[Candidate], dict[str, int]]:
    """Drop what cannot serve (excluded, not ready, breaker open) and narrow to fresh endpoints. The full
    filter comes later, in `schedule`, because a session's target may stay eligible when full."""
    dropped = {"excluded": 0, "not_ready": 0, "breaker_open": 0, "stale": 0, "full": 0}
    keep: list[Candidate] = []
    for c in cands:
        if c.id in info.exclude:
            dropped["excluded"] += 1
        elif not c.ready:
            dropped["not_ready"] += 1
        elif c.breaker_open:
            dropped["breaker_open"] += 1
        else:
            keep.append(c)
    # Saturation filters only narrow: a stale or full endpoint is still better than refusing outright.
    fresh = [c for c in keep if not c.stale]
    if fresh:
        dropped["stale"] = len(keep) - len(fresh)
        keep = fresh
    return keep, dropped


def _session_target(key: str, usable: Sequence[Candidate], load_bound: float) -> str | None:
    """Where a session goes: the first endpoint in the key's rendezvous order that is not overloaded.

    Overloaded: in-flight requests (this one included) past load_bound times the mean, as in bounded-load
    consistent hashing (`bounded_load_target`), and, for an endpoint with declared slots, also past
    load_bound times its slots. The slot bound matters at small counts, where a mean of 2 in flight lets
    1.25x allow only 3, which would move sessions off a replica with free slots. A full target keeps its
    session (the engine queues it briefly): waiting for a slot on the replica holding the conversation's
    prefix costs less than prefilling the history elsewhere. None when every endpoint is past its bound:
    the request then waits like any other. benchmarks/scheduling.py measured why (docs/routing.md).
    """
    total = sum(c.inflight for c in usable) + 1
    mean_ceiling = math.ceil(load_bound * total / len(usable))
    for c in sorted(usable, key=lambda c: _hash64(f"{key}\x00{c.id}"), reverse=True):
        ceiling = mean_ceiling if c.slots is None else max(mean_ceiling, math.ceil(c.slots * load_bound))
        if c.inflight + 1 <= ceiling:
            return c.id
    return None


def _over_bound(usable: Sequence[Candidate], load_bound: float) -> frozenset[str]:
    """The endpoints too loaded to be drawn by their prefix: in-flight (this request added) past load_bound
    times the mean, or past load_bound times their slots when that is larger (as `_session_target`)."""
    total = sum([c.inflight for c in usable]) + 1  # a list, not a generator resumed per endpoint
    mean_ceiling = math.ceil(load_bound * total / len(usable))
    over = set()
    for c in usable:
        ceiling = mean_ceiling if c.slots is None else max(mean_ceiling, math.ceil(c.slots * load_bound))
        if c.inflight + 1 > ceiling:
            over.add(c.id)
    return frozenset(over)


def _prefix_scores(
    kept: Sequence[Candidate], over: frozenset[str], policy: RoutingPolicySpec, info: RequestInfo
) -> tuple[dict[str, float], str | None]:
    """The prefix term per kept candidate, and the replica a hot prefix spills to (prefix_spill.py)."""
    p = info.prefix
    key = "" if p is None else spill_key(p.head) if p.head else f"{p.approx[0]:x}" if p.approx else ""
    return prefix_scores(kept, over, key, policy.prefix.min_share)


def _scores(
    c: Candidate, policy: RoutingPolicySpec, max_weight: float, target: str | None, prefix: dict[str, float]
) -> dict[str, float]:
    if c.stale:  # saturated by definition: nothing we read from it can be trusted
        queue = kv = load = 0.0
    else:
        queue = _NEUTRAL if c.waiting is None else 1.0 / (1.0 + c.waiting)
        if c.kv_usage is None:
            kv = _NEUTRAL
        else:
            kv = KV_PENALTY if c.kv_usage > policy.kv_ceiling else 1.0 - c.kv_usage
        if c.running is None:
            load = _NEUTRAL
        elif c.slots:
            load = 1.0 - min(1.0, c.running / c.slots)
        else:
            load = 1.0 / (1.0 + c.running)
    return {
        "queue": queue,
        "kv": kv,
        "inflight": 1.0 / (1.0 + c.inflight),
        "load": load,
        "weight": c.weight / max_weight if max_weight > 0 else 1.0,
        "session": 1.0 if c.id == target else 0.0,
        "prefix": prefix.get(c.id, 0.0),
    }


def _weighted(weights: dict[str, float], raw: dict[str, float]) -> float:
    """The scores' weighted sum, added in the scores' order from 0.0: bit for bit what sum() over a generator
    gives on Python 3.11 (whose float sum is plain addition), without resuming a generator per term (seven
    terms per endpoint, on every request)."""
    total = 0.0
    for name, value in raw.items():
        total += weights[name] * value
    return total


def _weights(policy: RoutingPolicySpec, has_session: bool) -> dict[str, float]:
    w = policy.weights
    weights = {
        "queue": w.queue,
        "kv": w.kv,
        "inflight": w.inflight,
        "load": w.load,
        "weight": w.weight,
        "session": w.session if has_session else 0.0,
        "prefix": w.prefix,
    }
    if not any(weights.values()):
        weights["inflight"] = 1.0  # a policy with no weights still spreads load
    return weights


def _pick(
    scored: list[EndpointScore],
    policy: RoutingPolicySpec,
    info: RequestInfo,
    rng: random.Random,
    target: str | None,
) -> EndpointScore:
    n = len(scored)
    if n == 1:
        return scored[0]
    picker = policy.picker
    if picker == "max_score":
        best = max(s.total for s in scored)
        return rng.choice([s for s in scored if s.total == best])
    if picker == "p2c":
        first = next((s for s in scored if s.id == target), None)
        if first is None:
            a, b = _two_of(scored, rng)
        else:
            a, b = first, rng.choice([s for s in scored if s is not first])
        return a if a.total >= b.total else b
    if picker == "softmax":
        top = max(s.total for s in scored)
        weights = [math.exp((s.total - top) / policy.softmax_temperature) for s in scored]
        return rng.choices(scored, weights=weights, k=1)[0]
    if picker == "round_robin":
        ordered = sorted(scored, key=lambda s: s.id)
        return ordered[info.rr_counter % n]
    return rng.choice(scored)  # random


def _two_of(scored: list[EndpointScore], rng: random.Random) -> tuple[EndpointScore, EndpointScore]:
    """`rng.sample(scored, 2)`, the same two for the same generator's state: for a list of up to 21, sample
    draws an index below n, then one below n - 1 standing for the last item where it hits the first pick.
    Drawn here with `choice` over ranges (the same draws), without sample's checks and copies (the abc
    check that the population is a Sequence cost more than the draws)."""
    n = len(scored)
    if n > 21:  # sample then keeps a set of what it drew instead: other draws
        a, b = rng.sample(scored, 2)
        return a, b
    i = rng.choice(range(n))
    j = rng.choice(range(n - 1))
    return scored[i], scored[n - 1 if j == i else j]


def _winner_reason(
    chosen: EndpointScore, scored: list[EndpointScore], weights: dict[str, float], picker: str
) -> str:
    if len(scored) == 1:
        return "only"
    others = [s.scores for s in scored if s is not chosen]
    best_name, best_gain = picker, 0.0
    for name, weight in weights.items():
        if not weight:
            continue
        summed = 0.0  # in order, as _weighted adds (no generator resumed per endpoint)
        for other in others:
            summed += other[name]
        gain = weight * (chosen.scores[name] - summed / len(others))
        if gain > best_gain:
            best_name, best_gain = name, gain
    return best_name


def schedule(
    candidates: Sequence[Candidate], policy: RoutingPolicySpec, info: RequestInfo, rng: random.Random
) -> Decision:
    """Filter, score and pick. `Decision.endpoint` is None when every candidate was filtered out."""
    usable, dropped = _filter(candidates, info)
    if not usable:
        return Decision(None, policy.picker, "none", (), dropped)
    has_session = info.session_key is not None and policy.weights.session > 0
    target = (
        _session_target(info.session_key or "", usable, policy.session.load_bound) if has_session else None
    )
    # The full filter only narrows, and spares a session's target: the caller forwards a session to its
    # target even when full, and the engine queues it briefly (within the bounds above). It spares the
    # prompt's prefix holders within the prefix load bound too, for the same reason: a slot's wait there costs
    # less than prefilling the whole prompt on a replica with a free slot.
    over = _over_bound(usable, policy.prefix.load_bound) if policy.weights.prefix > 0 else frozenset()
    holders = {c.id for c in usable if c.prefix > 0 and c.prefix >= policy.prefix.min_share} - over
    kept = [c for c in usable if not c.full or c.id == target or c.id in holders]
    if kept:
        dropped["full"] = len(usable) - len(kept)
    else:
        kept = usable
    weights = _weights(policy, has_session)
    max_weight = max([c.weight for c in kept])  # lists here: no generator resumed per endpoint
    prefix, spill = _prefix_scores(kept, over, policy, info) if weights["prefix"] else ({}, None)
    scored = []
    for c in kept:
        raw = _scores(c, policy, max_weight, target, prefix)
        scored.append(EndpointScore(c.id, raw, _weighted(weights, raw)))
    chosen = _pick(scored, policy, info, rng, target)
    reason = _winner_reason(chosen, scored, weights, policy.picker)
    sources = tuple(
        [(c.id, SPILL if c.id == spill else c.prefix_source) for c in kept if c.prefix_source is not None]
    )
    held = tuple([(c.id, c.prefix_hash) for c in kept if c.prefix_hash is not None])
    return Decision(
        chosen.id, policy.picker, reason, tuple(scored), dropped, target, sources, chosen.id in holders, held
    )
