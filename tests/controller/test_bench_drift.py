"""`llmgw bench --repeats`: every fitted parameter with its interval over the passes, and the drift check that
refuses to fit through an engine whose speed moved. The statistics are pure (checked against values worked
by hand); the passes and the probes run against a real sim engine, in this process so the test can slow it
down between the start probe and the first pass, as a neighbour's load slows an engine on a shared machine."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from dataclasses import asdict, replace
from typing import Any

import pytest
from aiohttp import web
from llmgw_agent.sim import SimEngine
from llmgw_agent.sim_model import LatencyConfig
from support import wait_for

from llmgw.cli.data.bench_passes import PROBE_REQUESTS, bench_result, run_bench_passes, spread_lines
from llmgw.core.capacity.engine_model import fit_engine_model
from llmgw.core.capacity.engine_spread import PARAMETERS, fit_engine_spread, pass_curves
from llmgw.core.capacity.spread import judge_drift, mean_interval, prediction_interval, t_quantile

# ------------------------------------------------------------------------------------------------ pure


def test_the_mean_interval_is_students_t_over_the_repeats() -> None:
    # 10, 12, 14: mean 12, s = 2, n = 3; 90 % two-sided t with 2 degrees of freedom is 2.920.
    i = mean_interval([10.0, 12.0, 14.0])
    assert (i.mid, i.n) == (12.0, 3)
    assert i.high - i.mid == pytest.approx(2.920 * 2 / math.sqrt(3), rel=1e-6)
    assert i.mid - i.low == pytest.approx(i.high - i.mid)
    assert mean_interval([5.0]).low == mean_interval([5.0]).high == 5.0  # one repeat: a point, said n=1
    assert t_quantile(2, 0.95) == 4.303 and t_quantile(11, 0.95) == 2.228  # between rows: the wider
    assert t_quantile(1000) == 1.645
    with pytest.raises(ValueError, match="at least 1"):
        t_quantile(0)
    with pytest.raises(ValueError, match="no values"):
        mean_interval([])


def test_the_prediction_interval_is_wider_than_the_mean_and_has_a_floor() -> None:
    ratios = [0.9, 1.0, 1.1]
    logs = [math.log(r) for r in ratios]
    sd = math.sqrt(sum((x - sum(logs) / 3) ** 2 for x in logs) / 2)
    p = prediction_interval(ratios)
    assert math.log(p.high / p.mid) == pytest.approx(2.920 * sd * math.sqrt(1 + 1 / 3), rel=1e-6)
    # Three passes that agree exactly do not make the engine steadier than the floor says.
    steady = prediction_interval([1.0, 1.0, 1.0], floor=0.1)
    assert steady.high == pytest.approx(1.1) and steady.low == pytest.approx(1 / 1.1)


def test_drift_is_a_move_past_the_limit_with_the_probes_apart() -> None:
    start = [100.0, 104.0, 98.0, 101.0, 99.0, 103.0]
    slower = [130.0, 128.0, 135.0, 129.0, 131.0, 140.0]
    moved = judge_drift(start, slower)
    assert moved.drifted and moved.change == pytest.approx(130.5 / 100.5 - 1)
    assert "drifted" in moved.words() and "+30%" in moved.words()
    # Apart but within the limit: a steady engine on a busy machine.
    assert not judge_drift(start, [110.0, 112.0, 111.0, 113.0, 115.0, 109.0]).drifted
    # Past the limit by the median, but one slow request at the start makes the probes overlap: noise.
    assert not judge_drift([*start[:5], 150.0], slower).drifted
    assert judge_drift(slower, start).drifted  # faster counts too: the fit would describe neither end
    with pytest.raises(ValueError, match="measured nothing"):
        judge_drift([], slower)


def _curve(scale: float, repeat: int | None) -> list[dict[str, Any]]:
    """A bench's steps with every cost times `scale` (a pass on a slower or faster moment)."""
    steps = [
        (1, "ladder", 128.0, 64.0, 10.0),
        (1, "short", 32.0, 16.0, 10.0),
        (2, "ladder", 128.0, 70.0, 11.0),
    ]
    out = []
    for n, role, prompt, ttft, itl in steps:
        requests = 48 if n == 2 else 40
        out.append(
            {
                "concurrency": n,
                "requests": requests,
                "failed": 0,
                "seconds": 9.984 * scale,
                "ttft_p50_ms": ttft * scale,
                "itl_p50_ms": itl * scale,
                "tokens_per_s": (158.654 if n == 2 else 132.0) / scale,
                "prompt_tokens": prompt,
                "role": role,
                "repeat": repeat,
            }
        )
    return out


