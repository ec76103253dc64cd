"""What the router adds on top of an engine: latency, throughput and CPU against a mock upstream, side by side.

The same mock upstream (an OpenAI-shaped aiohttp app answering instantly, vLLM metric names on /metrics, /health
for the vLLM router) is reached in one run:
  direct       - wrk straight to the mock
  floor        - a minimal aiohttp pass-through proxy (~20 lines): the floor for any Python proxy
  llmgw        - llmgw-router with every check on (benchmarks/every_check.py), named on the last line
  vllm-router  - PyPI `vllm-router` (Rust), one worker, round robin: no client auth, limits or accounting
  portkey      - npm `@portkey-ai/gateway` (Node), headless, provider openai at the mock's address
  litellm      - LiteLLM's proxy, one worker, no database
The peers install into throwaway places under the temp directory (benchmarks/peers.py) and are each skipped with
a one-line message when installing or starting fails. Non-streaming and streaming, at concurrency 1, 16 and 64,
measured with wrk. Prints a table of p50/p99 latency added over direct, requests per second, and the proxy's CPU
per request (user + system of its whole process tree from /proc, workers and children included, over the wrk
run); the last line is machine-readable:

  router_overhead: features=keys+limits3+... added_p50_ms_c1=X rps_c16=X floor_rps_c16=X litellm_rps_c16=X
  cpu_us_per_req_c16=X floor_cpu_us_per_req_c16=X vllm_router_rps_c16=X portkey_rps_c16=X p99_ms_c64=X
  floor_p99_ms_c64=X

(one line; a peer that was skipped or not asked for, or a level not run, reads `none`). `features` names the
configuration the llmgw rows run: every check on, committed in benchmarks/every_check.py. `--pin` runs every proxy under `taskset -c 0`
and wrk and the mock on CPU 1, so the proxies never compete with the load for a core; `--workers N` starts
llmgw-router with `--workers N` (N > 1 only). The line before the last sets llmgw's and the floor's req/s at
c=16 (whole) beside the bound the machine allows when the proxy and the load share its cores, cores / (proxy
CPU + load CPU) per request, the load being wrk (its own rusage) and the mock (its tree, from /proc):

  router_overhead_bound: cores=N llmgw_rps_c16=X llmgw_cpu_us=X llmgw_load_cpu_us=X llmgw_bound_rps_c16=X ...

Run: .venv/bin/python benchmarks/router_overhead.py [--duration 5] [--peers vllm,portkey,litellm] [--no-litellm]
     [--workers 2] [--pin] [--guardrails] [--no-cache]

The cache rows (left out with --no-cache) are a second llmgw-router whose project keeps a response cache:
`llmgw-cmiss` sends `Cache-Control: no-cache` on every request (keyed, recorded and stored like a miss, never
answered from memory), `llmgw-chit` the same body without it (every request after the first a hit). Their line:

  router_overhead_cache: miss_added_p50_ms_whole_c1=X miss_added_cpu_us_whole_c1=X hit_p50_ms_whole_c1=X
  hit_over_router_rps_whole_c1=X ... (whole and stream, at concurrency 1 and 16)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import every_check
import tracing_compare
from every_check import TRANSLATED
from harness import Procs, free_port, pinned, tree_cpu_seconds, wait_http
from peers import (
    BENCH_GUARD,
    MODEL,
    PEERS,
    Target,
    start_floor,
    start_litellm,
    start_llmgw,
    start_portkey,
    start_vllm_router,
)
from prometheus_client.parser import text_string_to_metric_families

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
async def health(request):  # the vLLM router waits for it before it listens
    return web.Response(text="ok")
async def metrics(request):
    return web.Response(body=METRICS, content_type="text/plain")
app = web.Application()
app.router.add_post("/v1/chat/completions", chat)
app.router.add_get("/v1/models", models)
app.router.add_get("/metrics", metrics)
app.router.add_get("/health", health)
async def traces(request):  # an OTLP/HTTP sink for `--tracing`: the spans are read and dropped
    await request.read()
    return web.Response(body=b"", content_type="application/x-protobuf")
app.router.add_post("/v1/traces", traces)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""


WRK_LUA = """
wrk.method = "POST"
wrk.body = [[{BODY}]]
wrk.headers["Content-Type"] = "application/json"
{HEADERS}
"""
BENCH_CACHE: dict[str, object] = {"ttl": "1h", "max_bytes": 64 * 1024 * 1024}
ROUTER_REQUESTS = "llmgw_router_requests"  # answered requests by model, status and error code (its metrics)
PROXY_CPUS, LOAD_CPUS = "0", "1"  # --pin: the proxies on CPU 0, wrk and the mock on CPU 1
MOCK_PID: list[int] = []  # the mock's process, once started: its CPU is the load's, with wrk's


@dataclass
class Result:
    p50_ms: float
    p99_ms: float
    rps: float
    errors: int
    requests: int
    cpu_us_per_req: float | None = None  # the proxy's process tree; None for direct
    load_cpu_us_per_req: float | None = None  # wrk's and the mock's CPU over the run, per request
    wrk_cpu_s: float = 0.0  # wrk's own user + system CPU (the run's child, reaped)
    failures: dict[str, int] = field(default_factory=dict)  # by kind (wrk_failures); sums to errors


# What each kind of failure wrk counts means for the client (wrk's own words are terse).
FAILURE_KINDS = {
    "non-2xx": "answered with a status of 300 or more",
    "timeout": "no answer within wrk's 2 s timeout",
    "read": "the connection failed or closed while the answer was read",
    "write": "the request could not be written",
    "connect": "no connection",
}


def wrk_failures(out: str) -> dict[str, int]:
    """The failed requests in wrk's report, by kind (FAILURE_KINDS); kinds with none are left out."""
    found: dict[str, int] = {}
    status = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    if status:
        found["non-2xx"] = int(status.group(1))
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if sock:
        for kind, n in zip(("connect", "read", "write", "timeout"), sock.groups(), strict=True):
            found[kind] = int(n)
    return {k: n for k, n in found.items() if n}


