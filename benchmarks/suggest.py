"""`llmgw plan --suggest` on a heterogeneous simulated fleet built so that a mix of GPU classes should win.

The fleet (issue 50): three GPU classes of different speeds and prices, each with an fp16 and an fp8 profile
(sim engines whose prefill and decode run `speed` times the a10's), two models and a diurnal day of traffic:

  chat       short prompts, tight objectives (p99 time per output token 20 ms: only the l40s at fp8 and the
             h100 meet it), two traffic classes (project `web` holds a tighter p99 TTFT than `api`);
  summarize  long prompts and answers, loose objectives: the cheapest throughput wins (the a10).

Steps:
1. every profile's sim engine is measured with `llmgw bench`'s own stepped load (`run_bench`), stored as
   `llmgw bench --save` stores it: what `--suggest` fits its engine models from (a bench on that profile);
2. the search, as `plan --suggest` runs it (`build_problem` + `search`), over every (profile, min, max) per
   model, at most MOST replicas: more than EXHAUSTIVE_LIMIT configurations, so it takes its heuristic; timed;
3. the same evaluator's exhaustive optimum over the whole space, and the cheapest single-class fleet (every
   model on one class) meeting the same objectives; the heuristic's cost over each;
4. `plan --suggest` itself (the CLI's function, on a repo, a saved live state and the trace) replays the top
   three for the busiest hour through the router's decisions and says whether each met every objective;
5. the suggested fleet runs on sim engines behind a real `llmgw-router`, for the peak hour and one off-peak
   hour: each for `--minutes` of that hour's own traffic at its own rate (a window of the hour, not the whole
   of it: within the 15 minutes the issue allows), measured by a streaming client against the objectives.

The last line: `suggest: method=heuristic space=N cost_over_exhaustive=X cost_over_single_class=X
slo_met=0|1 seconds=S` (S: the search's seconds; targets: at most 1.05, below 1, 1, at most 600).

Run: .venv/bin/python benchmarks/suggest.py [--minutes 2.5] [--bench-seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Procs, free_port, free_ports, interrupt_on_sigterm, start_snapshot_router, wait_http

from llmgw.adapters.repo_files import load_repo
from llmgw.cli.data.bench_load import bench_prompt, run_bench
from llmgw.cli.repo.plan_suggest import suggest
from llmgw.core.capacity.bench import percentile
from llmgw.core.desired.catalog import Catalog
from llmgw.core.fleet.views import LiveGpu, LiveNode, LiveState
from llmgw.core.plan import catalog_documents
from llmgw.core.suggest import search as search_module
from llmgw.core.suggest.build import build_problem, fleet_limits
from llmgw.core.suggest.demand import HOUR_S, busiest, demand_by_hour, periods_of
from llmgw.core.suggest.search import Candidate, Result, search
from llmgw.core.suggest.space import Problem, space_size
from llmgw.core.traffic.synthetic_trace import Shape, diurnal
from llmgw.core.traffic.trace import TracedRequest, TraceHeader, format_trace

# GPU class: (speed against the a10, price of a card per hour, cards in the fleet)
CLASSES = {"a10-24g": (1.0, 0.35, 24), "l40s-48g": (1.8, 1.40, 12), "h100-80g": (3.5, 3.20, 8)}
PRECISIONS = {"fp16": 1.0, "fp8": 1.4}  # fp8 runs 1.4 times as fast on every class
SLOTS = 4
MOST = 16  # replicas searched per model


@dataclass(frozen=True)
class ModelShape:
    prefill_ms_per_token: float  # on the a10 at fp16
    itl_ms: float
    prompt_tokens: int
    completion_tokens: int
    peaks: dict[str, float]  # project -> its peak requests per second (at 16:00)
    trough: float
    slo: str  # the Model's `slo:` block, flow style


MODELS = {
    "chat": ModelShape(
        prefill_ms_per_token=0.6,
        itl_ms=40.0,
        prompt_tokens=400,
        completion_tokens=120,
        peaks={"web": 2.4, "api": 1.6},
        trough=0.15,
        slo="{ttft_p90_ms: 600, ttft_p99_ms: 1500, tpot_p99_ms: 20, availability: 0.999, "
        "projects: {web: {ttft_p99_ms: 800}}}",
    ),
    "summarize": ModelShape(
        prefill_ms_per_token=0.3,
        itl_ms=50.0,
        prompt_tokens=1500,
        completion_tokens=200,
        peaks={"batch": 1.6},
        trough=0.3,
        slo="{ttft_p99_ms: 6000, tpot_p99_ms: 100, availability: 0.999}",
    ),
}


def profile_speed(cls: str, precision: str) -> float:
    return CLASSES[cls][0] * PRECISIONS[precision]


def profiles() -> list[tuple[str, str, str]]:
    """(profile name, class, precision), the h100 at fp16 first: what the repo runs before the suggestion."""
    out = [(f"{c.split('-')[0]}-{p}", c, p) for c in CLASSES for p in PRECISIONS]
    return sorted(out, key=lambda t: (t[1] != "h100-80g", t[2] != "fp16"))


def sim_speeds(model: str, cls: str, precision: str) -> tuple[float, float]:
    """(prefill ms per token, ms per output token) of the sim engine standing in for the profile."""
    shape, speed = MODELS[model], profile_speed(cls, precision)
    return shape.prefill_ms_per_token / speed, shape.itl_ms / speed


# ------------------------------------------------------------------------------------------------ the repo


def write_repo(root: Path) -> None:
    classes = ", ".join(f"{c}: {{memory_gb: {c.split('-')[1].removesuffix('g')}}}" for c in CLASSES)
    prices = ", ".join(f"{c}: {price}" for c, (_, price, _) in CLASSES.items())
    projects = sorted({p for m in MODELS.values() for p in m.peaks})
    docs = [
        "# The benchmark's cluster: three GPU classes, priced per card per hour.\n"
        "apiVersion: llmgw/v1\nkind: Cluster\nmetadata: {name: suggest-bench}\nspec:\n"
        f"  gpu_classes: {{{classes}}}\n  costs:\n    gpu_per_hour: {{{prices}}}\n",
        "apiVersion: llmgw/v1\nkind: Organization\nmetadata: {name: bench}\nspec: {}\n",
        *(
            f"apiVersion: llmgw/v1\nkind: Project\nmetadata: {{name: {p}}}\nspec: {{organization: bench}}\n"
            for p in projects
        ),
        "apiVersion: llmgw/v1\nkind: Node\nmetadata: {name: gpus}\nspec: {address: 10.0.0.1}\n",
    ]
    (root / "cluster.yaml").write_text("---\n".join(docs))
    (root / "models").mkdir()
    for model, shape in MODELS.items():
        lines = [
            f"# {model}: sized by hand until `llmgw plan --suggest --write` (this comment stays)",
            "apiVersion: llmgw/v1",
            "kind: Model",
            f"metadata: {{name: {model}}}",
            "spec:",
            "  context_length: 8192",
            "  scaling: {min: 1, max: 8}",  # --suggest searches up to twice the largest max: MOST
            f"  slo: {shape.slo}",
            "  profiles:",
        ]
        for name, cls, precision in profiles():
            lines.append(
                f"    - {{name: {name}, engine: sim, gpu_class: {cls}, gpus: 1, slots: {SLOTS}}}  # {precision}"
            )
        (root / "models" / f"{model}.yaml").write_text("\n".join(lines) + "\n")


def live_state(root: Path) -> LiveState:
    loaded = load_repo(root)
    assert loaded.repo is not None, [e.format_text() for e in loaded.errors]
    gpus: list[LiveGpu] = []
    for cls, (_, _, cards) in CLASSES.items():
        gpus += [LiveGpu(index=len(gpus) + i, gpu_class=cls) for i in range(cards)]
    return LiveState(
        revision="bench",
        taken_at=time.time(),
        nodes=[LiveNode(name="gpus", cpu_cores=256, memory_bytes=1 << 40, gpus=gpus, engines={"sim": None})],
        replicas=[],
        models={name: entry.spec for name, entry in loaded.repo.catalog.models.items()},
        documents=catalog_documents(loaded.repo.catalog),
    )


def day_trace(seed: int) -> list[TracedRequest]:
    """A diurnal day per model and project (peak at 16:00), merged in arrival order."""
    rng = random.Random(seed)
    out: list[TracedRequest] = []
    for model, shape in MODELS.items():
        for project, peak in shape.peaks.items():
            sizes = Shape(shape.prompt_tokens, shape.completion_tokens, 0.5, project)
            out += diurnal(model, peak, rng, trough=shape.trough, shape=sizes)[1]
    return sorted(out, key=lambda r: r.t)


# ------------------------------------------------------------------------------------------------ the bench


def start_sim(procs: Procs, model: str, cls: str, precision: str) -> str:
    prefill, decode = sim_speeds(model, cls, precision)
    port = free_port()
    procs.start(
        [
            sys.executable,
            "-m",
            "llmgw_agent.sim",
            "--port",
            str(port),
            "--model",
            model,
            "--prefill-ms-per-token",
            f"{prefill:.4f}",
            "--decode-ms-per-token",
            f"{decode:.4f}",
            "--max-concurrency",
            str(SLOTS),
            "--prefix-cache",
            "0",
            "--context-length",
            "8192",
        ]
    )
    return f"http://127.0.0.1:{port}"


async def bench_all(procs: Procs, seconds: float) -> dict[tuple[str, str], dict[str, Any]]:
    """Every profile's sim engine measured as `llmgw bench --save` measures it (one at a time)."""
    urls = {
        (model, name): start_sim(procs, model, cls, precision)
        for model in MODELS
        for name, cls, precision in profiles()
    }
    for url in urls.values():
        wait_http(url + "/health", 60)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for (model, name), url in urls.items():
        target = {"model": model, "base_url": url, "api_key": "none"}
        measured = await run_bench(target, [1, SLOTS], seconds, 128, 33, None)
        out[(model, name)] = {
            "concurrency": measured.concurrency,
            "prefill_ms_per_token": measured.prefill_ms_per_token,
            "decode_ms_per_token": measured.decode_ms_per_token,
            "curve": [asdict(s) for s in measured.curve],
        }
        print(
            f"bench {model}/{name}: prefill {measured.prefill_ms_per_token} ms/token, "
            f"decode {measured.decode_ms_per_token} ms/token",
            flush=True,
        )
    return out


