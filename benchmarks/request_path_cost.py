"""The request path's cost, stage by stage, in instructions: deterministic where CPU time on a shared machine is not.

The real request path (RequestService.handle and everything under it, assembled as app.build_router does on a
SQLite store: store keys, the pooled limiter, the usage writer and its spool) is driven in process: a fake exchange in
(the client: the request's bytes and headers, its answer kept), a fake engine out (the mock's answer, whole or as
the same SSE events, one per read), nothing between them replaced. It runs under `valgrind --tool=callgrind`
with PYTHONHASHSEED fixed; the inner run calls `os.getppid()` as a marker before and after each measured batch of
requests, and callgrind dumps its counts at every marker (`--dump-before=getppid`), so each batch's
instructions are read from its own dump and divided by the batch's requests.

Stages are the features of "every check on" (benchmarks/every_check.py), switched on one after another:
`core` is the path with every optional feature off (no keys, no tenants, one endpoint, no guardrail, no cache,
no tags, no trace context, no usage rows), and each further stage is what turning its feature on adds, so the
stages add up to every check on; then `bodies`, a project keeping every request's bodies (not one of every
check on: a project opts in), on top of them all. Both answers are measured: `whole` (one JSON body) and `stream` (the SSE
events). `off` is core again with those features configured for other models and projects (a guardrail, a
response cache, tag labels): what a feature that does not apply to a request costs it, shown beside core.

Budgets (benchmarks/request_path_budget.json) are the measured counts plus at most 10 % (plus the noise floor,
1 % of core's count, for a stage so small that 10 % of it is less). The run exits 1
naming every stage over its budget, and its last line is

  request_path_cost: total_instr=X budget_instr=X over=N

(total_instr: every check on, whole and stream, per request; over: the stages over budget). A new stage of
the request path comes with its line in the budget file (docs/router.md, Overhead).

What callgrind counts is user-space instructions: system calls (the sockets' writes, the spool's fsync) cost
kernel time it does not see; the wall-clock benchmarks (router_overhead.py, streams.py) see both.

Before the table, the floor's line (benchmarks/server_cost.py): llmgw-router with every check on and the floor of
router_overhead.py (~20 lines of aiohttp), each a whole server under callgrind, and llmgw's instructions per
request over the floor's, whole and streamed, a ratio the machine's load does not move:

  request_path_floor: instr_ratio_whole=X instr_ratio_stream=X spread=S

Run: .venv/bin/python benchmarks/request_path_cost.py [--requests 50] [--write-budgets] [--counts FILE]
  --no-floor         leave the two whole servers out (the budgets only)
  --floor-runs N     measure the whole servers N times in a row (spread: none for one run)
  --counts FILE      compare the counts recorded in FILE (JSON, as --save writes) instead of measuring
  --save FILE        keep the measured counts
  --write-budgets    write the budget file from this run (measured + 10 %, rounded up)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import every_check

HERE = Path(__file__).resolve().parent
BUDGETS = HERE / "request_path_budget.json"
MODES = ("whole", "stream")
# `bodies` is not one of every check on (a project opts in to it): measured last, on top of them all.
STAGES = ("core", *every_check.FEATURES, "bodies")
# The project's retention in the `bodies` stage: every request's request and answer bodies kept (docs/traffic.md).
BODIES = {"content": True, "ttl": "1h", "bodies": {"share": 1}}
MARGIN = 0.10  # a budget is the measured count plus at most this
# ... or plus this share of the core's count when that is more: two runs' stage counts differ by up to ~0.7 %
# of core (a guardrail's scan crosses threads, and where the scheduler switches is not the same every run).
NOISE_FLOOR = 0.01
WARMUP = 20  # requests before each measured batch: caches filled, the limiter's shares taken
SEED = "0"

CHAT = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": every_check.MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello from the mock"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
    }
).encode()


def _chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {"content": content} if content else {}
    event = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": every_check.MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(event).encode() + b"\n\n"


USAGE_EVENT = (
    b"data: "
    + json.dumps(
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": every_check.MODEL,
            "choices": [],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
        }
    ).encode()
    + b"\n\n"
)
STREAM = [_chunk(w) for w in ["hello", " from", " the", " mock", "!"]] + [_chunk(None, "stop")]


# ---------------------------------------------------------------------------------------------- budgets


def stage_counts(per_request: dict[str, dict[str, float]]) -> dict[str, dict[str, int]]:
    """Each stage's instructions per request from the cumulative configurations' counts (`per_request[mode]
    [stage]`: everything up to and including that stage on): the difference with the one before."""
    out: dict[str, dict[str, int]] = {}
    for mode in MODES:
        counts = per_request[mode]
        out[mode] = {}
        before = 0.0
        for stage in STAGES:
            out[mode][stage] = round(counts[stage] - before)
            before = counts[stage]
    return out


def budgets_for(stages: dict[str, dict[str, int]], margin: float = MARGIN) -> dict[str, dict[str, int]]:
    """The budget of each stage: its measured count plus `margin`, rounded up, or plus the measurement's
    noise floor when that is larger (a stage of a few thousand instructions, or of none, moves by that much
    between runs: it is the difference of two configurations' counts, each within a fraction of a percent)."""
    out: dict[str, dict[str, int]] = {}
    for mode, stages_of in stages.items():
        noise = math.ceil(abs(stages_of["core"]) * NOISE_FLOOR)
        out[mode] = {
            stage: max(math.ceil(count * (1 + margin)), count + noise) for stage, count in stages_of.items()
        }
    return out


def over_budget(stages: dict[str, dict[str, int]], budgets: dict[str, dict[str, int]]) -> list[str]:
    """The stages over their budget, each as `mode/stage: count > budget`; a stage without a budget line is
    over (a new stage comes with its budget)."""
    over = []
    for mode, stages_of in stages.items():
        for stage, count in stages_of.items():
            budget = budgets.get(mode, {}).get(stage)
            if budget is None:
                over.append(f"{mode}/{stage}: {count} has no budget line in {BUDGETS.name}")
            elif count > budget:
                over.append(f"{mode}/{stage}: {count} > budget {budget} (+{count / budget - 1:.1%})")
    return over


def report(stages: dict[str, dict[str, int]], budgets: dict[str, dict[str, int]], off: dict[str, int]) -> str:
    """The table, the off row, and the last line."""
    lines = [f"{'stage':<14}" + "".join(f"{m + ' instr':>14}{m + ' budget':>14}" for m in MODES)]
    for stage in STAGES:
        row = f"{stage:<14}"
        for mode in MODES:
            row += f"{stages[mode][stage]:>14,}{budgets.get(mode, {}).get(stage, 0):>14,}"
        lines.append(row)
    total = {m: sum(stages[m].values()) for m in MODES}
    budget = {m: sum(budgets.get(m, {}).values()) for m in MODES}
    lines.append(f"{'total':<14}" + "".join(f"{total[m]:>14,}{budget[m]:>14,}" for m in MODES))
    for mode in MODES:
        core = stages[mode]["core"]
        lines.append(
            f"off ({mode}): {off[mode]:,} instructions per request against core's {core:,} "
            f"({(off[mode] - core) / core:+.2%}): features configured for others cost this request that"
        )
    over = over_budget(stages, budgets)
    lines += [f"over budget: {o}" for o in over]
    lines.append(
        f"request_path_cost: total_instr={sum(total.values())} budget_instr={sum(budget.values())} "
        f"over={len(over)}"
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- the inner run


class FakeExchange:
    """A client's request: its bytes and headers in, its answer kept (llmgw_router.server.exchange.Exchange)."""

    method = "POST"
    path = "/v1/chat/completions"

    surface: Any = None  # the client's request as it came (exchange.AS_SENT), set where the router is loaded

    def __init__(self, body: bytes, headers: Any) -> None:
        self.headers = headers
        self._body = body
        self.started = False
        self.status = 0
        self.sent = 0

    @property
    def remote(self) -> str | None:
        return "127.0.0.1"

    async def read_body(self, limit: int) -> bytes:
        return self._body

    def authenticated(self) -> None:
        pass

    def respond(self, reply: Any) -> None:
        self.started, self.status, self.sent = True, reply.status, len(reply.body)

    def start_stream(self, status: int, headers: dict[str, str]) -> None:
        self.started, self.status = True, status

    async def write(self, chunk: bytes, limit_s: float) -> None:
        self.sent += len(chunk)

    async def write_eof(self, limit_s: float, last: bytes = b"") -> None:
        self.sent += len(last)

    def abort(self) -> None:
        pass


class FakeAnswer:
    """The engine's answer being read (llmgw_router.upstream.proxy.Upstream): whole, or one event per read."""

    def __init__(self, parts: list[bytes]) -> None:
        self.status = 200
        self._parts = parts
        self._next = 0

    def header(self, name: str, default: str = "") -> str:
        return "application/json" if name.lower() == "content-type" else default

    async def read(self) -> bytes:
        return b"".join(self._parts)

    async def readany(self) -> bytes:
        if self._next == len(self._parts):
            return b""
        self._next += 1
        return self._parts[self._next - 1]

    def close(self) -> None:
        pass

    def release(self) -> None:
        pass


class FakeEngine:
    """Where the router's engine client was: every request answered at once with the mock's answer."""

    @staticmethod
    def handles(url: str) -> bool:
        return True

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> FakeAnswer:
        if b'"stream":true' not in body and b'"stream": true' not in body:
            return FakeAnswer([CHAT])
        usage = [USAGE_EVENT] if b'"include_usage":true' in body or b'"include_usage": true' in body else []
        return FakeAnswer([*STREAM, *usage, b"data: [DONE]\n\n"])

    async def close(self) -> None:
        pass


@dataclass
class Config:
    """One configuration measured: the features on (a prefix of STAGES), or `off`."""

    label: str
    on: frozenset[str]
    off_configured: bool = False  # features configured for other models and projects (the `off` row)
    snapshot: dict[str, Any] = field(default_factory=dict)


def snapshot_for(config: Config) -> dict[str, Any]:
    """every_check's snapshot with the features not on taken out (or, for `off`, pointed elsewhere)."""
    snap = every_check.snapshot("http://127.0.0.1:9")
    on = config.on
    other = config.off_configured
    project = snap["tenants"]["projects"]["bench"]
    if "limits3" not in on:
        project["limits"] = {}
        snap["tenants"]["organizations"]["acme"]["limits"] = {}
        snap["tenants"]["teams"]["research"]["limits"] = {}
    if "keys" not in on and not other:
        snap[
            "tenants"
        ] = {}  # (`off` keeps them: a cache configured for a project, not this anonymous caller's)
    if "admission" not in on:
        snap["router"] = {k: v for k, v in snap["router"].items() if k != "admission"}
        for ep in snap["endpoints"]:
            ep.pop("slots", None)
    if "prefix4" not in on:
        snap["endpoints"] = [
            ep for ep in snap["endpoints"] if ep["replica_id"] in ("mock-0", "mock-translated")
        ]
        snap["router"] = {k: v for k, v in snap["router"].items() if k != "default_policy"}
    if "guard_in" not in on:
        snap["guard"] = {**every_check.INPUT_GUARD, "models": {every_check.TRANSLATED: ["bench-input"]}}
        if not other:
            del snap["guard"]
    if "cache_miss" not in on:
        del project["response_cache"]
        if other:
            snap["tenants"]["projects"]["other"] = {
                "team": "research",
                "response_cache": every_check.RESPONSE_CACHE,
            }
    if "tags2" not in on and not other:
        snap["router"] = {k: v for k, v in snap["router"].items() if k != "tag_labels"}
    if "bodies" in on:
        project["retention"] = BODIES
    elif other:
        snap["tenants"]["projects"].setdefault("other", {"team": "research"})["retention"] = BODIES
    return snap


def headers_for(config: Config, key: str) -> Any:
    from llmgw_router.server.exchange import Headers

    h = {"content-type": "application/json", "host": "127.0.0.1"}
    if "keys" in config.on:
        h["authorization"] = f"Bearer {key}"
    if "cache_miss" in config.on:
        h["cache-control"] = "no-cache"
    if "tags2" in config.on:
        h["x-llmgw-tags"] = every_check.TAGS
    if "trace_noexp" in config.on:
        h["traceparent"] = every_check.TRACEPARENT
    return Headers(h)


def configs() -> list[Config]:
    out = [Config(stage, frozenset(STAGES[1 : i + 1])) for i, stage in enumerate(STAGES)]
    out.append(Config("off", frozenset(), off_configured=True))
    return out


def request_body(stream: bool) -> bytes:
    body: dict[str, Any] = {
        "model": every_check.MODEL,
        "messages": [{"role": "user", "content": "Say hello in five words."}],
        "max_tokens": 16,
    }
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


class VirtualClock:
    """Seconds that advance by a fixed step at every reading: the limits' windows and shares decided the same
    way in every run, however slowly callgrind runs the code."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        self.now += 1e-5
        return self.now


async def _assemble(stack: contextlib.AsyncExitStack, dsn: str, work: Path) -> tuple[Any, Any]:
    """The router as app.build_router assembles it on a store (keys, the pooled limiter with its concurrency
    slots, the usage writer and its spool), with what runs on real time pinned, since callgrind slows real
    time fifty-fold and a timer would land in a measured batch by chance: the limits on a virtual clock, the
    slots' background passes (idle slots handed back after a linger, holds renewed every ttl/3), the key
    cache's expiry and the usage writer's interval far off; the writer's batch is written at the end of each
    measured batch instead, and counted in it. What is counted is the request path's own work, slots held
    as in a busy router."""
    from llmgw_router.options import RouterOptions
    from llmgw_router.path.auth import Authenticator, StoreKeys
    from llmgw_router.path.ratelimit import TenantLimiter
    from llmgw_router.path.service import RequestService
    from llmgw_router.server.exchange import AS_SENT

    FakeExchange.surface = AS_SENT

    from llmgw.store.limits.limiter import PoolLimiter
    from llmgw.store.limits.slots import PooledSlots
    from llmgw.store.store import Store
    from llmgw.store.usage.usage_writer import UsageWriter

    store = await Store.open(dsn)
    stack.push_async_callback(store.close)
    clock = VirtualClock()
    slots = PooledSlots(store, "bench", clock=clock, ttl=1e9, linger=1e9)
    await slots.start()
    stack.push_async_callback(slots.close)
    limiter = TenantLimiter(PoolLimiter(store, clock=clock, slots=slots))
    writer = UsageWriter(store, flush_interval=3600.0, spool_dir=work / "spool")
    await writer.start()
    stack.push_async_callback(writer.close)
    options = RouterOptions(router_id="bench")
    auth = Authenticator(StoreKeys(store), ttl=3600.0)
    return RequestService(options, auth, limiter, writer), writer


async def _body_keeper(stack: contextlib.AsyncExitStack, dsn: str) -> Any:
    """Kept bodies on the content vault, as app.build_router makes them with a content key."""
    from llmgw_router.surfaces.kept_bodies import BodyKeeper

    from llmgw.store.queries.content import KEY_BYTES, ContentVault
    from llmgw.store.store import Store

    store = await Store.open(dsn)
    stack.push_async_callback(store.close)
    return BodyKeeper(ContentVault(store, b"k" * KEY_BYTES))


def marker() -> None:
    """callgrind dumps its counts here (--dump-before=getppid): the end of one segment, the start of the next."""
    os.getppid()


async def one_request(service: Any, body: bytes, headers: Any, label: str) -> None:
    now = service.clock()
    for ep in service.table.all_endpoints():  # what the scrape loop keeps fresh
        ep.last_scraped = now
    exchange = FakeExchange(body, headers)
    await service.handle(exchange, "chat")
    if exchange.status != 200:
        raise SystemExit(f"{label}: answered {exchange.status}")


async def inner(work: Path, requests: int) -> list[str]:
    """Runs under callgrind: each configuration and mode, a warm-up, then `requests` requests between two
    markers. Returns the segments' labels in marker order."""
    from llmgw_router import heap
    from llmgw_router.fleet.ports import NullUsage
    from llmgw_router.path.auth import Authenticator
    from llmgw_router.path.ratelimit import NoLimits

    from llmgw.adapters.keys import create_key
    from llmgw.core.snapshot import RouterSnapshot
    from llmgw.store.store import Store

    random.seed(0)  # the request ids (drawn from the module's generator): the same in every run
    dsn = f"sqlite:///{work / 'store.db'}"
    store = await Store.open(dsn)
    key = (await create_key(store, "bench", time.time(), name="bench")).plaintext
    await store.close()
    labels: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        service, writer = await _assemble(stack, dsn, work)
        auth, limiter = service.auth, service.limiter
        service.engines = FakeEngine()  # type: ignore[assignment]
        import aiohttp

        service.session = aiohttp.ClientSession()  # never used: every endpoint is the fake engine's
        stack.push_async_callback(service.session.close)
        keeper = await _body_keeper(stack, dsn)
        for config in configs():
            service.apply_snapshot(RouterSnapshot.model_validate(snapshot_for(config)))
            # As llmgw-router does once it is built; again for each configuration, so that no measured batch
            # meets a full collection of what the ones before it left (it would count as the batch's).
            heap.settle_after_start()
            service.auth = auth if "keys" in config.on else Authenticator(None)
            service.limiter = limiter if "limits3" in config.on else NoLimits()
            service.usage = writer if "usage" in config.on else NullUsage()
            # A content key given (as with `--content-key-file`): `off` shows what it costs a request whose
            # project keeps no body, `bodies` what keeping every one adds.
            service.kept_bodies = keeper if "bodies" in config.on or config.off_configured else None
            headers = headers_for(config, key)
            for mode in MODES:
                body = request_body(mode == "stream")

                for _ in range(WARMUP):
                    await one_request(service, body, headers, f"{config.label}/{mode}")
                if "usage" in config.on:
                    await writer.flush()
                await keeper.drain()
                # Every batch starts with the collector's counts at zero, so the young collections that fall
                # in it are the same in every run (else a batch meets one more or one less by chance).
                gc.collect()
                marker()
                labels.append("setup")
                for _ in range(requests):
                    await one_request(service, body, headers, f"{config.label}/{mode}")
                if "usage" in config.on:
                    await writer.flush()
                await keeper.drain()  # the bodies sealed and written: counted in the batch, as usage is
                marker()
                labels.append(f"{config.label}/{mode}")
    labels.append("end")
    return labels


# ---------------------------------------------------------------------------------------------- the outer run


def _totals(path: Path) -> int:
    m = re.search(r"^totals:\s+(\d+)", path.read_text(errors="replace"), re.M)
    if not m:
        raise SystemExit(f"request_path_cost: {path} has no totals line (not a callgrind dump?)")
    return int(m.group(1))


def measure(requests: int) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """Run the inner driver under callgrind; per mode, each configuration's instructions per request."""
    if shutil.which("valgrind") is None:
        raise SystemExit("request_path_cost: valgrind is not installed (scripts/install-system-deps.sh)")
    work = Path(tempfile.mkdtemp(prefix="llmgw-cost-"))
    try:
        labels_file = work / "labels.json"
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={work / 'cg.out'}"]
        argv += ["--dump-before=getppid", "--collect-jumps=no", "--dump-instr=no"]
        argv += [sys.executable, __file__, "--inner", str(work), "--requests", str(requests)]
        env = dict(os.environ, PYTHONHASHSEED=SEED)
        env.pop("PYTHONDEVMODE", None)
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not labels_file.exists():
            raise SystemExit(f"request_path_cost: the run under callgrind failed:\n{done.stderr[-3000:]}")
        labels = json.loads(labels_file.read_text())
        dumps = sorted(
            (p for p in work.glob("cg.out.*") if p.suffix[1:].isdigit()), key=lambda p: int(p.suffix[1:])
        )
        # Dump k holds the instructions from marker k-1 to marker k: the segment labels[k-1] names.
        if len(dumps) < len(labels) - 1:
            raise SystemExit(f"request_path_cost: {len(dumps)} dumps for {len(labels) - 1} segments")
        per: dict[str, dict[str, float]] = {m: {} for m in MODES}
        off: dict[str, int] = {}
        for label, dump in zip(labels, dumps, strict=False):
            if label in ("setup", "end"):
                continue
            config, mode = label.split("/")
            value = _totals(dump) / requests
            if config == "off":
                off[mode] = round(value)
            else:
                per[mode][config] = value
        return per, off
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure_servers(runs: int) -> list[dict[str, dict[str, float]]]:
    """The floor's and llmgw-router's counts as whole servers (server_cost.py), `runs` times."""
    import server_cost

    measured = []
    for _ in range(runs):
        work = Path(tempfile.mkdtemp(prefix="llmgw-server-cost-"))
        try:
            measured.append(server_cost.measure(work))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return measured


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--requests", type=int, default=50, help="measured requests per configuration and mode")
    ap.add_argument("--counts", type=Path, help="compare these recorded counts (JSON) instead of measuring")
    ap.add_argument("--save", type=Path, help="write the measured counts here (JSON)")
    ap.add_argument("--budgets", type=Path, default=BUDGETS)
    ap.add_argument("--write-budgets", action="store_true", help="write the budget file from this run")
    ap.add_argument("--no-floor", action="store_true", help="leave out the whole servers' counts and ratio")
    ap.add_argument("--floor-runs", type=int, default=1, help="measure the whole servers this many times")
    ap.add_argument("--inner", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner is not None:
        try:
            import uvloop

            labels = uvloop.run(inner(args.inner, args.requests))
        except ImportError:
            labels = asyncio.run(inner(args.inner, args.requests))
        (args.inner / "labels.json").write_text(json.dumps(labels))
        return
    began = time.monotonic()
    servers = None
    if args.counts is not None:
        recorded = json.loads(args.counts.read_text())
        stages, off, servers = recorded["stages"], recorded["off"], recorded.get("servers")
        if isinstance(servers, dict):  # recorded before --floor-runs: one run
            servers = [servers]
    else:
        per, off = measure(args.requests)
        stages = stage_counts(per)
        if not args.no_floor:
            servers = measure_servers(args.floor_runs)
    if args.save is not None:
        args.save.write_text(json.dumps({"stages": stages, "off": off, "servers": servers}, indent=2) + "\n")
    if args.write_budgets:
        args.budgets.write_text(json.dumps(budgets_for(stages), indent=2) + "\n")
    budgets = json.loads(args.budgets.read_text()) if args.budgets.exists() else {}
    text = report(stages, budgets, off)
    print(f"(measured in {time.monotonic() - began:.0f} s)" if args.counts is None else "(recorded counts)")
    if servers is not None:
        import server_cost

        # llmgw-router runs every check on, not the kept bodies: its in-process part is the stages up to them.
        totals = {m: sum(v for k, v in stages[m].items() if k != "bodies") for m in MODES}
        print("\n".join(server_cost.ratio_lines(servers, totals)))
    print(text)
    if not text.endswith(" over=0"):
        sys.exit(1)


if __name__ == "__main__":
    main()
