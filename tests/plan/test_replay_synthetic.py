"""The synthetic traces plan --simulate and the replay benchmarks use: rates and shapes as documented."""

from __future__ import annotations

import math
import random

from llmgw.core.traffic.synthetic_trace import Shape, diurnal, diurnal_rate, steady


def test_steady_arrivals_come_at_each_models_rate() -> None:
    header, requests = steady({"a": 5.0, "b": 1.0}, 2000.0, random.Random(3))
    assert header.duration_s == 2000.0 and header.source == "synthetic steady: a 5/s, b 1/s"
    assert [r.t for r in requests] == sorted(r.t for r in requests)
    for model, rate in (("a", 5.0), ("b", 1.0)):
        n = sum(1 for r in requests if r.model == model)
        expected = rate * 2000.0
        assert abs(n - expected) < 5 * math.sqrt(expected), (model, n)  # Poisson: 5 sigma


def test_the_shape_bounds_every_request() -> None:
    shape = Shape(prompt_tokens=100, completion_tokens=50, spread=0.5, project="x")
    _, requests = steady({"a": 10.0}, 100.0, random.Random(1), shape)
    assert {r.prompt_tokens for r in requests} == {100} and {r.project for r in requests} == {"x"}
    assert (
        min(r.completion_tokens for r in requests) >= 25 and max(r.completion_tokens for r in requests) <= 75
    )
    assert all(r.stream for r in requests)


def test_the_diurnal_rate_peaks_at_16_and_bottoms_at_4() -> None:
    assert diurnal_rate(16 * 3600.0, 10.0, 0.2) == 10.0
    assert math.isclose(diurnal_rate(4 * 3600.0, 10.0, 0.2), 2.0)
    _, requests = diurnal("m", 2.0, random.Random(5), hours=24.0, trough=0.2)
    hours = [0] * 24
    for r in requests:
        hours[int(r.t // 3600)] += 1
    assert hours.index(max(hours)) in (15, 16) and hours.index(min(hours)) in (3, 4)
    # The day's mean rate is the raised cosine's: (1 + trough) / 2 of the peak.
    assert abs(len(requests) - 0.6 * 2.0 * 86400.0) < 5 * math.sqrt(0.6 * 2.0 * 86400.0)
