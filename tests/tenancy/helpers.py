"""Helpers for tenancy tests: router processes over a store, the snapshot they serve, the CLI, windows."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import openai
from faults.procs import RouterProc, start_router_proc
from router.helpers import SimProcess, endpoint
from typer.testing import CliRunner

from llmgw.adapters import keys
from llmgw.cli.main import app
from llmgw.core.tenancy.limits import MINUTE
from llmgw.store import Store

T = TypeVar("T")

FAST = "sim-chat"  # answers in a few ms
SLOW = "sim-slow"  # 50 ms per token: a stream with many tokens stays in flight until the test closes it
OTHER = "sim-other"  # a model some projects may not use
PRICE = 1_000_000.0  # per million tokens in and out: one unit of money per token, so costs are exact integers
BUDGET = 300.0


def tenants() -> dict[str, Any]:
    """One tree for every test; each test spends from its own project, so tests never share a pool."""
    return {
        "organizations": {"acme": {}, "pooled-org": {"limits": {"rpm": 6}}},
        "teams": {
            "research": {"organization": "acme"},
            "pooled": {"organization": "acme", "limits": {"rpm": 6}},
            "left": {"organization": "pooled-org"},
            "right": {"organization": "pooled-org"},
        },
        "projects": {
            "keys": {"team": "research", "models": [FAST]},
            "usage": {"team": "research", "models": ["sim-chat", "sim-slow"]},
            "rpm": {"team": "research", "limits": {"rpm": 5}},
            "tpm": {"team": "research", "limits": {"tpm": 400}},
            "conc": {"team": "research", "limits": {"concurrency": 2}},
            # tpm far above anything spent: only there so the answers carry x-ratelimit-*-tokens headers
            "budget": {
                "team": "research",
                "limits": {"budget": {"amount": BUDGET, "period": "30d"}, "tpm": 10**6},
            },
            "shared": {"team": "research", "limits": {"rpm": 10}},
            "team-a": {"team": "pooled"},
            "team-b": {"team": "pooled"},
            "org-a": {"team": "left"},
            "org-b": {"team": "right"},
        },
    }


def snapshot(fast: SimProcess, slow: SimProcess) -> dict[str, Any]:
    model = {"context_length": 8192, "capabilities": ["chat", "completions"], "simulated": True}
    prices = {"input_per_million": PRICE, "output_per_million": PRICE}
    return {
        "revision": "tenancy-1",
        "router": {"scrape_interval": "1s"},
        "models": {
            FAST: {**model, "prices": prices},
            SLOW: {**model, "prices": prices},
            OTHER: model,
        },
        "tenants": tenants(),
        "endpoints": [
            endpoint(fast, "fast-0"),
            endpoint(slow, "slow-0"),
            endpoint(fast, "other-0") | {"model": OTHER},
        ],
    }


# ---------------------------------------------------------------------------------------------- routers


def start_router(
    tmp: Path,
    snap: dict[str, Any],
    dsn: str,
    name: str = "router-1",
    *,
    clock_offset: float = 0.0,
    key_cache_ttl: float | None = None,
) -> RouterProc:
    """`llmgw-router --snapshot FILE --store DSN` as a process on fresh ports; waits until /health answers.
    `clock_offset` shifts its rate-limit windows (`window_start_offset`)."""
    snap_file = tmp / "snapshot.json"
    if not snap_file.exists():
        snap_file.write_text(json.dumps(snap))
    args = [
        "--snapshot",
        str(snap_file),
        "--store",
        dsn,
        "--router-id",
        name,
        "--limits-clock-offset",
        repr(clock_offset),
        "--state-dir",
        str(tmp / f"{name}-state"),
    ]
    if key_cache_ttl is not None:
        args += ["--key-cache-ttl", repr(key_cache_ttl)]
    return start_router_proc(tmp / f"{name}.log", args)


# ---------------------------------------------------------------------------------------------- CLI, keys

runner = CliRunner(env={"COLUMNS": "200"})


def cli(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, f"llmgw {' '.join(args)} failed ({result.exit_code}): {result.output}"
    return result.stdout


def create_key(dsn: str, project: str) -> str:
    """A key made as an operator makes one: `llmgw keys create --project P --json`."""
    made = json.loads(cli("keys", "create", "--project", project, "--name", "test", "--store", dsn, "--json"))
    assert made["key"].startswith("sk-llmgw-")
    return str(made["key"])


def create_expired_key(dsn: str, project: str) -> str:
    """Through the keys API: a key created a minute ago that lived ten seconds."""

    async def go() -> str:
        store = await Store.open(dsn)
        try:
            made = await keys.create_key(store, project, time.time() - 60, expires_in=10)
            return made.plaintext
        finally:
            await store.close()

    return asyncio.run(go())


def usage_rows(dsn: str, by: str = "project") -> dict[str, dict[str, Any]]:
    rows = json.loads(cli("usage", "--by", by, "--json", "--store", dsn))
    return {row[by]: row for row in rows}


# ---------------------------------------------------------------------------------------------- windows


def window_of(t: float) -> int:
    """The index of the fixed minute window holding `t`, as the limiter aligns them (to the epoch)."""
    return int(t // MINUTE)


def window_start_offset(lead_in: float = 1.0) -> float:
    """A `--limits-clock-offset` that puts a router's limiter `lead_in` seconds into the next minute window
    when it starts, so a test has a whole untouched window (59 s) without waiting for one in real time."""
    now = time.time()
    return (window_of(now) + 1) * MINUTE + lead_in - now


def in_one_window(offset: float, run: Callable[[], T]) -> T:
    """Run `run` and check it started and ended in one minute window of routers started with `offset`.

    Windows are fixed and aligned to the epoch: a run split by a window boundary would see two pools. With
    `window_start_offset` the run has the whole window; outlasting it is a failure to report, not to retry.
    """
    start = window_of(time.time() + offset)
    result = run()
    end = window_of(time.time() + offset)
    assert end == start, "the run outlasted the minute window it started in (59 s of headroom)"
    return result


def outcome(client: openai.OpenAI) -> str:
    """One short chat request: 'ok', or the 429's message."""
    try:
        client.chat.completions.create(
            model=FAST, messages=[{"role": "user", "content": "hello"}], max_tokens=1
        )
    except openai.RateLimitError as exc:
        return str(error_of(exc)["message"])
    return "ok"


def error_of(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.body
    assert isinstance(body, dict), f"not an OpenAI error body: {body!r}"
    err = body.get("error", body)
    assert isinstance(err, dict)
    return err
