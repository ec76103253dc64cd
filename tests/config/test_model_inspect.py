"""Model headers: the real gemma GGUF ($LLMGW_TEST_MODEL) read locally and over HTTP Range (the header's bytes
only), small GGUF and safetensors files written here, `llmgw model inspect`, the shape `llmgw model manifest`
records, and `validate` refusing a context_length above the trained context at its file:line:col."""

from __future__ import annotations

import asyncio
import json
import os
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from typer.testing import CliRunner

from llmgw.adapters.model_files import InspectError, inspect_source
from llmgw.adapters.repo_files import load_repo
from llmgw.cli.main import app
from llmgw.core.weights.model_headers import HeaderError, NeedMoreBytes, parse_gguf, parse_safetensors

GEMMA = os.environ.get("LLMGW_TEST_MODEL", "")
GEMMA_SIZE = Path(GEMMA).stat().st_size if Path(GEMMA).is_file() else 0
needs_gemma = pytest.mark.skipif(not Path(GEMMA).is_file(), reason="LLMGW_TEST_MODEL is not a file")


# ---------------------------------------------------------------------------------------------- writers


def _str(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf(meta: dict[str, Any], tensors: list[tuple[str, list[int], int]]) -> bytes:
    """A GGUF v3 file: `meta` (ints as UINT32, str, list of str as an array), tensors (name, dims, ggml type)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    for key, value in meta.items():
        out += _str(key)
        if isinstance(value, str):
            out += struct.pack("<I", 8) + _str(value)
        elif isinstance(value, list):
            out += struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_str(v) for v in value)
        else:
            out += struct.pack("<II", 4, value)
    for name, dims, kind in tensors:
        out += _str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", kind, 0)
    return out + b"\0" * 64  # the data section would follow


SMALL = gguf(
    {
        "general.architecture": "llama",
        "general.file_type": 7,
        "llama.block_count": 2,
        "llama.context_length": 8192,
        "llama.embedding_length": 64,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "tokenizer.ggml.tokens": ["<s>", "</s>", "hello"] * 100,
    },
    [("tok_embd.weight", [64, 32], 8), ("output_norm.weight", [64], 0)],  # Q8_0 and F32
)


def safetensors(tensors: dict[str, tuple[str, list[int]]], data: bool = True) -> bytes:
    """A safetensors file; without `data` only its header (offsets may claim gigabytes nobody writes)."""
    table: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    width = {"BF16": 2, "F16": 2, "F32": 4}
    for name, (dtype, shape) in tensors.items():
        size = width[dtype]
        for d in shape:
            size *= d
        table[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header = json.dumps(table).encode()
    return struct.pack("<Q", len(header)) + header + (b"\0" * offset if data else b"")


# ---------------------------------------------------------------------------------------------- pure


def test_a_small_gguf_header_is_read_whole() -> None:
    shape = parse_gguf(SMALL)
    assert (shape.architecture, shape.layers, shape.trained_context) == ("llama", 2, 8192)
    assert (shape.attention_heads, shape.kv_heads, shape.head_dim, shape.hidden_size) == (4, 2, 16, 64)
    assert shape.quantization == "Q8_0" and shape.tensors == 2
    assert shape.parameters == 64 * 32 + 64
    assert shape.tensor_bytes == (64 * 32 // 32) * 34 + 64 * 4  # Q8_0 blocks of 32 in 34 bytes; F32 norm


def test_every_cut_inside_the_header_asks_for_more_and_never_answers_wrong() -> None:
    end = len(SMALL) - 64
    for cut in range(0, end):
        with pytest.raises(NeedMoreBytes) as more:
            parse_gguf(SMALL[:cut])
        assert more.value.needed > cut
    assert parse_gguf(SMALL[:end]) == parse_gguf(SMALL)


def test_not_a_gguf_or_an_unknown_version_says_so() -> None:
    with pytest.raises(HeaderError, match="not a GGUF file"):
        parse_gguf(b"PK\x03\x04" + b"\0" * 40)
    with pytest.raises(HeaderError, match="GGUF version 9"):
        parse_gguf(b"GGUF" + struct.pack("<I", 9) + b"\0" * 40)


def test_an_unknown_tensor_type_leaves_the_bytes_unknown_not_zero() -> None:
    odd = gguf({"general.architecture": "llama"}, [("x", [8], 250)])
    shape = parse_gguf(odd)
    assert shape.tensor_bytes is None and shape.parameters == 8 and shape.layers is None


# ---------------------------------------------------------------------------------------------- files

CONFIG_7B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
}


def write_directory(root: Path, config: dict[str, Any] = CONFIG_7B) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    (root / "model-00001-of-00002.safetensors").write_bytes(
        safetensors({"a": ("BF16", [4096, 4096]), "norm": ("F32", [4096])}, data=False)
    )
    (root / "model-00002-of-00002.safetensors").write_bytes(safetensors({"b": ("BF16", [4096, 1024])}))
    return root


async def test_a_safetensors_directory_sums_its_shards_and_reads_config(tmp_path: Path) -> None:
    shape = await inspect_source(str(write_directory(tmp_path / "m")))
    assert (shape.format, shape.architecture, shape.layers, shape.trained_context) == (
        "safetensors",
        "LlamaForCausalLM",
        32,
        32768,
    )
    assert (shape.attention_heads, shape.kv_heads, shape.head_dim) == (32, 8, 128)
    assert shape.dtype == "BF16"  # the F32 norm is not the weights' dtype
    assert shape.parameters == 4096 * 4096 + 4096 + 4096 * 1024
    assert shape.tensor_bytes == 2 * 4096 * 4096 + 4 * 4096 + 2 * 4096 * 1024
    one = parse_safetensors((tmp_path / "m" / "model-00002-of-00002.safetensors").read_bytes())
    assert one.parameters_by_dtype == {"BF16": 4096 * 1024}


async def test_a_truncated_gguf_file_says_it_ends_inside_its_header(tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(SMALL[:100])
    with pytest.raises(InspectError, match="ends inside its GGUF header"):
        await inspect_source(str(cut))


@needs_gemma
def test_model_inspect_prints_the_real_gemma_gguf() -> None:
    result = CliRunner().invoke(app, ["model", "inspect", GEMMA])
    assert result.exit_code == 0, result.output
    assert "architecture:      gemma3" in result.stdout
    assert "layers:            18" in result.stdout
    assert "trained context:   32,768" in result.stdout
    assert "quantization:      Q4_K_M" in result.stdout
    as_json = json.loads(CliRunner().invoke(app, ["model", "inspect", GEMMA, "--json"]).stdout)
    assert as_json["kv_heads"] == 1 and as_json["head_dim"] == 256 and as_json["tensors"] == 236
    assert 0 < as_json["tensor_bytes"] < Path(GEMMA).stat().st_size


@pytest.fixture
async def gemma_server() -> AsyncIterator[tuple[str, list[str], list[int]]]:
    ranges: list[str] = []
    sent: list[int] = []

    async def serve(request: web.Request) -> web.StreamResponse:
        ranges.append(request.headers.get("Range", ""))
        response = web.FileResponse(GEMMA)
        await response.prepare(request)
        sent.append(response.content_length or 0)
        return response

    server = web.Application()
    server.router.add_get("/gemma.gguf", serve)
    runner = web.AppRunner(server)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/gemma.gguf", ranges, sent
    await runner.cleanup()


@needs_gemma
async def test_over_http_only_the_header_is_asked_for(
    gemma_server: tuple[str, list[str], list[int]],
) -> None:
    url, ranges, sent = gemma_server
    remote = await inspect_source(url)
    assert remote == await inspect_source(GEMMA)
    assert remote.architecture == "gemma3" and remote.layers == 18 and remote.trained_context == 32768
    assert ranges and all(r.startswith("bytes=0-") for r in ranges), ranges
    assert max(sent) <= 16 << 20 < GEMMA_SIZE  # megabytes of a 250 MB file


# ---------------------------------------------------------------------------------------------- manifest + validate

MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: seven}
spec:
  context_length: CTX
  source: {repo: org/seven, revision: v1, manifest: manifests/seven.json}
  profiles: [{name: a, engine: sim}]
"""
CLUSTER = """\
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: test}
spec:
  mirror: {url: 'http://mirror.internal:7073', origin: none}
"""


def test_the_manifest_records_the_shape_and_validate_refuses_a_longer_context(tmp_path: Path) -> None:
    model_dir = write_directory(tmp_path / "seven")
    repo = tmp_path / "repo"
    out = repo / "manifests" / "seven.json"
    result = CliRunner().invoke(app, ["model", "manifest", str(model_dir), "-o", str(out)])
    assert result.exit_code == 0, result.output
    recorded = json.loads(out.read_text())["model"]
    assert recorded["trained_context"] == 32768 and recorded["kv_heads"] == 8 and recorded["dtype"] == "BF16"
    (repo / "cluster.yaml").write_text(CLUSTER)
    (repo / "models.yaml").write_text(MODEL.replace("CTX", "32768"))
    loaded = load_repo(repo)
    assert loaded.ok and loaded.repo is not None, [str(e) for e in loaded.errors]
    shape = loaded.repo.catalog.models["seven"].shape
    assert shape is not None and shape.layers == 32
    (repo / "models.yaml").write_text(MODEL.replace("CTX", "65536"))
    result = CliRunner().invoke(app, ["validate", str(repo)])
    assert result.exit_code == 1
    assert (
        "models.yaml:5:19: spec.context_length: 65536 is above the model's trained context 32768 "
        "(recorded in " in result.output
    )
    assert "(at most 32768)" in result.output


def test_a_recorded_shape_of_the_wrong_type_is_refused_at_its_line(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "manifests").mkdir(parents=True)
    (repo / "cluster.yaml").write_text(CLUSTER)
    (repo / "models.yaml").write_text(MODEL.replace("CTX", "4096"))
    sha = "a" * 64
    (repo / "manifests" / "seven.json").write_text(
        '{"files": [{"name": "config.json", "size": 1, "sha256": "' + sha + '"}],\n'
        ' "model": {"layers": "thirty-two", "future_field": 1}}\n'
    )
    errors = [str(e) for e in load_repo(repo).errors]
    assert any("seven.json:2:22: model.layers: `layers` must be a whole number" in e for e in errors), errors


async def test_inspect_reads_a_directory_url_through_its_published_manifest(tmp_path: Path) -> None:
    from llmgw.adapters.mirror import MirrorStore, mirror_app

    MirrorStore(tmp_path / "mirror").add_directory(write_directory(tmp_path / "m"), "org/seven", "v1")
    runner = web.AppRunner(mirror_app(tmp_path / "mirror", lambda _t: True))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/org/seven/resolve/v1/"
        remote = await asyncio.wait_for(inspect_source(url), 30)
    finally:
        await runner.cleanup()
    assert remote == await inspect_source(str(tmp_path / "m"))