def test_each_pass_is_fitted_alone_and_every_parameter_gets_its_interval() -> None:
    scales = (0.9, 1.0, 1.2)
    measured = {
        "concurrency": 2,
        "curve": _curve(1.0, None) + [s for k, f in enumerate(scales) for s in _curve(f, k + 1)],
    }
    spread = fit_engine_spread(measured, 2, "chat/sim")
    assert spread.known and len(spread.passes) == 3 and set(spread.parameters) == set(PARAMETERS)
    # The pooled fit is exactly what the replay used before: the passes' steps do not enter it.
    assert spread.central == fit_engine_model({"concurrency": 2, "curve": _curve(1.0, None)}, 2, "chat/sim")
    per_token = spread.parameters["prefill_ms_per_token"]
    assert [round(m.prefill_ms_per_token, 4) for m in spread.passes] == [0.45, 0.5, 0.6]
    assert (
        per_token.mid == pytest.approx(sum((0.45, 0.5, 0.6)) / 3)
        and per_token.low < 0.45 < 0.6 < per_token.high
    )
    decode = spread.parameters["decode_ms_per_token"]
    assert decode.low < 9.0 and decode.high > 12.0
    assert sorted(pass_curves(measured["curve"])) == [1, 2, 3]
    # Without passes, no spread: unknown, not zero.
    assert not fit_engine_spread({"concurrency": 2, "curve": _curve(1.0, None)}, 2, "chat/sim").known


# ------------------------------------------------------------------------------------------------ a real sim


@pytest.fixture
async def sim() -> AsyncIterator[tuple[SimEngine, dict[str, Any]]]:
    engine = SimEngine(
        "sim-drift", LatencyConfig(prefill_ms_per_token=1.0, decode_ms_per_token=4.0, max_concurrency=2), None
    )
    runner = web.AppRunner(engine.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    target = {
        "model": "sim-drift",
        "base_url": f"http://127.0.0.1:{port}",
        "api_key": "none",
        "profile": "sim",
        "replica": "sim-drift-1",
        "engine": "sim",
    }
    yield engine, target
    await runner.cleanup()


async def test_a_steady_engine_is_fitted_per_pass_with_intervals(
    sim: tuple[SimEngine, dict[str, Any]],
) -> None:
    _, target = sim
    run = await run_bench_passes(target, [1, 2], 0.3, 16, 8, None, 3)
    assert run.drift is not None and not run.drift.drifted, run.drift
    assert [len(p) for p in run.passes] == [4, 4, 4]  # c1, short, long, c2: the first pass's steps, thrice
    assert {s.repeat for p in run.passes for s in p} == {1, 2, 3}
    pooled = {(s.concurrency, s.role): s.requests for s in run.measured.curve}
    for step in run.measured.curve:  # the pooled step holds every pass's requests of it
        assert step.repeat is None
        assert step.requests == sum(
            s.requests
            for p in run.passes
            for s in p
            if (s.concurrency, s.role) == (step.concurrency, step.role)
        )
    assert set(pooled) == {(1, "ladder"), (1, "short"), (1, "long"), (2, "ladder")}
    result = bench_result(target, None, run)
    lines = spread_lines(result, run.drift)
    assert "held" in lines[0] and any(
        "confidence interval of the mean over 3 passes" in line for line in lines
    )
    decode = next(line for line in lines if "decode per token (alone)" in line)
    assert "[" in decode, lines
    spread = fit_engine_spread(result, None, "sim-drift/sim")
    assert spread.known and spread.parameters["decode_ms_per_token"].n == 3


async def test_an_engine_that_slows_mid_bench_is_called_drifted_and_not_fitted(
    sim: tuple[SimEngine, dict[str, Any]],
) -> None:
    engine, target = sim

    async def slow_down_after_the_start_probe() -> None:
        # The warm-up request and the start probe: then the engine runs three times slower (its neighbour
        # started a compile, say) until the end.
        probed = 1 + PROBE_REQUESTS
        await wait_for(
            lambda: engine.stats.requests_finished >= probed, 60, "the start probe", interval=0.005
        )
        engine.cfg = replace(engine.cfg, prefill_ms_per_token=3.0, decode_ms_per_token=12.0)

    slowing = asyncio.create_task(slow_down_after_the_start_probe())
    run = await run_bench_passes(target, [1], 0.3, 16, 8, None, 2)
    await slowing
    assert run.drift is not None and run.drift.drifted, run.drift
    assert run.drift.change > 0.5  # the end probe's requests took far longer than the start's
    lines = spread_lines(bench_result(target, None, run), run.drift)
    assert "drifted" in lines[0] and lines[1].startswith("not fitted")
    assert not any("confidence interval" in line for line in lines)
    assert asdict(run.drift)["drifted"] is True  # what `--json` prints
