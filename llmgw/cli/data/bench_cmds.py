"""`llmgw bench MODEL` and `llmgw capacity`: measure what one replica serves, and list what is known.

`bench` asks the controller for a ready replica of the model (`GET /api/v1/bench/MODEL`: its address and engine
key, so the run measures the replica and not the router in front of it), drives it with streamed chat requests
at stepped concurrency (1, 2, 4, ... by default), and prints per step the p50/p99 time to first token, the
inter-token latency and tokens/s, then two more steps at concurrency 1 with prompts a quarter and twice as long
(what the prefill costs per prompt token, and how much faster than the prompt it grows, in the tokens the engine
counts); then the capacity at the model's objective (`slo.ttft_p99_ms`, or
`--objective`) as `llmgw.core.capacity.bench.conclude` reads the curve. `--save` stores it (`POST /api/v1/capacity`) and
the autoscaler uses it from then on.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.table import Table

from llmgw.cli import output
from llmgw.cli.admin_client import AdminError
from llmgw.cli.reach import ControllerOpt, JsonOpt, TokenOpt, controller_client, fail

MAX_REPEATS = 6
MAX_CURVE = 64  # steps the controller stores per measurement (api/capacity.py)

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
    app.command("capacity")(capacity)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def bench(
    model: Annotated[str, typer.Argument(help="Model (or alias) whose replica to measure")],
    profile: Annotated[
        str | None, typer.Option("--profile", help="Measure a replica of this profile")
    ] = None,
    save: Annotated[bool, typer.Option("--save", help="Store the result for the autoscaler")] = False,
    steps: Annotated[
        str, typer.Option("--steps", help="Concurrency steps, comma-separated")
    ] = "1,2,4,8,16,32",
    step_time: Annotated[float, typer.Option("--step-seconds", help="How long each step runs")] = 10.0,
    objective: Annotated[
        float | None, typer.Option("--objective", help="p99 TTFT objective in ms (default: the model's slo)")
    ] = None,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", help="Prompt length, in words")] = 128,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Completion tokens per request")] = 64,
    repeats: Annotated[
        int,
        typer.Option(
            "--repeats",
            min=1,
            max=MAX_REPEATS,
            help="Passes over the steps: each parameter's interval is over the passes' fits",
        ),
    ] = 3,
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure one replica under stepped concurrency: TTFT and inter-token latency per step, and its capacity."""
    levels = _levels(steps, repeats)
    from llmgw.cli.data.bench_passes import bench_result, run_bench_passes, spread_lines

    client = controller_client(controller, token_file)
    query = f"?profile={profile}" if profile else ""
    target = client.get(f"/api/v1/bench/{model}{query}")
    goal = objective if objective is not None else target.get("objective_ms")
    run = asyncio.run(run_bench_passes(target, levels, step_time, prompt_tokens, max_tokens, goal, repeats))
    result = bench_result(target, goal, run)
    drifted = run.drift is not None and run.drift.drifted
    if save and not drifted:
        try:
            client.post("/api/v1/capacity", result)
        except AdminError as exc:  # the run cost its time already: print it, say the save failed
            output.console(stderr=True).print(f"[yellow]not saved:[/yellow] {exc}", highlight=False)
    if as_json:
        output.print_json({**result, "drift": None if run.drift is None else asdict(run.drift)})
    else:
        _print_bench(result, target, save and not drifted, fitted=not drifted)
        for line in spread_lines(result, run.drift):
            output.console().print(line, highlight=False)
    raise typer.Exit(1 if drifted else 0)  # a drifted engine: the run measured nothing to act on


def _levels(steps: str, repeats: int) -> list[int]:
    """--steps as the concurrencies to run, checked (with --repeats, against what the controller stores)."""
    try:
        levels = sorted({int(s) for s in steps.split(",") if s.strip()})
    except ValueError:
        fail(f"--steps {steps!r}: expected whole numbers separated by commas, e.g. 1,2,4,8")
    if not levels or levels[0] < 1:
        fail(f"--steps {steps!r}: every step is at least 1")
    if (len(levels) + 2) * (repeats + 1) > MAX_CURVE:
        fail(f"--steps {steps!r} with --repeats {repeats}: over {MAX_CURVE} steps to store; fewer of either")
    return levels


def _print_bench(result: dict[str, Any], target: dict[str, Any], saved: bool, fitted: bool = True) -> None:
    console = output.console()
    where = f" on {target['gpu_class']}" if target.get("gpu_class") else ""
    console.print(
        f"{result['model']}/{result['profile']} ({result['engine']}{where}), replica {result['replica']}",
        highlight=False,
    )
    table = Table(
        "CONCURRENCY",
        "PROMPT",
        "REQUESTS",
        "FAILED",
        "TTFT P50",
        "TTFT P99",
        "ITL P50",
        "ITL P99",
        "TOKENS/S",
    )
    for s in result["curve"]:
        if s.get("repeat") is not None:  # one pass's share: its spread is printed after the table
            continue
        probe = f" ({s['role']})" if s.get("role", "ladder") != "ladder" else ""
        table.add_row(
            str(s["concurrency"]) + probe,
            _ms(s.get("prompt_tokens")),
            str(s["requests"]),
            str(s["failed"]),
            _ms(s["ttft_p50_ms"]),
            _ms(s["ttft_p99_ms"]),
            _ms(s["itl_p50_ms"]),
            _ms(s["itl_p99_ms"]),
            f"{s['tokens_per_s']:.1f}",
        )
    console.print(table)
    if not fitted:
        return
    goal = result["objective_ms"]
    against = f"p99 TTFT under {goal:g} ms" if goal is not None else "no objective: the throughput knee"
    cap = result["concurrency"]
    words = (
        "not one sequence met it"
        if cap is None
        else f"{cap} concurrent, {result['tokens_per_s']:.1f} tokens/s"
    )
    console.print(f"capacity ({against}): {words}", highlight=False)
    console.print(
        f"prefill {_ms(result['prefill_ms_per_token'])} ms/token, decode "
        f"{_ms(result['decode_ms_per_token'])} ms/token, load {result['load_s'] or '-'} s"
        + (" (saved)" if saved else ""),
        highlight=False,
    )


def capacity(controller: ControllerOpt = None, token_file: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Per model and profile: the measured capacity and when, else what is assumed (slots), else unknown."""
    data = controller_client(controller, token_file).get("/api/v1/capacity")
    if as_json:
        output.print_json(data)
        return
    table = Table(
        "MODEL", "PROFILE", "GPU CLASS", "SOURCE", "CONCURRENT", "TOKENS/S", "OBJECTIVE", "MEASURED"
    )
    now = time.time()
    for row in data.get("capacity", []):
        m = row.get("measured")
        if m is not None:
            conc = "-" if m["concurrency"] is None else str(m["concurrency"])
            tps = "-" if m["tokens_per_s"] is None else f"{m['tokens_per_s']:.1f}"
            goal = "-" if m["objective_ms"] is None else f"{m['objective_ms']:g} ms"
            when = f"{int((now - m['measured_at']) // 60)}m ago"
        else:
            conc = "-" if row["assumed_slots"] is None else f"{row['assumed_slots']} (slots)"
            tps, goal, when = "-", "-", "never"
        table.add_row(
            row["model"], row["profile"], row["gpu_class"] or "cpu", row["source"], conc, tps, goal, when
        )
    output.console().print(table)
