"""Does a profile fit its GPUs? The arithmetic, per GPU, from the model's own headers. Pure.

    weights   = tensor bytes / (tp x pp)                       (each GPU holds one tensor/pipeline shard)
    kv cache  = 2 (K and V) x ceil(layers / pp) x ceil(kv_heads / tp) x head_dim x cache dtype bytes
                x context_length x sequences                  (a GPU keeps its layers' share of its heads)
    overhead  = the runtime's own (CUDA context, activations, graphs): RUNTIME_OVERHEAD per GPU
    usable    = GPU memory x utilisation                       (vLLM's gpu_memory_utilization, 0.9 by default)
    headroom  = usable - weights - kv cache - overhead         (fits when 0 or more)

`sequences` is the profile's `slots`; without one, a single sequence of the full context is the least that must
fit (the engine sizes its batch to what is left). Unknown is not zero: a shape without layers, KV heads or head
size leaves the KV cache unknown, and the verdict says what it could not compute instead of passing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmgw.core.config.models import ModelSpec
from llmgw.core.weights.model_headers import ModelShape

__all__ = [
    "DEFAULT_UTILISATION",
    "GIB",
    "RUNTIME_OVERHEAD",
    "MemoryFit",
    "ProfileFit",
    "class_memory",
    "gib",
    "memory_fit",
    "profile_fits",
]

GIB = 1024**3
RUNTIME_OVERHEAD = (
    1 * GIB
)  # per GPU; what a card keeps beyond weights and cache (measured loads are ~0.5-2 GiB)
DEFAULT_UTILISATION = 0.9
_DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "FP8": 1, "INT8": 1}


def gib(n: int | float) -> str:
    return f"{n / GIB:.1f} GiB"


@dataclass(frozen=True)
class MemoryFit:
    gpus: int  # tp x pp
    gpu_memory: int
    usable: int
    weights: int | None
    kv_cache: int | None
    overhead: int
    sequences: int
    context_length: int
    missing: tuple[str, ...] = ()  # what the shape does not say, so what could not be computed

    @property
    def needed(self) -> int | None:
        if self.weights is None or self.kv_cache is None:
            return None
        return self.weights + self.kv_cache + self.overhead

    @property
    def headroom(self) -> int | None:
        return None if self.needed is None else self.usable - self.needed

    @property
    def fits(self) -> bool | None:
        """True or False when the numbers are known; None when they are not (never a silent yes)."""
        return None if self.headroom is None else self.headroom >= 0

    def words(self) -> str:
        """The arithmetic, per GPU, in one line."""
        if self.needed is None:
            return f"not computed: the model's headers do not give {', '.join(self.missing)}"
        assert self.weights is not None and self.kv_cache is not None and self.headroom is not None
        verdict = "fits" if self.headroom >= 0 else "does not fit"
        seqs = f"{self.sequences} sequence{'s' * (self.sequences != 1)}"
        return (
            f"{verdict} per GPU ({self.gpus} GPU{'s' * (self.gpus != 1)}): weights {gib(self.weights)} + "
            f"KV cache {gib(self.kv_cache)} ({seqs} x {self.context_length} tokens) + overhead "
            f"{gib(self.overhead)} = {gib(self.needed)} of {gib(self.usable)} usable "
            f"({gib(self.gpu_memory)} x {self.usable / self.gpu_memory:.2f}); headroom {gib(self.headroom)}"
        )


def memory_fit(
    shape: ModelShape,
    *,
    tp: int,
    pp: int,
    context_length: int,
    gpu_memory: int,
    slots: int | None = None,
    utilisation: float = DEFAULT_UTILISATION,
    cache_dtype: str | None = None,
) -> MemoryFit:
    """The per-GPU arithmetic of one profile on one GPU class (`gpu_memory` bytes per card)."""
    shards = tp * pp
    missing: list[str] = []
    weights = None
    if shape.tensor_bytes is not None:
        weights = -(-shape.tensor_bytes // shards)
    else:
        missing.append("tensor bytes")
    dtype = (cache_dtype or shape.dtype or "F16").upper()
    width = _DTYPE_BYTES.get(dtype, 2)  # a GGUF's cache is f16 unless the engine is told otherwise
    sequences = slots or 1
    kv = None
    for name, value in (
        ("layers", shape.layers),
        ("KV heads", shape.kv_heads),
        ("head size", shape.head_dim),
    ):
        if value is None:
            missing.append(name)
    if shape.layers is not None and shape.kv_heads is not None and shape.head_dim is not None:
        layers = -(-shape.layers // pp)
        heads = -(-shape.kv_heads // tp)
        kv = 2 * layers * heads * shape.head_dim * width * context_length * sequences
    return MemoryFit(
        gpus=shards,
        gpu_memory=gpu_memory,
        usable=int(gpu_memory * utilisation),
        weights=weights,
        kv_cache=kv,
        overhead=RUNTIME_OVERHEAD,
        sequences=sequences,
        context_length=context_length,
        missing=tuple(missing),
    )


@dataclass(frozen=True)
class ProfileFit:
    """One GPU profile of a model whose shape is known, against its GPU class as the fleet reports it."""

    model: str
    profile: str
    gpu_class: str
    fit: MemoryFit | None  # None: no node reports a GPU of the class with its memory
    note: str = ""

    @property
    def state(self) -> str:
        if self.fit is None or self.fit.fits is None:
            return "not checked"
        return "fits" if self.fit.fits else "does not fit"

    def words(self) -> str:
        return self.note if self.fit is None else self.fit.words()


def class_memory(gpus: Iterable[tuple[str | None, int | None]]) -> dict[str, int]:
    """GPU class -> the smallest memory any card of it reports (a replica must fit the smallest one)."""
    out: dict[str, int] = {}
    for cls, memory in gpus:
        if cls is not None and memory:
            out[cls] = min(memory, out.get(cls, memory))
    return out


def profile_fits(
    models: Mapping[str, tuple[ModelSpec, ModelShape | None]], memory: Mapping[str, int]
) -> tuple[ProfileFit, ...]:
    """Every GPU profile of every model with a known shape, against `memory` (class -> bytes per card)."""
    out: list[ProfileFit] = []
    for name, (spec, shape) in sorted(models.items()):
        if shape is None:
            continue
        for p in spec.profiles:
            if p.gpu_class is None:
                continue
            card = memory.get(p.gpu_class)
            if card is None:
                note = f"no node reports a {p.gpu_class} GPU with its memory"
                out.append(ProfileFit(name, p.name, p.gpu_class, None, note))
                continue
            share = p.args.get(
                "gpu_memory_utilization", p.args.get("mem_fraction_static", DEFAULT_UTILISATION)
            )
            fit = memory_fit(
                shape,
                tp=p.tp,
                pp=p.pp,
                context_length=spec.context_length,
                gpu_memory=card,
                slots=p.slots,
                utilisation=float(share) if isinstance(share, int | float) else DEFAULT_UTILISATION,
            )
            out.append(ProfileFit(name, p.name, p.gpu_class, fit))
    return tuple(out)
