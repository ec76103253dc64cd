"""Measured capacity: the bench's conclusion (pure), the store's rows, and `llmgw bench --save` on a real sim
replica through a real controller, read back by `llmgw capacity` and the autoscaler."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
from support import serving, wait_for
from typer.testing import CliRunner

from llmgw.cli.data.bench_load import bench_prompt, prompt_tags
from llmgw.cli.main import app
from llmgw.controller.loops.autoscaler import capacity_of
from llmgw.core.capacity.bench import RequestSample, Step, conclude, percentile, split_probes, summarize_step
from llmgw.core.capacity.engine_model import fit_engine_model
from llmgw.store import Store
from llmgw.store.queries.capacity import CapacityRecord

from .helpers import Admin, Agents, Repo, cluster_yaml, settings_for, start


def _step(n: int, p99: float | None, tps: float, failed: int = 0) -> Step:
    return Step(n, 10, failed, 1.0, p99, p99, 5.0, 6.0, tps)


def test_capacity_is_the_last_step_under_the_objective() -> None:
    curve = [_step(1, 20.0, 50), _step(2, 30.0, 95), _step(4, 90.0, 180), _step(8, 400.0, 190)]
    m = conclude(curve, objective_ms=100.0, prompt_tokens=10)
    assert (m.concurrency, m.tokens_per_s) == (4, 180)
    assert m.prefill_ms_per_token == 2.0 and m.decode_ms_per_token == 5.0
    assert conclude(curve, objective_ms=10.0, prompt_tokens=10).concurrency is None


def test_without_an_objective_capacity_is_the_throughput_knee_and_failures_end_it() -> None:
    curve = [_step(1, 20.0, 50), _step(2, 30.0, 95), _step(4, 90.0, 100), _step(8, 400.0, 300)]
    assert conclude(curve, None, 10).concurrency == 2  # 4 added under a tenth
    failing = [_step(1, 20.0, 50), _step(2, 30.0, 95, failed=1)]
    assert conclude(failing, 100.0, 10).concurrency == 1


def test_prefill_per_token_is_the_ttft_growth_between_the_two_prompt_lengths() -> None:
    long = replace(_step(1, 20.0, 50), ttft_p50_ms=70.0, prompt_tokens=120.0)
    short = replace(_step(1, 20.0, 50), ttft_p50_ms=40.0, prompt_tokens=30.0)
    top = replace(_step(2, 30.0, 95), prompt_tokens=120.0)
    m = conclude([long, top, short], objective_ms=100.0, prompt_tokens=64)
    assert m.prefill_ms_per_token == pytest.approx(30.0 / 90.0, abs=1e-4)  # not 70 ms / 64 words
    assert m.concurrency == 2 and m.decode_ms_per_token == 5.0
    assert split_probes(m.curve) == ((long, top), short, None)
    # The short step is not a rung: a failing one does not end the ladder, nor is it the capacity.
    assert conclude([long, replace(short, failed=10)], 100.0, 64).concurrency == 1


def test_the_short_step_is_the_shortest_single_not_any_single_below_the_top() -> None:
    # Seen on llama.cpp: the counted prompt drifted from 590 tokens at concurrency 1 to 654 at 2, and the
    # long concurrency-1 step was read as the short one (the fit then took 885 ms / 64 words per token).
    long = replace(_step(1, 20.0, 50), ttft_p50_ms=3069.0, prompt_tokens=590.0)
    short = replace(_step(1, 20.0, 50), ttft_p50_ms=885.0, prompt_tokens=158.0)
    top = replace(_step(2, 30.0, 95), prompt_tokens=654.0)
    m = conclude([long, short, top], objective_ms=None, prompt_tokens=64)
    assert split_probes(m.curve) == ((long, top), short, None)
    assert m.prefill_ms_per_token == pytest.approx((3069 - 885) / (590 - 158), abs=1e-4)
    model = fit_engine_model({"curve": [asdict(s) for s in m.curve]}, 2, "gemma")
    assert model.prefill_ms_per_token == pytest.approx((3069 - 885) / (590 - 158))
    # Two concurrency-1 steps of about one length are one rung measured twice, not a short step.
    assert split_probes([long, replace(long, prompt_tokens=560.0)])[1] is None


def test_a_bench_that_names_its_probes_is_read_by_their_roles_and_its_prompt_cost_is_a_parabola() -> None:
    def cost(n: float) -> float:
        return 200.0 + 3.0 * n + 0.003 * n * n  # llama.cpp on CPU, roughly: attention's square

    main = replace(_step(1, 20.0, 50), ttft_p50_ms=cost(400), prompt_tokens=400.0)
    short = replace(_step(1, 20.0, 50), ttft_p50_ms=cost(100), prompt_tokens=100.0, role="short")
    long = replace(_step(1, 20.0, 50), ttft_p50_ms=cost(800), prompt_tokens=800.0, role="long")
    top = replace(_step(2, 30.0, 95), prompt_tokens=400.0)
    assert split_probes([main, short, long, top]) == ((main, top), short, long)
    # The long step fails past a model's context: a probe, it ends nothing and is left out of the fit.
    assert conclude([main, short, replace(long, failed=10), top], None, 64).concurrency == 2
    model = fit_engine_model({"curve": [asdict(s) for s in (main, short, long, top)]}, 2, "gemma")
    assert model.prefill_ms(1600) == pytest.approx(cost(1600))
    # Without the long step the line through two lengths is all there is.
    line = fit_engine_model({"curve": [asdict(s) for s in (main, short, top)]}, 2, "gemma")
    assert line.prefill_ms_per_token_sq == 0.0
    assert line.prefill_ms_per_token == pytest.approx((cost(400) - cost(100)) / 300)
    # A parabola that bends down (noise) falls back to the line through the outer two.
    bent = replace(long, ttft_p50_ms=cost(400) + 1.0)
    flat = fit_engine_model({"curve": [asdict(s) for s in (main, short, bent, top)]}, 2, "gemma")
    assert flat.prefill_ms_per_token_sq == 0.0
    assert flat.prefill_ms(800) == pytest.approx(cost(400) + 1.0)


def test_bench_prompts_are_distinct_across_steps_and_runs_and_keep_their_length() -> None:
    run_a, run_b = prompt_tags(), prompt_tags()
    tags = [next(run_a) for _ in range(2000)] + [next(run_b) for _ in range(10)]
    assert len(set(tags)) == len(tags)
    assert len({len(t) for t in tags}) == 1
    first_words = {bench_prompt(8, t).split()[0] for t in tags}
    assert len(first_words) == len(tags)  # no two prompts share even their first word
    assert len(bench_prompt(8, tags[0]).split()) == 8  # the length asked, in words


def test_a_step_summary_keeps_unknown_apart_from_zero() -> None:
    assert percentile([], 0.99) is None
    step = summarize_step(2, [RequestSample(0.1, (0.01, 0.02), 3), RequestSample(0.0, (), 0, ok=False)], 2.0)
    assert (step.requests, step.failed, step.ttft_p99_ms, step.tokens_per_s) == (2, 1, 100.0, 1.5)
    assert step.itl_mean_ms == 15.0
    assert step.prompt_tokens is None  # the engine counted nothing: unknown
    counted = summarize_step(1, [RequestSample(0.1, (), 1, prompt_tokens=10), RequestSample(0.1, (), 1)], 1.0)
    assert counted.prompt_tokens == 10.0
    empty = summarize_step(1, [], 1.0)
    assert empty.ttft_p99_ms is None and empty.itl_p50_ms is None


async def test_the_store_keeps_one_measurement_per_model_profile_and_gpu_class(controller_dsn: str) -> None:
    store = await Store.open(controller_dsn)
    try:
        rec = CapacityRecord("m", "sim", "", "sim", 1.0, 100.0, 4, 80.0, 0.1, 10.0, 1.5, "r1", [{"c": 1}])
        await store.save_capacity(rec)
        await store.save_capacity(
            CapacityRecord("m", "sim", "h100", "vllm", 2.0, None, None, None, None, None, None)
        )
        again = CapacityRecord("m", "sim", "", "sim", 3.0, 100.0, 6, 120.0, 0.1, 9.0, 1.2, "r2", [])
        await store.save_capacity(again)
        rows = await store.list_capacity("m")
        assert rows == [
            again,
            CapacityRecord("m", "sim", "h100", "vllm", 2.0, None, None, None, None, None, None),
        ]
        assert (await store.row_counts())["capacity"] == 2
    finally:
        await store.close()


MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: sim-bench}
spec:
  context_length: 4096
  slo: {ttft_p99_ms: 300}
  scaling: {min: 1, max: 2}
  profiles:
    - {name: sim, engine: sim, cpu_cores: 1, args: {max_concurrency: 2, decode_ms_per_token: 30}}
"""


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[tuple[Admin, Any]]:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "models/bench.yaml": MODEL})
    running, admin = await start(settings_for(tmp_path, repo.path))
    agents = Agents(tmp_path, tmp_path / "token")
    try:
        agents.start("n1", running.url.removeprefix("http://"))

        async def ready() -> bool:
            return bool(await admin.replicas("sim-bench", "ready"))

        await wait_for(ready, 60, "a ready sim-bench replica")
        yield admin, running
    finally:
        await running.stop()
        agents.cleanup()


