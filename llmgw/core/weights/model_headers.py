"""A model's shape read from its own files: a GGUF header, safetensors headers and config.json. Pure: bytes in,
dataclasses out (llmgw.adapters.model_files reads the bytes, from a local file or with HTTP Range requests).

A GGUF file starts with its metadata (architecture, layer count, trained context, file type) and the table of
its tensors (name, shape, type, offset); `parse_gguf` reads exactly that much and raises `NeedMoreBytes` when
the bytes it was given end first, saying how many it needs, so a reader can fetch the header alone and never
the weights. A safetensors file starts with an 8-byte length and a JSON table of its tensors (dtype, shape);
config.json carries layers, hidden size, attention and KV heads. Unknown is not zero: a field the file does not
carry is None, and a tensor type this table does not know leaves the tensor bytes unknown.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from llmgw.core.errors import LlmgwError

__all__ = [
    "GGUF_FILE_TYPES",
    "MAX_HEADER_BYTES",
    "HeaderError",
    "ModelShape",
    "NeedMoreBytes",
    "SafetensorsHeader",
    "from_hf_config",
    "merge_safetensors",
    "parse_gguf",
    "parse_safetensors",
    "safetensors_header_length",
]

# A header larger than this is refused rather than read: gemma-3's, with a 262,144-token vocabulary, is ~4 MiB.
MAX_HEADER_BYTES = 64 * 1024 * 1024
_MAX_COUNT = 1 << 24  # tensors, keys or array items: more is a corrupt file, not a model


class HeaderError(LlmgwError, ValueError):
    """The bytes are not a header of the kind asked for; the message says what was wrong and where."""


class NeedMoreBytes(HeaderError):
    """The header goes on past the bytes given: read at least `needed` bytes from the start and ask again."""

    def __init__(self, needed: int) -> None:
        super().__init__(f"the header goes on past the bytes given: {needed} bytes are needed")
        self.needed = needed


@dataclass(frozen=True)
class ModelShape:
    """What sizing a model needs, as its files say it. Every field None when the files do not say it."""

    format: str  # "gguf", "safetensors"
    architecture: str | None = None
    layers: int | None = None
    trained_context: int | None = None
    hidden_size: int | None = None
    attention_heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    dtype: str | None = None  # safetensors' weights dtype (BF16, F16, F32, F8_E4M3 ...)
    quantization: str | None = None  # GGUF's file type (Q4_K_M, F16 ...)
    parameters: int | None = None
    tensor_bytes: int | None = None
    tensors: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelShape:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


# ---------------------------------------------------------------------------------------------- GGUF

# llama.cpp's llama_ftype (general.file_type), as llama-quantize names them.
GGUF_FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
}
# ggml_type -> (elements per block, bytes per block), from ggml's type traits.
_GGML_BLOCKS = {
    0: (1, 4),
    1: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    9: (32, 36),
    10: (256, 84),
    11: (256, 110),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
    15: (256, 292),
    16: (256, 66),
    17: (256, 74),
    18: (256, 98),
    19: (256, 50),
    20: (32, 18),
    21: (256, 110),
    22: (256, 82),
    23: (256, 136),
    24: (1, 1),
    25: (1, 2),
    26: (1, 4),
    27: (1, 8),
    28: (1, 8),
    29: (256, 56),
    30: (1, 2),
    34: (256, 54),
    35: (256, 66),
    39: (32, 17),
}
# GGUF value types: fixed-size scalars by struct format; 8 is a string, 9 an array.
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


class _Reader:
    def __init__(self, data: bytes, version: int) -> None:
        self.data, self.pos, self.version = data, 0, version

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise NeedMoreBytes(max(end, 2 * len(self.data)))
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def skip(self, n: int) -> None:
        if self.pos + n > len(self.data):
            raise NeedMoreBytes(max(self.pos + n, 2 * len(self.data)))
        self.pos += n

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def count(self, what: str) -> int:
        n = int(self.scalar("<I" if self.version == 1 else "<Q"))
        if n > _MAX_COUNT:
            raise HeaderError(f"GGUF header at byte {self.pos}: {what} count {n} is not believable")
        return n

    def string(self) -> str:
        n = self.count("string length")
        return self.take(n).decode("utf-8", errors="replace")

    def value(self, kind: int, keep: bool) -> Any:
        """The value (or None when not `keep`: arrays such as the 262k-token vocabulary are skipped)."""
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, n = int(self.scalar("<I")), self.count("array")
            if item in _SCALARS:
                self.skip(n * struct.calcsize(_SCALARS[item]))
            else:
                for _ in range(n):
                    self.value(item, False)
            return None
        raise HeaderError(f"GGUF header at byte {self.pos}: unknown value type {kind}")


def parse_gguf(data: bytes) -> ModelShape:
    """The shape a GGUF header gives, from the file's first bytes. Raises NeedMoreBytes(n) when `data` ends
    inside the header, HeaderError when it is no GGUF (v1-v3) header."""
    if len(data) < 8:
        raise NeedMoreBytes(24)
    if data[:4] != b"GGUF":
        raise HeaderError(f"not a GGUF file: it starts with {data[:4]!r}, not b'GGUF'")
    version = struct.unpack("<I", data[4:8])[0]
    if version not in (1, 2, 3):
        raise HeaderError(f"GGUF version {version}: this llmgw reads versions 1 to 3")
    r = _Reader(data, version)
    r.pos = 8
    tensors, keys = r.count("tensor"), r.count("key")
    meta: dict[str, Any] = {}
    for _ in range(keys):
        key = r.string()
        kind = int(r.scalar("<I"))
        meta[key] = r.value(kind, True)
    tensor_bytes: int | None = 0
    parameters = 0
    for _ in range(tensors):
        r.string()
        dims = [int(r.scalar("<Q" if version > 1 else "<I")) for _ in range(int(r.scalar("<I")))]
        ggml_type = int(r.scalar("<I"))
        r.skip(8)  # offset into the data section
        elements = math.prod(dims)
        parameters += elements
        block = _GGML_BLOCKS.get(ggml_type)
        if block is None or tensor_bytes is None:
            tensor_bytes = None  # a type this table does not know: unknown, never a guess
        else:
            tensor_bytes += -(-elements // block[0]) * block[1]
    return _gguf_shape(meta, tensors, parameters, tensor_bytes)


def _gguf_shape(
    meta: Mapping[str, Any], tensors: int, parameters: int, tensor_bytes: int | None
) -> ModelShape:
    arch = meta.get("general.architecture")
    arch = arch if isinstance(arch, str) else None

    def num(key: str) -> int | None:
        value = meta.get(f"{arch}.{key}") if arch else None
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    hidden, heads = num("embedding_length"), num("attention.head_count")
    head_dim = num("attention.key_length") or (hidden // heads if hidden and heads else None)
    file_type = meta.get("general.file_type")
    return ModelShape(
        format="gguf",
        architecture=arch,
        layers=num("block_count"),
        trained_context=num("context_length"),
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=num("attention.head_count_kv") or heads,
        head_dim=head_dim,
        quantization=GGUF_FILE_TYPES.get(file_type, f"type {file_type}")
        if isinstance(file_type, int)
        else None,
        parameters=parameters,
        tensor_bytes=tensor_bytes,
        tensors=tensors,
    )


# ---------------------------------------------------------------------------------------------- safetensors

_DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


@dataclass(frozen=True)
class SafetensorsHeader:
    """One safetensors file's tensors: parameters and bytes per dtype."""

    parameters_by_dtype: Mapping[str, int] = field(default_factory=dict)
    bytes_by_dtype: Mapping[str, int] = field(default_factory=dict)
    tensors: int = 0


