"""The proxies the benchmarks put in front of one mock upstream: llmgw, the Python floor, and the peers.

Each start_* returns a Target, or None with a one-line message when the peer cannot be installed or started
here (only PyPI and npm are reachable; nothing is downloaded otherwise). Peers install into throwaway places
under the temp directory and are reused by later runs:
  floor        a ~20-line aiohttp pass-through: the least any Python proxy does
  llmgw        llmgw-router with every check on (benchmarks/every_check.py: keys, limits at three levels,
               admission, the prefix policy over 4 endpoints, an input guardrail, the response cache, tags,
               tracing configured, usage rows)
  vllm-router  PyPI `vllm-router` (Rust), one worker, round robin; no client auth, limits or accounting
  portkey      npm `@portkey-ai/gateway` (Node), headless, provider openai with a custom host; no client keys,
               limits or usage store, but it parses and rebuilds each body for the provider
  litellm      LiteLLM's proxy, one worker, no database (its master key is the client key)
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import every_check
from every_check import ENGINE_KEY, MODEL
from harness import Procs, free_port, free_ports, wait_http

THROWAWAY = Path(tempfile.gettempdir())
LITELLM_VENV = THROWAWAY / "llmgw-bench-litellm"
LITELLM_KEY = "sk-bench-litellm-master"
VLLM_ROUTER_VENV = THROWAWAY / "llmgw-bench-vllm-router"
PORTKEY_DIR = THROWAWAY / "llmgw-bench-portkey"
PEERS = ("vllm", "portkey", "litellm")
ENDPOINT_ENV = (
    "OTEL_EXPORTER_OTLP_ENDPOINT"  # llmgw.adapters.tracing's: an OTLP endpoint from the environment
)


@dataclass
class Target:
    name: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None  # the proxy's process (the root of its tree); None for direct
    metrics: str | None = None  # llmgw's /metrics URL: what it answered, read around each run
    log: Path | None = None  # the proxy's output (Procs.start's file): its lines from a failed run are shown


# The floor: the least a Python proxy can do (read, forward, stream back), about 20 lines.
FLOOR = r"""
import sys, aiohttp
from aiohttp import web
UP = sys.argv[2]
async def session_ctx(app):
    app["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    yield
    await app["s"].close()
async def proxy(request):
    body = await request.read()
    async with request.app["s"].post(UP + request.path, data=body, headers={"Content-Type": "application/json"}) as up:
        resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers.get("Content-Type", "")})
        await resp.prepare(request)
        async for data in up.content.iter_any():
            await resp.write(data)
        await resp.write_eof()
        return resp
app = web.Application()
app.cleanup_ctx.append(session_ctx)
app.router.add_post("/v1/chat/completions", proxy)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""


def start_floor(procs: Procs, work: Path, upstream: str, cpus: str | None = None) -> Target:
    port = free_port()
    (work / "floor.py").write_text(FLOOR)
    proc = procs.start([sys.executable, str(work / "floor.py"), str(port), upstream], cpus=cpus)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/", proc=proc)  # 404 from aiohttp: listening
    return Target("floor", url, proc=proc)


async def _make_store_key(dsn: str) -> str:
    from llmgw.adapters.keys import create_key
    from llmgw.store.store import Store

    store = await Store.open(dsn)
    try:
        return (await create_key(store, "bench", time.time(), name="bench")).plaintext
    finally:
        await store.close()


# A guardrail of deterministic checks only (no judge), input and output, that the benchmark's requests never
# trip: what screening costs a request that passes (router_overhead.py --guardrails).
BENCH_GUARD = {
    "guardrails": {
        "bench-guard": {
            "stages": ["input", "output"],
            "pii": ["email", "phone", "card", "national_id"],
            "keywords": ["project bluebird", "internal only", "do not share"],
            "regex": [r"(?i)secret[-_ ]key"],
            "blocked_topics": {"weapons": ["rifle", "ammunition"]},
            "max_prompt_chars": 100000,
        }
    },
    "models": {MODEL: ["bench-guard"]},
}


def start_llmgw(
    procs: Procs,
    work: Path,
    upstream: str,
    workers: int = 1,
    cpus: str | None = None,
    *,
    name: str = "llmgw",
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    guard: dict[str, object] | None = None,
    cache: dict[str, object] | None = None,
    engine: str = "vllm",
) -> Target:
    """llmgw-router in `work` (its store, snapshot and state) with every check on (every_check.py); `extra`
    flags and `env` (a PYTHONPATH naming another tree, for benchmarks/tracing_compare.py) when given; `guard`
    and `cache` replace the configuration's guardrails and the project's response_cache; `engine`: the
    upstream's engine kind (engine_overhead.py fronts real ones)."""
    work.mkdir(parents=True, exist_ok=True)
    dsn = f"sqlite:///{work / 'store.db'}"
    key = asyncio.run(_make_store_key(dsn))
    (work / "snapshot.json").write_text(json.dumps(every_check.snapshot(upstream, guard, cache, engine)))
    port, metrics_port = free_ports(2)
    argv = [sys.executable, "-m", "llmgw_router", "--snapshot", str(work / "snapshot.json"), "--store", dsn]
    argv += ["--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}"]
    argv += ["--log-level", "WARNING", *every_check.ROUTER_FLAGS, *extra]
    # Never the checkout's .llmgw/router: two benchmarks at once would share its usage spool.
    if "--state-dir" not in extra:
        argv += ["--state-dir", str(work / "state")]
    if workers > 1:  # only then, so the benchmark runs on a router that has no --workers yet
        argv += ["--workers", str(workers)]
    # Tracing configured without an endpoint: the standard variable would name one.
    env = {k: v for k, v in (env or os.environ).items() if k != ENDPOINT_ENV}
    proc = procs.start(argv, env=env, cpus=cpus)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/ready", proc=proc)
    headers = {"Authorization": f"Bearer {key}", **every_check.REQUEST_HEADERS}
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    return Target(name, url, headers, proc, metrics=metrics, log=procs.log_path(procs.procs.index(proc)))


