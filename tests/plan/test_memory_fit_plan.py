"""`llmgw plan` shows the memory fit of every GPU profile whose model's manifest records its shape, against
the fleet's GPU classes, and fails on one that cannot fit, with the numbers. Synthetic safetensors headers for
a 7B and a 70B config (the files claim gigabytes of tensors and hold only their headers), `llmgw model
manifest` recording them, and a saved live state with a 24 GB and an 80 GB class."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.core.fleet.views import LiveGpu, LiveNode, LiveState

GIB = 1024**3
CONFIGS = {
    "seven": {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
        "architectures": ["MistralForCausalLM"],
    },
    "seventy": {
        "hidden_size": 8192,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "architectures": ["LlamaForCausalLM"],
    },
}
PARAMETERS = {"seven": 7_241_732_096, "seventy": 70_553_706_496}
MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: NAME}
spec:
  context_length: CTX
  source: {repo: org/NAME, revision: v1, manifest: manifests/NAME.json}
  scaling: {min: 0, max: 1, idle_timeout: 10m}
  profiles:
PROFILES
"""
CLUSTER = """\
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: test}
spec:
  mirror: {url: 'http://mirror.internal:7073', origin: none}
"""


def header_only(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(CONFIGS[name]))
    n = PARAMETERS[name]
    table = json.dumps({"w": {"dtype": "BF16", "shape": [n], "data_offsets": [0, 2 * n]}}).encode()
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(table)) + table)
    return directory


def profile(name: str, cls: str, tp: int, slots: int) -> str:
    return f"    - {{name: {name}, engine: vllm, gpu_class: {cls}, gpus: {tp}, tp: {tp}, slots: {slots}}}"


def write_repo(tmp: Path, profiles: dict[str, list[str]], ctx: dict[str, int]) -> Path:
    repo = tmp / "repo"
    (repo / "models").mkdir(parents=True)
    (repo / "cluster.yaml").write_text(CLUSTER)
    for name, lines in profiles.items():
        source = header_only(tmp / "hf" / name, name)
        out = repo / "manifests" / f"{name}.json"
        made = CliRunner().invoke(app, ["model", "manifest", str(source), "-o", str(out)])
        assert made.exit_code == 0, made.output
        text = (
            MODEL.replace("NAME", name).replace("CTX", str(ctx[name])).replace("PROFILES", "\n".join(lines))
        )
        (repo / "models" / f"{name}.yaml").write_text(text)
    return repo


def state(tmp: Path) -> Path:
    def node(name: str, cls: str, memory: int) -> LiveNode:
        gpus = [LiveGpu(index=i, gpu_class=cls, memory_bytes=memory) for i in range(8)]
        return LiveNode(name=name, cpu_cores=64, memory_bytes=512 * GIB, gpus=gpus, engines={"vllm": None})

    path = tmp / "state.json"
    live = LiveState(nodes=[node("l4-node", "l4-24gb", 24 * GIB), node("a100-node", "a100-80gb", 80 * GIB)])
    path.write_text(live.model_dump_json())
    return path


def plan(repo: Path, state_file: Path, *extra: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["plan", str(repo), "--state", str(state_file), "--offline", *extra])
    return result.exit_code, result.stdout, result.stderr


def test_fits_and_needs_tp_4_are_shown_with_the_numbers(tmp_path: Path) -> None:
    repo = write_repo(
        tmp_path,
        {
            "seven": [profile("l4", "l4-24gb", 1, 1)],
            "seventy": [profile("a100x4", "a100-80gb", 4, 8)],
        },
        {"seven": 32768, "seventy": 8192},
    )
    code, out, err = plan(repo, state(tmp_path))
    assert code == 0, err
    assert (
        "= seven/l4 on l4-24gb: fits per GPU (1 GPU): weights 13.5 GiB + KV cache 4.0 GiB (1 sequence x 32768 "
        "tokens) + overhead 1.0 GiB = 18.5 GiB of 21.6 GiB usable (24.0 GiB x 0.90); headroom 3.1 GiB"
    ) in out
    assert "= seventy/a100x4 on a100-80gb: fits per GPU (4 GPUs): weights 32.9 GiB + KV cache 5.0 GiB" in out
    fits = json.loads(plan(repo, state(tmp_path), "--format", "json")[1])["memory_fit"]
    assert {(f["model"], f["state"]) for f in fits} == {("seven", "fits"), ("seventy", "fits")}
    seventy = next(f for f in fits if f["model"] == "seventy")
    assert seventy["weights"] == 2 * PARAMETERS["seventy"] // 4 and seventy["gpus"] == 4


def test_a_profile_that_cannot_fit_fails_the_plan_with_its_arithmetic(tmp_path: Path) -> None:
    repo = write_repo(
        tmp_path,
        {"seventy": [profile("a100x2", "a100-80gb", 2, 8), profile("l4x4", "l4-24gb", 4, 8)]},
        {"seventy": 8192},
    )
    code, out, err = plan(repo, state(tmp_path), "--out", str(tmp_path / "p.json"))
    assert code == 1
    assert (
        "error: model seventy profile a100x2 on a100-80gb: does not fit per GPU (2 GPUs): weights 65.7 GiB + "
        "KV cache 10.0 GiB (8 sequences x 8192 tokens) + overhead 1.0 GiB = 76.7 GiB of 72.0 GiB usable"
    ) in err
    assert (
        "error: model seventy profile l4x4 on l4-24gb: does not fit per GPU (4 GPUs): weights 32.9 GiB" in err
    )
    assert "! seventy/a100x2 on a100-80gb: does not fit" in out
    assert not (tmp_path / "p.json").exists()


def test_a_class_no_node_reports_is_not_checked_not_passed(tmp_path: Path) -> None:
    repo = write_repo(tmp_path, {"seven": [profile("h100", "h100-80gb", 1, 1)]}, {"seven": 32768})
    code, out, _ = plan(repo, state(tmp_path))
    assert code == 0
    assert "? seven/h100 on h100-80gb: no node reports a h100-80gb GPU with its memory" in out


def test_validate_checks_the_fit_offline_against_the_declared_gpu_classes(tmp_path: Path) -> None:
    repo = write_repo(
        tmp_path,
        {"seventy": [profile("a100x4", "a100-80gb", 4, 8), profile("l4x4", "l4-24gb", 4, 8)]},
        {"seventy": 8192},
    )
    classes = "  gpu_classes: {a100-80gb: {memory_gb: 80}, l4-24gb: {memory_gb: 24}}\n"
    (repo / "cluster.yaml").write_text(CLUSTER + classes)
    result = CliRunner().invoke(app, ["validate", str(repo)])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if "spec.profiles" in line]
    assert len(lines) == 1, result.output  # the 80 GB profile fits; only the 24 GB one is refused
    assert (
        "models/seventy.yaml:10:7: spec.profiles[1]: on l4-24gb (24 GiB): does not fit per GPU (4 GPUs): "
        in lines[0]
    )
    assert "weights 32.9 GiB" in lines[0] and "(more tp or pp, a larger gpu_class" in lines[0]
    # Without a declaration validate cannot know a class's memory, and says nothing; plan asks the fleet.
    (repo / "cluster.yaml").write_text(CLUSTER)
    assert CliRunner().invoke(app, ["validate", str(repo)]).exit_code == 0