def failures_text(failures: dict[str, int]) -> str:
    return "; ".join(f"{kind} {n}: {FAILURE_KINDS.get(kind, kind)}" for kind, n in failures.items())


def _ms(text: str) -> float:
    m = re.match(r"([0-9.]+)(us|ms|s)", text)
    if not m:
        return float("nan")
    value, unit = float(m.group(1)), m.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


# The Responses rows: the same question to a model whose engine kind does not serve /v1/responses, once as
# chat ("llmgw-tchat") and once as a Responses request the router translates ("llmgw-resp"); the difference
# is the translation's cost per request, both ways, whole and streamed.
RESPONSES_ROWS = {"llmgw-tchat": "/v1/chat/completions", "llmgw-resp": "/v1/responses"}


def request_body(stream: bool, path: str = "/v1/chat/completions", model: str = MODEL) -> dict[str, object]:
    body: dict[str, object]
    if path == "/v1/responses":
        body = {"model": model, "input": "Say hello in five words.", "max_output_tokens": 16}
    else:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Say hello in five words."}],
            "max_tokens": 16,
        }
    if stream:
        body["stream"] = True
    return body


def messages_body(stream: bool) -> dict[str, object]:
    """The Anthropic Messages request that translates to request_body(stream)."""
    return {**request_body(stream), "max_tokens": 16}


