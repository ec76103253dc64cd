"""Scheduling quality: llmgw's policies against round-robin, random and least-inflight, on real processes.

A heterogeneous fleet of sim engines (separate processes; one replica half as fast, different concurrency
limits) sits behind real `llmgw-router` processes, one per strategy, all pointed at the same engines. Open-loop
Poisson arrivals (seeded) at fractions of the fleet's capacity drive three workloads:

  short      independent short prompts
  multiturn  conversations whose growing history is a shared prefix the sim's prefix cache rewards; every
             request carries its conversation's key in x-session-id
  mix        mostly short prompts, 15% long ones
  prefix     llm-d's shared-prefix workload, and lowreuse, on their own fleet (benchmarks/scheduling_prefix.py)

Strategies, in the same run, interleaved per load and workload so background noise hits them alike:

  round-robin     picker round_robin                      (LiteLLM's simple-shuffle is its random cousin)
  random          picker random
  least-inflight  inflight weight only, max_score picker  (LiteLLM least-busy, KubeAI LeastLoad)
  default         llmgw's `balanced` RoutingPolicy from examples/cluster-repo/policies/routing.yaml
  session         llmgw's `session` RoutingPolicy from the same file
  default-noslots `balanced` without the endpoints' slots (what the scorers do with no declared capacity)

The baselines stand for routers that forward at once and let engines queue, so their endpoints carry no
`slots`. llmgw's policies run as deployed: the controller publishes each profile's `slots` (the example sim
profile declares them), so the router holds a request when every endpoint is full instead of queueing it in one
engine. `default-noslots` shows how much of the default's result is the scorers alone.

Capacity: a replica serves `max_concurrency` sequences at once, each taking prefill_ms * prompt_tokens +
decode_ms * max_tokens (the sim has no batching slowdown), so its capacity in requests per second is
concurrency / mean service time, every prompt token counted as prefilled (no cache hits). The fleet's capacity is
the sum; a load of 80% is a Poisson rate of 0.8 times it.

Figures per row: p50/p99 time to first token and p99 end-to-end latency (from each request's scheduled time, so
client lag counts against it), offered load (requests over the span of their scheduled times: multiturn turns
wait for the previous reply, so conversations ramp up and the offered rate stays below the nominal one),
throughput (completed requests over the phase), prefix-cache hit rate (multiturn:
`hit` is follow-up turns with any cached_tokens, `full` those whose cached_tokens cover the previous turn's
whole prompt, the figure in the last line; others: the engines' token counters
vllm:prefix_cache_hits_total / queries_total), and the most-loaded replica's share of requests from the engines'
vllm:request_success_total, also as max over mean. The last line is machine-readable:

  scheduling: p99_ttft_default_over_rr=X p99_ttft_default_over_least_inflight=X session_hit_rate=X
  session_max_load_over_mean=X prefix_p90_ttft_over_rr=X prefix_p90_ttft_over_session=X
  prefix_throughput_over_least_inflight=X lowreuse_p99_over_least_inflight=X
  prefix_p90_ttft_over_rr_closed=X prefix_p90_ttft_over_session_closed=X
  lowreuse_p99_over_least_inflight_closed=X

(the prefix workloads' latency ratios from their open-loop phase, `_closed` ones from the saturated closed loop
their throughput is measured in; benchmarks/scheduling_prefix.py)

Run: .venv/bin/python benchmarks/scheduling.py [--quick] [--seed 42] [--repeats 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
from harness import free_port, free_ports
from ruamel.yaml import YAML

from llmgw.core.config.models import RoutingPolicySpec

MODEL = "bench-chat"
BLOCK = 16  # the sim's prefix-cache block size (its default)
MAX_TOKENS = 8
TURNS = 4  # per multi-turn conversation
ROOT = Path(__file__).resolve().parent.parent
POLICIES_FILE = ROOT / "examples" / "cluster-repo" / "policies" / "routing.yaml"


# ------------------------------------------------------------------------------------------------ the fleet


@dataclass(frozen=True)
class Replica:
    name: str
    prefill_ms: float
    decode_ms: float
    concurrency: int

    def service_s(self, prompt_tokens: float, out_tokens: float) -> float:
        return (self.prefill_ms * prompt_tokens + self.decode_ms * out_tokens) / 1000


# Time scale: a short request takes ~0.27 s on a fast replica, so the router's own ~1-2 ms is small beside it.
FLEET = (
    Replica("r0-fast-c4", 0.5, 30.0, 4),
    Replica("r1-fast-c4", 0.5, 30.0, 4),
    Replica("r2-fast-c2", 0.5, 30.0, 2),
    Replica("r3-slow-c4", 1.0, 60.0, 4),  # half as fast: the same slots on a slower machine
)


def capacity_rps(fleet: tuple[Replica, ...], mean_prompt: float, out_tokens: float) -> float:
    return sum(r.concurrency / r.service_s(mean_prompt, out_tokens) for r in fleet)


# ------------------------------------------------------------------------------------------------ strategies


@dataclass(frozen=True)
class Strategy:
    name: str
    policy: RoutingPolicySpec
    slots: bool  # whether its endpoints carry slots (router-side admission)


def load_policies(path: Path) -> dict[str, RoutingPolicySpec]:
    out: dict[str, RoutingPolicySpec] = {}
    for doc in YAML(typ="safe").load_all(path.read_text()):
        if isinstance(doc, dict) and doc.get("kind") == "RoutingPolicy":
            out[doc["metadata"]["name"]] = RoutingPolicySpec.model_validate(doc.get("spec") or {})
    return out


def strategies(policies: dict[str, RoutingPolicySpec], with_noslots: bool) -> list[Strategy]:
    out = [
        Strategy("round-robin", RoutingPolicySpec(picker="round_robin"), False),
        Strategy("random", RoutingPolicySpec(picker="random"), False),
        Strategy(
            "least-inflight",
            RoutingPolicySpec.model_validate({"picker": "max_score", "weights": {"inflight": 1}}),
            False,
        ),
        Strategy("default", policies["balanced"], True),
        Strategy("session", policies["session"], True),
    ]
    if with_noslots:
        out.append(Strategy("default-noslots", policies["balanced"], False))
    # Any other policy in the file (a candidate while tuning) runs with slots unless named *-noslots.
    out += [
        Strategy(n, p, not n.endswith("-noslots"))
        for n, p in policies.items()
        if n not in ("balanced", "session")
    ]
    return out


# ------------------------------------------------------------------------------------------------ workloads


@dataclass
class Turn:
    text: str  # the user's message for this turn


@dataclass
class Conversation:
    key: str
    arrival: float  # seconds after the phase starts
    turns: list[Turn]
    think_s: list[float]  # pause after each turn's reply


def _words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(5000)}" for _ in range(n))


def make_conversations(
    workload: str, rate: float, window: float, rng: random.Random, salt: str
) -> list[Conversation]:
    """Poisson arrivals of requests (short, mix) or of conversations at rate/turns (multiturn)."""
    turns_per = TURNS if workload == "multiturn" else 1
    out: list[Conversation] = []
    t = rng.expovariate(rate / turns_per)
    i = 0
    while t < window:
        key = f"{salt}-c{i}"
        if workload == "multiturn":
            turns = [Turn(f"{key} " + _words(rng, 47)) for _ in range(turns_per)]
            think = [rng.expovariate(1 / 0.3) for _ in range(turns_per)]
        elif workload == "mix" and rng.random() < 0.15:
            turns, think = [Turn(f"{key} " + _words(rng, rng.randint(700, 1100)))], [0.0]
        else:
            turns, think = [Turn(f"{key} " + _words(rng, rng.randint(40, 80)))], [0.0]
        out.append(Conversation(key, t, turns, think))
        t += rng.expovariate(rate / turns_per)
        i += 1
    return out


def mean_prompt_tokens(workload: str) -> float:
    """Mean prompt tokens as the sim counts them (whitespace words of `role: content` lines)."""
    if workload == "short":
        return 60 + 2  # "user:" and the key
    if workload == "mix":
        return 0.85 * 62 + 0.15 * 902
    # multiturn: turn k holds k user messages (49 words each) and k-1 replies (MAX_TOKENS + 1 words)
    per_turn = [k * 49 + (k - 1) * (MAX_TOKENS + 1) for k in range(1, TURNS + 1)]
    return sum(per_turn) / len(per_turn)


# ------------------------------------------------------------------------------------------------ processes


def wait_http(url: str, limit_s: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not up within {limit_s:g}s; see {log}")


class Procs:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.logs / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
        with log.open("wb") as out:
            # A group of its own, signalled whole: a pass-through waits for the engine it started to get the
            # signal too (as the agent sends it), so a signal to its pid alone left the engine running.
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.procs.append(proc)
        return proc, log

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                _signal_group(p, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait(5)
            _signal_group(p, signal.SIGKILL)  # what of the group outlived its leader


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def start_sims(procs: Procs) -> list[str]:
    urls = []
    for r in FLEET:
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "llmgw_agent.sim",
            "--port",
            str(port),
            "--model",
            MODEL,
            "--prefill-ms-per-token",
            str(r.prefill_ms),
            "--decode-ms-per-token",
            str(r.decode_ms),
            "--max-concurrency",
            str(r.concurrency),
            "--max-tokens-default",
            str(MAX_TOKENS),
            "--block-size",
            str(BLOCK),
            "--prefix-cache",
            "20000",
        ]
        proc, log = procs.start(r.name, argv)
        urls.append((f"http://127.0.0.1:{port}", proc, log))
    for url, proc, log in urls:
        wait_http(url + "/health", 60, proc, log)
    return [u for u, _, _ in urls]


def snapshot_for(s: Strategy, sims: list[str], listen: str, metrics: str) -> dict[str, Any]:
    return {
        "revision": f"bench-{s.name}",
        "router": {
            "listen": listen,
            "metrics_listen": metrics,
            "default_policy": "p",
            "admission": {"queue_size": 4096, "timeout": "60s"},
        },
        "models": {MODEL: {"context_length": 32768, "simulated": True}},
        "policies": {"p": s.policy.model_dump(mode="json")},
        "endpoints": [
            {
                "replica_id": r.name,
                "model": MODEL,
                "engine": "sim",
                "base_url": url,
                "slots": r.concurrency if s.slots else None,
                "simulated": True,
            }
            for r, url in zip(FLEET, sims, strict=True)
        ],
    }


def start_routers(procs: Procs, work: Path, strats: list[Strategy], sims: list[str]) -> dict[str, str]:
    started = []
    for s in strats:
        listen, metrics = (f"127.0.0.1:{port}" for port in free_ports(2))
        snap = work / f"snapshot-{s.name}.json"
        snap.write_text(json.dumps(snapshot_for(s, sims, listen, metrics), indent=1))
        argv = [
            sys.executable,
            "-m",
            "llmgw_router",
            "--snapshot",
            str(snap),
            "--no-auth",
            "--listen",
            listen,
            "--metrics-listen",
            metrics,
            "--log-level",
            "WARNING",
        ]
        proc, log = procs.start(f"router-{s.name}", argv)
        started.append((s.name, f"http://{listen}", proc, log))
    for _, url, proc, log in started:
        wait_http(url + "/v1/models", 60, proc, log)
    return {name: url for name, url, _, _ in started}


# ------------------------------------------------------------------------------------------------ the client


@dataclass
class Result:
    turn: int
    due: float = 0.0  # when it was meant to be sent (loop time)
    ttft: float = math.inf
    e2e: float = math.inf
    ok: bool = False
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prev_prompt_tokens: int = 0


async def one_request(
    http: aiohttp.ClientSession, url: str, messages: list[dict[str, str]], key: str, res: Result, due: float
) -> str:
    """Stream one chat completion; fill `res` (times from `due`, the moment it was meant to be sent)."""
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    loop = asyncio.get_running_loop()
    text: list[str] = []
    async with http.post(url + "/v1/chat/completions", json=body, headers={"x-session-id": key}) as resp:
        if resp.status != 200:
            await resp.read()
            return ""
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            if res.ttft == math.inf:
                res.ttft = loop.time() - due
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            usage = chunk.get("usage")
            if usage:
                res.prompt_tokens = usage.get("prompt_tokens", 0)
                res.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            for choice in chunk.get("choices") or ():
                text.append((choice.get("delta") or {}).get("content") or "")
    res.e2e = loop.time() - due
    res.ok = True
    return "".join(text)


async def run_conversation(
    http: aiohttp.ClientSession, url: str, conv: Conversation, start: float, out: list[Result]
) -> None:
    loop = asyncio.get_running_loop()
    due = start + conv.arrival
    messages: list[dict[str, str]] = []
    prev_prompt = 0
    for i, turn in enumerate(conv.turns):
        await asyncio.sleep(max(0.0, due - loop.time()))
        messages.append({"role": "user", "content": turn.text})
        res = Result(turn=i, due=due, prev_prompt_tokens=prev_prompt)
        out.append(res)
        try:
            reply = await one_request(http, url, messages, conv.key, res, due)
        except (TimeoutError, aiohttp.ClientError):
            return
        if not res.ok:
            return
        messages.append({"role": "assistant", "content": reply})
        prev_prompt = res.prompt_tokens
        due = loop.time() + conv.think_s[i]


# ------------------------------------------------------------------------------------------------ engines


_SAMPLE = re.compile(r"^(vllm:[a-z_]+)\{[^}]*\} (\S+)$", re.M)


async def engine_counters(http: aiohttp.ClientSession, sims: list[str]) -> list[dict[str, float]]:
    out = []
    for url in sims:
        async with http.get(url + "/metrics") as resp:
            text = await resp.text()
        out.append({m.group(1): float(m.group(2)) for m in _SAMPLE.finditer(text)})
    return out


# ------------------------------------------------------------------------------------------------ a phase


@dataclass
class PhaseData:
    results: list[Result]
    per_replica: list[int]
    cache_queries: float
    cache_hits: float
    elapsed: float


@dataclass
class Row:
    strategy: str
    requests: int
    failed: int
    p50_ttft: float
    p99_ttft: float
    p99_e2e: float
    offered: float
    throughput: float
    hit_rate: float | None
    full_hit_rate: float | None
    max_share: float
    max_over_mean: float
    per_replica: list[int]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _delta(after: list[dict[str, float]], before: list[dict[str, float]], name: str) -> list[float]:
    return [a.get(name, 0.0) - b.get(name, 0.0) for a, b in zip(after, before, strict=True)]


async def wait_idle(http: aiohttp.ClientSession, sims: list[str], limit_s: float) -> None:
    """Until no engine runs or queues anything: a cancelled backlog must not spill into the next phase."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        counters = await engine_counters(http, sims)
        busy = sum(
            c.get("vllm:num_requests_running", 0) + c.get("vllm:num_requests_waiting", 0) for c in counters
        )
        if busy == 0:
            return
        await asyncio.sleep(0.1)


