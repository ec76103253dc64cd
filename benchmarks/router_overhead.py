"""What the router adds on top of an engine: latency and throughput against a mock upstream, side by side.

The same mock upstream (an OpenAI-shaped aiohttp app answering instantly, vLLM metric names on /metrics) is
reached in one run:
  direct   - wrk straight to the mock
  floor    - a minimal aiohttp pass-through proxy (~20 lines): the floor for any Python proxy
  llmgw    - llmgw-router with auth (store keys), pooled limits, scheduling, scraping and usage accounting on
  litellm  - LiteLLM's proxy, one worker, no database, installed into a throwaway venv under /tmp (skipped with a
             message when that fails)
Non-streaming and streaming, at concurrency 1, 16 and 64, measured with wrk. Prints a table of p50/p99 latency
added over direct and requests per second; the last line is machine-readable:

  router_overhead: added_p50_ms_c1=X rps_c16=X floor_rps_c16=X litellm_rps_c16=X

Run: .venv/bin/python benchmarks/router_overhead.py [--duration 5] [--no-litellm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

MODEL = "bench-model"
LITELLM_VENV = Path(tempfile.gettempdir()) / "llmgw-bench-litellm"
LITELLM_KEY = "sk-bench-litellm-master"

MOCK = r"""
import json, sys
from aiohttp import web
CHAT = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "bench-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello from the mock"},
    "finish_reason": "stop"}], "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}}).encode()
def chunk(content, finish=None):
    return ("data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "bench-model",
        "choices": [{"index": 0, "delta": {"content": content} if content else {}, "finish_reason": finish}]}) + "\n\n").encode()
