"""A RoutingPolicy's prefix settings: how the prefix scorer names a prompt's blocks and when it trusts events.

Apart from llmgw.core.config.models so that file stays under its size; models re-exports the name.
"""

from __future__ import annotations

from pydantic import Field

from llmgw.core.config.base import Duration, Strict


class PrefixSettings(Strict):
    """How the prefix scorer names a prompt's blocks and when it trusts the engines' KV-cache events."""

    block_chars: int = Field(64, ge=1, description="Characters per block of the approximate index")
    max_blocks: int = Field(256, ge=1, description="Leading blocks of a prompt looked up (the rest ignored)")
    index_blocks: int = Field(
        32768, ge=0, description="Block hashes the approximate index keeps per endpoint (LRU; 0: none)"
    )
    events_stale_after: Duration = Field(
        "10s",
        description="An endpoint's KV-event stream is stale when a request that should have stored blocks "
        "has gone this long without an event; its prefix is then read from the approximate index",
    )
    hash_seed: str = Field(
        "0",
        description="PYTHONHASHSEED the engines run with: the root of vLLM's block hashes (NONE_HASH)",
    )
    load_bound: float = Field(
        1.5,
        gt=1.0,
        description="An endpoint whose in-flight requests pass this times the mean (or, when larger, this "
        "times its slots) scores no prefix: a hot prefix spills to the next replica holding it",
    )
    min_share: float = Field(
        0.2,
        ge=0.0,
        le=1.0,
        description="The least share of a prompt's leading blocks a replica must hold to draw the request: "
        "shorter matches count as none, and load alone decides",
    )
