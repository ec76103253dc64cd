"""A tiny LoRA adapter in llama.cpp's GGUF-LoRA format, written for a base GGUF model (tests only).

llama.cpp's adapter loader (llama-adapter.cpp) wants: general.architecture equal to the base's, general.type
`adapter`, adapter.type `lora`, adapter.lora.alpha, and for each adapted weight `<name>.lora_a` with ggml shape
[in, rank] and `<name>.lora_b` with [rank, out] (numpy shapes reversed), where the base's weight is [in, out].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter

__all__ = ["write_lora"]


def _architecture(reader: GGUFReader) -> str:
    field = reader.fields["general.architecture"]
    return bytes(field.parts[field.data[0]]).decode()


def write_lora(
    base: Path, out: Path, *, rank: int = 4, alpha: float = 4.0, scale: float = 0.5, seed: int = 0
) -> list[str]:
    """Write a LoRA for `base`'s attention q and v weights with random factors (large enough to change what
    the model says); the names of the adapted weights."""
    reader = GGUFReader(str(base))
    arch = _architecture(reader)
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(out), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    adapted = []
    for tensor in reader.tensors:
        if not (tensor.name.endswith("attn_q.weight") or tensor.name.endswith("attn_v.weight")):
            continue
        n_in, n_out = int(tensor.shape[0]), int(tensor.shape[1])
        a = rng.standard_normal((rank, n_in)).astype(np.float32) * scale
        b = rng.standard_normal((n_out, rank)).astype(np.float32) * scale
        writer.add_tensor(tensor.name + ".lora_a", a)
        writer.add_tensor(tensor.name + ".lora_b", b)
        adapted.append(tensor.name)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return adapted
