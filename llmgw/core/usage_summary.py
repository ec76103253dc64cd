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
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "SUMMARY_FORMAT",
    "MeasuredCapacity",
    "ModelUsage",
    "PairUsage",
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


@dataclass
class _Totals:
    requests: int = 0
    errors: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0

    def add(self, row: UsageRow) -> None:
        self.requests += 1
        self.errors += row.status >= 400
        self.tokens_in += row.tokens_in
        self.tokens_out += row.tokens_out
        self.cost += row.cost


@dataclass
class _Intervals:
    """Arrival and completion times as packed doubles: 16 bytes a request, for a week of a busy fleet."""

    starts: array[float] = field(default_factory=lambda: array("d"))
    ends: array[float] = field(default_factory=lambda: array("d"))

    def add(self, start: float, end: float) -> None:
        self.starts.append(start)
        self.ends.append(end)


@dataclass
class _Peak:
    value: int = 0
    at: float | None = None

    def offer(self, value: int, at: float) -> None:
        if value > self.value:
            self.value, self.at = value, at


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
    """Fold usage rows, oldest completion first, into a `UsageSummary`."""

    def __init__(self, since: float, until: float) -> None:
        self.since, self.until = since, until
        self.rows = 0
        self.earliest: float | None = None
        self._last: float | None = None
        self._pairs: dict[tuple[str, str], _Totals] = {}
        self._models: dict[str, _Totals] = {}
        self._spent: dict[tuple[TenantLevel, str], float] = {}
        self._busy: dict[str, _Intervals] = {}  # model -> intervals
        self._tenant_busy: dict[tuple[TenantLevel, str], _Intervals] = {}
        self._minute: int | None = None
        self._minute_tokens: dict[tuple[TenantLevel, str], int] = {}
        self._minute_requests: dict[tuple[TenantLevel, str], int] = {}
        self._tpm: dict[tuple[TenantLevel, str], _Peak] = {}
        self._rpm: dict[tuple[TenantLevel, str], _Peak] = {}

    def add(self, row: UsageRow) -> None:
        if self._last is not None and row.time < self._last:
            raise ValueError(f"usage rows must come oldest first: {row.time} after {self._last}")
        self._last = row.time
        self.rows += 1
        if self.earliest is None:
            self.earliest = row.time
        self._pairs.setdefault((row.project, row.model), _Totals()).add(row)
        self._models.setdefault(row.model, _Totals()).add(row)
        minute = math.floor(row.time / 60)
        if minute != self._minute:
            self._close_minute()
            self._minute = minute
        held = row.status != 429 and row.latency_ms > 0
        start = row.time - row.latency_ms / 1000
        if held:
            self._busy.setdefault(row.model, _Intervals()).add(start, row.time)
        for level, name in zip(LEVELS, (row.org, row.team, row.project), strict=True):
            if not name:
                continue
            key = (level, name)
            self._minute_tokens[key] = self._minute_tokens.get(key, 0) + row.tokens_in + row.tokens_out
            self._minute_requests[key] = self._minute_requests.get(key, 0) + 1
            self._spent[key] = self._spent.get(key, 0.0) + row.cost
            if held:
                self._tenant_busy.setdefault(key, _Intervals()).add(start, row.time)

    def _close_minute(self) -> None:
        if self._minute is None:
            return
        at = self._minute * 60.0
        for key, tokens in self._minute_tokens.items():
            self._tpm.setdefault(key, _Peak()).offer(tokens, at)
        for key, requests in self._minute_requests.items():
            self._rpm.setdefault(key, _Peak()).offer(requests, at)
        self._minute_tokens, self._minute_requests = {}, {}

    def summary(self, capacity: list[MeasuredCapacity] | None = None) -> UsageSummary:
        self._close_minute()
        self._minute = None
        models = []
        for name, t in sorted(self._models.items()):
            iv = self._busy.get(name)
            peak, at = peak_overlap(iv.starts, iv.ends) if iv else (0, None)
            models.append(
                ModelUsage(model=name, requests=t.requests, tokens_in=t.tokens_in, tokens_out=t.tokens_out,
                           cost=t.cost, peak_concurrency=peak, peak_concurrency_at=at)
            )  # fmt: skip
        tenants = []
        for key in sorted(self._spent, key=lambda k: (LEVELS.index(k[0]), k[1])):
            iv = self._tenant_busy.get(key)
            tpm, rpm = self._tpm.get(key, _Peak()), self._rpm.get(key, _Peak())
            tenants.append(
                TenantPeak(level=key[0], name=key[1], peak_tpm=tpm.value, peak_tpm_at=tpm.at,
                           peak_rpm=rpm.value, peak_rpm_at=rpm.at,
                           peak_concurrency=peak_overlap(iv.starts, iv.ends)[0] if iv else 0,
                           cost=self._spent[key])
            )  # fmt: skip
        pairs = [
            PairUsage(project=p, model=m, requests=t.requests, errors=t.errors, tokens_in=t.tokens_in,
                      tokens_out=t.tokens_out, cost=t.cost)
            for (p, m), t in sorted(self._pairs.items())
        ]  # fmt: skip
        return UsageSummary(
            since=self.since,
            until=self.until,
            rows=self.rows,
            earliest=self.earliest,
            pairs=pairs,
            models=models,
            tenants=tenants,
            capacity=sorted(capacity or [], key=lambda c: (c.model, c.profile, c.gpu_class)),
        )