# ------------------------------------------------------------------------------------------------ the search


def problem_for(catalog: Catalog, requests: list[TracedRequest], live: LiveState, measured: Any) -> Problem:
    """What `plan --suggest` searches for this trace (build_problem, as plan_suggest.suggest calls it)."""
    limits, _ = fleet_limits(catalog, live)
    demand = demand_by_hour(requests, HOUR_S * 24)
    built = build_problem(catalog, demand, periods_of(requests, HOUR_S * 24), measured, limits, MOST)
    return built.problem


def exhaustive(problem: Problem) -> Result:
    """The same evaluator's optimum over every configuration (the search with no heuristic)."""
    kept = search_module.EXHAUSTIVE_LIMIT
    search_module.EXHAUSTIVE_LIMIT = space_size(problem)
    try:
        return search(problem)
    finally:
        search_module.EXHAUSTIVE_LIMIT = kept


def single_class(problem: Problem) -> tuple[str, Candidate] | None:
    """The cheapest fleet with every model on one GPU class that meets the same objectives."""
    found: list[tuple[float, str, Candidate]] = []
    for cls in CLASSES:
        options = {
            m: tuple(o for o in opts if o.choice.resource == cls) for m, opts in problem.options.items()
        }
        best = exhaustive(Problem(options, problem.limits, problem.periods)).best
        print(f"single class {cls}: " + (f"{best.cost_per_hour:.2f}/h" if best else "meets no objective set"))
        if best is not None:
            found.append((best.cost_per_hour, cls, best))
    if not found:
        return None
    _, cls, best = min(found, key=lambda f: f[0])
    return cls, best


