"""Tenant limits and the admission decision. Pure: no I/O, no clock — values in, a value out.

The tenant chain is Organization > Team > Project. Every level may set rpm, tpm, concurrency and a budget per
period; a level's limit is one pool shared by everything beneath it, so a request is charged to every level
of its chain and is refused when any level has run out. `decide` names the level and limit that refused and
says when to retry, with the x-ratelimit-* header values OpenAI's clients already understand.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from llmgw.core.config import models as config
from llmgw.core.words import parse_duration

__all__ = [
    "MICROS",
    "MINUTE",
    "RATE_HEADER_METRICS",
    "Allowed",
    "Budget",
    "Decision",
    "Estimate",
    "Level",
    "LevelLimits",
    "LevelState",
    "LimitRefused",
    "Meter",
    "Metric",
    "QuotaScope",
    "RateMetric",
    "Resources",
    "Tenant",
    "decide",
    "format_reset",
    "level_limits",
    "limit_key",
    "need",
    "put_rate_headers",
    "quota_scope",
    "rate_headers",
    "request_cost",
    "to_micros",
    "window_bounds",
    "windowed_limits",
]

# person: one person across every key and project; member: one person's share of a scope (`per_member`), named
# `PERSON@KIND/SCOPE` (llmgw.core.tenancy.people.person_chain).
Level = Literal["organization", "team", "project", "member", "person"]
Metric = Literal["requests", "tokens", "concurrency", "budget"]
METRICS: tuple[Metric, ...] = ("concurrency", "requests", "tokens", "budget")
RateMetric = Literal["requests", "tokens"]
RATE_HEADER_METRICS: tuple[RateMetric, ...] = ("requests", "tokens")  # the x-ratelimit-* headers OpenAI sends
MINUTE = 60.0
MICROS = 1_000_000  # budgets are counted in millionths of the currency unit, so counters stay integers


@dataclass(frozen=True, slots=True)
class Resources:
    """GPUs, CPU cores and memory (bytes) of one class; None: not said (no guarantee or no limit of it)."""

    gpus: int | None = None
    cpu_cores: int | None = None
    memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class QuotaScope:
    """A tenant's quota a model counts against, per class (a GPU class, or `cpu`): at most `gpus[class]` GPUs
    (its `gpu_quota` and capacity GPU limits), at most `limits[class]` cores and memory, and `guaranteed[class]`
    kept for it whatever else wants room (docs/placement.md, Quotas with guarantees)."""

    name: str  # "Team ml", "Organization acme", "Project chat"
    gpus: Mapping[str, int]
    limits: Mapping[str, Resources] = field(default_factory=dict)
    guaranteed: Mapping[str, Resources] = field(default_factory=dict)


def _resources(amounts: config.Amounts) -> Resources:
    memory = None if amounts.memory_gb is None else int(amounts.memory_gb * 1024**3)
    return Resources(amounts.gpus, amounts.cpu_cores, memory)


def quota_scope(
    name: str, gpu_quota: Mapping[str, int], capacity: Mapping[str, config.ClassCapacity]
) -> QuotaScope:
    """The scope a tenant document declares: `gpu_quota` and `capacity` merged (validate refuses a class's
    GPU limit said in both)."""
    gpus = dict(gpu_quota)
    limits: dict[str, Resources] = {}
    guaranteed: dict[str, Resources] = {}
    for cls, declared in capacity.items():
        if declared.limit.gpus is not None:
            gpus[cls] = declared.limit.gpus
        limit, given = _resources(declared.limit), _resources(declared.guaranteed)
        if limit != Resources():
            limits[cls] = limit
        if given != Resources():
            guaranteed[cls] = given
    return QuotaScope(name, gpus, limits, guaranteed)


@dataclass(frozen=True)
class Budget:
    amount: float  # money per period, in the currency of the model prices
    period_seconds: float


@dataclass(frozen=True)
class LevelLimits:
    """None means "no limit at this level" (not zero: zero refuses everything)."""

    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None
    budget: Budget | None = None


def level_limits(declared: config.Limits) -> LevelLimits:
    """The limits a tenant document declares (`spec.limits` of an Organization, Team or Project)."""
    budget = declared.budget
    return LevelLimits(
        rpm=declared.rpm,
        tpm=declared.tpm,
        concurrency=declared.concurrency,
        budget=Budget(budget.amount, parse_duration(budget.period)) if budget is not None else None,
    )


@dataclass(frozen=True)
class Tenant:
    level: Level
    name: str
    limits: LevelLimits = field(default_factory=LevelLimits)

    @property
    def key(self) -> str:
        return f"{self.level}:{self.name}"


# Not frozen: built on every request, and a frozen dataclass costs about three times as much to construct
# (object.__setattr__ per field). Nothing mutates these after construction.
@dataclass(slots=True)
class Estimate:
    """What a request is expected to cost before it runs (prompt estimate + max output tokens)."""

    tokens: int
    cost: float = 0.0

    @property
    def cost_micros(self) -> int:
        return to_micros(self.cost)


@dataclass(slots=True)
class Meter:
    """One limit of one level as the deciding router sees it now.

    `available` is what this router may spend right now (its share); `remaining` is its best knowledge of what
    is left for everyone (for headers); `reset_at` is when the window ends (None: not windowed).
    """

    limit: float
    available: float
    reset_at: float | None
    remaining: float | None = None


@dataclass(slots=True)
class LevelState:
    tenant: Tenant
    meters: dict[Metric, Meter]


@dataclass(slots=True)
class Allowed:
    headers: dict[str, str]


@dataclass(slots=True)
class LimitRefused:
    level: Level
    tenant: str
    metric: Metric
    limit: float
    retry_after: int  # whole seconds, at least 1
    message: str
    headers: dict[str, str]
    never_fits: bool = False  # the request alone is larger than the limit: retrying will not help


Decision = Allowed | LimitRefused


def window_bounds(now: float, length: float) -> tuple[float, float]:
    """The fixed window holding `now`: windows are aligned to the epoch so every router agrees on them."""
    start = math.floor(now / length) * length
    return start, start + length


def to_micros(amount: float) -> int:
    scaled = amount * MICROS
    whole = int(scaled)
    if whole == scaled:  # a whole number of micro-units (a free model: 0) needs no rounding, which is dear
        return whole
    return math.ceil(round(scaled, 6))


def request_cost(
    tokens_in: int, tokens_out: int, input_per_million: float, output_per_million: float
) -> float:
    return (tokens_in * input_per_million + tokens_out * output_per_million) / 1_000_000


def limit_key(tenant: Tenant, metric: Metric) -> str:
    """The store's name for one pooled limit (a row per window in limit_counters)."""
    return f"{tenant.key}:{metric}"