def wrk(
    url: str,
    stream: bool,
    conns: int,
    duration: int,
    headers: dict[str, str],
    cpus: str | None,
    body: dict[str, object] | None = None,
) -> Result:
    body = body if body is not None else request_body(stream)
    lines = "\n".join(f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items())
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(WRK_LUA.replace("{BODY}", json.dumps(body)).replace("{HEADERS}", lines))
        script = f.name
    threads = 1 if conns == 1 else 2
    argv = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{duration}s", "--latency", "-s", script, url]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        out = subprocess.run(
            pinned(argv, cpus), capture_output=True, text=True, timeout=duration + 60, check=True
        ).stdout
    finally:
        os.unlink(script)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wrk_cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if re.search(r"Non-2xx|Socket errors", out):
        _show_error(url, body, headers, out)
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    rps = re.search(r"Requests/sec:\s+([0-9.]+)", out)
    done = re.search(r"^\s*(\d+) requests in", out, re.M)
    failures = wrk_failures(out)
    return Result(
        _ms(p50.group(1)) if p50 else float("nan"),
        _ms(p99.group(1)) if p99 else float("nan"),
        float(rps.group(1)) if rps else 0.0,
        sum(failures.values()),
        int(done.group(1)) if done else 0,
        failures=failures,
        wrk_cpu_s=wrk_cpu,
    )


def _show_error(url: str, body: dict[str, object], headers: dict[str, str], out: str) -> None:
    """wrk saw errors: say which (its summary line and one request's answer), so a number is never silently bad."""
    print(
        "  wrk: "
        + " | ".join(
            line.strip() for line in out.splitlines() if "error" in line.lower() or "Non-2xx" in line
        )
    )
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            print(f"  one request now: {r.status}")
    except urllib.error.HTTPError as exc:
        print(f"  one request now: {exc.code} {exc.read()[:300]!r}")
    except Exception as exc:
        print(f"  one request now: {type(exc).__name__}: {exc}")


def measure(
    target: Target, stream: bool, conns: int, duration: int, cpus: str | None, messages: bool = False
) -> Result:
    """One wrk run against target after a 1 s warm-up, with the proxy tree's CPU over the measured run.
    `messages`: Anthropic's /v1/messages instead of chat (llmgw translates it onto chat); a Responses row
    (RESPONSES_ROWS) sends /v1/responses."""
    body: dict[str, object] | None
    if messages:
        path, body = "/v1/messages", messages_body(stream)
    else:
        path = RESPONSES_ROWS.get(target.name, "/v1/chat/completions")
        body = request_body(stream, path, TRANSLATED) if target.name in RESPONSES_ROWS else None
    url = target.url + path
    told = f"{target.name} {'stream' if stream else 'whole'} c={conns}"
    watched(target, f"{told} warm-up", lambda: wrk(url, stream, conns, 1, target.headers, cpus, body))

    def run() -> Result:  # the proxy's CPU over the run only, not over watched's read of its metrics
        before = tree_cpu_seconds(target.proc.pid) if target.proc else 0.0
        mock_before = tree_cpu_seconds(MOCK_PID[0]) if MOCK_PID else 0.0
        result = wrk(url, stream, conns, duration, target.headers, cpus, body)
        if target.proc and result.requests:
            result.cpu_us_per_req = (tree_cpu_seconds(target.proc.pid) - before) / result.requests * 1e6
        if MOCK_PID and result.requests:
            mock = tree_cpu_seconds(MOCK_PID[0]) - mock_before
            result.load_cpu_us_per_req = (result.wrk_cpu_s + mock) / result.requests * 1e6
        return result

    return watched(target, told, run)


def watched(target: Target, told: str, run: Callable[[], Result]) -> Result:
    """run(), and when wrk saw failures, what the proxy says of them (_show_failed_answers); its answers are
    read from its metrics before the run and, only after a failed one, after it."""
    answered, log_at = router_answers(target), log_size(target)
    result = run()
    if result.errors:
        print(f"  {told}: {result.errors} failed ({failures_text(result.failures)})")
        _show_failed_answers(target, answered, log_at)
    return result


def router_answers(target: Target) -> Counter[tuple[str, str]] | None:
    """llmgw's answers so far by (status, error code), from its requests counter on /metrics; None for a
    target without one or when it cannot be read (said so)."""
    if target.metrics is None:
        return None
    try:
        with urllib.request.urlopen(target.metrics, timeout=10) as r:
            text = r.read().decode()
    except OSError as exc:
        print(f"  {target.name}: its metrics unreadable: {type(exc).__name__}: {exc}")
        return None
    counts: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != ROUTER_REQUESTS:
            continue
        for sample in family.samples:
            if sample.name == ROUTER_REQUESTS + "_total":
                counts[(sample.labels["status"], sample.labels["code"])] += int(sample.value)
    return counts