async def test_bench_save_measures_the_replica_and_the_autoscaler_uses_it(
    fleet: tuple[Admin, Any], tmp_path: Path
) -> None:
    admin, running = fleet
    target = await admin.get("/api/v1/bench/sim-bench")
    assert target["objective_ms"] == 300 and target["engine"] == "sim" and target["api_key"]
    assert target["load_s"] is not None and target["load_s"] > 0
    before = await admin.get("/api/v1/capacity")
    assert before["capacity"] == [
        {
            "model": "sim-bench",
            "profile": "sim",
            "gpu_class": None,
            "source": "slots",
            "assumed_slots": 2,
            "measured": None,
        }
    ]

    argv = [
        "bench",
        "sim-bench",
        "--save",
        "--json",
        "--steps",
        "1,2,4",
        "--step-seconds",
        "0.6",
        "--repeats",
        "2",
        "--prompt-tokens",
        "8",
        "--max-tokens",
        "16",
        "--controller",
        running.url,
        "--token-file",
        str(tmp_path / "token"),
    ]
    result = await asyncio.to_thread(CliRunner().invoke, app, argv)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    # Two sequences run at once; at four, two wait a whole request (16 x 30 ms) for a slot: over 300 ms. The
    # objective leaves concurrency 2 as much room for a stall on a busy CI machine (one of 150 ms failed it).
    assert out["concurrency"] == 2, out["curve"]
    # The ladder and, after its concurrency 1, the short and the long step: 2 and 16 words, counted by the
    # engine, each named by its role.
    # Every pass's steps ride in the curve beside the pooled ones, each pass's marked by its `repeat`.
    steps = [(s["concurrency"], s["role"]) for s in out["curve"] if s["repeat"] is None]
    assert steps == [(1, "ladder"), (1, "short"), (1, "long"), (2, "ladder"), (4, "ladder")], out["curve"]
    for k in (1, 2):
        assert [(s["concurrency"], s["role"]) for s in out["curve"] if s["repeat"] == k] == steps
    assert out["drift"] is not None and not out["drift"]["drifted"], out["drift"]
    ladder_one, short, long = out["curve"][:3]
    assert 0 < short["prompt_tokens"] < ladder_one["prompt_tokens"] == out["curve"][-1]["prompt_tokens"]
    assert long["prompt_tokens"] > ladder_one["prompt_tokens"]
    assert out["decode_ms_per_token"] is not None and out["decode_ms_per_token"] > 20

    after = await admin.get("/api/v1/capacity")
    measured = after["capacity"][0]["measured"]
    assert after["capacity"][0]["source"] == "measured" and measured["concurrency"] == 2
    assert measured["objective_ms"] == 300 and len(measured["curve"]) == 15
    assert measured["curve"][1]["prompt_tokens"] == short["prompt_tokens"]  # stored, for the engine model
    assert capacity_of(running.controller.desired, running.controller.fleet, "sim-bench").per_replica == 2
    assert capacity_of(running.controller.desired, running.controller.fleet, "sim-bench").source == "measured"
    # The bench's load time is what routers hold requests for until this controller watches a load itself.
    assert running.controller.worker_state.model("sim-bench").bench_load_s == target["load_s"]
    events = (await admin.get("/api/v1/events"))["events"]
    assert any(e["kind"] == "capacity_measured" and "2 concurrent sequences" in e["message"] for e in events)

    listed = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["capacity", "--controller", running.url, "--token-file", str(tmp_path / "token")],
    )
    assert listed.exit_code == 0 and "measured" in listed.output, listed.output

    # `llmgw status` ends with the capacity at a glance: cores used by the replica, and the replica's
    # idleness unknown ("-"): no router has reported on it.
    shown = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["status", "--controller", running.url, "--token-file", str(tmp_path / "token")],
    )
    assert shown.exit_code == 0, shown.output
    rows = [[cell for cell in line.split() if cell not in ("│", "┃")] for line in shown.output.splitlines()]
    assert ["cpu", "cores", "4", "1", "3", "-", "1"] in rows, shown.output
    assert [target["replica"], "sim-bench", "-", "-"] in rows, shown.output
    assert "held at 1: no load report" in shown.output


