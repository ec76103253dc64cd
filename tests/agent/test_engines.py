"""Engine adapters: exact command lines, key handling, and stand-ins for the engines that cannot run here."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from llmgw_agent import engines
from llmgw_agent.engines import LaunchContext, SpecError, launch_plan, metric_mapping
from llmgw_agent.protocol import ShardSpec, ShardStatus, WeightSource
from llmgw_agent.supervisor import Supervisor, SupervisorConfig
from prometheus_client.parser import text_string_to_metric_families
from support import free_port_range, wait_for

from .helpers import group_alive, read_cmdline

STANDINS = Path(__file__).parent / "standins"


def spec(engine: str, **kw: object) -> ShardSpec:
    base: dict[str, object] = {"replica_id": "r1", "model": "m", "engine": engine, "api_key": "sekrit"}
    base.update(kw)
    return ShardSpec.model_validate(base)


CTX = LaunchContext("0.0.0.0", 20001, "/models/m.gguf", "/state/work/r1-0", None, python="/usr/bin/python3")


def test_llamacpp_command_line_and_key_by_environment() -> None:
    plan = launch_plan(
        spec("llamacpp", context_length=2048, slots=2, cpu_cores=3, served_model_name="gemma"), CTX
    )
    assert plan.argv == [
        "llama-server",
        "-m",
        "/models/m.gguf",
        "--host",
        "0.0.0.0",
        "--port",
        "20001",
        "-c",
        "2048",
        "-np",
        "2",
        "-t",
        "3",
        "--metrics",
        "-a",
        "gemma",
    ]
    assert plan.env == {"LLAMA_API_KEY": "sekrit"} and "sekrit" not in plan.argv
    assert plan.health_path == "/health" and plan.metrics_path == "/metrics"


def test_llamacpp_embeddings_and_pooling_come_from_the_profile_args() -> None:
    # gemma's GGUF declares no pooling: without --pooling llama-server refuses /v1/embeddings.
    plan = launch_plan(spec("llamacpp", args={"embeddings": True, "pooling": "mean"}), CTX)
    assert plan.argv[-3:] == ["--embeddings", "--pooling", "mean"]
    assert "--embeddings" not in launch_plan(spec("llamacpp", args={"embeddings": False}), CTX).argv


def test_llamacpp_refuses_what_it_cannot_do() -> None:
    with pytest.raises(SpecError, match="never spans nodes"):
        launch_plan(spec("llamacpp", shard_count=2), CTX)
    with pytest.raises(SpecError, match="tensor parallelism"):
        launch_plan(spec("llamacpp", args={"tensor_parallel_size": 2}), CTX)
    with pytest.raises(SpecError, match="unknown arg 'rm_rf'"):
        launch_plan(spec("llamacpp", args={"rm_rf": "/"}), CTX)


def test_vllm_command_line() -> None:
    s = spec(
        "vllm",
        gpus=[0, 1],
        context_length=8192,
        slots=64,
        served_model_name="llama",
        args={"quantization": "fp8"},
    )
    plan = launch_plan(s, CTX)
    assert plan.argv == [
        "vllm",
        "serve",
        "/models/m.gguf",
        "--served-model-name",
        "llama",
        "--host",
        "0.0.0.0",
        "--port",
        "20001",
        "--max-model-len",
        "8192",
        "--max-num-seqs",
        "64",
        "--quantization",
        "fp8",
        "-tp",
        "2",
    ]
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "0,1", "VLLM_API_KEY": "sekrit"}


def test_a_whisper_profile_may_raise_vllms_step_budget() -> None:
    # Whisper's encoder takes 1,500 positions at once; vLLM refuses to start below that (docs/engines.md, Speech).
    plan = launch_plan(spec("vllm", args={"max_num_batched_tokens": 2048}), CTX)
    assert plan.argv[plan.argv.index("--max-num-batched-tokens") + 1] == "2048"


def test_sglang_command_line_key_is_an_argument() -> None:
    plan = launch_plan(spec("sglang", gpus=[0, 1, 2, 3], slots=8), CTX)
    assert plan.argv[:4] == ["python3", "-m", "sglang.launch_server", "--model-path"]
    assert "--tp-size" in plan.argv and plan.argv[plan.argv.index("--tp-size") + 1] == "4"
    assert "--tp" not in plan.argv and "--enable-metrics" in plan.argv
    assert plan.argv[-2:] == ["--api-key", "sekrit"] and plan.key_exposure == "argv"


def test_trtllm_command_line_and_prometheus_path() -> None:
    plan = launch_plan(spec("trtllm", slots=16, context_length=4096), CTX)
    assert plan.argv[:6] == ["trtllm-serve", "/models/m.gguf", "--host", "0.0.0.0", "--port", "20001"]
    assert plan.argv[-2:] == ["--config", "/state/work/r1-0/trtllm-extra.yaml"]
    assert "return_perf_metrics: true" in plan.files["trtllm-extra.yaml"]
    assert plan.metrics_path == "/prometheus/metrics" and plan.key_exposure == "none"
    assert "sekrit" not in " ".join(plan.argv) and "sekrit" not in str(plan.env)


def test_sim_command_line() -> None:
    plan = launch_plan(spec("sim", slots=3, args={"decode_ms_per_token": 5}), CTX)
    assert plan.argv[:3] == ["/usr/bin/python3", "-m", "llmgw_agent.sim"]
    assert plan.argv[plan.argv.index("--max-concurrency") + 1] == "3"
    # The sim imports the agent's own code, wherever the agent was imported from (engines get no PYTHONPATH
    # from the agent's environment).
    import llmgw_agent

    assert plan.env == {"VLLM_API_KEY": "sekrit", "PYTHONPATH": str(Path(llmgw_agent.__file__).parent.parent)}


def test_metric_mappings() -> None:
    assert metric_mapping("llamacpp").kv_usage is None  # llama.cpp has no KV ratio
    assert metric_mapping("llamacpp").running == "llamacpp:requests_processing"
    assert metric_mapping("vllm").kv_usage_alternatives == ("vllm:gpu_cache_usage_perc",)
    assert metric_mapping("sim").waiting == "vllm:num_requests_waiting"
    assert metric_mapping("trtllm").metrics_path == "/prometheus/metrics"
    with pytest.raises(KeyError, match="unknown engine"):
        metric_mapping("ollama")


@pytest.fixture
async def supervisor(tmp_path: Path) -> AsyncIterator[tuple[Supervisor, list[ShardStatus]]]:
    updates: list[ShardStatus] = []
    # The stand-in `sglang` package is found through a PYTHONPATH the node's operator sets in the engine's
    # executable, as a real install would; a profile may not set PYTHONPATH.
    sglang_python = tmp_path / "sglang-python"
    sglang_python.write_text(f'#!/bin/sh\nPYTHONPATH={STANDINS} exec {sys.executable} "$@"\n')
    sglang_python.chmod(0o755)
    ports = free_port_range(100)
    cfg = SupervisorConfig(
        state_dir=tmp_path / "state",
        advertise_host="127.0.0.1",
        bind_host="127.0.0.1",
        port_range=(ports, ports + 99),
        engine_binaries={
            "vllm": str(STANDINS / "vllm"),
            "trtllm": str(STANDINS / "trtllm-serve"),
            "sglang": str(sglang_python),
        },
        ready_timeout_s=30,
        stop_grace_s=5,
        poll_interval_s=0.05,
    )
    sup = Supervisor(cfg, updates.append)
    yield sup, updates
    await sup.stop_all()
    await sup.close()


@pytest.mark.integration
@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
async def test_standin_started_by_supervisor(
    engine: str, supervisor: tuple[Supervisor, list[ShardStatus]], tmp_path: Path
) -> None:
    sup, _ = supervisor
    weights = tmp_path / "weights"
    weights.mkdir()
    s = spec(engine, slots=4, context_length=1024, source=WeightSource(path=str(weights)))
    sup.start(s)
    status = await wait_for(
        lambda: next((x for x in sup.statuses() if x.state in ("ready", "failed")), None), limit_s=20
    )
    assert status.state == "ready", status.last_output_lines
    mapping = metric_mapping(engine)
    assert status.metrics_path == mapping.metrics_path
    async with aiohttp.ClientSession() as http:
        # Reached through the agent's pass-through: every path needs the key, metrics included (M1).
        async with http.get(f"{status.base_url}{status.metrics_path}") as resp:
            assert resp.status == 401
        key = {"Authorization": "Bearer sekrit"}
        async with http.get(f"{status.base_url}{status.metrics_path}", headers=key) as resp:
            assert resp.status == 200
            text = await resp.text()
        async with http.get(f"{status.base_url}/v1/models") as resp:
            assert resp.status == 401  # TRT-LLM too, which has no key of its own
            async with http.get(
                f"{status.base_url}/v1/models", headers={"Authorization": "Bearer sekrit"}
            ) as resp:
                assert resp.status == 200
    names = {smp.name for fam in text_string_to_metric_families(text) for smp in fam.samples}
    for name in (
        mapping.running,
        mapping.waiting,
        mapping.kv_usage,
        mapping.prompt_tokens,
        mapping.generation_tokens,
    ):
        assert name in names
    assert status.pid is not None
    cmdline = read_cmdline(status.pid)
    if engine == "vllm":
        assert "sekrit" not in cmdline  # by environment, not on the command line
    (stopped,) = await sup.stop("r1")
    assert stopped.state == "stopped"
    assert not group_alive(status.pid)


@pytest.mark.integration
async def test_standin_refuses_an_unknown_flag(supervisor: tuple[Supervisor, list[ShardStatus]]) -> None:
    """The stand-ins are strict, so they would catch an adapter passing a flag the real CLI lacks."""
    sup, updates = supervisor
    engines._PLANNERS["vllm"] = _with_extra_flag(engines._PLANNERS["vllm"])
    try:
        sup.start(spec("vllm"))
        failed = await wait_for(lambda: next((u for u in updates if u.state == "failed"), None), limit_s=20)
    finally:
        engines._PLANNERS["vllm"] = engines._vllm_plan
    assert failed.exit_code == 2
    assert any("unrecognized arguments: --not-a-vllm-flag" in line for line in failed.last_output_lines)


def _with_extra_flag(
    planner: Callable[[ShardSpec, LaunchContext], engines.LaunchPlan],
) -> Callable[[ShardSpec, LaunchContext], engines.LaunchPlan]:
    def plan(s: ShardSpec, ctx: LaunchContext) -> engines.LaunchPlan:
        p = planner(s, ctx)
        return engines.LaunchPlan(
            [*p.argv, "--not-a-vllm-flag"], p.env, p.files, p.health_path, p.metrics_path
        )

    return plan
