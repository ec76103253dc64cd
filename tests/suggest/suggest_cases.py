"""Small search problems built straight from needs per hour (no engine model), and a brute force written apart
from the search: the reference the search is held to."""

from __future__ import annotations

import itertools
import random
from typing import Any

from llmgw.core.suggest.evaluate import Need
from llmgw.core.suggest.space import Choice, Limits, Option, Problem, options_for

CLASSES = ("a10", "l4", "h100")


def random_problem(seed: int, models: int, profiles: int, most: int, hours: int = 4) -> Problem:
    """Each model's profiles on random classes with random prices and needs per hour; tight GPU limits."""
    rng = random.Random(seed)
    options: dict[str, tuple[Option, ...]] = {}
    for m in range(models):
        choices = []
        for p in range(profiles):
            cls = CLASSES[(m + p) % len(CLASSES)]
            units = rng.choice((1, 1, 2))
            needs = tuple(
                Need(h, rng.randint(1, most) if rng.random() > 0.1 else None, ("short",))
                for h in range(hours)
            )
            price = round(rng.uniform(0.5, 4.0) * units, 2)
            choices.append(Choice(f"m{m}", f"p{p}", cls, units, price, "test", "test", needs, ("Team t",)))
        options[f"m{m}"] = options_for(choices, most, hours)
    caps = {cls: rng.randint(most, most * models) for cls in CLASSES}
    quotas = {("Team t", "h100"): rng.randint(most, 2 * most)}
    return Problem(options, Limits(caps, quotas), hours)


def brute_force(problem: Problem) -> float | None:
    """The cheapest configuration meeting every objective and limit, by trying them all."""
    best: float | None = None
    models = sorted(problem.options)
    for combo in itertools.product(*(problem.options[m] for m in models)):
        if any(o.missed is not None for o in combo):
            continue
        held: dict[str, list[int]] = {}
        for o in combo:
            keys = [o.choice.resource] + [f"quota {s} {o.choice.resource}" for s in o.choice.scopes]
            for key in keys:
                row = held.setdefault(key, [0] * problem.periods)
                for h, n in enumerate(o.replicas):
                    row[h] += n * o.choice.units
        caps = dict(problem.limits.resources)
        caps.update({f"quota {s} {c}": v for (s, c), v in problem.limits.quotas.items()})
        if any(max(row) > caps[key] for key, row in held.items() if key in caps):
            continue
        cost = sum(o.cost_per_hour for o in combo)
        best = cost if best is None or cost < best else best
    return best


def bench_row(
    model: str, profile: str, prefill_ms_per_token: float, itl_ms: float, slots: int
) -> dict[str, Any]:
    """A `llmgw capacity --json` row as `llmgw bench --save` would store it for an engine whose prefill costs
    `prefill_ms_per_token` and whose gap between tokens is `itl_ms` at any concurrency, prefills holding
    nothing up: two prompt lengths at concurrency 1, and a step at the slots that completed what they do."""
    completion = 33

    def step(concurrency: int, prompt: int) -> dict[str, Any]:
        prefill = prompt * prefill_ms_per_token
        cycle_ms = prefill + (completion - 1) * itl_ms
        requests = 24 * concurrency
        seconds = requests * cycle_ms / concurrency / 1000.0
        return {
            "concurrency": concurrency,
            "requests": requests,
            "failed": 0,
            "seconds": seconds,
            "ttft_p50_ms": prefill,
            "itl_p50_ms": itl_ms,
            "tokens_per_s": requests * completion / seconds,
            "prompt_tokens": float(prompt),
        }

    curve = [step(1, 128), step(1, 32), step(slots, 128)]
    measured = {
        "concurrency": slots,
        "prefill_ms_per_token": prefill_ms_per_token,
        "decode_ms_per_token": itl_ms,
        "curve": curve,
    }
    return {"model": model, "profile": profile, "source": "measured", "measured": measured}
