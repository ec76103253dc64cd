""" "Every check on": the one configuration the llmgw rows of the benchmarks run (issue 41), committed here.

router_overhead.py and streams.py start their llmgw target with it (peers.start_llmgw) and name it on their last
line (`features=...`); request_path_cost.py drives the same stages in process. What a request goes through:
  keys           a key from the store (SQLite), checked on every request (its cache of lookups included)
  limits3        limits at three levels: the organization's rpm, the team's tpm, the project's rpm, tpm and
                 concurrency (the concurrency slots: acquired, released before the answer's last bytes)
  admission      the admission queue configured (sizes and a timeout); endpoints declare slots (SLOTS, more
                 than any benchmark holds open), so a pick checks for room and always finds it
  prefix4        the prefix-aware policy (prefix, queue, kv and in-flight scorers) over 4 endpoints of the model
  guard_in       a guardrail of deterministic checks on the input (PII shapes, keywords, a regex, a topic, a
                 bound), attached to the model; no output stage (streams are measured without one)
  cache_miss     the project's response cache, every request a miss (`Cache-Control: no-cache`: keyed,
                 recorded and stored, never answered from memory)
  tags2          two request tags (`x-llmgw-tags: app=bench,env=prod`), both declared as metric labels
  trace_noexp    tracing configured without an endpoint (`--trace-sample` set, no `--otlp-endpoint`): the
                 client's traceparent is checked and passed on
  usage          usage rows: the spool and batched writes to the store
The limits are far above what a benchmark reaches: they are checked and counted, never refused.
"""

from __future__ import annotations

from typing import Any

MODEL = "bench-model"
TRANSLATED = "bench-translated"
ENGINE_KEY = "engine-key"
ENDPOINTS = 4  # replicas of MODEL, all at the one mock
# Each endpoint's slots: checked on every pick, never full in a benchmark, as the limits are never reached.
# streams.py holds 2,000 streams open at once, 500 an endpoint: with 64 slots it served 256 and the
# admission queue refused the rest with 429.
SLOTS = 1024
FEATURES = (
    "keys",
    "limits3",
    "admission",
    "prefix4",
    "guard_in",
    "cache_miss",
    "tags2",
    "trace_noexp",
    "usage",
)
TAGS = "app=bench,env=prod"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
# Sent with every request of the llmgw rows, besides the key.
REQUEST_HEADERS = {"x-llmgw-tags": TAGS, "Cache-Control": "no-cache", "traceparent": TRACEPARENT}
# Router flags: tracing configured (a sample ratio) while no endpoint is (the OTLP variable is removed too).
ROUTER_FLAGS = ("--trace-sample", "1.0")

INPUT_GUARD: dict[str, Any] = {
    "guardrails": {
        "bench-input": {
            "stages": ["input"],
            "pii": ["email", "phone", "card", "national_id"],
            "keywords": ["project bluebird", "internal only", "do not share"],
            "regex": [r"(?i)secret[-_ ]key"],
            "blocked_topics": {"weapons": ["rifle", "ammunition"]},
            "max_prompt_chars": 100000,
        }
    },
    "models": {MODEL: ["bench-input"]},
}
RESPONSE_CACHE: dict[str, Any] = {"ttl": "1h", "max_bytes": 64 * 1024 * 1024}
ROUTER: dict[str, Any] = {
    "default_policy": "prefix",
    "admission": {"queue_size": 1024, "model_queue_size": 512, "timeout": "10s"},
    "tag_labels": ["app", "env"],
}
POLICIES: dict[str, Any] = {
    "prefix": {"picker": "p2c", "weights": {"prefix": 4, "queue": 2, "kv": 2, "inflight": 1}},
}


def snapshot(
    upstream: str,
    guard: dict[str, Any] | None = None,
    cache: dict[str, Any] | None = None,
    engine: str = "vllm",
) -> dict[str, Any]:
    """The router snapshot of every check on, its endpoints at `upstream`; `guard` and `cache` replace the
    input guardrail and the project's response cache (router_overhead.py's --guardrails and cache rows);
    `engine`: what serves MODEL there (engine_overhead.py fronts real llama.cpp too)."""
    project: dict[str, Any] = {
        "team": "research",
        "limits": {"rpm": 100_000_000, "tpm": 10_000_000_000, "concurrency": 100_000},
        "response_cache": cache if cache is not None else RESPONSE_CACHE,
    }
    endpoints: list[dict[str, Any]] = [
        {
            "replica_id": f"mock-{i}",
            "model": MODEL,
            "engine": engine,
            "base_url": upstream,
            "api_key": ENGINE_KEY,
            "slots": SLOTS,
        }
        for i in range(ENDPOINTS)
    ]
    # TRANSLATED: the same mock behind an engine kind that does not serve /v1/responses, so a Responses
    # request to it is translated onto chat (router_overhead.py's Responses row).
    endpoints.append(
        {
            "replica_id": "mock-translated",
            "model": TRANSLATED,
            "engine": "sim",
            "base_url": upstream,
            "api_key": ENGINE_KEY,
        }
    )
    return {
        "guard": guard if guard is not None else INPUT_GUARD,
        "revision": "bench",
        "models": {m: {"context_length": 8192, "capabilities": ["chat"]} for m in (MODEL, TRANSLATED)},
        "policies": POLICIES,
        "router": ROUTER,
        "tenants": {
            "organizations": {"acme": {"limits": {"rpm": 100_000_000}}},
            "teams": {"research": {"organization": "acme", "limits": {"tpm": 10_000_000_000}}},
            "projects": {"bench": project},
        },
        "endpoints": endpoints,
    }


def features() -> str:
    """The configuration's name on a benchmark's last line."""
    return "+".join(FEATURES)