def describe(label: str, candidate: Candidate | None) -> None:
    if candidate is None:
        print(f"{label}: none")
        return
    parts = ", ".join(f"{o.model} {o.choice.profile} {o.min}..{o.max}" for o in candidate.options)
    print(f"{label}: {candidate.cost_per_hour:.3f}/h ({parts})", flush=True)


# ------------------------------------------------------------------------------------------------ on sim engines


def start_router(procs: Procs, work: Path, endpoints: list[dict[str, Any]], name: str) -> str:
    listen, metrics = (f"127.0.0.1:{port}" for port in free_ports(2))
    snapshot = {
        "revision": f"suggest-{name}",
        "router": {"listen": listen, "metrics_listen": metrics},
        "models": {m: {"context_length": 8192, "capabilities": ["chat"]} for m in MODELS},
        "endpoints": endpoints,
    }
    url, _ = start_snapshot_router(procs, work / f"snapshot-{name}.json", snapshot)
    return url


@dataclass
class Seen:
    model: str
    project: str
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    served: bool = False


async def one(http: aiohttp.ClientSession, url: str, req: TracedRequest, i: int, due: float) -> Seen:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, due - loop.time()))
    seen = Seen(req.model, req.project)
    body = {
        "model": req.model,
        "messages": [{"role": "user", "content": bench_prompt(req.prompt_tokens, f"s{i:06d}")}],
        "max_tokens": req.completion_tokens,
        "stream": True,
    }
    first = last = None
    tokens = 0
    try:
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                await resp.read()
                return seen
            async for line in resp.content:
                if line.startswith(b"data: {") and b'"content"' in line:
                    last = loop.time()
                    first = first or last
                    tokens += 1
    except (aiohttp.ClientError, TimeoutError):
        return seen
    if first is not None and last is not None:
        seen.served = True
        seen.ttft_ms = (first - due) * 1000.0
        seen.tpot_ms = (last - first) * 1000.0 / (tokens - 1) if tokens > 1 else None
    return seen