def log_size(target: Target) -> int:
    return target.log.stat().st_size if target.log is not None and target.log.exists() else 0


def _show_failed_answers(target: Target, before: Counter[tuple[str, str]] | None, log_at: int) -> None:
    """What the proxy itself says of a run in which wrk saw failures: llmgw's answers of 300 or more by
    status and error code (its metrics, before and after), and the lines it logged meanwhile."""
    after = router_answers(target)
    if before is not None and after is not None:
        failed = {k: n for k, n in (after - before).items() if not k[0].startswith("2")}
        said = ", ".join(f"{status} {code or '-'}: {n}" for (status, code), n in sorted(failed.items()))
        print(f"  {target.name} counted its answers of 300 or more in the run: {said or 'none'}")
    if target.log is not None and target.log.exists():
        with target.log.open("rb") as f:
            f.seek(log_at)
            lines = f.read().decode(errors="replace").splitlines()
        print(f"  {target.name} logged in the run: {len(lines)} lines")
        for line in lines[-20:]:
            print(f"    {line[:400]}")


def start_mock(procs: Procs, work: Path, load_cpus: str | None) -> str:
    """The mock upstream (and OTLP sink); its base URL."""
    mock_port = free_port()
    (work / "mock.py").write_text(MOCK)
    mock = procs.start([sys.executable, str(work / "mock.py"), str(mock_port)], cpus=load_cpus)
    MOCK_PID[:] = [mock.pid]
    upstream = f"http://127.0.0.1:{mock_port}"
    wait_http(upstream + "/health", proc=mock)
    return upstream


def start_targets(procs: Procs, work: Path, args: argparse.Namespace) -> list[Target]:
    proxy_cpus, load_cpus = (PROXY_CPUS, LOAD_CPUS) if args.pin else (None, None)
    upstream = start_mock(procs, work, load_cpus)
    targets = [Target("direct", upstream)]
    targets.append(start_floor(procs, work, upstream, proxy_cpus))
    llmgw = start_llmgw(procs, work, upstream, args.workers, proxy_cpus)
    targets.append(llmgw)
    for name in RESPONSES_ROWS:  # the same router process, asked the other way
        targets.append(replace(llmgw, name=name))
    if args.guardrails:  # a second router with a deterministic guardrail on every request, in and out
        guarded = work / "guarded"
        state = ("--state-dir", str(guarded / "state"))  # its own usage spool: one router per directory
        targets.append(
            start_llmgw(
                procs,
                guarded,
                upstream,
                args.workers,
                proxy_cpus,
                name="llmgw+guard",
                extra=state,
                guard=BENCH_GUARD,
            )
        )
    if args.cache:  # a second router whose project keeps a response cache: a miss's cost, a hit's latency
        cached = start_llmgw(
            procs,
            work / "cache",
            upstream,
            args.workers,
            proxy_cpus,
            name="llmgw-cmiss",
            extra=("--state-dir", str(work / "cache" / "state")),  # a usage spool of its own
            cache=BENCH_CACHE,
        )
        # Every request says no-cache: keyed, recorded and stored like a miss, never answered from memory.
        targets.append(
            replace(cached, name="llmgw-cmiss", headers={**cached.headers, "Cache-Control": "no-cache"})
        )
        # The same body without it (every_check's headers say no-cache): every request after the first a hit.
        hit = {k: v for k, v in cached.headers.items() if k != "Cache-Control"}
        targets.append(replace(cached, name="llmgw-chit", headers=hit))
    starters = {"vllm": start_vllm_router, "portkey": start_portkey, "litellm": start_litellm}
    for peer in args.peers:
        started = starters[peer](procs, work, upstream, proxy_cpus)
        if started:
            targets.append(started)
    return targets