async def run_phase(
    http: aiohttp.ClientSession, url: str, sims: list[str], convs: list[Conversation], drain_s: float
) -> PhaseData:
    await wait_idle(http, sims, 60)
    before = await engine_counters(http, sims)
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05
    results: list[Result] = []
    tasks = [asyncio.ensure_future(run_conversation(http, url, c, start, results)) for c in convs]
    window = max((c.arrival for c in convs), default=0.0)
    pending: set[asyncio.Future[None]] = set()
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=window + drain_s)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    elapsed = loop.time() - start
    await wait_idle(http, sims, 60)
    after = await engine_counters(http, sims)
    return PhaseData(
        results,
        [int(x) for x in _delta(after, before, "vllm:request_success_total")],
        sum(_delta(after, before, "vllm:prefix_cache_queries_total")),
        sum(_delta(after, before, "vllm:prefix_cache_hits_total")),
        elapsed,
    )


def summarize(strategy: str, workload: str, phases: list[PhaseData]) -> Row:
    """One row from one or more repeats: percentiles over the pooled requests, counts summed."""
    results = [r for p in phases for r in p.results]
    done = [r for r in results if r.ok]
    per = [sum(col) for col in zip(*(p.per_replica for p in phases), strict=True)]
    total = sum(per) or 1
    hit: float | None
    full_hit: float | None = None
    if workload == "multiturn":
        follow = [r for r in done if r.turn > 0]
        full = [r for r in follow if 0 < r.prev_prompt_tokens // BLOCK * BLOCK <= r.cached_tokens]
        hit = sum(1 for r in follow if r.cached_tokens > 0) / len(follow) if follow else None
        full_hit = len(full) / len(follow) if follow else None
    else:
        queries = sum(p.cache_queries for p in phases)
        hit = sum(p.cache_hits for p in phases) / queries if queries else None
    elapsed = sum(p.elapsed for p in phases)
    # multiturn turns wait for the previous reply, so they spread past the window: what was really offered
    spans = [max(r.due for r in p.results) - min(r.due for r in p.results) for p in phases if p.results]
    return Row(
        strategy=strategy,
        requests=len(results),
        failed=len(results) - len(done),
        # a failed or unfinished request counts as infinitely slow
        p50_ttft=percentile([r.ttft for r in results], 0.50),
        p99_ttft=percentile([r.ttft for r in results], 0.99),
        p99_e2e=percentile([r.e2e for r in results], 0.99),
        offered=len(results) / sum(spans) if sum(spans) > 0 else 0.0,
        throughput=len(done) / elapsed if elapsed > 0 else 0.0,
        hit_rate=hit,
        full_hit_rate=full_hit,
        max_share=max(per) / total,
        max_over_mean=max(per) / (total / len(per)),
        per_replica=per,
    )


# ------------------------------------------------------------------------------------------------ output


def _ms(seconds: float) -> str:
    return "inf" if math.isinf(seconds) else "nan" if math.isnan(seconds) else f"{seconds * 1000:.0f}"


def table(title: str, rows: list[Row]) -> str:
    head = (
        f"{'strategy':<16}{'reqs':>6}{'fail':>5}{'p50 TTFT':>10}{'p99 TTFT':>10}{'p99 e2e':>9}"
        f"{'offered':>8}{'req/s':>7}{'hit':>7}{'full':>7}{'max share':>11}{'max/mean':>9}  per replica"
    )
    lines = [title, head, "-" * len(head)]
    for r in rows:
        hit = "-" if r.hit_rate is None else f"{r.hit_rate * 100:.1f}%"
        full = "-" if r.full_hit_rate is None else f"{r.full_hit_rate * 100:.1f}%"
        lines.append(
            f"{r.strategy:<16}{r.requests:>6}{r.failed:>5}{_ms(r.p50_ttft):>10}{_ms(r.p99_ttft):>10}"
            f"{_ms(r.p99_e2e):>9}{r.offered:>8.1f}{r.throughput:>7.1f}{hit:>7}{full:>7}{r.max_share * 100:>10.1f}%"
            f"{r.max_over_mean:>9.2f}  {'/'.join(str(n) for n in r.per_replica)}"
        )
    return "\n".join(lines)


def _ratio(a: float, b: float) -> str:
    if math.isinf(b) and not math.isinf(a):
        return "0.000"
    if b <= 0 or math.isnan(a) or math.isnan(b) or math.isinf(a):
        return "nan"
    return f"{a / b:.3f}"


def final_line(rows: dict[tuple[float, str], dict[str, Row]], prefix: str = "") -> str:
    short = rows.get((0.8, "short"), {})
    multi = rows.get((0.8, "multiturn"), {})
    default, rr, li = short.get("default"), short.get("round-robin"), short.get("least-inflight")
    session = multi.get("session")
    nan = math.nan
    # the strict figure: follow-up turns that found the whole previous prompt cached
    hit = session.full_hit_rate if session is not None and session.full_hit_rate is not None else nan
    return (
        "scheduling: "
        f"p99_ttft_default_over_rr={_ratio(default.p99_ttft if default else nan, rr.p99_ttft if rr else nan)} "
        "p99_ttft_default_over_least_inflight="
        f"{_ratio(default.p99_ttft if default else nan, li.p99_ttft if li else nan)} "
        f"session_hit_rate={hit:.3f} "
        f"session_max_load_over_mean={session.max_over_mean if session else nan:.3f}"
        + (f" {prefix}" if prefix else "")
    )


# ------------------------------------------------------------------------------------------------ main


@dataclass(frozen=True)
class Plan:
    loads: tuple[float, ...]
    workloads: tuple[str, ...]
    window_s: float
    drain_s: float
    repeats: int
    seed: int
    noslots: bool
    only: tuple[str, ...] | None
    policies: Path
    open_fraction: float = 0.8  # the prefix workloads' open-loop rate, of the lowest closed-loop throughput


def phase_seed(seed: int, workload: str, load: float, repeat: int) -> int:
    return seed * 1_000_003 + sum(map(ord, workload)) * 1009 + round(load * 100) * 101 + repeat


async def run_all(
    plan: Plan, sims: list[str], routers: dict[str, str], strats: list[Strategy]
) -> dict[tuple[float, str], dict[str, Row]]:
    rows: dict[tuple[float, str], dict[str, Row]] = {}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        for load in plan.loads:
            for workload in plan.workloads:
                cap = capacity_rps(FLEET, mean_prompt_tokens(workload), MAX_TOKENS)
                rate = load * cap
                data: dict[str, list[PhaseData]] = {s.name: [] for s in strats}
                for rep in range(plan.repeats):
                    seed = phase_seed(plan.seed, workload, load, rep)
                    order = strats[rep % len(strats) :] + strats[: rep % len(strats)]
                    for s in order:
                        rng = random.Random(seed)  # same arrivals and prompts for every strategy
                        convs = make_conversations(workload, rate, plan.window_s, rng, f"{s.name}-{seed}")
                        data[s.name].append(await run_phase(http, routers[s.name], sims, convs, plan.drain_s))
                rows[(load, workload)] = {s.name: summarize(s.name, workload, data[s.name]) for s in strats}
                title = (
                    f"\n## load {load:.0%} of capacity {cap:.1f} req/s ({rate:.1f} req/s), workload {workload}, "
                    f"{plan.repeats} repeat(s) of {plan.window_s:g} s, seed {plan.seed}"
                )
                print(table(title, list(rows[(load, workload)].values())), flush=True)
    return rows


def parse_args(argv: list[str] | None = None) -> Plan:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="80%% load only, shorter phases")
    p.add_argument("--loads", help="comma-separated fractions of capacity (default 0.5,0.8,0.95)")
    p.add_argument("--workloads", help="comma-separated: short,multiturn,mix,prefix,lowreuse (default all)")
    p.add_argument("--window", type=float, help="seconds of arrivals per phase (default 8, quick 4)")
    p.add_argument("--drain", type=float, default=20.0, help="seconds a phase may run past its window")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--no-noslots", action="store_true", help="skip the default-noslots strategy")
    p.add_argument("--only", help="comma-separated strategy names to run (default all)")
    p.add_argument("--policies", default=str(POLICIES_FILE), help="file of RoutingPolicy documents")
    p.add_argument(
        "--open-fraction",
        type=float,
        default=0.8,
        help="prefix workloads: the open loop's rate, of the lowest closed-loop throughput",
    )
    ns = p.parse_args(argv)
    if not 0 < ns.open_fraction <= 1:
        p.error(f"--open-fraction {ns.open_fraction:g}: a fraction of the lowest throughput, in (0, 1]")
    loads = ns.loads or ("0.8" if ns.quick else "0.5,0.8,0.95")
    return Plan(
        loads=tuple(float(x) for x in loads.split(",")),
        workloads=tuple((ns.workloads or "short,multiturn,mix,prefix,lowreuse").split(",")),
        window_s=ns.window or (4.0 if ns.quick else 8.0),
        drain_s=ns.drain,
        repeats=ns.repeats,
        seed=ns.seed,
        noslots=not ns.no_noslots,
        only=tuple(ns.only.split(",")) if ns.only else None,
        policies=Path(ns.policies),
        open_fraction=ns.open_fraction,
    )


