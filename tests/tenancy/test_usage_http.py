"""Usage through a real router process: what `llmgw usage` reports equals what the answers said."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from support import wait_until

from .helpers import FAST, OTHER, PRICE, SLOW, create_key, start_router, usage_rows

pytestmark = pytest.mark.integration


def test_usage_totals_match_the_requests_made(store_dsn: str, snap: dict[str, Any], tmp_path: Path) -> None:
    key = create_key(store_dsn, "usage")
    router = start_router(tmp_path, snap, store_dsn)
    prompt = completion = 0
    made = 0
    try:
        with router.client(key) as client:
            for i in range(6):
                messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "word " * (i + 1)}]
                done = client.chat.completions.create(model=FAST, messages=messages, max_tokens=i + 1)
                assert done.usage is not None
                prompt += done.usage.prompt_tokens
                completion += done.usage.completion_tokens
                made += 1
            # A stream without include_usage: the router asks for usage anyway and accounts it, but the client
            # never sees it; the same messages asked without a stream tell its prompt tokens.
            same: list[ChatCompletionMessageParam] = [{"role": "user", "content": "a stream"}]
            probe = client.chat.completions.create(model=SLOW, messages=same, max_tokens=1)
            assert probe.usage is not None
            prompt += 2 * probe.usage.prompt_tokens
            completion += probe.usage.completion_tokens + 4
            stream = client.chat.completions.create(model=SLOW, messages=same, max_tokens=4, stream=True)
            assert sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content) == 4
            made += 2
            streamed = client.chat.completions.create(
                model=SLOW,
                messages=[{"role": "user", "content": "another stream"}],
                max_tokens=3,
                stream=True,
                stream_options={"include_usage": True},
            )
            final = [chunk.usage for chunk in streamed if chunk.usage is not None]
            assert len(final) == 1
            prompt += final[0].prompt_tokens
            completion += final[0].completion_tokens
            made += 1
            # a refused request is a record too (an error, no tokens)
            with pytest.raises(openai.PermissionDeniedError):
                client.chat.completions.create(model=OTHER, messages=[{"role": "user", "content": "x"}])
            made += 1

        # The router writes usage in batches off the request path (every second): wait for it while the
        # router keeps running, not for the flush at shutdown.
        def flushed() -> dict[str, Any] | None:
            row = usage_rows(store_dsn).get("usage")
            return row if row is not None and row["requests"] == made else None

        row = wait_until(flushed, 30, f"{made} usage records of project usage")
    finally:
        assert router.stop() == 0, router.text()[-3000:]
    assert usage_rows(store_dsn)["usage"]["requests"] == made, "nothing counted twice at shutdown"
    by_model = usage_rows(store_dsn, "model")
    assert (row["requests"], row["errors"]) == (made, 1)
    assert (row["tokens_in"], row["tokens_out"]) == (prompt, completion)
    assert row["cost"] == pytest.approx((prompt + completion) * PRICE / 1e6)
    assert by_model[FAST]["requests"] == 6 and by_model[SLOW]["requests"] == 3
    by_team = usage_rows(store_dsn, "team")
    assert by_team["research"]["tokens_out"] == completion
