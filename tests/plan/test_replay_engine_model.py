"""The engine model read from a bench curve: interpolation, extrapolation, and the words for what is assumed."""

from __future__ import annotations

import pytest

from llmgw.core.engine_model import ASSUMED_SLOTS, assumed_model, fit_engine_model

MEASURED = {
    "prefill_ms_per_token": 0.5,
    "decode_ms_per_token": 10.0,
    "concurrency": 2,
    "curve": [
        {"concurrency": 1, "requests": 20, "failed": 0, "ttft_p50_ms": 64.0, "itl_p50_ms": 10.0},
        {"concurrency": 2, "requests": 20, "failed": 0, "ttft_p50_ms": 80.0, "itl_p50_ms": 12.0},
        {"concurrency": 4, "requests": 20, "failed": 0, "ttft_p50_ms": 120.0, "itl_p50_ms": 16.0},
        {"concurrency": 8, "requests": 20, "failed": 20, "ttft_p50_ms": None, "itl_p50_ms": None},
    ],
}


def test_ttft_is_contention_from_the_curve_plus_the_prompts_prefill() -> None:
    m = fit_engine_model(MEASURED, None, "m/p")
    assert m.measured and m.assumptions == ()
    assert m.ttft(1, 128) == pytest.approx(64.0)  # 0.5 ms x 128 tokens, nothing to wait for
    assert m.ttft(2, 128) == pytest.approx(80.0)
    assert m.ttft(3, 128) == pytest.approx(64.0 + 36.0)  # halfway between the steps 2 and 4
    assert m.ttft(1, 256) == pytest.approx(128.0)
    # Past the last step served (8 failed): along the last segment's slope, 20 ms per request.
    assert m.ttft(6, 128) == pytest.approx(64.0 + 56.0 + 40.0)
    assert m.itl(3) == pytest.approx(14.0) and m.itl(16) == pytest.approx(16.0)
    assert m.duration(1, 128, 11) == pytest.approx((64.0, 64.0 + 10 * 10.0))
    assert m.capacity == 2  # the concurrency that met the objective, with no slots declared


def test_declared_slots_are_the_capacity() -> None:
    assert fit_engine_model(MEASURED, 6, "m/p").capacity == 6


def test_no_measurement_is_assumed_and_says_so() -> None:
    m = fit_engine_model(None, None, "gemma/cpu")
    assert not m.measured and m.capacity == ASSUMED_SLOTS
    (words,) = m.assumptions
    assert words.startswith(
        "gemma/cpu: not measured (`llmgw bench MODEL --profile P --save`): assumed prefill"
    )
    assert f"(no slots declared: {ASSUMED_SLOTS} assumed)" in words
    assert m.ttft(ASSUMED_SLOTS, 100) == m.ttft(1, 100)  # flat: no slowdown is invented either
    assert assumed_model(2, "x").capacity == 2


def test_a_measurement_without_prefill_keeps_its_first_ttft_as_a_fixed_cost() -> None:
    partial = {"curve": [{"concurrency": 1, "requests": 3, "failed": 0, "ttft_p50_ms": 40.0}]}
    m = fit_engine_model(partial, 2, "m/p")
    assert m.ttft(1, 10) == m.ttft(1, 1000) == pytest.approx(40.0)
    assert any("prompt's length is not modelled" in a for a in m.assumptions)
    assert any("no inter-token latency measured" in a for a in m.assumptions)


def test_requests_per_second_at_capacity() -> None:
    m = fit_engine_model(MEASURED, 4, "m/p")
    _, ms = m.duration(4, 128, 64)
    assert m.requests_per_s(128, 64) == pytest.approx(4000.0 / ms)
