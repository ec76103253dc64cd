"""A bench pass's model is the pooled fit at that pass's speed, not a fit of its own four short steps.

The curve below is llama.cpp's gemma-3-270m as `benchmarks/replay_fidelity.py` benched it on this 2-core machine
(2026-12-06, three passes, a helper's tests beside it): the passes' own figures move by a tenth, apart from
one stalled step in each of two passes (2.6 s and 1.7 s TTFTs of four requests). Fitting each pass's seven
parameters afresh put the prefill's fixed cost anywhere in [0, 354] ms and printed the engine's speed as
spreading ±854 %; the pass's speed read as medians of its steps over the pooled ones does not move with one
stalled step."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.core.capacity.engine_model import fit_engine_model
from llmgw.core.capacity.engine_spread import at_pass_speed, fit_engine_spread


def _step(
    concurrency: int,
    role: str,
    prompt: int,
    requests: int,
    seconds: float,
    ttft: float,
    itl_mean: float,
    tokens_per_s: float,
    repeat: int | None,
) -> dict[str, Any]:
    return {
        "concurrency": concurrency,
        "role": role,
        "prompt_tokens": float(prompt),
        "requests": requests,
        "failed": 0,
        "seconds": seconds,
        "ttft_p50_ms": ttft,
        "itl_p50_ms": 12.0 * concurrency,
        "itl_mean_ms": itl_mean,
        "tokens_per_s": tokens_per_s,
        "repeat": repeat,
    }


CURVE = [
    _step(1, "ladder", 105, 76, 24.7, 164.2, 12.5, 24.6, None),
    _step(1, "short", 47, 79, 31.9, 89.2, 30.3, 19.8, None),
    _step(1, "long", 201, 30, 31.6, 330.7, 43.2, 7.6, None),
    _step(2, "ladder", 105, 32, 27.1, 666.4, 66.0, 9.4, None),
    _step(1, "ladder", 105, 31, 8.2, 164.4, 11.1, 30.3, 1),
    _step(1, "short", 47, 10, 15.2, 291.1, 146.7, 5.3, 1),
    _step(1, "long", 201, 8, 12.6, 352.7, 97.6, 5.1, 1),
    _step(2, "ladder", 105, 12, 8.3, 369.1, 51.5, 11.6, 1),
    _step(1, "ladder", 105, 11, 8.5, 187.3, 27.8, 10.4, 2),
    _step(1, "short", 47, 50, 8.0, 89.2, 9.1, 50.0, 2),
    _step(1, "long", 201, 18, 10.1, 325.5, 17.6, 14.2, 2),
    _step(2, "ladder", 105, 4, 9.1, 2580.3, 159.1, 3.5, 2),
    _step(1, "ladder", 105, 34, 8.0, 162.3, 8.9, 33.9, 3),
    _step(1, "short", 47, 19, 8.7, 80.0, 24.7, 17.4, 3),
    _step(1, "long", 201, 4, 8.8, 1731.4, 49.9, 3.6, 3),
    _step(2, "ladder", 105, 16, 9.6, 354.5, 53.7, 13.3, 3),
]
MEASURED = {"concurrency": 1, "prefill_ms_per_token": 1.29, "decode_ms_per_token": 12.0, "curve": CURVE}


def test_each_pass_is_the_pooled_fit_at_its_speed() -> None:
    spread = fit_engine_spread(MEASURED, 2, "gemma/gemma")
    central = spread.central
    assert spread.known and len(spread.passes) == 3
    for one in spread.passes:
        # The shape is the pooled fit's; only the speed moves: every prefill cost by one factor, the gaps by
        # another, the shares not at all.
        factor = one.prefill_ms_per_token / central.prefill_ms_per_token
        assert one.fixed_ms == pytest.approx(central.fixed_ms * factor)
        assert (one.exclusive, one.contention, one.capacity) == (
            central.exclusive,
            central.contention,
            central.capacity,
        )
        gaps = {at: ms / base for (at, ms), (_, base) in zip(one.itl_ms, central.itl_ms, strict=True)}
        assert len(set(round(g, 9) for g in gaps.values())) == 1
    # Each pass's prefill factor is the median of its three concurrency-1 steps over the pooled ones: pass 1's
    # stalled short step (291 ms against 89) and pass 3's stalled long one (1731 against 331) do not count.
    prefill = [one.prefill_ms_per_token / central.prefill_ms_per_token for one in spread.passes]
    assert prefill == pytest.approx([352.7 / 330.7, 89.2 / 89.2, 162.3 / 164.2])
    fixed = spread.parameters["prefill_fixed_ms"]
    assert central.fixed_ms > 0 and fixed.high - fixed.low < 0.5 * central.fixed_ms, fixed


def test_the_gaps_follow_the_ladders_mean_gaps_and_a_pass_with_no_step_beside_a_pooled_one_has_no_speed() -> (
    None
):
    pooled = [s for s in CURVE if s["repeat"] is None]
    central = fit_engine_model(MEASURED, 2, "gemma/gemma")
    pass_two = [s for s in CURVE if s["repeat"] == 2]
    slow = at_pass_speed(central, pooled, pass_two)
    assert slow is not None
    # Its ladder's mean gaps over the pooled ladder's: 27.8/12.5 and 159.1/66.0, their median.
    expected = (27.8 / 12.5 + 159.1 / 66.0) / 2
    assert slow.itl(1) == pytest.approx(central.itl(1) * expected)
    # A pass measured only where nothing pooled was (another concurrency) tells no speed: no model for it.
    assert at_pass_speed(central, pooled, [{**pass_two[0], "concurrency": 4}]) is None