def print_table(
    targets: list[Target], levels: list[int], results: dict[tuple[str, bool, int], Result]
) -> None:
    print(
        f"\n{'mode':<8}{'target':<13}{'conc':>5}{'p50 ms':>9}{'p99 ms':>9}{'+p50 ms':>9}{'+p99 ms':>9}"
        f"{'req/s':>9}{'cpu us/req':>12}{'errors':>8}"
    )
    for stream in (False, True):
        for conns in levels:
            ref = results[("direct", stream, conns)]
            for t in targets:
                r = results[(t.name, stream, conns)]
                added50 = r.p50_ms - ref.p50_ms if t.name != "direct" else 0.0
                added99 = r.p99_ms - ref.p99_ms if t.name != "direct" else 0.0
                cpu = f"{r.cpu_us_per_req:.0f}" if r.cpu_us_per_req is not None else "-"
                print(
                    f"{'stream' if stream else 'whole':<8}{t.name:<13}{conns:>5}{r.p50_ms:>9.2f}{r.p99_ms:>9.2f}"
                    f"{added50:>9.2f}{added99:>9.2f}{r.rps:>9.0f}{cpu:>12}{r.errors:>8}"
                )
    for (name, stream, conns), r in results.items():
        mode = "stream" if stream else "whole"
        if r.errors:  # wrk counts every answer: a rate of failures must not read as a speed
            print(
                f"  {name} {mode} c={conns}: {r.errors} of {r.requests} requests failed "
                f"({failures_text(r.failures)}); its req/s counts them"
            )
        elif not r.requests:
            print(f"  {name} {mode} c={conns}: no request completed within the run (a longer --duration?)")


def measure_messages(
    llmgw: Target, conns: int, duration: int, cpus: str | None, chat: dict[tuple[str, bool, int], Result]
) -> str:
    """The Messages rows: llmgw serving /v1/messages against its own chat rows at the same concurrency (the
    translation's cost per request is the CPU difference). Returns the machine-readable line."""
    print(
        f"\nmessages (llmgw, c={conns}){'req/s':>12}{'cpu us/req':>12}{'chat req/s':>12}{'chat cpu':>10}{'errors':>8}"
    )
    cpu: dict[bool, str] = {}
    for stream in (False, True):
        r = measure(llmgw, stream, conns, duration, cpus, messages=True)
        ref = chat[("llmgw", stream, conns)]
        mine = f"{r.cpu_us_per_req:.0f}" if r.cpu_us_per_req is not None else "none"
        theirs = f"{ref.cpu_us_per_req:.0f}" if ref.cpu_us_per_req is not None else "none"
        cpu[stream] = f"cpu_us_per_req_c{conns}={mine} chat_cpu_us_per_req_c{conns}={theirs}"
        mode = "stream" if stream else "whole"
        print(f"{mode:<24}{r.rps:>12.0f}{mine:>12}{ref.rps:>12.0f}{theirs:>10}{r.errors:>8}")
    return f"router_overhead_messages: whole {cpu[False]} stream {cpu[True]}"


def responses_line(levels: list[int], results: dict[tuple[str, bool, int], Result]) -> str:
    """The translation's cost: CPU per request of a Responses request against the same request as chat."""
    c16 = 16 if 16 in levels else levels[-1]
    parts = []
    for stream in (False, True):
        chat, resp = results[("llmgw-tchat", stream, c16)], results[("llmgw-resp", stream, c16)]
        mode = "stream" if stream else "whole"
        for label, r in (("chat", chat), ("responses", resp)):
            cpu = "none" if r.cpu_us_per_req is None else f"{r.cpu_us_per_req:.0f}"
            parts.append(f"{label}_{mode}_cpu_us_per_req_c16={cpu}")
        ratio = (
            resp.cpu_us_per_req / chat.cpu_us_per_req if resp.cpu_us_per_req and chat.cpu_us_per_req else None
        )
        parts.append(f"responses_over_chat_{mode}={'none' if ratio is None else f'{ratio:.2f}'}")
    return "router_overhead_responses: " + " ".join(parts)


