"""What the engine computes on (issue 19): a shard that wanted a GPU but whose engine runs on the CPU is failed
in the engine's own words, not called ready; a CPU shard is untouched and says what it runs on."""

from __future__ import annotations

import os

import pytest
from llmgw_agent.compute import Compute, gpu_problem, read_compute, wants_gpu

from .fake_controller import FakeController
from .test_daemon import (
    AgentProcs,
    gemma_model,
    llama_binary,
    registered,
    start_ready,
    until_state,
)

# llama-server b11434 built without a GPU backend, given -ngl 99 (recorded here).
CPU_BUILD = [
    "warning: no usable GPU found, --gpu-layers option will be ignored",
    "warning: one possible reason is that llama.cpp was compiled without GPU support",
    "0.00.005.405 I srv    load_model: loading model '/models/gemma.gguf'",
    "0.01.785.456 I srv  llama_server: listening on http://127.0.0.1:18999",
]


def test_llama_cpp_without_a_gpu_backend_is_read_as_the_cpu() -> None:
    said = read_compute("llamacpp", CPU_BUILD)
    assert said.words() == "cpu (no usable GPU)"
    assert gpu_problem(said, wanted=True) == (
        "the engine runs without a GPU, in its own words: "
        "'warning: no usable GPU found, --gpu-layers option will be ignored'"
    )
    assert gpu_problem(said, wanted=False) is None, "a CPU shard on a CPU engine is what was asked"


def test_offloading_no_layer_is_computing_on_the_cpu() -> None:
    said = read_compute("llamacpp", ["load_tensors: offloaded 0/19 layers to GPU"])
    assert said == Compute(None, (0, 19))
    assert (
        gpu_problem(said, wanted=True)
        == "the engine offloaded 0 of 19 layers to the GPU: it computes on the CPU"
    )
    full = read_compute("llamacpp", ["load_tensors: offloaded 19/19 layers to GPU"])
    assert full.words() == "gpu (19/19 layers offloaded)" and gpu_problem(full, wanted=True) is None


def test_vllm_on_the_cpu_platform_is_named_and_silence_is_not_a_failure() -> None:
    line = "INFO 10-07 13:06:57 [__init__.py:239] Automatically detected platform cpu."
    assert gpu_problem(read_compute("vllm", [line]), wanted=True) is not None
    assert (
        gpu_problem(read_compute("vllm", ["INFO Automatically detected platform cuda."]), wanted=True) is None
    )
    assert gpu_problem(read_compute("sglang", []), wanted=True) is None, "unknown is not a failure"


@pytest.mark.parametrize(
    ("engine", "gpus", "args", "wanted"),
    [
        ("llamacpp", [], {"n_gpu_layers": 99}, True),
        ("llamacpp", [], {"n_gpu_layers": 0}, False),
        ("llamacpp", [], {}, False),
        ("vllm", [0, 1], {}, True),
        ("sim", [], {"n_gpu_layers": 5}, False),
    ],
)
def test_a_shard_wants_a_gpu_when_given_devices_or_told_to_offload(
    engine: str, gpus: list[int], args: dict[str, object], wanted: bool
) -> None:
    assert wants_gpu(engine, gpus, args) is wanted


def _gemma_spec(replica: str, **args: object) -> dict[str, object]:
    return {
        "replica_id": replica,
        "model": "gemma",
        "engine": "llamacpp",
        "source": {"path": str(gemma_model())},
        "context_length": 512,
        "slots": 1,
        "cpu_cores": 1,
        "api_key": "llama-key",
        "served_model_name": "gemma",
        "args": dict(args),
    }


@pytest.mark.llamacpp
async def test_the_real_cpu_llama_server_given_a_gpu_profile_is_failed_in_its_own_words(
    ctl: FakeController, agents: AgentProcs
) -> None:
    agents.start([ctl.url], engines={"llamacpp": {"path": llama_binary(), "version": "b11434"}})
    await registered(ctl)
    since = len(ctl.updates)
    reply = await ctl.command("start_shard", spec=_gemma_spec("rep-gpu", n_gpu_layers=99))
    assert reply.ok, reply.error
    failed = await until_state(ctl, "rep-gpu", "ready", "failed", since=since)
    assert failed.state == "failed", "a GPU profile running on the CPU must not be called ready"
    assert "no usable GPU found" in failed.message, failed.message
    assert failed.message.startswith("the engine runs without a GPU, in its own words:")
    assert failed.compute == "cpu (no usable GPU)"
    assert failed.pid is None or not _alive(failed.pid), "the engine was stopped"

    cpu = await start_ready(ctl, agents, _gemma_spec("rep-cpu"))
    assert cpu.compute is None, "without -ngl llama.cpp says nothing about a GPU: not said, not a failure"
    assert (await ctl.command("stop_shard", replica_id="rep-cpu")).ok


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