def window(requests: list[TracedRequest], hour: int, minutes: float) -> list[TracedRequest]:
    start = hour * HOUR_S
    return [replace(r, t=r.t - start) for r in requests if start <= r.t < start + minutes * 60.0]


def judged(catalog: Catalog, seen: list[Seen]) -> tuple[bool, list[str]]:
    """Each model's and project's figures against its objectives."""
    groups: dict[tuple[str, str], list[Seen]] = {}
    for s in seen:
        groups.setdefault((s.model, s.project), []).append(s)
    ok, lines = True, []
    for (model, project), rows in sorted(groups.items()):
        slo = catalog.models[model].spec.slo
        assert slo is not None
        ttft = [r.ttft_ms for r in rows if r.ttft_ms is not None]
        figures = {
            "ttft_p90_ms": percentile(ttft, 0.9),
            "ttft_p99_ms": percentile(ttft, 0.99),
            "tpot_p99_ms": percentile([r.tpot_ms for r in rows if r.tpot_ms is not None], 0.99),
            "availability": sum(r.served for r in rows) / len(rows),
        }
        for objective, target in slo.for_project(project).items():
            value = figures[objective]
            met = value is not None and (value >= target if objective == "availability" else value <= target)
            ok = ok and met
            shown = "-" if value is None else f"{value:.4g}"
            lines.append(
                f"  {model} ({project}, {len(rows)} requests) {objective} {shown} vs {target:g}: "
                f"{'met' if met else 'MISSED'}"
            )
    return ok, lines


async def run_hour(
    procs: Procs,
    work: Path,
    catalog: Catalog,
    best: Candidate,
    requests: list[TracedRequest],
    hour: int,
    minutes: float,
) -> bool:
    """The suggestion's fleet for `hour` on sim engines behind a router, driven by the hour's own traffic."""
    kinds = {name: (cls, precision) for name, cls, precision in profiles()}
    endpoints: list[dict[str, Any]] = []
    for o in best.options:
        for i in range(o.replicas[hour]):
            url = start_sim(procs, o.model, *kinds[o.choice.profile])
            endpoints.append(
                {
                    "replica_id": f"{o.model}-{o.choice.profile}-{i}",
                    "model": o.model,
                    "engine": "sim",
                    "base_url": url,
                    "slots": SLOTS,
                }
            )
    for e in endpoints:
        wait_http(f"{e['base_url']}/health", 60)
    url = start_router(procs, work, endpoints, f"hour{hour}")
    todo = window(requests, hour, minutes)
    print(
        f"hour {hour}: {len(endpoints)} sim replicas, {len(todo)} requests over {minutes:g} minutes",
        flush=True,
    )
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=180)) as http:
        start = asyncio.get_running_loop().time() + 0.5
        seen = await asyncio.gather(*(one(http, url, r, i, start + r.t) for i, r in enumerate(todo)))
    ok, lines = judged(catalog, list(seen))
    print("\n".join(lines), flush=True)
    return ok


# ------------------------------------------------------------------------------------------------ main


def fmt(value: float | None) -> str:
    return "NA" if value is None else f"{value:.3f}"