def windowed_limits(tenant: Tenant) -> list[tuple[Metric, int, float]]:
    """(metric, limit in units, window length) for every counted limit the tenant sets."""
    out: list[tuple[Metric, int, float]] = []
    lim = tenant.limits
    if lim.rpm is not None:
        out.append(("requests", lim.rpm, MINUTE))
    if lim.tpm is not None:
        out.append(("tokens", lim.tpm, MINUTE))
    if lim.budget is not None:
        out.append(("budget", to_micros(lim.budget.amount), lim.budget.period_seconds))
    return out


def need(metric: Metric, estimate: Estimate) -> float:
    if metric in ("requests", "concurrency"):
        return 1
    if metric == "tokens":
        return estimate.tokens
    return estimate.cost_micros


def format_reset(seconds: float) -> str:
    """OpenAI's spelling of a reset time: 1s, 6m0s, 1h2m3s, 20ms."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    total = math.ceil(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def _tightest(states: Sequence[LevelState], metric: Metric) -> Meter | None:
    best: Meter | None = None
    best_left = 0.0
    for state in states:
        meter = state.meters.get(metric)
        if meter is None:
            continue
        left = meter.remaining if meter.remaining is not None else meter.available
        if best is None or left < best_left:
            best, best_left = meter, left
    return best


def rate_headers(
    states: Sequence[LevelState], estimate: Estimate, now: float, charged: bool
) -> dict[str, str]:
    """x-ratelimit-{limit,remaining,reset}-{requests,tokens} from the tightest level; absent when unlimited."""
    headers: dict[str, str] = {}
    for metric in RATE_HEADER_METRICS:
        meter = _tightest(states, metric)
        if meter is None:
            continue
        left = meter.remaining if meter.remaining is not None else meter.available
        if charged:
            left -= need(metric, estimate)
        reset = (meter.reset_at - now) if meter.reset_at is not None else 0.0
        put_rate_headers(headers, metric, meter.limit, left, reset)
    return headers


_HEADER_NAMES = {
    m: (f"x-ratelimit-limit-{m}", f"x-ratelimit-remaining-{m}", f"x-ratelimit-reset-{m}")
    for m in RATE_HEADER_METRICS
}


def put_rate_headers(
    headers: dict[str, str], metric: RateMetric, limit: float, left: float, reset_in: float
) -> None:
    """The three x-ratelimit-* headers of one metric, as OpenAI spells them."""
    limit_name, remaining_name, reset_name = _HEADER_NAMES[metric]
    headers[limit_name] = str(int(limit))
    headers[remaining_name] = str(max(0, math.floor(left)))
    headers[reset_name] = format_reset(max(0.0, reset_in))


_WHAT = {
    "requests": "requests per minute",
    "tokens": "tokens per minute",
    "concurrency": "concurrent requests",
    "budget": "budget",
}


def _refusal(state: LevelState, metric: Metric, meter: Meter, estimate: Estimate, now: float) -> LimitRefused:
    tenant = state.tenant
    needed = need(metric, estimate)
    never = metric in ("tokens", "budget") and needed > meter.limit
    if metric == "concurrency" or meter.reset_at is None:
        retry = 1
    else:
        retry = max(1, math.ceil(meter.reset_at - now))
    if metric == "budget":
        limit_text = f"budget of {meter.limit / MICROS:g} for this period"
    else:
        limit_text = f"{int(meter.limit)} {_WHAT[metric]}"
    if never:
        message = (
            f"This request needs {_amount(metric, needed)}, more than {tenant.level} {tenant.name!r} allows "
            f"in total ({limit_text}); it can never be served as it is — ask for fewer tokens."
        )
    else:
        message = (
            f"Rate limit reached: {tenant.level} {tenant.name!r} has used its {limit_text}. "
            f"Retry after {retry} s."
        )
    return LimitRefused(tenant.level, tenant.name, metric, meter.limit, retry, message, {}, never)


def _amount(metric: Metric, value: float) -> str:
    if metric == "budget":
        return f"an estimated {value / MICROS:g} of budget"
    return f"{int(value)} tokens"


def decide(states: Sequence[LevelState], estimate: Estimate, now: float) -> Decision:
    """Allow the request, or refuse it naming the level and limit.

    Every level of the chain is checked; when several refuse, the one that frees up last is named (retrying
    earlier would only be refused again by it), ties going to the most specific level.
    """
    worst: LimitRefused | None = None
    needs = {metric: need(metric, estimate) for metric in METRICS}
    for state in reversed(states):  # project first: the most specific level wins ties
        for metric in METRICS:
            meter = state.meters.get(metric)
            if meter is None or meter.available >= needs[metric]:
                continue
            refused = _refusal(state, metric, meter, estimate, now)
            if worst is None or refused.retry_after > worst.retry_after:
                worst = refused
    if worst is None:
        return Allowed(rate_headers(states, estimate, now, charged=True))
    headers = rate_headers(states, estimate, now, charged=False)
    headers["retry-after"] = str(worst.retry_after)
    return LimitRefused(
        worst.level,
        worst.tenant,
        worst.metric,
        worst.limit,
        worst.retry_after,
        worst.message,
        headers,
        worst.never_fits,
    )
