"""The Adapter kind's spec: a LoRA adapter served on a base model's replicas under a model name of its own.

Apart from llmgw.core.config.models so that file stays one concept per screen; models re-exports the names.
The adapter's files come the way a model's weights do (`Source`: a path on the node, a URL fetched into the
agent's cache, or a mirrored repo; sha256 checked after the fetch).
"""

from __future__ import annotations

from pydantic import Field

from llmgw.core.config.base import Name, Strict
from llmgw.core.config.specs.source_spec import Source

__all__ = ["LORA_ENGINES", "AdapterSpec"]

# Engines whose replicas can carry a LoRA adapter (docs/lora.md): llama.cpp loads them at start, vLLM at
# start or at runtime.
LORA_ENGINES: frozenset[str] = frozenset({"llamacpp", "vllm"})


class AdapterSpec(Strict):
    """Which base model carries the adapter, where its files are, and who may use it."""

    base: str = Field(description="The Model whose replicas carry this adapter (its name, not an alias)")
    source: Source = Field(
        description="The adapter's files: a GGUF-LoRA file (llama.cpp) or a PEFT directory (vLLM)"
    )
    projects: list[Name] | None = Field(
        None, description="Projects that may use it (unset: every project that may use the base model)"
    )
    rank: int | None = Field(
        None, ge=1, le=1024, description="The adapter's LoRA rank (vLLM's --max-lora-rank takes the largest)"
    )
    scale: float = Field(1.0, gt=0, le=16, description="llama.cpp: the scale the adapter is applied with")
