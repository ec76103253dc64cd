"""Prefill and decode apart: a profile's role, and a model's pairing of a prefill pool with a decode pool.

A disaggregated model serves a request in two steps (vLLM's `kv_transfer_params` protocol): a replica of its
prefill pool computes the prompt's KV cache and keeps it for a remote decode, then a replica of its decode pool
takes that KV and generates. Each pool is a Model of its own (its profiles carry the pool's `role`), so it is
placed, scaled and shown by `plan` and `explain` like any replica; the pairing only tells routers to go through
both. Apart from llmgw.core.config.models so that file stays under its size (and specs/ under its module count);
models re-exports the names.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmgw.core.config.base import Strict

__all__ = ["PD_ENGINES", "Disaggregation", "ProfileRole", "StepFailure"]

ProfileRole = Literal["both", "prefill", "decode"]
StepFailure = Literal["plain", "retry", "fail"]
# The engines that speak vLLM's P/D protocol (`kv_transfer_params` in the request and the answer); the sim
# follows it as vLLM documents it.
PD_ENGINES = frozenset({"vllm", "sim"})


class Disaggregation(Strict):
    """Which models hold this model's prefill and decode pools, and what a failed step does."""

    prefill: str = Field(
        description="The model whose replicas prefill (its profiles have `role: prefill`): asked for one token "
        "with `kv_transfer_params.do_remote_decode`, it keeps the prompt's KV cache for the decode"
    )
    decode: str = Field(
        description="The model whose replicas decode (its profiles have `role: decode`): sent the request with "
        "the prefill's `kv_transfer_params`, it streams the answer"
    )
    on_failure: StepFailure = Field(
        "plain",
        description="A step that fails before the client saw a byte (a prefill, or a decode replica gone or "
        "refusing): plain (serve the whole request on this model's own replicas, then its fallbacks), retry "
        "(both steps once more, on other replicas), or fail (a 502). A decode that breaks mid-stream is "
        "continued in the same stream on one of this model's own replicas (plain) or another decode replica "
        "(retry), or its stream ends with an error event (fail)",
    )