def guardrails_line(levels: list[int], results: dict[tuple[str, bool, int], Result]) -> str:
    """Screening's cost: CPU per request of the guarded router against the plain one, the same requests."""
    c16 = 16 if 16 in levels else levels[-1]
    parts = []
    for stream in (False, True):
        plain, guarded = results[("llmgw", stream, c16)], results[("llmgw+guard", stream, c16)]
        mode = "stream" if stream else "whole"
        for label, r in (("plain", plain), ("guarded", guarded)):
            cpu = "none" if r.cpu_us_per_req is None else f"{r.cpu_us_per_req:.0f}"
            parts.append(f"{label}_{mode}_cpu_us_per_req_c16={cpu}")
        ratio = (
            guarded.cpu_us_per_req / plain.cpu_us_per_req
            if guarded.cpu_us_per_req and plain.cpu_us_per_req
            else None
        )
        parts.append(f"guarded_over_plain_{mode}={'none' if ratio is None else f'{ratio:.2f}'}")
    return "router_overhead_guardrails: " + " ".join(parts)


def cache_line(levels: list[int], results: dict[tuple[str, bool, int], Result]) -> str:
    """The response cache's rows against the plain router's, at concurrency 1 and 16, whole and streamed:
    a miss's added p50 and CPU per request (cache on, nothing reused), a hit's p50 and requests per second."""
    parts = []
    for conns in sorted({levels[0], 16 if 16 in levels else levels[-1]}):
        for stream in (False, True):
            mode = f"{'stream' if stream else 'whole'}_c{conns}"
            base, miss, hit = (
                results.get((n, stream, conns)) for n in ("llmgw", "llmgw-cmiss", "llmgw-chit")
            )
            if base is None or miss is None or hit is None:
                continue
            cpu = (
                f"{miss.cpu_us_per_req - base.cpu_us_per_req:.0f}"
                if miss.cpu_us_per_req is not None and base.cpu_us_per_req is not None
                else "none"
            )
            parts += [
                f"miss_added_p50_ms_{mode}={miss.p50_ms - base.p50_ms:.3f}",
                f"miss_added_cpu_us_{mode}={cpu}",
                f"hit_p50_ms_{mode}={hit.p50_ms:.3f}",
                f"hit_over_router_rps_{mode}={hit.rps / base.rps:.2f}"
                if base.rps
                else f"hit_over_router_rps_{mode}=none",
            ]
    return "router_overhead_cache: " + " ".join(parts)


def bound_line(levels: list[int], results: dict[tuple[str, bool, int], Result]) -> str:
    """Requests/s at c=16 (whole) beside what the machine's cores allow when the proxy and the load (wrk and
    the mock) share them: cores / (proxy CPU + load CPU) per request. With --workers N, N workers' CPU."""
    c16 = 16 if 16 in levels else levels[-1]
    parts = [f"router_overhead_bound: cores={os.cpu_count()}"]
    for name in ("llmgw", "floor"):
        r = results.get((name, False, c16))
        if r is None or r.cpu_us_per_req is None or r.load_cpu_us_per_req is None:
            parts.append(f"{name}_bound_rps_c{c16}=none")
            continue
        bound = (os.cpu_count() or 1) * 1e6 / (r.cpu_us_per_req + r.load_cpu_us_per_req)
        parts.append(
            f"{name}_rps_c{c16}={r.rps:.0f} {name}_cpu_us={r.cpu_us_per_req:.0f} "
            f"{name}_load_cpu_us={r.load_cpu_us_per_req:.0f} {name}_bound_rps_c{c16}={bound:.0f}"
        )
    return " ".join(parts)