def safetensors_header_length(first8: bytes) -> int:
    """The JSON header's length from a safetensors file's first 8 bytes (the whole header is 8 + that)."""
    if len(first8) < 8:
        raise NeedMoreBytes(8)
    n = int(struct.unpack("<Q", first8[:8])[0])
    if n > MAX_HEADER_BYTES:
        raise HeaderError(f"not a safetensors file: its header would be {n} bytes")
    return n


def parse_safetensors(data: bytes) -> SafetensorsHeader:
    """A safetensors file's tensor table from its first 8 + N bytes (NeedMoreBytes when fewer were given)."""
    n = safetensors_header_length(data)
    if len(data) < 8 + n:
        raise NeedMoreBytes(8 + n)
    try:
        table = json.loads(data[8 : 8 + n])
    except ValueError as exc:
        raise HeaderError(f"not a safetensors file: its header is not JSON ({exc})") from exc
    if not isinstance(table, dict):
        raise HeaderError("not a safetensors file: its header is not a JSON object")
    params: dict[str, int] = {}
    sizes: dict[str, int] = {}
    count = 0
    for name, info in table.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or not isinstance(info.get("shape"), list):
            raise HeaderError(f"safetensors header: tensor {name!r} has no shape")
        dtype = str(info.get("dtype"))
        elements = math.prod(int(d) for d in info["shape"])
        params[dtype] = params.get(dtype, 0) + elements
        offsets = info.get("data_offsets")
        if isinstance(offsets, list) and len(offsets) == 2:
            sizes[dtype] = sizes.get(dtype, 0) + int(offsets[1]) - int(offsets[0])
        else:
            sizes[dtype] = sizes.get(dtype, 0) + elements * _DTYPE_BYTES.get(dtype, 0)
        count += 1
    return SafetensorsHeader(params, sizes, count)


def merge_safetensors(headers: Sequence[SafetensorsHeader], config: Mapping[str, Any] | None) -> ModelShape:
    """A directory's shape: its shards' tensors summed, its config.json's architecture (None: no config)."""
    params: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for h in headers:
        for k, v in h.parameters_by_dtype.items():
            params[k] = params.get(k, 0) + v
        for k, v in h.bytes_by_dtype.items():
            sizes[k] = sizes.get(k, 0) + v
    # The weights' dtype is the one holding the most bytes (norms kept in F32 beside BF16 weights are not it).
    dtype = max(sizes, key=lambda k: (sizes[k], k)) if sizes else None
    shape = from_hf_config(config) if config is not None else ModelShape(format="safetensors")
    return ModelShape(
        **{
            **asdict(shape),
            "format": "safetensors",
            "dtype": dtype,
            "parameters": sum(params.values()) if headers else None,
            "tensor_bytes": sum(sizes.values()) if headers else None,
            "tensors": sum(h.tensors for h in headers) if headers else None,
        }
    )


def from_hf_config(config: Mapping[str, Any]) -> ModelShape:
    """The architecture an HF config.json declares (a multimodal model's `text_config` when it has one)."""
    text = config.get("text_config")
    c: Mapping[str, Any] = text if isinstance(text, Mapping) else config

    def num(*keys: str) -> int | None:
        for key in keys:
            value = c.get(key, config.get(key))
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    archs = config.get("architectures")
    hidden, heads = num("hidden_size", "n_embd", "d_model"), num("num_attention_heads", "n_head")
    return ModelShape(
        format="safetensors",
        architecture=str(archs[0]) if isinstance(archs, list) and archs else config.get("model_type"),
        layers=num("num_hidden_layers", "n_layer", "num_layers"),
        trained_context=num("max_position_embeddings", "n_positions", "max_sequence_length"),
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=num("num_key_value_heads") or heads,
        head_dim=num("head_dim") or (hidden // heads if hidden and heads else None),
    )
