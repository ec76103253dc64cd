"""`llmgw model plan`: every way a model could run on every GPU class, with the arithmetic. Pure.

Choosing a precision is choosing an engine: a GGUF file is served by llama.cpp at the quantization it was
written in (split across cards by layer), a safetensors checkpoint by vLLM at its own dtype or, with
`--quantization fp8`, at one byte per weight. Every candidate is listed, not one answer: with cards to spare an
operator wants the full-precision fit, with one card free they want to know a quantised one exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from llmgw.core.weights.memory_fit import MemoryFit, memory_fit
from llmgw.core.weights.model_headers import ModelShape

__all__ = ["GPU_COUNTS", "FitRow", "Precision", "fit_table", "precisions"]

GPU_COUNTS = (1, 2, 4, 8)  # cards of one node a replica may span


@dataclass(frozen=True)
class Precision:
    name: str  # "Q4_K_M", "bf16", "fp8"
    engine: str  # the engine that serves weights this way
    how: str  # what the profile says to get it
    tensor_bytes: int | None
    split: str  # "tp" (tensor parallel: heads split) or "layers" (llama.cpp: layers split)


@dataclass(frozen=True)
class FitRow:
    precision: Precision
    gpus: int
    gpu_class: str
    fit: MemoryFit


def precisions(shape: ModelShape) -> tuple[Precision, ...]:
    """The ways these weights can be served. fp8 from a 16-bit checkpoint halves the weights (vLLM quantises
    at load); from an fp8 or 32-bit one nothing is offered beyond its own dtype."""
    if shape.format == "gguf":
        name = shape.quantization or "as written"
        return (Precision(name, "llamacpp", f"the file as it is ({name})", shape.tensor_bytes, "layers"),)
    dtype = (shape.dtype or "BF16").upper()
    own = Precision(dtype.lower(), "vllm", "no quantization arg", shape.tensor_bytes, "tp")
    if dtype in ("BF16", "F16") and shape.tensor_bytes is not None:
        fp8 = Precision("fp8", "vllm", "args: {quantization: fp8}", shape.tensor_bytes // 2, "tp")
        return (own, fp8)
    return (own,)


def fit_table(
    shape: ModelShape,
    classes: Mapping[str, int],
    *,
    context_length: int,
    slots: int | None = None,
) -> tuple[FitRow, ...]:
    """Each precision x card count x GPU class (`classes`: class -> bytes per card). A tensor-parallel split
    needs the KV heads to divide by the card count, so those that do not are left out."""
    rows: list[FitRow] = []
    for p in precisions(shape):
        sized = ModelShape(**{**shape.to_json(), "tensor_bytes": p.tensor_bytes})
        for n in GPU_COUNTS:
            if p.split == "tp" and shape.kv_heads is not None and shape.kv_heads % n:
                continue
            tp, pp = (n, 1) if p.split == "tp" else (1, n)
            for cls, memory in sorted(classes.items()):
                fit = memory_fit(
                    sized, tp=tp, pp=pp, context_length=context_length, gpu_memory=memory, slots=slots
                )
                rows.append(FitRow(p, n, cls, fit))
    return tuple(rows)