def _skipped(name: str, procs: Procs, proc: subprocess.Popen[bytes] | None, exc: BaseException) -> None:
    tail = procs.log_tail(proc) if proc is not None else ""
    if proc is not None:
        procs.stop(proc)
    print(f"{name} skipped: {type(exc).__name__}: {str(exc)[:300]} {tail[:400]}".rstrip(), flush=True)


def _venv_install(venv: Path, requirement: str, exe: Path) -> None:
    if exe.exists():
        return
    print(f"installing {requirement} into {venv} (throwaway venv) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", requirement],
        check=True,
        timeout=1800,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def start_litellm(procs: Procs, work: Path, upstream: str, cpus: str | None = None) -> Target | None:
    litellm = LITELLM_VENV / "bin" / "litellm"
    proc = None
    try:
        _venv_install(LITELLM_VENV, "litellm[proxy]", litellm)
        config = work / "litellm.yaml"
        config.write_text(
            "model_list:\n"
            f"  - model_name: {MODEL}\n"
            "    litellm_params:\n"
            f"      model: openai/{MODEL}\n"
            f"      api_base: {upstream}/v1\n"
            f"      api_key: {ENGINE_KEY}\n"
            "general_settings:\n  disable_spend_logs: true\n"
        )
        port = free_port()
        # LiteLLM refuses to start without a master key; clients then present it as their key.
        env = dict(os.environ, LITELLM_LOG="ERROR", LITELLM_MASTER_KEY=LITELLM_KEY)
        env.pop("DATABASE_URL", None)
        argv = [str(litellm), "--config", str(config), "--port", str(port), "--num_workers", "1"]
        proc = procs.start(argv, env=env, cwd=str(work), cpus=cpus)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health/liveliness", limit_s=300, proc=proc)
        return Target("litellm", url, {"Authorization": f"Bearer {LITELLM_KEY}"}, proc)
    except Exception as exc:
        _skipped("LiteLLM", procs, proc, exc)
        return None


def start_vllm_router(procs: Procs, work: Path, upstream: str, cpus: str | None = None) -> Target | None:
    """vllm-router 0.1.x: it waits until every worker's /health answers 200 before it listens."""
    exe = VLLM_ROUTER_VENV / "bin" / "vllm-router"
    proc = None
    try:
        _venv_install(VLLM_ROUTER_VENV, "vllm-router", exe)
        port, prometheus_port = free_ports(2)
        argv = [str(exe), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", upstream]
        argv += ["--policy", "round_robin", "--log-level", "warning", "--worker-startup-check-interval", "1"]
        # Its Prometheus listener defaults to port 29000: a free one, so two runs never collide.
        argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(prometheus_port)]
        proc = procs.start(argv, cwd=str(work), cpus=cpus)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", limit_s=60, proc=proc)
        return Target("vllm-router", url, {}, proc)
    except Exception as exc:
        _skipped("vLLM router", procs, proc, exc)
        return None


def start_portkey(procs: Procs, work: Path, upstream: str, cpus: str | None = None) -> Target | None:
    """Portkey's gateway for Node: the provider and where it lives come with each request, as headers."""
    package = PORTKEY_DIR / "node_modules" / "@portkey-ai" / "gateway"
    proc = None
    try:
        if not (package / "build" / "start-server.js").exists():
            if shutil.which("npm") is None:
                raise RuntimeError("npm is not installed")
            print(f"installing @portkey-ai/gateway into {PORTKEY_DIR} (throwaway) ...", flush=True)
            PORTKEY_DIR.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [
                    "npm",
                    "install",
                    "--prefix",
                    str(PORTKEY_DIR),
                    "--no-audit",
                    "--no-fund",
                    "@portkey-ai/gateway",
                ],
                check=True,
                timeout=900,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        port = free_port()
        argv = ["node", "build/start-server.js", f"--port={port}", "--headless"]
        proc = procs.start(argv, cwd=str(package), cpus=cpus)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/", limit_s=60, proc=proc)
        headers = {
            "x-portkey-provider": "openai",
            "x-portkey-custom-host": f"{upstream}/v1",
            "Authorization": f"Bearer {ENGINE_KEY}",  # passed on to the provider as its key
        }
        return Target("portkey", url, headers, proc)
    except Exception as exc:
        _skipped("Portkey", procs, proc, exc)
        return None