@contextmanager
def fleet(work: Path, strats: list[Strategy]) -> Iterator[tuple[list[str], dict[str, str]]]:
    procs = Procs(work)
    try:
        sims = start_sims(procs)
        yield sims, start_routers(procs, work, strats, sims)
    finally:
        procs.stop_all()


def main(argv: list[str] | None = None) -> None:
    # a SIGTERM (timeout, a CI cancel) unwinds like ^C, so the engines and routers started are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    plan = parse_args(argv)
    strats = strategies(load_policies(plan.policies), plan.noslots)
    if plan.only:
        strats = [s for s in strats if s.name in plan.only]
    print(
        "fleet: "
        + ", ".join(
            f"{r.name} (prefill {r.prefill_ms:g} ms/token, decode {r.decode_ms:g} ms/token, concurrency {r.concurrency})"
            for r in FLEET
        )
    )
    shown = plan.policies.relative_to(ROOT) if plan.policies.is_relative_to(ROOT) else plan.policies
    print(f"policies from {shown}; seed {plan.seed}, repeats {plan.repeats}")
    started = time.monotonic()
    from scheduling_prefix import WORKLOADS, run_prefix_workloads

    main_plan = replace(plan, workloads=tuple(w for w in plan.workloads if w not in WORKLOADS))
    rows: dict[tuple[float, str], dict[str, Row]] = {}
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-sched-") as tmp:
        if main_plan.workloads:
            with fleet(Path(tmp), strats) as (sims, routers):
                rows = asyncio.run(run_all(main_plan, sims, routers, strats))
        procs = Procs(Path(tmp))
        try:  # the prefix workloads run on their own fleet, after the others have stopped
            policies = load_policies(plan.policies)
            prefix = run_prefix_workloads(
                procs,
                Path(tmp),
                policies,
                plan.workloads,
                plan.seed,
                plan.window_s,
                plan.only,
                plan.open_fraction,
            )
        finally:
            procs.stop_all()
    line = final_line(rows, prefix)
    print(f"\n(took {time.monotonic() - started:.0f} s)")
    print(line, flush=True)


if __name__ == "__main__":
    main()
