"""The sim's decode runs on its own clock: token k is due k decode steps after prefill would end, so a host
whose CPU delays the sim's wake-ups does not make the simulated accelerator slower (benchmarks that share two
cores with routers and clients measure the policy, not the machine)."""

from __future__ import annotations

import asyncio
import time

import pytest
from llmgw_agent import sim as sim_module
from llmgw_agent.sim import SimEngine, Work
from llmgw_agent.sim_model import LatencyConfig


def _engine(step_ms: float) -> SimEngine:
    return SimEngine("m", LatencyConfig(decode_ms_per_token=step_ms), api_key=None)


async def _delays(
    monkeypatch: pytest.MonkeyPatch, engine: SimEngine, work: Work, tokens: int, stall_s: float
) -> list[float]:
    """The sleeps decode_one asks for, the clock moved on by `stall_s` before the first (a late wake-up)."""
    asked: list[float] = []
    real_sleep = asyncio.sleep

    async def record(delay: float) -> None:
        asked.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(sim_module.asyncio, "sleep", record)
    work.token_due = time.monotonic() - stall_s
    for _ in range(tokens):
        await engine.decode_one(work)
    return asked


async def test_a_late_wake_up_is_made_up_by_the_next_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, work = _engine(10.0), Work(["a"], 8)
    asked = await _delays(monkeypatch, engine, work, 8, stall_s=0.035)
    # 35 ms behind with 10 ms steps: the first three tokens are already due, the fourth is due in ~5 ms
    assert asked[:3] == [0.0, 0.0, 0.0]
    assert 0.0 < asked[3] <= 0.005
    assert engine.stats.generation_tokens == 8


async def test_on_time_tokens_wait_one_step_each_and_never_run_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, work = _engine(10.0), Work(["a"], 4)
    start = time.monotonic()
    asked = await _delays(monkeypatch, engine, work, 4, stall_s=0.0)
    # every sleep ends at its token's due time: anchor + k steps, whatever the time spent between calls
    assert all(d > 0 for d in asked)
    assert work.token_due == pytest.approx(start + 4 * 0.010, abs=0.002)
