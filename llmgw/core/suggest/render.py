"""`plan --suggest`'s report: the suggested configuration, its headroom at the busiest hour, the replay of the
best candidates, the runners-up and the alternatives with why each lost, where every figure came from and what
could not be checked; as text for a terminal and as markdown (tables, the diff, a Mermaid chart) for the PR
comment. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmgw.core.capacity.spread import Interval
from llmgw.core.suggest.build import pool_figures
from llmgw.core.suggest.search import Candidate, Result
from llmgw.core.suggest.space import Option
from llmgw.core.suggest.uncertainty import span

__all__ = ["Confirmed", "Report", "chart", "document", "render_markdown", "render_text"]


@dataclass(frozen=True)
class Confirmed:
    """A candidate replayed: the worst figures over its models and classes (each with its interval over the
    bench's passes, `llmgw.core.suggest.uncertainty`), and whether every objective held for certain."""

    candidate: Candidate
    ttft_p99_ms: float | None
    tpot_p99_ms: float | None
    availability: float | None
    ttft_share: float | None  # the worst p99 TTFT as a share of its objective (None: no objective)
    met: bool  # every objective's whole interval within it
    missed: tuple[str, ...] = ()  # the whole interval past it
    undecided: tuple[str, ...] = ()  # the interval straddles it, with the replicas that would decide it
    ttft_p90: Interval | None = None  # the worst declared p90 TTFT objective's figure
    ttft_p99: Interval | None = None
    tpot_p99: Interval | None = None
    share: Interval | None = None  # `ttft_share`'s interval
    spread: str = ""  # where the intervals come from, or why a figure has none
    deciding: tuple[str, ...] = ()  # per `undecided`, in order: the headroom that would decide it

    @property
    def verdict(self) -> str:
        """met, missed or undecided (missed wins: one objective surely missed is enough)."""
        if self.missed:
            return "missed"
        return "undecided" if self.undecided else "met"

    def point(self, value: float | None, interval: Interval | None, digits: int) -> str:
        """The figure with its interval where one was replayed (`412 [380, 455]`)."""
        if interval is not None:
            return span(interval, digits)
        return "-" if value is None else f"{value:.{digits}f}"


@dataclass(frozen=True)
class Report:
    result: Result
    objective: str
    currency: str
    periods: int
    busiest: int  # the hour replayed (the trace's busiest)
    replayed: Sequence[Confirmed] = ()
    replay_words: str = ""
    provenance: Sequence[str] = ()
    unchecked: Sequence[str] = ()
    changes: Sequence[str] = ()  # in words, one per edited model
    diff: str = ""
    limits: Mapping[str, int] = field(default_factory=dict)


def _config(o: Option, currency: str) -> str:
    hours = " ".join(str(n) for n in o.replicas)
    return f"{o.label()}, {o.cost_per_hour:.2f} {currency}/h on average (replicas by hour: {hours})"


def _headroom(best: Candidate, busiest: int, limits: Mapping[str, int]) -> list[str]:
    out = []
    held: dict[str, int] = {}
    for o in best.options:
        n = o.replicas[busiest]
        c = o.choice
        held[c.resource] = held.get(c.resource, 0) + n * c.units
        for project, figures in pool_figures(c, busiest, n).items():
            parts = [f"utilization {figures.utilization:.2f}"]
            for objective, target in c.targets.get(project, {}).items():
                value = figures.figure(objective)
                if objective == "availability":
                    parts.append(f"{objective} {value:.5f} of {target:g}")
                else:
                    parts.append(f"{objective} {value:.4g} of {target:g} ({1 - value / target:.0%} spare)")
            out.append(f"{o.model} ({project}): {n} x {c.profile}, " + ", ".join(parts))
    for resource, n in sorted(held.items()):
        cap = limits.get(resource)
        out.append(f"{resource}: {n} held" + ("" if cap is None else f" of {cap} ({cap - n} free)"))
    return out


def _method(report: Report) -> str:
    r = report.result
    words = f"{r.method}: {r.space} configurations, {r.evaluated} weighed"
    if r.words:
        words += f"; {r.words}"
    if r.bound is not None and r.best is not None and r.bound > 0:
        words += f"; at most {r.best.cost_per_hour / r.bound:.3f}x the optimum (lower bound {r.bound:.2f})"
    return words


def _name(i: int) -> str:
    return "suggested" if i == 0 else f"runner-up {i}"


def _profiles(c: Confirmed, busiest: int) -> str:
    return ", ".join(f"{o.model}: {o.choice.profile} x {o.replicas[busiest]}" for o in c.candidate.options)


def _replay_rows(report: Report) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for i, c in enumerate(report.replayed):
        name, profiles = _name(i), _profiles(c, report.busiest)
        rows.append(
            (
                f"{name} ({profiles})",
                f"{c.candidate.cost_per_hour:.2f}",
                span(c.ttft_p90),
                c.point(c.ttft_p99_ms, c.ttft_p99, 0),
                c.point(c.tpot_p99_ms, c.tpot_p99, 1),
                "-" if c.availability is None else f"{c.availability:.4f}",
                _verdict(c),
            )
        )
    return rows


def _verdict(c: Confirmed) -> str:
    if c.verdict == "met":
        return "met"
    if c.verdict == "missed":
        return "MISSED: " + "; ".join(c.missed)
    return "UNDECIDED: " + "; ".join(c.undecided)


HEADER = ("candidate", "cost/h", "p90 TTFT ms", "p99 TTFT ms", "p99 TPOT ms", "availability", "objectives")


def _sections(report: Report) -> list[tuple[str, list[str]]]:
    """The report's sections as (title, lines), shared by both renderings."""
    r, cur = report.result, report.currency
    out: list[tuple[str, list[str]]] = []
    if r.best is None:
        out.append(("No configuration meets every objective within the limits", []))
    else:
        lines = [_config(o, cur) for o in r.best.options]
        peak = sum(o.replicas[report.busiest] * o.choice.price_per_hour for o in r.best.options)
        lines.append(
            f"fleet: {r.best.cost_per_hour:.2f} {cur}/h on average over {report.periods} hour(s), "
            f"{peak:.2f} {cur}/h at the busiest (hour {report.busiest})"
        )
        first = report.replayed[0] if report.replayed else None
        if first is not None and first.verdict == "undecided":
            lines.append("not proposed as meeting every objective: its replay leaves some undecided")
            lines.extend(f"undecided: {u}; {d}" for u, d in zip(first.undecided, first.deciding, strict=True))
            sure = next((i for i, c in enumerate(report.replayed) if c.verdict == "met"), None)
            if sure is not None:
                lines.append(
                    f"{_name(sure)} meets every objective with its whole interval, at "
                    f"{report.replayed[sure].candidate.cost_per_hour:.2f} {report.currency}/h"
                )
        out.append((f"Suggested fleet (objective {report.objective})", lines))
        out.append(
            (
                f"Headroom at the busiest hour ({report.busiest})",
                _headroom(r.best, report.busiest, report.limits),
            )
        )
    out.append(("Search", [_method(report)]))
    if report.changes:
        out.append(("Change (`llmgw plan --suggest --write` makes it)", list(report.changes)))
    runners = [f"{' + '.join(o.label() for o in c.options)}: {c.lost}" for c in r.runners_up]
    if runners:
        out.append(("Runners-up", runners))
    if r.rejected:
        out.append(("Alternatives and why they lost", [f"{what}: {why}" for what, why in r.rejected]))
    out.append(("Figures from", list(report.provenance)))
    out.append(("Not checked", list(report.unchecked)))
    return out


def render_text(report: Report) -> str:
    lines = [""]
    for title, body in _sections(report):
        lines.append(f"{title}:")
        lines.extend(f"  {line}" for line in body)
        if title.startswith("Headroom") and report.replayed:
            lines.append(f"Replay ({report.replay_words}):")
            lines.append("  " + " | ".join(HEADER))
            lines.extend("  " + " | ".join(row) for row in _replay_rows(report))
            lines.extend(f"  {line}" for line in _spread_lines(report))
    return "\n".join(lines) + "\n"


def _spread_lines(report: Report) -> list[str]:
    """Where each candidate's intervals come from (or why a figure has none), once when all agree."""
    said = [c.spread for c in report.replayed if c.spread]
    if not said:
        return []
    if len(set(said)) == 1:
        return [f"intervals: {said[0]}"]
    return [f"intervals of {_name(i)}: {c.spread}" for i, c in enumerate(report.replayed) if c.spread]


def chart(report: Report) -> str:
    """A Mermaid xychart: each replayed candidate's cost per hour against its worst p99 TTFT as a share of the
    objective, the objective's line at 100 %. xychart has no error bars: where the replay carries intervals,
    a first bar series holds each candidate's upper bound and the second its figure; Mermaid draws a later
    series over an earlier one at the same place (it does not group them), so the part of the first bar
    above the second is the interval's upper side, in the GitHub and Gitea renderings alike."""
    shown = [c for c in report.replayed if c.ttft_share is not None]
    if not shown:
        return ""
    labels = ", ".join(f'"{c.candidate.cost_per_hour:.2f}"' for c in shown)
    shares = [round(100 * (c.ttft_share or 0.0)) for c in shown]
    highs = [
        round(100 * c.share.high) if c.share is not None else s for c, s in zip(shown, shares, strict=True)
    ]
    spread = highs != shares
    top = max([*highs, 100]) * 1.2
    title = "p99 TTFT (replay; the taller bar: its interval's upper bound)" if spread else "p99 TTFT (replay)"
    lines = [
        "```mermaid",
        "xychart-beta",
        f'    title "Candidates: cost per hour against {title}"',
        f'    x-axis "{report.currency} per hour" [{labels}]',
        f'    y-axis "worst p99 TTFT, % of its objective" 0 --> {top:.0f}',
    ]
    if spread:
        lines.append(f"    bar [{', '.join(str(h) for h in highs)}]")
    lines += [
        f"    bar [{', '.join(str(s) for s in shares)}]",
        f"    line [{', '.join('100' for _ in shown)}]",
        "```",
    ]
    return "\n".join(lines)


def render_markdown(report: Report) -> str:
    lines = ["", "#### Suggested fleet", ""]
    for title, body in _sections(report):
        lines.append(f"**{title}**")
        lines.append("")
        lines.extend(f"- {line}" for line in body)
        lines.append("")
        if title.startswith("Headroom") and report.replayed:
            lines.append(f"**Replay** ({report.replay_words})")
            lines.append("")
            lines.append("| " + " | ".join(HEADER) + " |")
            lines.append("|" + "---|" * len(HEADER))
            lines.extend("| " + " | ".join(row) + " |" for row in _replay_rows(report))
            lines.append("")
            lines.extend(f"- {line}" for line in _spread_lines(report))
            lines.append("")
            drawn = chart(report)
            if drawn:
                lines.extend([drawn, ""])
    if report.diff:
        lines.extend(["**Suggested change**", "", "```diff", report.diff.rstrip("\n"), "```", ""])
    return "\n".join(lines)


def _bounds(c: Confirmed) -> dict[str, object]:
    """The intervals `--post` sends (absent without one: unknown is not a zero-width interval)."""
    out: dict[str, object] = {"undecided": list(c.undecided)}
    if c.ttft_p99 is not None and c.ttft_p99.n > 1:
        out.update(ttft_p99_low_ms=c.ttft_p99.low, ttft_p99_high_ms=c.ttft_p99.high)
    if c.share is not None and c.share.n > 1:
        out.update(ttft_share_low=c.share.low, ttft_share_high=c.share.high)
    return out


def document(report: Report, revision: str, found: bool) -> dict[str, object]:
    """The suggestion as `plan --suggest --post` sends it (llmgw.core.api.suggestions.SuggestionBody): the
    replayed candidates, the first the suggestion when the search found one, and the report's text."""
    candidates = [
        {
            "name": _name(i),
            "configuration": _profiles(c, report.busiest),
            "chosen": i == 0 and report.result.best is not None,
            "cost_per_hour": c.candidate.cost_per_hour,
            "ttft_p99_ms": c.ttft_p99_ms,
            "ttft_share": c.ttft_share,
            "tpot_p99_ms": c.tpot_p99_ms,
            "availability": c.availability,
            "met": c.met,
            "missed": list(c.missed),
            **_bounds(c),
        }
        for i, c in enumerate(report.replayed)
    ]
    return {
        "revision": revision,
        "objective": report.objective,
        "currency": report.currency,
        "busiest_hour": report.busiest,
        "found": found,
        "method": _method(report),
        "replay": report.replay_words,
        "candidates": candidates,
        "text": render_text(report),
    }
