"""Every limit refusing at the right moment with the right error, through a real router process over the store.

Each test spends from its own project's pools (see helpers.tenants). Minute windows are fixed and aligned to
the epoch, so tests counting against rpm or tpm start their router at the start of a window (its
`--limits-clock-offset`, test-only) and check the run stayed inside it (`in_one_window`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam
from support import wait_until

from .helpers import (
    BUDGET,
    FAST,
    SLOW,
    RouterProc,
    create_key,
    error_of,
    in_one_window,
    start_router,
    window_start_offset,
)

pytestmark = pytest.mark.integration

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


def _ask(client: openai.OpenAI, max_tokens: int = 2) -> tuple[Any, dict[str, str]]:
    """One chat completion: (the parsed answer, its headers)."""
    raw = client.chat.completions.with_raw_response.create(model=FAST, messages=HELLO, max_tokens=max_tokens)
    return raw.parse(), dict(raw.headers)


def _until_refused(
    client: openai.OpenAI, most: int, max_tokens: int = 2
) -> tuple[list[tuple[Any, dict[str, str]]], openai.RateLimitError]:
    """Requests one after another until the first 429 (at most `most` successes)."""
    done: list[tuple[Any, dict[str, str]]] = []
    for _ in range(most + 1):
        try:
            done.append(_ask(client, max_tokens))
        except openai.RateLimitError as exc:
            return done, exc
    raise AssertionError(f"{len(done)} requests passed, none refused")


def test_rpm_refuses_request_n_plus_one(store_dsn: str, snap: dict[str, Any], tmp_path: Path) -> None:
    key = create_key(store_dsn, "rpm")  # project rpm: 5 requests per minute
    offset = window_start_offset()
    router = start_router(tmp_path, snap, store_dsn, clock_offset=offset)
    try:
        with router.client(key) as client:
            done, refused = in_one_window(offset, lambda: _until_refused(client, 20))
        assert len(done) == 5
        remaining = [int(h["x-ratelimit-remaining-requests"]) for _, h in done]
        assert remaining == [4, 3, 2, 1, 0]
        assert all(h["x-ratelimit-limit-requests"] == "5" for _, h in done)
        err = error_of(refused)
        assert refused.status_code == 429 and err["code"] == "rate_limit_exceeded"
        assert "project 'rpm'" in err["message"] and "5 requests per minute" in err["message"]
        headers = refused.response.headers
        assert headers.get_list("retry-after") == [headers["retry-after"]], "one Retry-After header"
        assert 1 <= int(headers["retry-after"]) <= 60
        assert headers["x-ratelimit-limit-requests"] == "5"
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert headers["x-ratelimit-reset-requests"].endswith("s")
    finally:
        assert router.stop() == 0, router.text()[-3000:]


def test_tpm_refuses_the_request_that_no_longer_fits(
    store_dsn: str, snap: dict[str, Any], tmp_path: Path
) -> None:
    key = create_key(store_dsn, "tpm")  # project tpm: 400 tokens per minute
    offset = window_start_offset()
    router = start_router(tmp_path, snap, store_dsn, clock_offset=offset)
    try:
        with router.client(key) as client:
            done, refused = in_one_window(offset, lambda: _until_refused(client, 40, max_tokens=30))
        assert done, "the first request fits in an empty pool"
        # Admission charges the estimate (prompt estimate + max_tokens) and corrects to the real usage at the
        # end, so the n-th request is admitted while (n-1) real requests + one estimate fit in 400.
        estimate = 400 - int(done[0][1]["x-ratelimit-remaining-tokens"])
        used = {a.usage.total_tokens for a, _ in done}
        assert len(used) == 1, f"identical requests use identical tokens: {used}"
        actual = used.pop()
        assert 0 < actual <= estimate
        assert len(done) == (400 - estimate) // actual + 1
        err = error_of(refused)
        assert refused.status_code == 429 and err["code"] == "rate_limit_exceeded"
        assert "project 'tpm'" in err["message"] and "400 tokens per minute" in err["message"]
        left = int(refused.response.headers["x-ratelimit-remaining-tokens"])
        assert left == 400 - len(done) * actual < estimate
        assert 1 <= int(refused.response.headers["retry-after"]) <= 60
    finally:
        assert router.stop() == 0, router.text()[-3000:]


def test_concurrency_refuses_while_slow_requests_are_in_flight(
    store_dsn: str, snap: dict[str, Any], tmp_path: Path
) -> None:
    key = create_key(store_dsn, "conc")  # project concurrency: 2
    router = start_router(tmp_path, snap, store_dsn)
    try:
        with router.client(key) as client:
            # Two streams of 1000 tokens at 50 ms each: in flight until closed. The router answers once the
            # engine sent its first bytes, so a received chunk means the request holds its slot.
            streams: list[openai.Stream[ChatCompletionChunk]] = []
            for _ in range(2):
                stream = client.chat.completions.create(
                    model=SLOW, messages=HELLO, max_tokens=1000, stream=True
                )
                next(iter(stream))
                streams.append(stream)
            with pytest.raises(openai.RateLimitError) as caught:
                _ask(client)
            err = error_of(caught.value)
            assert err["code"] == "rate_limit_exceeded"
            assert "project 'conc'" in err["message"] and "2 concurrent requests" in err["message"]
            assert caught.value.response.headers["retry-after"] == "1"
            for stream in streams:
                stream.close()

            again: list[openai.Stream[ChatCompletionChunk]] = []

            def holds_another() -> bool:
                try:
                    stream = client.chat.completions.create(
                        model=SLOW, messages=HELLO, max_tokens=1000, stream=True
                    )
                except openai.RateLimitError:
                    return False
                next(iter(stream))
                again.append(stream)
                return len(again) == 2

            # the router notices the closed streams and gives both slots back: two slow streams fit again
            wait_until(holds_another, 20, "both slots back once the slow streams were closed")
            for stream in again:
                stream.close()
    finally:
        assert router.stop() == 0, router.text()[-3000:]


def _spend_budget(
    router: RouterProc, key: str
) -> tuple[list[tuple[Any, dict[str, str]]], openai.RateLimitError]:
    with router.client(key) as client:
        return _until_refused(client, 100, max_tokens=20)


def test_budget_refuses_once_spent_and_after_a_restart(
    store_dsn: str, snap: dict[str, Any], tmp_path: Path
) -> None:
    key = create_key(store_dsn, "budget")  # project budget: 300 per 30d; the models cost 1 per token
    router = start_router(tmp_path, snap, store_dsn)
    try:
        done, refused = _spend_budget(router, key)
    finally:
        assert router.stop() == 0, router.text()[-3000:]
    # A request is charged its estimate (tokens at the dearer price) and corrected to its real cost at the
    # end, so the n-th is admitted while (n-1) real costs + one estimate fit in the budget.
    estimate = 10**6 - int(done[0][1]["x-ratelimit-remaining-tokens"])  # tokens; 1 token costs 1
    costs = {a.usage.total_tokens for a, _ in done}
    assert len(costs) == 1, costs
    cost = costs.pop()
    assert len(done) == math.floor((BUDGET - estimate) / cost) + 1
    assert len(done) * cost <= BUDGET < len(done) * cost + estimate
    err = error_of(refused)
    assert refused.status_code == 429 and err["code"] == "rate_limit_exceeded"
    assert "project 'budget'" in err["message"] and "budget of 300" in err["message"]
    assert int(refused.response.headers["retry-after"]) > 60  # the 30-day period, not a minute

    # A new router process over the same store: the spend is remembered, the next request still refused.
    again = start_router(tmp_path, snap, store_dsn, name="router-2")
    try:
        with again.client(key) as client, pytest.raises(openai.RateLimitError) as caught:
            _ask(client, 20)
        assert "budget of 300" in error_of(caught.value)["message"]
    finally:
        assert again.stop() == 0, again.text()[-3000:]
