"""The response cache's pure parts: what the key covers and leaves out, the client's directives, and the LRU's
byte bound and TTL (llmgw_router.decisions.response_cache)."""

from __future__ import annotations

from typing import Any

import pytest
from llmgw_router.decisions.response_cache import (
    ENTRY_OVERHEAD,
    CacheEntry,
    ProjectCache,
    cache_key,
    directive,
)

from llmgw.core.config.models import ResponseCacheSpec

BODY: dict[str, Any] = {
    "model": "chat",
    "messages": [{"role": "user", "content": "hi"}],
    "temperature": 0,
    "tools": [{"type": "function", "function": {"name": "f"}}],
}


def key(body: dict[str, Any], project: str = "p", kind: str = "chat", model: str = "m") -> str:
    return cache_key(project, kind, model, body)


def test_fields_that_do_not_change_the_answer_are_left_out_and_key_order_does_not_matter() -> None:
    same = {
        **BODY,
        "model": "an-alias",
        "user": "u",
        "metadata": {"a": "b"},
        "store": True,
        "service_tier": "x",
    }
    assert key(same) == key(BODY)
    assert key(dict(reversed(list(BODY.items())))) == key(BODY)


@pytest.mark.parametrize(
    "changed",
    [
        {"temperature": 0.5},
        {"tools": []},
        {"messages": [{"role": "user", "content": "hi!"}]},
        {"stream": True},
        {"stream": True, "stream_options": {"include_usage": True}},
        {"max_tokens": 3},
        {"seed": 1},
    ],
)
def test_what_changes_the_answer_changes_the_key(changed: dict[str, Any]) -> None:
    assert key({**BODY, **changed}) != key(BODY)


def test_project_endpoint_and_model_are_in_the_key() -> None:
    assert len({key(BODY), key(BODY, project="q"), key(BODY, kind="completions"), key(BODY, model="n")}) == 4


@pytest.mark.parametrize(
    ("header", "said"),
    [
        (None, "use"),
        ("", "use"),
        ("max-age=0", "use"),
        ("no-cache", "refresh"),
        ("No-Cache, max-age=0", "refresh"),
        ("no-store", "bypass"),
        ("no-cache, no-store", "bypass"),
    ],
)
def test_cache_control(header: str | None, said: str) -> None:
    assert directive(header) == said


def entry(size: int, now: float = 0.0, ttl: float = 60.0) -> CacheEntry:
    return CacheEntry(False, b"x" * size, "application/json", 1, 1, 0, now, now + ttl)


def test_the_lru_stays_under_its_bytes_and_drops_the_least_recently_used() -> None:
    cache = ProjectCache(ResponseCacheSpec(ttl="1m", max_bytes=65536, max_entry_bytes=4096))
    per = 1000 + ENTRY_OVERHEAD
    for i in range(100):
        assert cache.put(str(i), entry(1000))
        assert cache.bytes <= 65536
    assert len(cache.entries) == 65536 // per
    assert cache.get("0", 1.0) is None and cache.get("99", 1.0) is not None
    oldest = next(iter(cache.entries))
    assert cache.get(oldest, 1.0) is not None  # used: now the most recent
    cache.put("new", entry(1000))
    assert oldest in cache.entries, "a lookup makes an entry recent"
    assert not cache.put("big", entry(4097)) and "big" not in cache.entries


def test_an_entry_is_not_served_at_or_after_its_expiry_and_goes() -> None:
    cache = ProjectCache(ResponseCacheSpec(ttl="1m"))
    cache.put("k", entry(10, now=100.0, ttl=60.0))
    assert cache.get("k", 159.9) is not None
    assert cache.get("k", 160.0) is None
    assert "k" not in cache.entries and cache.bytes == 0
