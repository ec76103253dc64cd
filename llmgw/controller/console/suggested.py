"""The plan page's suggested fleet (`llmgw plan --suggest --post`): the chart the PR comment draws with Mermaid,
drawn here as SVG on the server (no script, so it reads the same with JavaScript off): each replayed
candidate's cost per hour against its worst p99 TTFT as a share of its objective, the objective's line at
100 %, the suggestion marked, each candidate's interval over the bench's passes a bar through its point
(where a spread was measured). The template (plan.html) draws these coordinates; the table beside it says the
same in words. Pure: a posted suggestion in, the figure's geometry out."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from llmgw.core.api.suggestions import PostedSuggestion, SuggestedCandidate

__all__ = ["HEIGHT", "WIDTH", "Chart", "Point", "Tick", "chart"]

WIDTH, HEIGHT = 640, 300
LEFT, RIGHT, TOP, BOTTOM = 72, 24, 20, 48  # room for the axes' ticks and titles
SLO_SHARE = 1.0  # the objective itself: a share of 1


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    candidate: SuggestedCandidate
    words: str  # its tooltip: name, cost, share (and its interval)
    low_y: float | None = (
        None  # the share's interval as a bar from here to `high_y` (None: no spread measured)
    )
    high_y: float | None = None

    @property
    def state(self) -> str:
        """met, missed or undecided: its colour."""
        if self.candidate.met:
            return "met"
        return "missed" if self.candidate.missed else "undecided"


@dataclass(frozen=True)
class Tick:
    at: float  # pixels along its axis
    label: str


@dataclass(frozen=True)
class Chart:
    points: list[Point]
    slo_y: float
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    left: float
    right: float
    top: float
    bottom: float
    undrawn: list[str]  # candidates with no TTFT objective, so no share to place (the table has them)


def _step(top: float) -> float:
    """A round tick step giving about four ticks up to `top`."""
    raw = top / 4
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= raw)


def _ticks(top: float, at: float, span: float, unit: str, *, upward: bool) -> list[Tick]:
    step = _step(top)
    out, value = [], 0.0
    while value <= top + 1e-9:
        offset = value / top * span
        out.append(Tick(at - offset if upward else at + offset, f"{value:g}{unit}"))
        value += step
    return out


def _between(c: SuggestedCandidate) -> str:
    if c.ttft_share_low is None or c.ttft_share_high is None:
        return " (no spread measured)"
    return f" [{100 * c.ttft_share_low:.0f}, {100 * c.ttft_share_high:.0f} %]"


def _bar(c: SuggestedCandidate, y_of: Callable[[float], float]) -> tuple[float | None, float | None]:
    if c.ttft_share_low is None or c.ttft_share_high is None:
        return None, None
    return y_of(100 * c.ttft_share_low), y_of(100 * c.ttft_share_high)


def chart(posted: PostedSuggestion) -> Chart:
    s = posted.suggestion
    placed = [c for c in s.candidates if c.ttft_share is not None]
    x_top = max([c.cost_per_hour for c in s.candidates] + [0.01]) * 1.15
    y_top = max([100 * (c.ttft_share_high or c.ttft_share or 0) for c in placed] + [100]) * 1.2
    left, right, top, bottom = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
    width, height = right - left, bottom - top

    def y_of(percent: float) -> float:
        return bottom - percent / y_top * height

    points = [
        Point(
            left + c.cost_per_hour / x_top * width,
            y_of(100 * (c.ttft_share or 0)),
            c,
            f"{c.name}: {c.cost_per_hour:.2f} {s.currency}/h, p99 TTFT {100 * (c.ttft_share or 0):.0f} % "
            f"of its objective{_between(c)}",
            *_bar(c, y_of),
        )
        for c in placed
    ]
    return Chart(
        points=points,
        slo_y=y_of(100 * SLO_SHARE),
        x_ticks=_ticks(x_top, left, width, "", upward=False),
        y_ticks=_ticks(y_top, bottom, height, " %", upward=True),
        left=left,
        right=right,
        top=top,
        bottom=bottom,
        undrawn=[c.name for c in s.candidates if c.ttft_share is None],
    )
