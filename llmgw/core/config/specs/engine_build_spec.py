"""Builds of one engine version (a CUDA 13, a CUDA 12.9 and a CPU build of the same llama.cpp), the check an
install passes on the device before it counts, and the Cluster's `engine_overrides` (by GPU class, labels or
node, or a per-node disable). Which build a node gets is decided in llmgw.core.placement.engine_builds.

Split from engine_spec.py (which imports these) to keep each file under the size limit.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmgw.core.config.base import Duration, Strict

__all__ = ["AVX2_ENGINES", "Accelerator", "EngineBuildCheck", "EngineOverride"]

Accelerator = Literal["cuda", "cpu"]
# Engines whose CPU builds are vectorised for AVX2 on x86 (llama.cpp's ggml-cpu, vLLM's CPU backend): a CPU
# without it runs them several times slower, or not at all.
AVX2_ENGINES = frozenset({"llamacpp", "vllm"})


class EngineBuildCheck(Strict):
    """A command run once an install's `--version` probe passed, on the device the build computes on; the
    install counts only when it exits 0 (and prints `expect`, when given) within `timeout`."""

    argv: list[str] = Field(
        min_length=1,
        description="The command; `{binary}` is replaced by the installed executable (e.g. "
        '["{binary}", "--list-devices"])',
    )
    expect: str | None = Field(
        None, description="A regular expression the output must match (e.g. `CUDA\\d+:` for a CUDA device)"
    )
    timeout: Duration = Field("60s", description="Longest the check may take")


class EngineOverride(Strict):
    """Which build a set of nodes runs, or that they run none of this engine: by node, labels or GPU class
    (a node matched by several: the most specific, node before labels before GPU class, then the first)."""

    engine: Literal["llamacpp", "vllm", "sglang", "trtllm"] = Field(description="The engine this is about")
    node: str | None = Field(None, description="A node by name")
    labels: dict[str, str] | None = Field(None, description="Nodes carrying every one of these labels")
    gpu_class: str | None = Field(None, description="Nodes with a GPU of this class")
    build: str | None = Field(None, description="The build these nodes run (a name in the engine's `builds`)")
    disabled: bool = Field(False, description="These nodes run no build of this engine")

    @model_validator(mode="after")
    def _one_match_one_outcome(self) -> EngineOverride:
        if self.node is None and not self.labels and self.gpu_class is None:
            raise ValueError("an engine override matches by `node`, `labels` or `gpu_class`")
        if (self.build is None) == (not self.disabled):
            raise ValueError("an engine override takes exactly one of `build` or `disabled: true`")
        return self

    def matches(self, node: str, labels: dict[str, str], gpu_classes: frozenset[str]) -> bool:
        if self.node is not None and self.node != node:
            return False
        if self.labels and any(labels.get(k) != v for k, v in self.labels.items()):
            return False
        return self.gpu_class is None or self.gpu_class in gpu_classes

    def specificity(self) -> int:
        return 3 if self.node is not None else 2 if self.labels else 1
