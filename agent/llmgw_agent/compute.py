"""What an engine says it computes on, read from its own start-up output (issue 19).

A GPU replica whose engine found no usable GPU still answers `/health` 200 and serves, a hundred times slower,
on the CPU: readiness alone calls it healthy. The engine says so in its first lines, so the agent reads them
as the shard becomes ready and fails a shard that was given GPUs (or asked to offload layers) but runs on the
CPU, quoting the engine's own line. Pure: lines in, words out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# The engine's own words for "no GPU here", per engine. llama.cpp (b11434) prints the first at start when built
# without a GPU backend or when none is usable; vLLM logs the platform it detected and torch says the second.
_NO_GPU: dict[str, tuple[re.Pattern[str], ...]] = {
    "llamacpp": (re.compile(r"no usable GPU found"),),
    "vllm": (re.compile(r"Automatically detected platform cpu"), re.compile(r"No CUDA GPUs are available")),
    "sglang": (re.compile(r"No CUDA GPUs are available"),),
    "trtllm": (re.compile(r"No CUDA GPUs are available"),),
}
# llama.cpp: "load_tensors: offloaded 19/19 layers to GPU".
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")


@dataclass(frozen=True)
class Compute:
    """What the output said; None fields: it did not say."""

    no_gpu_line: str | None = None
    offloaded: tuple[int, int] | None = None  # (layers on the GPU, layers in all)

    def words(self) -> str | None:
        if self.no_gpu_line is not None:
            return "cpu (no usable GPU)"
        if self.offloaded is not None:
            return f"gpu ({self.offloaded[0]}/{self.offloaded[1]} layers offloaded)"
        return None


def read_compute(engine: str, lines: Iterable[str]) -> Compute:
    patterns = _NO_GPU.get(engine, ())
    no_gpu: str | None = None
    offloaded: tuple[int, int] | None = None
    for line in lines:
        if no_gpu is None and any(p.search(line) for p in patterns):
            no_gpu = line.strip()
        if (m := _OFFLOADED.search(line)) is not None:
            offloaded = (int(m.group(1)), int(m.group(2)))
    return Compute(no_gpu, offloaded)


def wants_gpu(engine: str, gpus: Iterable[int], args: Mapping[str, Any]) -> bool:
    """A shard handed GPU devices, or a llama.cpp shard told to offload layers (`n_gpu_layers` > 0)."""
    if any(True for _ in gpus):
        return True
    layers = args.get("n_gpu_layers")
    return engine == "llamacpp" and isinstance(layers, int) and not isinstance(layers, bool) and layers > 0


def gpu_problem(compute: Compute, wanted: bool) -> str | None:
    """Why a shard that wanted a GPU must not be called ready; None when it did not want one or the engine
    said nothing against it (unknown is not a failure)."""
    if not wanted:
        return None
    if compute.no_gpu_line is not None:
        return f"the engine runs without a GPU, in its own words: {compute.no_gpu_line!r}"
    if compute.offloaded is not None and compute.offloaded[0] == 0:
        layers = compute.offloaded[1]
        return f"the engine offloaded 0 of {layers} layers to the GPU: it computes on the CPU"
    return None
