"""The search against brute force (issue 50): exact on small spaces, the heuristic exact on these larger ones
and never below its bound, the same answer every time; and the evaluator it relies on, where more replicas
never make a figure worse."""

from __future__ import annotations

import itertools

import pytest

from llmgw.core.capacity.engine_model import EngineModel, assumed_model
from llmgw.core.suggest import search as search_module
from llmgw.core.suggest.demand import ClassDemand, Demand
from llmgw.core.suggest.evaluate import estimate, misses, needed, pool_rows
from llmgw.core.suggest.search import EXHAUSTIVE_LIMIT, search
from llmgw.core.suggest.space import space_size

from .suggest_cases import brute_force, random_problem


@pytest.mark.parametrize("seed", range(12))
def test_a_small_space_is_searched_whole_and_matches_brute_force(seed: int) -> None:
    problem = random_problem(seed, models=2, profiles=3, most=5)
    assert space_size(problem) <= EXHAUSTIVE_LIMIT
    found = search(problem)
    assert found.method == "exhaustive"
    assert found.evaluated == space_size(problem)
    expected = brute_force(problem)
    if expected is None:
        assert found.best is None and found.rejected
    else:
        assert found.best is not None
        assert found.best.cost_per_hour == pytest.approx(expected)


@pytest.mark.parametrize("seed", range(6))
def test_a_large_space_takes_the_heuristic_and_still_finds_the_optimum(seed: int) -> None:
    problem = random_problem(seed, models=3, profiles=3, most=6)
    assert space_size(problem) > EXHAUSTIVE_LIMIT
    found = search(problem)
    assert found.method == "heuristic" and found.bound is not None
    expected = brute_force(problem)
    assert (found.best is None) == (expected is None)
    if found.best is not None and expected is not None:
        assert found.best.cost_per_hour == pytest.approx(expected)
        assert found.bound <= expected + 1e-9  # a lower bound on the optimum


@pytest.mark.parametrize("seed", range(10))
def test_branch_and_bound_on_its_budget_is_feasible_and_never_below_the_bound(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(search_module, "EXHAUSTIVE_LIMIT", 1)  # every space takes the branch and bound
    monkeypatch.setattr(search_module, "BRANCH_BUDGET", 6)  # and it stops early: local search does the rest
    problem = random_problem(seed, models=3, profiles=4, most=4)
    found = search(problem)
    expected = brute_force(problem)
    if expected is None:
        assert found.best is None and found.rejected
        return
    assert "branch and bound" in found.words
    assert found.best is not None and found.bound is not None
    assert found.bound - 1e-9 <= expected <= found.best.cost_per_hour + 1e-9
    assert all(o.missed is None for o in found.best.options)


def test_the_answer_is_the_same_every_time_and_says_why_the_others_lost() -> None:
    problem = random_problem(3, models=3, profiles=3, most=6)
    first, again = search(problem), search(random_problem(3, models=3, profiles=3, most=6))
    assert first.best is not None and again.best is not None
    assert [o.label() for o in first.best.options] == [o.label() for o in again.best.options]
    assert [c.profiles for c in first.runners_up] == [c.profiles for c in again.runners_up]
    assert first.rejected == again.rejected
    for runner in first.runners_up:
        assert runner.cost_per_hour >= first.best.cost_per_hour
        assert runner.lost is not None and runner.lost.startswith("costs +")
    assert first.rejected and all(why for _, why in first.rejected)


def test_the_latency_objective_buys_the_lowest_worst_ttft_the_limits_allow() -> None:
    problem = random_problem(5, models=2, profiles=3, most=5)
    cheapest, fastest = search(problem, "cost"), search(problem, "latency")
    assert cheapest.best is not None and fastest.best is not None
    assert max(o.latency for o in fastest.best.options) <= max(o.latency for o in cheapest.best.options)
    assert fastest.best.cost_per_hour >= cheapest.best.cost_per_hour


def _demand(rate: float) -> Demand:
    cls = ClassDemand("web", rate, 400.0, 900.0, 1600.0, 150.0)
    return Demand("chat", 0, 3600.0, rate, 400.0, 150.0, (cls,))


ENGINE = EngineModel(0.4, ((1.0, 20.0), (4.0, 26.0), (8.0, 40.0)), 8, True, exclusive=0.3, fixed_ms=30.0)


@pytest.mark.parametrize("engine", [ENGINE, assumed_model(4, "test")])
def test_more_replicas_never_make_an_estimate_worse(engine: EngineModel) -> None:
    demand = _demand(6.0)
    rows = [estimate(engine, engine.capacity, n, demand, demand.classes[0], 30.0) for n in range(1, 12)]
    for fewer, more in itertools.pairwise(rows):
        assert more.ttft_p99_ms <= fewer.ttft_p99_ms and more.ttft_p90_ms <= fewer.ttft_p90_ms
        assert more.tpot_p99_ms <= fewer.tpot_p99_ms and more.availability >= fewer.availability
    assert rows[0].ttft_p99_ms > rows[-1].ttft_p99_ms


def test_the_fewest_replicas_meeting_the_objectives_and_what_the_largest_pool_misses() -> None:
    demand = _demand(6.0)
    rows = pool_rows(ENGINE, 8, demand, 10, 30.0)
    need = needed(0, rows, {"web": {"ttft_p99_ms": 2000.0, "tpot_p99_ms": 60.0}})
    assert need.replicas is not None
    assert not misses(rows[need.replicas - 1]["web"], {"ttft_p99_ms": 2000.0, "tpot_p99_ms": 60.0})
    assert misses(rows[need.replicas - 2]["web"], {"ttft_p99_ms": 2000.0, "tpot_p99_ms": 60.0})
    impossible = needed(0, rows, {"web": {"tpot_p99_ms": 1.0}})
    assert impossible.replicas is None and "tpot_p99_ms" in impossible.short[0]
