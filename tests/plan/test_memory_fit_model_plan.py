"""`llmgw model plan`: every precision x card count x GPU class, with the numbers (llmgw.core.weights.fit_table)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.core.weights.fit_table import fit_table, precisions
from llmgw.core.weights.memory_fit import GIB

from .test_memory_fit import SEVEN_B, SEVENTY_B

CLASSES = {"rtx4090-24g": 24 * GIB, "h100-80g": 80 * GIB}


def _fits(rows, precision: str, cls: str) -> list[int]:
    return [r.gpus for r in rows if r.precision.name == precision and r.gpu_class == cls and r.fit.fits]


def test_a_70b_at_bf16_needs_4_h100s_and_at_fp8_two() -> None:
    rows = fit_table(SEVENTY_B, CLASSES, context_length=8192, slots=8)
    assert [p.name for p in precisions(SEVENTY_B)] == ["bf16", "fp8"]
    assert _fits(rows, "bf16", "h100-80g") == [4, 8]
    assert _fits(rows, "fp8", "h100-80g") == [2, 4, 8]
    # 16.4 GiB of weights + 2.5 GiB of cache + 1 GiB per card: only across all 8 of a node's 24 GB cards.
    assert _fits(rows, "bf16", "rtx4090-24g") == [8]
    fp8 = next(r for r in rows if r.precision.name == "fp8" and r.gpus == 2 and r.gpu_class == "h100-80g")
    assert fp8.fit.weights == SEVENTY_B.tensor_bytes // 2 // 2
    assert fp8.precision.how == "args: {quantization: fp8}" and fp8.precision.engine == "vllm"


def test_a_7b_fits_one_24gb_card_and_tp_must_divide_the_kv_heads() -> None:
    rows = fit_table(SEVEN_B, CLASSES, context_length=32768)
    assert _fits(rows, "bf16", "rtx4090-24g")[0] == 1
    odd = SEVEN_B.__class__(**{**SEVEN_B.to_json(), "kv_heads": 6})
    assert {r.gpus for r in fit_table(odd, CLASSES, context_length=4096)} == {1, 2}, (
        "6 heads split 1 or 2 ways"
    )


def test_a_gguf_is_served_as_written_by_llama_cpp_split_by_layers() -> None:
    shape = SEVEN_B.__class__(**{**SEVEN_B.to_json(), "format": "gguf", "quantization": "Q4_K_M"})
    (only,) = precisions(shape)
    assert (only.name, only.engine, only.split) == ("Q4_K_M", "llamacpp", "layers")


def _gemma() -> Path:
    path = Path(
        os.environ.get("LLMGW_TEST_MODEL", Path.home() / ".cache/llmgw/models/gemma-3-270m-q4_k_m.gguf")
    )
    if not path.exists():
        pytest.skip(f"tiny model {path} is missing (make model)")
    return path


def test_the_command_plans_the_real_gemma_file_against_the_classes_given() -> None:
    args = ["model", "plan", str(_gemma()), "--slots", "4", "--gpu-class", "t4-16g=15", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["context_length"] == 32768, "the trained context, from the file's header"
    assert {(r["precision"], r["engine"]) for r in answer["rows"]} == {("Q4_K_M", "llamacpp")}
    assert [r["gpus"] for r in answer["rows"]] == [1, 2, 4, 8]
    assert all(r["fits"] for r in answer["rows"])
    text = CliRunner().invoke(app, args[:-1])
    assert "t4-16g: fewest cards: 1 at Q4_K_M (llamacpp" in text.stdout, text.stdout


def test_a_bad_gpu_class_says_what_to_give() -> None:
    result = CliRunner().invoke(app, ["model", "plan", str(_gemma()), "--gpu-class", "h100"])
    assert result.exit_code == 1
    assert "--gpu-class 'h100': give NAME=GiB per card, e.g. h100-80g=80" in result.output
