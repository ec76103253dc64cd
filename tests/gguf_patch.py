"""A real GGUF with its `general.architecture` patched, for the tests that judge architectures
(tests/config/test_gguf_arch.py, tests/mirror/test_ollama_import.py)."""

from __future__ import annotations

import struct
from pathlib import Path

from llmgw.core.weights.model_headers import NeedMoreBytes, parse_gguf


def patch_architecture(source: Path, target: Path, name: str) -> None:
    """`source`'s header with its general.architecture value made `name` (same length: nothing else moves), in a
    sparse file of the same size: llama.cpp checks the tensors lie within the file before it reads the
    architecture, and the zeros after the header cost no disk."""
    key = b"general.architecture"
    with source.open("rb") as f:
        data = bytearray(f.read(8 << 20))
    at = data.index(key) + len(key)
    kind, length = struct.unpack_from("<IQ", data, at)
    assert kind == 8 and length == len(name), (kind, length)
    data[at + 12 : at + 12 + length] = name.encode()
    header_end = len(parse_gguf_prefix(bytes(data)))
    with target.open("wb") as f:
        f.write(data[:header_end])
        f.truncate(source.stat().st_size)


def parse_gguf_prefix(data: bytes) -> bytes:
    """The bytes up to the end of the tensor table (the header as parse_gguf reads it), found by growing a prefix."""
    size = 1 << 16
    while True:
        try:
            parse_gguf(data[:size])
            return data[:size]
        except NeedMoreBytes as more:
            assert size < len(data), "the header goes on past the bytes read"
            size = more.needed