def final_line(levels: list[int], results: dict[tuple[str, bool, int], Result]) -> str:
    c1 = levels[0]
    c16 = 16 if 16 in levels else levels[-1]

    def at16(name: str, what: str) -> str:
        r = results.get((name, False, c16))
        value = None if r is None else r.rps if what == "rps" else r.cpu_us_per_req
        return "none" if value is None else f"{value:.0f}"

    def p99_at64(name: str) -> str:
        r = results.get((name, False, 64))
        return "none" if r is None or not r.requests else f"{r.p99_ms:.2f}"

    added = results[("llmgw", False, c1)].p50_ms - results[("direct", False, c1)].p50_ms
    return (
        f"router_overhead: features={every_check.features()} "
        f"added_p50_ms_c1={added:.3f} rps_c16={at16('llmgw', 'rps')} "
        f"floor_rps_c16={at16('floor', 'rps')} litellm_rps_c16={at16('litellm', 'rps')} "
        f"cpu_us_per_req_c16={at16('llmgw', 'cpu')} floor_cpu_us_per_req_c16={at16('floor', 'cpu')} "
        f"vllm_router_rps_c16={at16('vllm-router', 'rps')} portkey_rps_c16={at16('portkey', 'rps')} "
        f"p99_ms_c64={p99_at64('llmgw')} floor_p99_ms_c64={p99_at64('floor')}"
    )


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument(
        "--duration", type=int, default=5, help="whole seconds per wrk run (wrk takes no fractions)"
    )
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument(
        "--peers", default=",".join(PEERS), help=f"comma-separated, of {','.join(PEERS)}; '' for none"
    )
    ap.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out of --peers")
    ap.add_argument(
        "--guardrails",
        action="store_true",
        help="also a router screening every request with a guardrail of deterministic checks (llmgw+guard)",
    )
    ap.add_argument(
        "--no-cache",
        dest="cache",
        action="store_false",
        help="leave out the response cache rows (llmgw-cmiss: every request a miss; llmgw-chit: every one a hit)",
    )
    ap.add_argument("--workers", type=int, default=1, help="llmgw-router worker processes (passed when > 1)")
    ap.add_argument(
        "--pin", action="store_true", help="proxies on CPU 0 (taskset), wrk and the mock on CPU 1"
    )
    ap.add_argument(
        "--tracing",
        action="store_true",
        help="instead: llmgw built without tracing (hooks stripped, or --baseline), with it but no endpoint, "
        "and exporting, "
        "interleaved (benchmarks/tracing_compare.py)",
    )
    ap.add_argument(
        "--baseline",
        default=None,
        help="with --tracing: a git revision to run as the build without it (default: this tree, hooks stripped)",
    )
    ap.add_argument(
        "--rounds", type=int, default=3, help="with --tracing: measurements per target, interleaved"
    )
    args = ap.parse_args()
    peers = [p for p in args.peers.split(",") if p]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        ap.error(f"--peers: unknown {','.join(unknown)} (known: {','.join(PEERS)})")
    args.peers = [p for p in peers if not (args.no_litellm and p == "litellm")]
    if args.pin and (os.cpu_count() or 1) < 2:
        ap.error("--pin needs at least 2 CPUs (the proxies on 0, the load on 1)")
    return args


def main() -> None:
    args = parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("router_overhead: wrk is not installed (scripts/install-system-deps.sh installs it)")
    levels = [int(c) for c in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-"))
    procs = Procs(work)
    load_cpus = LOAD_CPUS if args.pin else None
    try:
        if args.tracing:
            tracing_compare.run(procs, work, args, levels, start_mock, measure, load_cpus)
            return
        targets = start_targets(procs, work, args)
        results: dict[tuple[str, bool, int], Result] = {}
        for stream in (False, True):
            for conns in levels:
                for t in targets:
                    results[(t.name, stream, conns)] = measure(t, stream, conns, args.duration, load_cpus)
        print_table(targets, levels, results)
        llmgw = next(t for t in targets if t.name == "llmgw")
        c16 = 16 if 16 in levels else levels[-1]
        print(measure_messages(llmgw, c16, args.duration, load_cpus, results))
        print(responses_line(levels, results))
        if args.guardrails:
            print(guardrails_line(levels, results))
        if args.cache:
            print(cache_line(levels, results))
        print(bound_line(levels, results))
        print(final_line(levels, results))
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