USAGE = ("data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "bench-model",
    "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}}) + "\n\n").encode()
STREAM = [chunk(w) for w in ["hello", " from", " the", " mock", "!"]] + [chunk(None, "stop")]
METRICS = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n"
async def chat(request):
    body = await request.json()
    if not body.get("stream"):
        return web.Response(body=CHAT, content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for c in STREAM:
        await resp.write(c)
    if (body.get("stream_options") or {}).get("include_usage"):
        await resp.write(USAGE)
    await resp.write(b"data: [DONE]\n\n")
    return resp
async def models(request):
    return web.json_response({"object": "list", "data": [{"id": "bench-model", "object": "model"}]})
async def metrics(request):
    return web.Response(body=METRICS, content_type="text/plain")
app = web.Application()
app.router.add_post("/v1/chat/completions", chat)
app.router.add_get("/v1/models", models)
app.router.add_get("/metrics", metrics)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""

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

WRK_LUA = """
wrk.method = "POST"
wrk.body = [[{BODY}]]
wrk.headers["Content-Type"] = "application/json"
{AUTH}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(
    url: str,
    limit_s: float = 120.0,
    headers: dict[str, str] | None = None,
    proc: subprocess.Popen[bytes] | None = None,
) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the process serving {url} exited with {proc.returncode}")
        try:
            req = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(req, timeout=5) as r:
                if r.status < 500:
                    return
        except Exception:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {limit_s:g} s")


@dataclass
class Result:
    p50_ms: float
    p99_ms: float
    rps: float
    errors: int


def _ms(text: str) -> float:
    m = re.match(r"([0-9.]+)(us|ms|s)", text)
    if not m:
        return float("nan")
    value, unit = float(m.group(1)), m.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


def wrk(url: str, stream: bool, conns: int, duration: float, key: str | None) -> Result:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello in five words."}],
        "max_tokens": 16,
    }
    if stream:
        body["stream"] = True
    auth = f'wrk.headers["Authorization"] = "Bearer {key}"' if key else ""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(WRK_LUA.replace("{BODY}", json.dumps(body)).replace("{AUTH}", auth))
        script = f.name
    threads = 1 if conns == 1 else 2
    try:
        out = subprocess.run(
            ["wrk", f"-t{threads}", f"-c{conns}", f"-d{duration:g}s", "--latency", "-s", script, url],
            capture_output=True,
            text=True,
            timeout=duration + 60,
            check=True,
        ).stdout
    finally:
        os.unlink(script)
    if re.search(r"Non-2xx|Socket errors", out):
        _show_error(url, body, key, out)
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    rps = re.search(r"Requests/sec:\s+([0-9.]+)", out)
    errs = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    sock = re.search(r"Socket errors:.*?timeout (\d+)", out)
    return Result(
        _ms(p50.group(1)) if p50 else float("nan"),
        _ms(p99.group(1)) if p99 else float("nan"),
        float(rps.group(1)) if rps else 0.0,
        (int(errs.group(1)) if errs else 0) + (int(sock.group(1)) if sock else 0),
    )


def _show_error(url: str, body: dict[str, object], key: str | None, out: str) -> None:
    """wrk saw errors: say which (its summary line and one request's answer), so a number is never silently bad."""
    print(
        "  wrk: "
        + " | ".join(
            line.strip() for line in out.splitlines() if "error" in line.lower() or "Non-2xx" in line
        )
    )
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            print(f"  one request now: {r.status}")
    except urllib.error.HTTPError as exc:
        print(f"  one request now: {exc.code} {exc.read()[:300]!r}")
    except Exception as exc:
        print(f"  one request now: {type(exc).__name__}: {exc}")


class Procs:
    def __init__(self, logs: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = logs

    def start(
        self, argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None
    ) -> subprocess.Popen[bytes]:
        # Output to a file, never a pipe nobody reads: a full pipe would stall the process mid-benchmark.
        with open(self.logs / f"proc-{len(self.procs)}.log", "wb") as log:
            p = subprocess.Popen(
                argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs.append(p)
        return p

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


async def make_store_key(dsn: str) -> str:
    from llmgw.adapters.keys import create_key
    from llmgw.store.store import Store

    store = await Store.open(dsn)
    try:
        return (await create_key(store, "bench", time.time(), name="bench")).plaintext
    finally:
        await store.close()


def start_llmgw(procs: Procs, work: Path, upstream: str) -> tuple[str, str]:
    dsn = f"sqlite:///{work / 'store.db'}"
    key = asyncio.run(make_store_key(dsn))
    snapshot = {
        "revision": "bench",
        "models": {MODEL: {"context_length": 8192, "capabilities": ["chat"]}},
        "policies": {"balanced": {"picker": "p2c", "weights": {"queue": 2, "kv": 2, "inflight": 1}}},
        "router": {"default_policy": "balanced"},
        "tenants": {
            "organizations": {"acme": {"limits": {"rpm": 100_000_000}}},
            "projects": {
                "bench": {"organization": "acme", "limits": {"rpm": 100_000_000, "tpm": 10_000_000_000}}
            },
        },
        "endpoints": [
            {
                "replica_id": "mock-0",
                "model": MODEL,
                "engine": "vllm",
                "base_url": upstream,
                "api_key": "engine-key",
            }
        ],
    }
    (work / "snapshot.json").write_text(json.dumps(snapshot))
    port = free_port()
    procs.start(
        [
            sys.executable,
            "-m",
            "llmgw_router",
            "--snapshot",
            str(work / "snapshot.json"),
            "--store",
            dsn,
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics-listen",
            f"127.0.0.1:{free_port()}",
            "--log-level",
            "WARNING",
        ]
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/ready")
    return url, key


def start_litellm(procs: Procs, work: Path, upstream: str) -> str | None:
    py = LITELLM_VENV / "bin" / "python"
    litellm = LITELLM_VENV / "bin" / "litellm"
    try:
        if not litellm.exists():
            print(f"installing LiteLLM into {LITELLM_VENV} (throwaway venv) ...", flush=True)
            subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True, timeout=300)
            subprocess.run(
                [str(py), "-m", "pip", "install", "-q", "litellm[proxy]"],
                check=True,
                timeout=1800,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        config = work / "litellm.yaml"
        config.write_text(
            "model_list:\n"
            f"  - model_name: {MODEL}\n"
            "    litellm_params:\n"
            f"      model: openai/{MODEL}\n"
            f"      api_base: {upstream}/v1\n"
            "      api_key: engine-key\n"
            "general_settings:\n  disable_spend_logs: true\n"
        )
        port = free_port()
        # LiteLLM refuses to start without a master key; clients then present it as their key.
        env = dict(os.environ, LITELLM_LOG="ERROR", LITELLM_MASTER_KEY=LITELLM_KEY)
        env.pop("DATABASE_URL", None)
        proc = procs.start(
            [str(litellm), "--config", str(config), "--port", str(port), "--num_workers", "1"],
            env=env,
            cwd=str(work),
        )
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health/liveliness", limit_s=300, proc=proc)
        return url
    except Exception as exc:
        tail = ""
        logs = sorted(work.glob("proc-*.log"))
        if logs:
            tail = " | ".join(logs[-1].read_text(errors="replace").strip().splitlines()[-3:])
        print(f"LiteLLM skipped: {type(exc).__name__}: {str(exc)[:300]} {tail[:400]}", flush=True)
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    ap.add_argument("--no-litellm", action="store_true")
    ap.add_argument("--concurrency", default="1,16,64")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("router_overhead: wrk is not installed (scripts/install-system-deps.sh installs it)")
    levels = [int(c) for c in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-"))
    procs = Procs(work)
    try:
        mock_port = free_port()
        (work / "mock.py").write_text(MOCK)
        procs.start([sys.executable, str(work / "mock.py"), str(mock_port)])
        upstream = f"http://127.0.0.1:{mock_port}"
        wait_http(upstream + "/v1/models")
        floor_port = free_port()
        (work / "floor.py").write_text(FLOOR)
        procs.start([sys.executable, str(work / "floor.py"), str(floor_port), upstream])
        floor = f"http://127.0.0.1:{floor_port}"
        llmgw, key = start_llmgw(procs, work, upstream)
        litellm = None if args.no_litellm else start_litellm(procs, work, upstream)
        targets: dict[str, tuple[str, str | None]] = {
            "direct": (upstream, None),
            "floor": (floor, None),
            "llmgw": (llmgw, key),
        }
        if litellm:
            targets["litellm"] = (litellm, LITELLM_KEY)
        results: dict[tuple[str, bool, int], Result] = {}
        for stream in (False, True):
            for conns in levels:
                for name, (base, k) in targets.items():
                    wrk(
                        base + "/v1/chat/completions", stream, conns, 1.0, k
                    )  # warm up connections and caches
                    results[(name, stream, conns)] = wrk(
                        base + "/v1/chat/completions", stream, conns, args.duration, k
                    )
        print(
            f"\n{'mode':<10}{'target':<9}{'conc':>5}{'p50 ms':>9}{'p99 ms':>9}{'+p50 ms':>9}{'+p99 ms':>9}{'req/s':>10}{'errors':>8}"
        )
        for stream in (False, True):
            for conns in levels:
                ref = results[("direct", stream, conns)]
                for name in targets:
                    r = results[(name, stream, conns)]
                    added50 = r.p50_ms - ref.p50_ms if name != "direct" else 0.0
                    added99 = r.p99_ms - ref.p99_ms if name != "direct" else 0.0
                    print(
                        f"{'stream' if stream else 'whole':<10}{name:<9}{conns:>5}{r.p50_ms:>9.2f}{r.p99_ms:>9.2f}"
                        f"{added50:>9.2f}{added99:>9.2f}{r.rps:>10.0f}{r.errors:>8}"
                    )
        c1 = levels[0]
        c16 = 16 if 16 in levels else levels[-1]
        added = results[("llmgw", False, c1)].p50_ms - results[("direct", False, c1)].p50_ms
        lite = results.get(("litellm", False, c16))
        print(
            f"router_overhead: added_p50_ms_c1={added:.3f} rps_c16={results[('llmgw', False, c16)].rps:.0f} "
            f"floor_rps_c16={results[('floor', False, c16)].rps:.0f} "
            f"litellm_rps_c16={f'{lite.rps:.0f}' if lite else 'none'}"
        )
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
