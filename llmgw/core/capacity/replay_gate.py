"""`plan --simulate`'s verdict: the current and the planned fleet's figures per model, side by side, and the
regressions past the Cluster's `spec.plan.simulate` thresholds. Pure: figures in, words out.

A p99 TTFT regression needs a current p99 to compare with (a model the current fleet served nothing of has
none: unknown is not zero, so only its refusals are judged). Refusals are compared as shares of the model's
requests, in percentage points, so one trace's size does not change what a threshold means.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmgw.core.config.models import SimulateSettings

__all__ = ["Figures", "percent", "regressions", "render_text"]


@dataclass(frozen=True, slots=True)
class Figures:
    model: str
    requests: int
    served: int
    refused: Mapping[str, int]  # reason -> count
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    utilization: float | None  # None: no replica of the model in this fleet

    @property
    def refused_share(self) -> float:
        return sum(self.refused.values()) / self.requests if self.requests else 0.0


def percent(text: str) -> float:
    """'20%' -> 0.2 (the schema's Percent pattern has checked the shape)."""
    return float(text.rstrip("%")) / 100.0


def regressions(
    current: Mapping[str, Figures], planned: Mapping[str, Figures], limits: SimulateSettings
) -> list[str]:
    """One line per model and figure the planned fleet makes worse than the thresholds allow."""
    max_p99, max_refused = percent(limits.max_p99_ttft_increase), percent(limits.max_refusals_increase)
    out: list[str] = []
    for model in sorted(set(current) | set(planned)):
        now, then = current.get(model), planned.get(model)
        if then is None or not then.requests:
            continue
        before = now.ttft_p99_ms if now is not None else None
        if before is not None and then.ttft_p99_ms is not None and then.ttft_p99_ms > before * (1 + max_p99):
            rise = then.ttft_p99_ms / before - 1 if before > 0 else float("inf")
            out.append(
                f"model {model}: p99 TTFT {before:.0f} ms -> {then.ttft_p99_ms:.0f} ms (+{rise:.0%}; "
                f"spec.plan.simulate.max_p99_ttft_increase is {limits.max_p99_ttft_increase})"
            )
        share_before = now.refused_share if now is not None else 0.0
        if then.refused_share - share_before > max_refused:
            out.append(
                f"model {model}: refused {share_before:.1%} -> {then.refused_share:.1%} of its requests "
                f"({_reasons(then.refused)}; spec.plan.simulate.max_refusals_increase is "
                f"{limits.max_refusals_increase})"
            )
    return out


def _reasons(refused: Mapping[str, int]) -> str:
    return (
        ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(refused.items()) if n) or "none"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _row(label: str, f: Figures | None) -> str:
    if f is None:
        return f"  {label:<8} no requests"
    util = "no replica" if f.utilization is None else f"{f.utilization:.0%}"
    refused = sum(f.refused.values())
    detail = f" ({_reasons(f.refused)})" if refused else ""
    return (
        f"  {label:<8} p50 {_ms(f.ttft_p50_ms):>6} ms  p99 {_ms(f.ttft_p99_ms):>6} ms  "
        f"refused {refused}/{f.requests}{detail}  utilization {util}"
    )


def render_text(
    source: str,
    current: Mapping[str, Figures],
    planned: Mapping[str, Figures],
    found: Sequence[str],
    assumptions: Sequence[str],
    *,
    extra: Sequence[str] = (),
    undecided: Sequence[str] = (),
) -> str:
    """The section `plan --simulate` prints after the plan. `extra`: lines after the figures (their intervals,
    `llmgw.core.capacity.replay_spread`); `undecided`: verdicts whose interval straddles a threshold, said as
    neither passed nor failed."""
    lines = ["", f"Simulated serving (virtual time, {source}):"]
    for model in sorted(set(current) | set(planned)):
        lines.append(f"model {model}")
        lines.append(_row("current", current.get(model)))
        lines.append(_row("planned", planned.get(model)))
    lines.extend(extra)
    if assumptions:
        lines.append("Assumed (not measured):")
        lines.extend(f"  {a}" for a in assumptions)
    if found:
        lines.append(f"Regressions ({len(found)}):")
        lines.extend(f"  {r}" for r in found)
    if undecided:
        lines.append(f"Undecided ({len(undecided)}; the interval straddles the threshold):")
        lines.extend(f"  {r}" for r in undecided)
    if not found and not undecided:
        lines.append("No regression past spec.plan.simulate's thresholds.")
    return "\n".join(lines) + "\n"