def quietest(requests: list[TracedRequest]) -> int:
    counts = [0] * 24
    for r in requests:
        counts[min(23, int(r.t // HOUR_S))] += 1
    return counts.index(min(counts))


def phase(work: Path, name: str) -> Procs:
    logs = work / name
    logs.mkdir()
    return Procs(logs)


async def measure(work: Path, seconds: float) -> dict[tuple[str, str], dict[str, Any]]:
    procs = phase(work, "bench")
    try:
        return await bench_all(procs, seconds)
    finally:
        procs.stop_all()


def searched(
    catalog: Catalog, requests: list[TracedRequest], live: LiveState, measured: Any
) -> tuple[Result, float, float | None, float | None]:
    """The heuristic's result and seconds, its cost over the exhaustive optimum and over one class."""
    started = time.monotonic()
    problem = problem_for(catalog, requests, live, measured)
    found = search(problem)
    seconds = time.monotonic() - started
    print(f"search: {found.method}, {space_size(problem)} configurations, {seconds:.2f} s; {found.words}")
    describe("suggested", found.best)
    started = time.monotonic()
    whole = exhaustive(problem)
    print(f"exhaustive: {whole.evaluated} weighed in {time.monotonic() - started:.2f} s")
    describe("exhaustive optimum", whole.best)
    single = single_class(problem)
    describe(f"cheapest single class ({single[0] if single else '-'})", single[1] if single else None)
    if found.best is None:
        return found, seconds, None, None
    over_whole = found.best.cost_per_hour / whole.best.cost_per_hour if whole.best else None
    over_single = found.best.cost_per_hour / single[1].cost_per_hour if single else None
    return found, seconds, over_whole, over_single


async def main_async(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="llmgw-suggest-"))
    repo = work / "repo"
    repo.mkdir()
    write_repo(repo)
    loaded = load_repo(repo)
    assert loaded.repo is not None, [e.format_text() for e in loaded.errors]
    catalog, live = loaded.repo.catalog, live_state(repo)
    requests = day_trace(args.seed)
    trace = work / "day.jsonl"
    trace.write_text("\n".join(format_trace(TraceHeader(0.0, HOUR_S * 24, "diurnal"), requests)) + "\n")
    print(f"trace: {len(requests)} requests over 24 hours; work in {work}", flush=True)
    if args.measured is not None:
        rows = json.loads(args.measured.read_text())
        measured = {(r["model"], r["profile"]): r["measured"] for r in rows}
    else:
        measured = await measure(work, args.bench_seconds)
        rows = [{"model": m, "profile": p, "measured": v} for (m, p), v in measured.items()]
        (work / "measured.json").write_text(json.dumps(rows))
    found, seconds, over_whole, over_single = searched(catalog, requests, live, measured)
    told = suggest(catalog, loaded.documents, live, trace, measured, seed=args.seed)
    print(told.text)
    confirmed = len(told.replayed) >= 1 and all(c.met for c in told.replayed)
    print(
        f"replay of the top {len(told.replayed)}: "
        + ", ".join(
            {"met": "met", "missed": "MISSED", "undecided": "UNDECIDED"}[c.verdict] for c in told.replayed
        )
    )
    met = confirmed
    if found.best is not None:
        peak = busiest(requests, HOUR_S * 24)
        for hour in (peak, quietest(requests)) if not args.search_only else ():
            procs = phase(work, f"hour{hour}")
            try:
                met = await run_hour(procs, work, catalog, found.best, requests, hour, args.minutes) and met
            finally:
                procs.stop_all()
    else:
        met = False
    print(
        f"suggest: method={found.method} space={found.space} cost_over_exhaustive={fmt(over_whole)} "
        f"cost_over_single_class={fmt(over_single)} slo_met={int(met)} seconds={seconds:.1f}"
    )
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.5, help="of each hour run on sim engines")
    parser.add_argument("--bench-seconds", type=float, default=3.0, help="per bench step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--measured", type=Path, help="a measured.json of an earlier run (no bench)")
    parser.add_argument("--search-only", action="store_true", help="no run on sim engines (slo_met: replay)")
    args = parser.parse_args()
    interrupt_on_sigterm()  # a `timeout` or a kill stops the sims and routers it started, as Ctrl-C does
    raise SystemExit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
