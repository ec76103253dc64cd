"""The billing rule (accounting.charge): what the engine reported, else what was reserved, never a way around
budgets by hanging up or omitting `usage`, and nothing spent when no engine saw the request."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from llmgw_router.path.accounting import Charge, Reservation, charge

from llmgw.core.config.models import Prices

PRICES = Prices(input_per_million=2.0, output_per_million=10.0)
RESERVED = Reservation(prompt=100, completion=50)


@dataclass
class Answer:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    events: int = 0
    images: int | None = None
    audio_seconds: float | None = None


def test_reported_usage_is_charged_as_reported() -> None:
    got = charge(Answer(30, 7), RESERVED, PRICES, status=200, engine_reached=True)
    assert got == Charge(prompt=30, completion=7, used=37, cost=pytest.approx((30 * 2 + 7 * 10) / 1e6))


def test_a_stream_cut_short_is_charged_the_prompt_estimate_and_a_token_per_event() -> None:
    got = charge(Answer(events=12), RESERVED, PRICES, status=499, engine_reached=True)
    assert (got.prompt, got.completion, got.used) == (100, 12, 112)
    assert got.cost == pytest.approx((100 * 2 + 12 * 10) / 1e6)


def test_a_200_without_usage_is_charged_what_was_reserved() -> None:
    got = charge(Answer(), RESERVED, PRICES, status=200, engine_reached=True)
    assert (got.prompt, got.completion, got.used) == (100, 50, 150)
    assert got.cost == pytest.approx((100 * 2 + 50 * 10) / 1e6)


def test_an_engine_error_without_usage_spends_the_reservation_but_costs_nothing() -> None:
    got = charge(Answer(), RESERVED, PRICES, status=502, engine_reached=True)
    assert got == Charge(prompt=None, completion=0, used=150, cost=0.0)


def test_refused_before_any_engine_gives_the_whole_reservation_back() -> None:
    got = charge(None, RESERVED, PRICES, status=429, engine_reached=False)
    assert got == Charge(prompt=None, completion=0, used=0, cost=0.0)


def test_a_model_without_prices_counts_tokens_at_no_cost() -> None:
    got = charge(Answer(30, 7), RESERVED, None, status=200, engine_reached=True)
    assert (got.used, got.cost) == (37, 0.0)


def test_reported_completion_without_prompt_in_a_finished_stream_counts_the_events() -> None:
    # Usage in a stream comes in one event with both counts; without the prompt's the events are the measure.
    got = charge(Answer(None, 5, events=3), RESERVED, PRICES, status=200, engine_reached=True)
    assert (got.prompt, got.completion) == (100, 3)
