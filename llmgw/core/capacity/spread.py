"""The statistics behind `llmgw bench`'s spread and drift check, as pure functions: intervals from repeated
measurements, and whether an engine's speed moved while it was measured.

- `mean_interval`: where the mean of the repeats lies (Student's t over n repeats, two-sided): what a
  parameter's confidence interval says about the bench itself.
- `prediction_interval`: where the next repeat will land, on the log scale (costs are positive and move by
  factors, not by milliseconds): mean ± t·s·√(1 + 1/n). This, not the mean's interval, is what a replay of
  traffic that comes later must carry: the engine of next week is one more draw, not the average of the bench.
- `judge_drift`: the same probe at the bench's start and its end. Drifted when the two medians differ by more
  than DRIFT_LIMIT and the probes part entirely (no request of one as slow as one of the other): a steady
  engine's probes disagree by their noise and overlap, a drifting one's part; a fit through a drift
  describes neither end.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CONFIDENCE",
    "DRIFT_LIMIT",
    "Drift",
    "Interval",
    "judge_drift",
    "mean_interval",
    "prediction_interval",
    "t_quantile",
]

CONFIDENCE = 0.9  # two-sided: one figure in ten may fall outside, which the plan's words say
DRIFT_LIMIT = 0.2  # a fifth: the speed a loaded 2-core machine was seen to move between steps of one bench

# Student's t, upper quantiles by degrees of freedom (a table: the project has no scipy, and these are exact
# to the digits shown). Past the last row the normal's.
_DF = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 30, 60)
_T = {
    0.95: (
        6.314,
        2.920,
        2.353,
        2.132,
        2.015,
        1.943,
        1.895,
        1.860,
        1.833,
        1.812,
        1.782,
        1.753,
        1.725,
        1.697,
        1.671,
    ),
    0.975: (
        12.706,
        4.303,
        3.182,
        2.776,
        2.571,
        2.447,
        2.365,
        2.306,
        2.262,
        2.228,
        2.179,
        2.131,
        2.086,
        2.042,
        2.0,
    ),
}
_NORMAL = {0.95: 1.645, 0.975: 1.960}


@dataclass(frozen=True, slots=True)
class Interval:
    """A figure and where it lies: `low` <= `mid` <= `high`; `n` the repeats it comes from (1: no spread
    known, the interval is the point)."""

    low: float
    mid: float
    high: float
    n: int = 1

    @property
    def relative(self) -> float:
        """The larger side's distance from the middle, as a share of it (inf for a zero middle)."""
        if self.mid <= 0:
            return 0.0 if self.high == self.low == self.mid else math.inf
        return max(self.mid - self.low, self.high - self.mid) / self.mid

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def text(self, digits: int = 0) -> str:
        if self.n <= 1 and self.low == self.high:
            return f"{self.mid:.{digits}f}"
        return f"{self.mid:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided `confidence` quantile of Student's t with `df` degrees of freedom (at least 1); between
    the table's rows the next smaller row's (wider: the safe side)."""
    if df < 1:
        raise ValueError(f"t_quantile: {df} degrees of freedom; at least 1 is needed")
    upper = round(0.5 + confidence / 2, 3)
    table = _T.get(upper)
    if table is None:
        raise ValueError(f"t_quantile: confidence {confidence}: only 0.9 and 0.95 are tabled")
    if df > _DF[-1]:
        return _NORMAL[upper]
    return table[max(i for i, k in enumerate(_DF) if k <= df)]


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The mean of the repeats and its two-sided confidence interval (one value: the point, n=1)."""
    if not values:
        raise ValueError("mean_interval: no values")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Interval(mean, mean, mean, 1)
    half = t_quantile(len(values) - 1, confidence) * statistics.stdev(values) / math.sqrt(len(values))
    return Interval(mean - half, mean, mean + half, len(values))


def prediction_interval(
    ratios: Sequence[float], confidence: float = CONFIDENCE, floor: float = 0.0
) -> Interval:
    """Where the next repeat's factor lands, from the repeats' factors (each repeat's figure over the pooled
    one; positive), on the log scale; at least ±`floor` (a share) whatever the repeats agreed on: three
    repeats that happen to agree do not make an engine steadier than the machine it shares."""
    logs = [math.log(r) for r in ratios if r > 0]
    if not logs:
        raise ValueError("prediction_interval: no positive ratios")
    centre = statistics.fmean(logs)
    spread = 0.0
    if len(logs) >= 2:
        spread = t_quantile(len(logs) - 1, confidence) * statistics.stdev(logs) * math.sqrt(1 + 1 / len(logs))
    spread = max(spread, math.log1p(floor))
    return Interval(math.exp(centre - spread), math.exp(centre), math.exp(centre + spread), len(logs))


@dataclass(frozen=True, slots=True)
class Drift:
    """The start and end probes' median request time (ms) and the verdict."""

    start_ms: float
    end_ms: float
    change: float  # end over start, minus one
    scatter: float  # the probes' own relative scatter (the larger half-range over its median)
    drifted: bool

    def words(self) -> str:
        verb = "drifted" if self.drifted else "held"
        return (
            f"the engine's speed {verb}: a request took {self.start_ms:.0f} ms at the start and "
            f"{self.end_ms:.0f} ms at the end ({self.change:+.0%}; each probe scatters ±{self.scatter:.0%}; "
            f"drifted means past ±{DRIFT_LIMIT:.0%} with the probes apart)"
        )


def _scatter(values: Sequence[float]) -> float:
    middle = statistics.median(values)
    return (max(values) - min(values)) / 2 / middle if middle > 0 else 0.0


def judge_drift(start_ms: Sequence[float], end_ms: Sequence[float], limit: float = DRIFT_LIMIT) -> Drift:
    """Whether the engine's speed moved between two probes of the same requests (their times in ms): their
    medians differ by more than `limit`, and the probes do not overlap (every request of one slower than
    every request of the other: with six a side, a steady engine's probes part so by chance once in 460)."""
    if not start_ms or not end_ms:
        raise ValueError("judge_drift: a probe measured nothing (every request failed?)")
    a, b = statistics.median(start_ms), statistics.median(end_ms)
    change = b / a - 1 if a > 0 else math.inf
    scatter = max(_scatter(start_ms), _scatter(end_ms))
    apart = min(end_ms) > max(start_ms) or max(end_ms) < min(start_ms)
    return Drift(a, b, change, scatter, abs(change) > limit and apart)
