"""The engine model read from a bench curve: the fit recovers the parameters that generated a curve, the run
(`llmgw.core.capacity.engine_run`) does what the equations say, and what is assumed is said."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from llmgw.core.capacity.engine_model import (
    ASSUMED_SLOTS,
    EngineModel,
    assumed_model,
    closed_loop_per_ms,
    fit_engine_model,
)
from llmgw.core.capacity.engine_run import EngineRun, RunEvent


def _curve(
    fixed: float,
    per_token: float,
    share: float,
    itl: dict[int, float],
    long: int,
    completion: int,
    contention: float = 0.0,
) -> dict[str, Any]:
    """What `llmgw bench --save` would store for an engine that is exactly the model with these parameters:
    the ladder at `long` prompt tokens, the short step at a quarter of it, each step 30 s long; the gaps'
    p50 is half their mean (a tail of stalls, as on a busy CPU): the mean is what a completion costs."""
    seconds = 30.0
    steps = []
    for n, gap in sorted(itl.items()):
        prefill = fixed + per_token * long
        stretched = prefill * (1 + contention * (n - 1))  # a closed loop's prefills start beside n - 1 others
        per_s = 1000.0 * closed_loop_per_ms(n, stretched, (completion - 1) * gap, share)
        requests = per_s * seconds  # not rounded to a whole count: so the recovery can be exact
        steps.append(
            {
                "concurrency": n,
                "requests": requests,
                "failed": 0,
                "seconds": seconds,
                "ttft_p50_ms": prefill if n == 1 else prefill * 2,
                "itl_p50_ms": gap / 2,
                "itl_mean_ms": gap,
                "tokens_per_s": requests * completion / seconds,
                "prompt_tokens": float(long),
            }
        )
    short = long // 4
    steps.append(
        {
            "concurrency": 1,
            "requests": 40,
            "failed": 0,
            "seconds": seconds,
            "ttft_p50_ms": fixed + per_token * short,
            "itl_p50_ms": itl[1],
            "tokens_per_s": 10.0,
            "prompt_tokens": float(short),
        }
    )
    return {
        "concurrency": max(itl),
        "prefill_ms_per_token": None,
        "decode_ms_per_token": itl[1],
        "curve": steps,
    }


@settings(max_examples=60, deadline=None)
@given(
    fixed=st.floats(0.0, 200.0),
    per_token=st.floats(0.05, 20.0),
    share=st.floats(0.0, 1.0),
    itl1=st.floats(2.0, 60.0),
    growth=st.floats(0.0, 1.0),
    long=st.integers(64, 2048),
    completion=st.integers(8, 256),
)
def test_the_fit_recovers_the_parameters_that_made_the_curve(
    fixed: float, per_token: float, share: float, itl1: float, growth: float, long: int, completion: int
) -> None:
    itl = {1: itl1, 2: itl1 * (1 + growth), 4: itl1 * (1 + 3 * growth)}
    m = fit_engine_model(_curve(fixed, per_token, share, itl, long, completion), None, "m/p")
    assert m.measured and m.assumptions == ()
    assert m.prefill_ms_per_token == pytest.approx(per_token, rel=1e-6)
    assert m.fixed_ms == pytest.approx(fixed, rel=1e-6, abs=1e-6)
    assert [m.itl(k) for k in (1, 2, 4)] == pytest.approx([itl[1], itl[2], itl[4]])
    assert m.exclusive == pytest.approx(share, abs=1e-6) and m.contention == pytest.approx(0.0, abs=1e-6)
    assert m.capacity == 4


@settings(max_examples=40, deadline=None)
@given(
    per_token=st.floats(0.05, 20.0),
    contention=st.floats(0.0, 2.0),
    long=st.integers(64, 2048),
    completion=st.integers(8, 256),
)
def test_a_replica_slower_than_wholly_exclusive_prefills_is_fitted_a_contention(
    per_token: float, contention: float, long: int, completion: int
) -> None:
    itl = {1: 20.0, 2: 30.0, 4: 50.0}
    m = fit_engine_model(_curve(40.0, per_token, 1.0, itl, long, completion, contention), None, "m/p")
    assert m.exclusive == pytest.approx(1.0) and m.contention == pytest.approx(contention, abs=1e-6)
    # The model then completes what the bench did at its top step.
    prefill = 40.0 + per_token * long
    top = closed_loop_per_ms(4, prefill * (1 + 3 * contention), (completion - 1) * 50.0, 1.0)
    assert m.requests_per_s(long, completion) == pytest.approx(1000.0 * top, rel=1e-6)
    assert m.prefill_ms(long) == pytest.approx(prefill)  # alone, a prefill is not stretched


@settings(max_examples=60, deadline=None)
@given(
    share=st.floats(0.3, 1.0),
    own=st.floats(1.0, 1.5),
    long=st.integers(64, 1024),
    completion=st.integers(8, 128),
)
def test_the_other_requests_prefills_in_the_gaps_are_fitted_as_the_exclusive_share(
    share: float, own: float, long: int, completion: int
) -> None:
    """An engine whose prefills hold the replica (one batch at a time): above concurrency 1 a stream's span
    also holds the others' prefills, so its mean gap is far above its p50. The fit takes the decode from the
    p50 (times the engine's own jitter, measured alone) and gets the share back from what the step completed;
    from the means it put the stalls in the decode and the share near zero (0.07 on vLLM's CPU build here)."""
    itl = {1: 12.0, 2: 13.0, 4: 14.0}  # the decode step, k sequences
    prefill = 20.0 + 0.4 * long
    curve = _curve(20.0, 0.4, share, itl, long, completion)
    for step in curve["curve"]:
        if step.get("role") is None:
            n = step["concurrency"]
            step["itl_p50_ms"] = itl[n] / own  # the median gap misses the engine's own stalls
            # A completion's span: its own tokens, plus the n - 1 others' exclusive prefills of its cycle.
            step["itl_mean_ms"] = itl[n] + (n - 1) * share * prefill / (completion - 1)
    m = fit_engine_model(curve, None, "m/p")
    assert [m.itl(k) for k in (1, 2, 4)] == pytest.approx([itl[1], itl[2], itl[4]])
    assert m.exclusive == pytest.approx(share, abs=1e-6) and m.contention == pytest.approx(0.0, abs=1e-6)


def test_itl_interpolates_between_the_steps_and_stays_at_the_last() -> None:
    m = fit_engine_model(_curve(10.0, 1.0, 0.5, {1: 10.0, 2: 12.0, 4: 16.0}, 256, 32), None, "m/p")
    assert m.itl(3) == pytest.approx(14.0) and m.itl(16) == pytest.approx(16.0) and m.itl(0) == 10.0


def test_a_curve_of_old_benches_keeps_its_per_token_prefill_and_says_what_it_lacks() -> None:
    old = {
        "prefill_ms_per_token": 0.5,
        "decode_ms_per_token": 10.0,
        "concurrency": 2,
        "curve": [
            {"concurrency": 1, "requests": 20, "failed": 0, "ttft_p50_ms": 64.0, "itl_p50_ms": 10.0},
            {"concurrency": 2, "requests": 20, "failed": 0, "ttft_p50_ms": 80.0, "itl_p50_ms": 12.0},
            {"concurrency": 8, "requests": 20, "failed": 20, "ttft_p50_ms": None, "itl_p50_ms": None},
        ],
    }
    m = fit_engine_model(old, None, "m/p")
    assert (m.fixed_ms, m.prefill_ms_per_token, m.exclusive, m.capacity) == (0.0, 0.5, 0.0, 2)
    assert m.itl(8) == 12.0  # the step that failed says nothing
    (words,) = m.assumptions
    assert words == (
        "m/p: no step above concurrency 1 says what it completed: prefills assumed not to hold up the other slots"
    )


def test_declared_slots_are_the_capacity() -> None:
    assert fit_engine_model(_curve(0, 1, 0, {1: 5.0, 2: 6.0}, 100, 10), 6, "m/p").capacity == 6


def test_no_measurement_is_assumed_and_says_so() -> None:
    m = fit_engine_model(None, None, "gemma/cpu")
    assert not m.measured and m.capacity == ASSUMED_SLOTS
    (words,) = m.assumptions
    assert words.startswith(
        "gemma/cpu: not measured (`llmgw bench MODEL --profile P --save`): assumed prefill"
    )
    assert f"(no slots declared: {ASSUMED_SLOTS} assumed)" in words
    assert m.itl(ASSUMED_SLOTS) == m.itl(1) and m.exclusive == 0.0  # flat: no slowdown is invented either
    assert assumed_model(2, "x").capacity == 2


def test_a_measurement_without_prefill_keeps_its_first_ttft_as_a_fixed_cost() -> None:
    partial = {"curve": [{"concurrency": 1, "requests": 3, "failed": 0, "ttft_p50_ms": 40.0}]}
    m = fit_engine_model(partial, 2, "m/p")
    assert m.prefill_ms(10) == m.prefill_ms(1000) == pytest.approx(40.0)
    assert any("prompt's length is not modelled" in a for a in m.assumptions)
    assert any("no inter-token latency measured" in a for a in m.assumptions)


# ------------------------------------------------------------------------------------------------ the run


def _model(share: float, itl: tuple[tuple[float, float], ...] = ((1.0, 10.0), (2.0, 15.0))) -> EngineModel:
    return EngineModel(prefill_ms_per_token=1.0, itl_ms=itl, capacity=2, measured=True, exclusive=share)


def _all(run: EngineRun) -> list[RunEvent]:
    run.advance(1e12)
    return run.take()


def test_side_by_side_prefills_do_not_wait_for_each_other() -> None:
    run = EngineRun(_model(0.0))
    run.add(0.0, 1, 100, 3)
    run.add(0.0, 2, 100, 3)
    # Both prefill 100 ms, then decode 2 tokens at 15 ms each (two decoding).
    assert _all(run) == [
        RunEvent(1, "first", 100.0),
        RunEvent(2, "first", 100.0),
        RunEvent(1, "end", 130.0),
        RunEvent(2, "end", 130.0),
    ]


def test_an_exclusive_prefill_queues_and_stalls_the_sequence_decoding() -> None:
    run = EngineRun(_model(1.0))
    run.add(0.0, 1, 100, 5)  # first token at 100, then 4 tokens at 10 ms alone
    run.add(110.0, 2, 50, 2)  # arrives after one of them: its prefill holds the replica until 160
    events = _all(run)
    assert events[:2] == [RunEvent(1, "first", 100.0), RunEvent(2, "first", 160.0)]
    # 1 had 3 tokens left at 110; stalled to 160; then both decode at 15 ms: 2 ends at 175 with its one.
    assert events[2] == RunEvent(2, "end", pytest.approx(175.0))  # type: ignore[arg-type]
    # 1: one more token by 175, then alone at 10 ms for the last 2: 175 + 20 = 195.
    assert events[3] == RunEvent(1, "end", pytest.approx(195.0))  # type: ignore[arg-type]
    assert run.sequences == 0 and run.next_ms() is None


def test_two_exclusive_prefills_arriving_together_go_one_after_the_other() -> None:
    run = EngineRun(_model(1.0))
    run.add(0.0, 1, 100, 1)
    run.add(0.0, 2, 100, 1)
    assert _all(run) == [
        RunEvent(1, "first", 100.0),
        RunEvent(1, "end", 100.0),
        RunEvent(2, "first", 200.0),
        RunEvent(2, "end", 200.0),
    ]


def test_a_prefill_that_starts_beside_another_sequence_is_stretched_by_the_contention() -> None:
    contended = EngineModel(1.0, ((1.0, 10.0), (2.0, 15.0)), 2, True, exclusive=1.0, contention=0.5)
    run = EngineRun(contended)
    run.add(0.0, 1, 100, 1)  # alone: 100 ms
    run.add(0.0, 2, 100, 1)  # beside the first: 150 ms, after it
    assert _all(run) == [
        RunEvent(1, "first", 100.0),
        RunEvent(1, "end", 100.0),
        RunEvent(2, "first", 250.0),
        RunEvent(2, "end", 250.0),
    ]


@settings(max_examples=40, deadline=None)
@given(share=st.floats(0.0, 1.0), prefill=st.floats(10.0, 2000.0), completion=st.integers(2, 200))
def test_a_closed_loop_on_the_run_completes_about_what_the_fit_assumes(
    share: float, prefill: float, completion: int
) -> None:
    """The fit solves the closed-loop rate for the share; the run, driven the way the bench drives an
    engine (two requests always in flight), must complete within a tenth of that rate."""
    model = EngineModel(prefill, ((1.0, 10.0), (2.0, 12.0)), 2, True, exclusive=share)
    run, key, ends = EngineRun(model), 0, 0
    for _ in range(2):
        run.add(0.0, key := key + 1, 1, completion)
    while ends < 200:
        at = run.next_ms()
        assert at is not None
        run.advance(at)
        for e in run.take():
            if e.kind == "end":
                ends += 1
                run.add(e.at_ms, key := key + 1, 1, completion)
    expected = closed_loop_per_ms(2, model.prefill_ms(1), (completion - 1) * 12.0, share)
    assert ends / run.now_ms == pytest.approx(expected, rel=0.1)
