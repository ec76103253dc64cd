"""`plan --suggest`'s replayed figures with their intervals, and the verdicts they allow. Pure: the replays'
figures in, intervals and verdicts out.

The mechanism is `plan --simulate`'s (`llmgw.core.capacity.replay_spread`): a candidate is replayed once with
the pooled engine models (the figure shown) and once per bench pass's models; a figure's interval is the
passes' prediction interval around the pooled replay's figure, widened by the trace's own sampling of the
percentile. A model whose profile has no measured spread (one pass, a fit estimate, an assumption) keeps its
figure as a point, and the report says why rather than invent an interval.

An objective is met when the whole interval is within it, missed when it is all past it, undecided when the
interval straddles it (`verdict_state`): an undecided candidate is not proposed as meeting every objective, and
`decided_at` says how many replicas the evaluator expects to make it decided.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmgw.core.capacity.engine_spread import EngineSpread
from llmgw.core.capacity.replay_spread import figure_interval, quantile_interval, verdict_state
from llmgw.core.capacity.spread import Interval
from llmgw.core.suggest.served import SloRow
from llmgw.core.suggest.space import Choice

__all__ = ["Judged", "decided_at", "interval_of", "judge", "no_spread_reason", "span"]

Key = tuple[str, str, str]  # (model, project, objective)
_QUANTILE = {"ttft_p90_ms": 0.9, "ttft_p99_ms": 0.99, "tpot_p99_ms": 0.99}
_SAID = {"pass": "met", "fail": "MISSED", "undecided": "UNDECIDED (the interval straddles it)"}


def span(value: Interval | None, digits: int = 0) -> str:
    """`412 [380, 455]` as `plan --simulate` prints an interval (`Interval.text`); `-` for unknown."""
    return "-" if value is None else value.text(digits)


def interval_of(
    central: float | None,
    passes: Sequence[float | None],
    samples: Sequence[float],
    q: float,
    known: bool,
    bounds: Sequence[float | None] = (),
) -> Interval | None:
    """The pooled replay's figure with the passes' prediction interval widened by its sampling (`q`: the
    percentile the figure is) and by the bound replays' figures; a point where the spread is not `known`;
    None for an unknown figure."""
    if central is None:
        return None
    if not known:
        return Interval(central, central, central, 1)
    return figure_interval(central, passes, quantile_interval(samples, q), bounds)


@dataclass(frozen=True, slots=True)
class Judged:
    """One declared objective of one model and project against its replayed figure's interval."""

    model: str
    project: str
    objective: str
    target: float
    figure: Interval | None  # None: the replay served nothing of it
    state: str  # "pass", "fail", "undecided"

    def words(self) -> str:
        sign = ">=" if self.objective == "availability" else "<="
        digits = 4 if self.objective == "availability" else 0
        said = _SAID[self.state] if self.figure is not None else "MISSED (nothing served)"
        return f"{self.model} ({self.project}) {self.objective} {span(self.figure, digits)} {sign} {self.target:g}: {said}"


def judge(
    central: Sequence[SloRow],
    passes: Sequence[Sequence[SloRow]],
    samples: Mapping[tuple[str, str, str], Sequence[float]],
    known: Mapping[str, bool],
    bounds: Sequence[Sequence[SloRow]] = (),
) -> list[Judged]:
    """Each objective of the pooled replay's rows with its interval (over the same rows of each pass's
    replay and of each bound replay) and its verdict. Availability is no percentile: its interval is the
    replays' range."""
    by_pass = [_by_key(rows) for rows in passes]
    by_bound = [_by_key(rows) for rows in bounds]
    out = []
    for r in central:
        key = (r.model, r.project, r.objective)
        others = [p.get(key) for p in by_pass]
        at_error = [b.get(key) for b in by_bound]
        mine = known.get(r.model, False)
        if r.objective == "availability":
            seen = [v for v in [r.figure, *others, *at_error] if v is not None] if mine else []
            figure = (
                Interval(min(seen), r.figure, max(seen), len(seen))
                if r.figure is not None and len(seen) > 1
                else interval_of(r.figure, (), (), 0.5, False)
            )
        else:
            quantile = _QUANTILE[r.objective]
            figure = interval_of(r.figure, others, samples.get(key, ()), quantile, mine, at_error)
        state = (
            "fail"
            if figure is None
            else verdict_state(figure, r.target, at_least=r.objective == "availability")
        )
        out.append(Judged(r.model, r.project, r.objective, r.target, figure, state))
    return out


def _by_key(rows: Sequence[SloRow]) -> dict[Key, float | None]:
    return {(r.model, r.project, r.objective): r.figure for r in rows}


def decided_at(choice: Choice, period: int, replicas: int, judged: Judged) -> int | None:
    """The fewest replicas (more than `replicas`) whose evaluator estimate keeps the objective's whole
    interval within it: the estimate at most the target shrunk by the interval's upper side (high over
    mid); None when the searched range holds none, or for availability (its interval is not a factor)."""
    rows = choice.table.get(period) or ()
    figure = judged.figure
    if judged.objective == "availability" or figure is None or figure.high <= 0 or figure.mid <= 0:
        return None
    wanted = judged.target * figure.mid / figure.high
    for n in range(replicas + 1, len(rows) + 1):
        estimate = rows[n - 1].get(judged.project)
        if estimate is not None and estimate.figure(judged.objective) <= wanted:
            return n
    return None


def no_spread_reason(spread: EngineSpread) -> str | None:
    """Why a profile's figures carry no interval; None when its spread was measured."""
    if spread.known:
        return None
    if not spread.central.measured:
        return "an assumption, nothing measured"
    if spread.central.assumptions:
        return "a fit estimate with one bench pass"
    return "one bench pass, `llmgw bench --repeats 3` measures the spread"
