"""What the fleet served in a recent window, folded to the few numbers a plan's Impact section needs. Pure.

`UsageFolder` takes the usage rows of a window in the order they completed (the store's `usage` table:
completion time, project/team/org, model, tokens, cost, latency, status) and gives a `UsageSummary`:
- requests and tokens per (project, model), and per model (the traffic a removal or a price change meets);
- per tenant (organization, team, project): its busiest minute of tokens and of requests, and its peak
  concurrency (what a limit is compared with);
- per model: its peak concurrency, from each request's arrival (completion - latency) and completion;
- the measured capacities (`llmgw bench --save`) to judge a replica count against.

The summary is a pydantic value because it crosses boundaries: the admin API sends it, `plan --save-state`
writes it and a CI job reads it back.

Rules where the store is silent: a minute is a calendar minute of completion times (the limiter's window
slides, so its peak can only be higher); every request counts toward requests per minute (one refused is
demand too); only requests that were not refused with 429 and took time hold a slot in the concurrency sweep;
a request ending exactly when another starts does not overlap it.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "SUMMARY_FORMAT",
    "MeasuredCapacity",
    "ModelUsage",
    "PairUsage",
    "TenantLevel",
    "TenantPeak",
    "UsageFolder",
    "UsageRow",
    "UsageSummary",
    "peak_overlap",
]

SummaryFormat = Literal["llmgw-usage-summary/v1"]
SUMMARY_FORMAT: SummaryFormat = "llmgw-usage-summary/v1"
TenantLevel = Literal["organization", "team", "project"]
LEVELS: tuple[TenantLevel, ...] = ("organization", "team", "project")


class _Value(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PairUsage(_Value):
    """What one project sent to one model in the window."""

    project: str
    model: str
    requests: int = Field(ge=0)
    errors: int = Field(0, ge=0, description="Requests answered with a status of 400 or more")
    tokens_in: int = Field(0, ge=0)
    tokens_out: int = Field(0, ge=0)
    cost: float = Field(0.0, ge=0)


class ModelUsage(_Value):
    """One model's traffic in the window and its busiest moment."""

    model: str
    requests: int = Field(ge=0)
    tokens_in: int = Field(0, ge=0)
    tokens_out: int = Field(0, ge=0)
    cost: float = Field(0.0, ge=0)
    peak_concurrency: int = Field(0, ge=0)
    peak_concurrency_at: float | None = None


class TenantPeak(_Value):
    """A tenant's busiest minute (tokens, requests) and its peak concurrency in the window."""

    level: TenantLevel
    name: str
    peak_tpm: int = Field(ge=0, description="Most prompt + completion tokens completed in one minute")
    peak_tpm_at: float | None = Field(None, description="Start of that minute (unix time)")
    peak_rpm: int = Field(ge=0, description="Most requests completed in one minute")
    peak_rpm_at: float | None = None
    peak_concurrency: int = Field(0, ge=0)
    cost: float = Field(0.0, ge=0, description="Spent in the window")


class MeasuredCapacity(_Value):
    """`llmgw bench --save`'s answer for one replica of a model's profile (None: no concurrency met the SLO)."""

    model: str
    profile: str
    gpu_class: str = ""
    concurrency: int | None = None
    measured_at: float


class UsageSummary(_Value):
    format: SummaryFormat = SUMMARY_FORMAT
    since: float = Field(description="Start of the window (unix time)")
    until: float = Field(description="End of the window (unix time)")
    rows: int = Field(0, ge=0, description="Usage rows read")
    earliest: float | None = Field(None, description="Completion time of the oldest row read; None: no rows")
    pairs: list[PairUsage] = Field(default_factory=list)
    models: list[ModelUsage] = Field(default_factory=list)
    tenants: list[TenantPeak] = Field(default_factory=list)
    capacity: list[MeasuredCapacity] = Field(default_factory=list)

    @property
    def window_s(self) -> float:
        return max(self.until - self.since, 0.0)

    def pair(self, project: str, model: str) -> PairUsage | None:
        return next((p for p in self.pairs if p.project == project and p.model == model), None)

    def model(self, name: str) -> ModelUsage | None:
        return next((m for m in self.models if m.model == name), None)

    def tenant(self, level: TenantLevel, name: str) -> TenantPeak | None:
        return next((t for t in self.tenants if t.level == level and t.name == name), None)


@dataclass(frozen=True, slots=True)
class UsageRow:
    """The columns of one usage row the summary reads."""

    time: float  # completion
    org: str
    team: str
    project: str
    model: str
    tokens_in: int
    tokens_out: int
    cost: float
    latency_ms: float
    status: int


@dataclass(slots=True)
class _Totals:
    requests: int = 0
    errors: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0


class _Intervals:
    """Arrival and completion times as packed doubles: 16 bytes a request, for a week of a busy fleet."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: array[float] = array("d")
        self.ends: array[float] = array("d")


class _Tenant:
    """One tenant's running numbers: its current minute, its best minutes, its spend, its busy intervals."""

    __slots__ = (
        "busy",
        "minute",
        "minute_requests",
        "minute_tokens",
        "rpm",
        "rpm_at",
        "spent",
        "tpm",
        "tpm_at",
    )

    def __init__(self) -> None:
        self.minute = -1
        self.minute_tokens = self.minute_requests = 0
        self.tpm = self.rpm = 0
        self.tpm_at: float | None = None
        self.rpm_at: float | None = None
        self.spent = 0.0
        self.busy = _Intervals()

    def close_minute(self) -> None:
        if self.minute_tokens > self.tpm:
            self.tpm, self.tpm_at = self.minute_tokens, self.minute * 60.0
        if self.minute_requests > self.rpm:
            self.rpm, self.rpm_at = self.minute_requests, self.minute * 60.0