async def test_bench_refuses_an_unknown_profile_and_says_which_exist(fleet: tuple[Admin, Any]) -> None:
    admin, running = fleet
    import aiohttp

    async with (
        aiohttp.ClientSession() as s,
        s.get(running.url + "/api/v1/bench/sim-bench?profile=gpu", headers=admin.headers) as r,
    ):
        assert r.status == 404
        assert "has no profile 'gpu' (its profiles: sim)" in (await r.json())["error"]["message"]


async def test_a_steps_workers_start_a_requests_time_apart_not_in_lockstep() -> None:
    """Started together, a closed loop's requests stay in lockstep and llama.cpp batches their prefills,
    which traffic on its own schedule seldom gets; the workers start `request_s / concurrency` apart."""
    from aiohttp import web

    from llmgw.cli.data.bench_load import _step

    arrivals: list[float] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        arrivals.append(time.monotonic())
        await asyncio.sleep(0.2)  # a request takes 0.2 s: a worker's next one comes no sooner
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n')
        await out.write(b"data: [DONE]\n\n")
        return out

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with serving(app) as port:
        target = {"model": "m", "base_url": f"http://127.0.0.1:{port}", "api_key": "k"}
        called = time.monotonic()
        step = await _step(target, 4, 0.6, 4, 1, prompt_tags(), request_s=0.4)
    assert step.requests == len(arrivals) >= 4 and step.failed == 0
    # Worker k sleeps k x 0.1 s before its first request (a sleep never ends early) and worker 0's second
    # request waits for its first answer (0.2 s). So, from the call, the second arrival can come no sooner than
    # 0.1 s and the fourth no sooner than 0.2 s; in lockstep all four would arrive at once. Only lower bounds
    # are checked: a busy machine delays arrivals, it never brings them forward.
    since_call = [round(t - called, 3) for t in sorted(arrivals)]
    assert since_call[1] >= 0.1 and since_call[3] >= 0.2, since_call
