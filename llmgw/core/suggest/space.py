"""The configurations the repo allows, as the search sees them: per model, a profile (its GPU class or CPU node
kind, tensor-parallel degree and precision are the profile's) and the autoscaler's bounds `scaling.min` and
`scaling.max`; what each costs per hour over the trace's periods, what it holds of each limited resource in each
period, and whether it meets the model's objectives. Pure.

The autoscaler is taken to run, in each period, the fewest replicas between min and max that meet the
objectives (`evaluate.needed`): a configuration meets them when its max covers every period's need. A model's
replicas all run one profile: placement takes profiles in preference order, so the repo cannot ask for a mix
within one model (the search mixes classes across models).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmgw.core.suggest.evaluate import Estimate, Need

__all__ = ["Choice", "Limits", "Option", "Problem", "options_for", "space_size"]


@dataclass(frozen=True, slots=True)
class Choice:
    """One profile of a model, evaluated: its needs per period, its price and where each figure came from."""

    model: str
    profile: str
    resource: str  # the GPU class, or `cpu:<node kind>`
    units: int  # GPUs (CPU nodes) one replica holds
    price_per_hour: float  # one replica's
    price_source: str  # "costs.gpu_per_hour.h100-80g", "costs.default_gpu_per_hour", ...
    engine_source: str  # "bench on this profile", "fit estimate: ...", "assumption: ..."
    needs: tuple[Need, ...]  # per period with demand, in period order
    scopes: tuple[str, ...] = ()  # the quota scopes (`Team ml`) that count its replicas
    table: Mapping[int, Sequence[Mapping[str, Estimate]]] = field(default_factory=dict)  # period -> [n-1]
    ttft_target_ms: float | None = None  # the model's own p99 TTFT objective (what `latency` ranks against)
    targets: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # by project: its objectives

    def ttft_p99_ms(self, period: int, replicas: int) -> float:
        """The worst class's estimated p99 TTFT with `replicas` running in `period` (0 without its table)."""
        rows = self.table.get(period)
        if not rows or replicas < 1:
            return 0.0
        return max((e.ttft_p99_ms for e in rows[min(replicas, len(rows)) - 1].values()), default=0.0)

    @property
    def peak(self) -> int | None:
        """The most replicas any period needs; None when a period cannot be met within the limit."""
        if any(n.replicas is None for n in self.needs):
            return None
        return max((n.replicas or 0 for n in self.needs), default=0)


@dataclass(frozen=True, slots=True)
class Option:
    """A model's configuration: a profile and the autoscaler's bounds."""

    choice: Choice
    min: int
    max: int
    replicas: tuple[int, ...]  # what runs in each of the trace's periods
    cost_per_hour: float  # the mean over the periods
    missed: str | None  # why it misses an objective (None: it meets them all)
    ttft_p99_ms: float = 0.0  # the worst period's estimated p99 TTFT at the replicas it runs

    @property
    def latency(self) -> float:
        """p99 TTFT over the model's objective (over a second without one): what `--objective latency` ranks."""
        return self.ttft_p99_ms / (self.choice.ttft_target_ms or 1000.0)

    @property
    def model(self) -> str:
        return self.choice.model

    def label(self) -> str:
        c = self.choice
        return f"{c.model}: {c.profile} ({c.resource}) x {self.min}..{self.max}"


@dataclass(frozen=True)
class Limits:
    """What the fleet may hold: units per resource (absent: not known, not checked) and GPUs per quota scope
    and class."""

    resources: Mapping[str, int] = field(default_factory=dict)
    quotas: Mapping[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class Problem:
    """What the search is given: every model's options in a stable order, the limits, the periods."""

    options: Mapping[str, tuple[Option, ...]]
    limits: Limits
    periods: int

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted(self.options))


def _option(choice: Choice, low: int, high: int, periods: int) -> Option:
    by_period = {n.period: n for n in choice.needs}
    replicas: list[int] = []
    missed: str | None = None
    for period in range(periods):
        need = by_period.get(period)
        wanted = 0 if need is None else need.replicas
        if wanted is None or wanted > high:
            if missed is None and need is not None:
                short = "; ".join(need.short) if wanted is None else f"needs {wanted} replicas"
                missed = f"hour {period}: {short}"
            wanted = high
        replicas.append(max(low, min(wanted, high)))
    cost = sum(replicas) * choice.price_per_hour / max(periods, 1)
    worst = max((choice.ttft_p99_ms(n.period, replicas[n.period]) for n in choice.needs), default=0.0)
    return Option(choice, low, high, tuple(replicas), cost, missed, worst)


def options_for(choices: Sequence[Choice], most: int, periods: int) -> tuple[Option, ...]:
    """Every (profile, min, max) with 1 <= min <= max <= `most`, in profile order, then min, then max."""
    return tuple(
        _option(choice, low, high, periods)
        for choice in choices
        for low in range(1, most + 1)
        for high in range(low, most + 1)
    )


def space_size(problem: Problem) -> int:
    size = 1
    for options in problem.options.values():
        size *= len(options)
    return size