def peak_overlap(starts: array[float], ends: array[float]) -> tuple[int, float | None]:
    """The most intervals open at once and when that began; an interval ending as another starts is closed."""
    opened, closed = sorted(starts), sorted(ends)
    best, at, now, j = 0, None, 0, 0
    for s in opened:
        while j < len(closed) and closed[j] <= s:
            now -= 1
            j += 1
        now += 1
        if now > best:
            best, at = now, s
    return best, at


class UsageFolder:
    """Fold usage rows, oldest completion first, into a `UsageSummary`. `add_values` is the hot path (a week
    of a busy fleet is millions of rows): one lookup per level and per (project, model), no objects made."""

    def __init__(self, since: float, until: float) -> None:
        self.since, self.until = since, until
        self.rows = 0
        self.earliest: float | None = None
        self._last = -math.inf
        self._pairs: dict[tuple[str, str], _Totals] = {}
        self._busy: dict[str, _Intervals] = {}  # model -> intervals
        self._tenants: dict[tuple[TenantLevel, str], _Tenant] = {}

    def add(self, row: UsageRow) -> None:
        self.add_values(
            row.time,
            row.org,
            row.team,
            row.project,
            row.model,
            row.tokens_in,
            row.tokens_out,
            row.cost,
            row.latency_ms,
            row.status,
        )

    def add_values(
        self,
        time: float,
        org: str,
        team: str,
        project: str,
        model: str,
        tokens_in: int,
        tokens_out: int,
        cost: float,
        latency_ms: float,
        status: int,
    ) -> None:
        if time < self._last:
            raise ValueError(f"usage rows must come oldest first: {time} after {self._last}")
        if self.earliest is None:
            self.earliest = time
        self._last = time
        self.rows += 1
        pair = self._pairs.get((project, model))
        if pair is None:
            pair = self._pairs[(project, model)] = _Totals()
        pair.requests += 1
        pair.errors += status >= 400
        pair.tokens_in += tokens_in
        pair.tokens_out += tokens_out
        pair.cost += cost
        held = status != 429 and latency_ms > 0
        start = time - latency_ms / 1000
        if held:
            busy = self._busy.get(model)
            if busy is None:
                busy = self._busy[model] = _Intervals()
            busy.starts.append(start)
            busy.ends.append(time)
        minute = math.floor(time / 60)
        tokens = tokens_in + tokens_out
        for key in (("organization", org), ("team", team), ("project", project)):
            if not key[1]:
                continue
            t = self._tenants.get(key)
            if t is None:
                t = self._tenants[key] = _Tenant()
            if t.minute != minute:
                t.close_minute()
                t.minute, t.minute_tokens, t.minute_requests = minute, 0, 0
            t.minute_tokens += tokens
            t.minute_requests += 1
            t.spent += cost
            if held:
                t.busy.starts.append(start)
                t.busy.ends.append(time)

    def summary(self, capacity: list[MeasuredCapacity] | None = None) -> UsageSummary:
        return UsageSummary(
            since=self.since,
            until=self.until,
            rows=self.rows,
            earliest=self.earliest,
            pairs=self._pair_usage(),
            models=self._model_usage(),
            tenants=self._tenant_peaks(),
            capacity=sorted(capacity or [], key=lambda c: (c.model, c.profile, c.gpu_class)),
        )

    def _model_usage(self) -> list[ModelUsage]:
        """Per model: the pairs' totals summed over projects, and its busiest moment."""
        by_model: dict[str, _Totals] = {}
        for (_, model), p in self._pairs.items():
            m = by_model.setdefault(model, _Totals())
            m.requests += p.requests
            m.tokens_in += p.tokens_in
            m.tokens_out += p.tokens_out
            m.cost += p.cost
        models = []
        for name, t in sorted(by_model.items()):
            iv = self._busy.get(name)
            peak, at = peak_overlap(iv.starts, iv.ends) if iv else (0, None)
            models.append(
                ModelUsage(
                    model=name,
                    requests=t.requests,
                    tokens_in=t.tokens_in,
                    tokens_out=t.tokens_out,
                    cost=t.cost,
                    peak_concurrency=peak,
                    peak_concurrency_at=at,
                )
            )
        return models

    def _tenant_peaks(self) -> list[TenantPeak]:
        """Per organization, team and project: its peak rates and concurrency, and what it spent."""
        tenants = []
        for (level, name), acc in sorted(
            self._tenants.items(), key=lambda kv: (LEVELS.index(kv[0][0]), kv[0][1])
        ):
            acc.close_minute()  # the last minute is as whole as it will get
            tenants.append(
                TenantPeak(
                    level=level,
                    name=name,
                    peak_tpm=acc.tpm,
                    peak_tpm_at=acc.tpm_at,
                    peak_rpm=acc.rpm,
                    peak_rpm_at=acc.rpm_at,
                    peak_concurrency=peak_overlap(acc.busy.starts, acc.busy.ends)[0],
                    cost=acc.spent,
                )
            )
        return tenants

    def _pair_usage(self) -> list[PairUsage]:
        return [
            PairUsage(
                project=p,
                model=m,
                requests=t.requests,
                errors=t.errors,
                tokens_in=t.tokens_in,
                tokens_out=t.tokens_out,
                cost=t.cost,
            )
            for (p, m), t in sorted(self._pairs.items())
        ]
