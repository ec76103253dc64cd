"""The engine model's own error in every interval: two replays more, every cost of the pooled fits MODEL_SLOWER
higher and MODEL_FASTER lower. The passes measure how the engine's speed moves, not how far the model is from the
engine serving traffic: on vLLM's CPU build the engine serving a trace was 6-13 % slower than its bench's model,
and at 80 % of capacity a p50 of 837 ms fell outside an interval of [326, 690] built from passes that agreed to
±4 %."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gitops.test_replay_cli import write_repo
from gitops.test_replay_uncertainty import FIGURE, simulate, spread_files, with_passes
from llmgw.core.capacity.engine_model import EngineModel
from llmgw.core.capacity.engine_spread import at_speed
from llmgw.core.capacity.replay_gate import Figures
from llmgw.core.capacity.replay_spread import MODEL_FASTER, MODEL_SLOWER, figure_spread

__all__ = ["spread_files"]  # the fixture, shared


def test_the_replays_at_the_models_error_widen_an_interval_the_passes_left_narrow() -> None:
    central = Figures("chat", 10, 10, {}, 100.0, 400.0, 0.5)
    passes = [Figures("chat", 10, 10, {}, 99.0, 396.0, 0.5), Figures("chat", 10, 10, {}, 101.0, 404.0, 0.5)]
    narrow = figure_spread(central, passes)
    assert narrow.p50 is not None and narrow.p50.high < 120.0
    bounds = [Figures("chat", 10, 10, {}, 135.0, 600.0, 0.5), Figures("chat", 10, 10, {}, 80.0, 330.0, 0.5)]
    wide = figure_spread(central, passes, bounds=bounds)
    assert wide.p50 is not None and wide.p99 is not None
    assert (wide.p50.low, wide.p50.mid, wide.p50.high) == (80.0, 100.0, 135.0)
    assert (wide.p99.low, wide.p99.high) == (330.0, 600.0)
    # A bound the replay could not give (no requests of that model) leaves the interval as the passes made it.
    assert figure_spread(central, passes, bounds=[None, None]).p50 == narrow.p50


def test_at_speed_moves_every_cost_and_keeps_the_shares() -> None:
    model = EngineModel(0.5, ((1.0, 10.0), (4.0, 14.0)), 4, True, (), 20.0, 0.8, 0.1, 0.001)
    slow = at_speed(model, 1 + MODEL_SLOWER, 1 + MODEL_SLOWER)
    assert slow.prefill_ms(300) == pytest.approx(model.prefill_ms(300) * 1.15)
    assert slow.itl(4) == pytest.approx(model.itl(4) * 1.15)
    assert (slow.exclusive, slow.contention, slow.capacity) == (0.8, 0.1, 4)


def test_passes_that_agree_exactly_still_give_an_interval_the_models_error(
    spread_files: dict[str, Path],
) -> None:
    # Three passes at one speed: the passes alone would make every interval a point.
    spread_files["capacity"].write_text(json.dumps(with_passes((1.0, 1.0, 1.0))))
    code, out, err = simulate(spread_files, write_repo(spread_files["root"] / "same", 2))
    assert code == 0, (out, err)
    said = f"the model's own error, every cost +{MODEL_SLOWER:.0%} and -{MODEL_FASTER:.0%}"
    assert said in out, out
    rows = FIGURE.findall(out)
    assert [r[0] for r in rows] == ["current", "planned"], out
    for _, p50, p50_low, p50_high, p99, low, high in rows:
        assert int(p50_low) < int(p50) < int(p50_high), out
        assert int(low) < int(p99) < int(high), out
