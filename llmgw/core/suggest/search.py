"""The search: the best configuration of every model together that meets each model's objectives within the
fleet's limits (GPUs per class, CPU nodes per kind, quotas). Deterministic: no randomness, ties go to the
first in the problem's order (models by name, profiles in the repo's preference order, then min, then max).

- **exhaustive** (a space of at most EXHAUSTIVE_LIMIT configurations): every configuration is weighed, and the
  limits are checked for every one that would beat the best found with the same profiles.
- **heuristic** (a larger space): dominance pruning per model first. An option whose max exceeds the most any
  period needs runs the same replicas as one whose max is exactly that, and (for `cost`) a higher min only adds
  replicas: with an evaluator where more replicas never worsen a figure, what is pruned can never be the only
  best, so nothing is lost. Then a Pareto filter (cost, latency, what it holds per limit and period). When the
  product of what is left is at most EXHAUSTIVE_LIMIT, it is searched whole (exact); otherwise branch and
  bound over it (each model's options best first, the models with most to lose first, a branch cut when its
  bound cannot beat the best found), which stops after BRANCH_BUDGET nodes with the best found, then local
  search (single and paired swaps until none improves). The bound: the sum of each model's best option with
  the limits ignored is at most the optimum, so `cost / bound` is the most the answer can be above it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from llmgw.core.suggest.space import Limits, Option, Problem, space_size

__all__ = ["EXHAUSTIVE_LIMIT", "Candidate", "Objective", "Result", "search"]

EXHAUSTIVE_LIMIT = 5000
BRANCH_BUDGET = 200_000  # nodes the heuristic's branch and bound visits before it takes the best found
Objective = Literal["cost", "latency"]
Load = tuple[tuple[str, tuple[int, ...]], ...]  # (limit key, what it holds in each period)


@dataclass(frozen=True)
class Candidate:
    options: tuple[Option, ...]  # one per model, in the problem's model order
    lost: str | None = None  # why it is not the suggestion (None: it is)

    @property
    def cost_per_hour(self) -> float:
        return sum(o.cost_per_hour for o in self.options)

    @property
    def ttft_p99_ms(self) -> float:
        return max((o.ttft_p99_ms for o in self.options), default=0.0)

    @property
    def profiles(self) -> tuple[str, ...]:
        return tuple(o.choice.profile for o in self.options)


@dataclass(frozen=True)
class Result:
    method: Literal["exhaustive", "heuristic"]
    space: int  # configurations in the space
    evaluated: int  # configurations weighed
    best: Candidate | None
    runners_up: tuple[Candidate, ...]  # feasible, next best, with profiles unlike the best's
    rejected: tuple[tuple[str, str], ...]  # (an alternative, why it lost)
    bound: float | None  # the heuristic's lower bound on the optimum's cost (None: exhaustive)
    words: str


class _Limits:
    """Per option what it holds of each limited thing, and the joint check."""

    def __init__(self, limits: Limits) -> None:
        self.caps: dict[str, int] = dict(limits.resources)
        for (scope, cls), gpus in limits.quotas.items():
            self.caps[f"quota {scope} {cls}"] = gpus
        self.cache: dict[int, Load] = {}

    def load(self, option: Option) -> Load:
        found = self.cache.get(id(option))
        if found is None:
            c = option.choice
            keys = [c.resource, *(f"quota {s} {c.resource}" for s in c.scopes)]
            found = tuple((k, tuple(r * c.units for r in option.replicas)) for k in keys if k in self.caps)
            self.cache[id(option)] = found
        return found

    def violation(self, options: Iterable[Option]) -> str | None:
        totals: dict[str, list[int]] = {}
        for option in options:
            for key, held in self.load(option):
                row = totals.setdefault(key, [0] * len(held))
                for i, n in enumerate(held):
                    row[i] += n
        for key, row in totals.items():
            cap = self.caps[key]
            over = next((i for i, n in enumerate(row) if n > cap), None)
            if over is not None:
                if key.startswith("quota "):
                    return f"{key}: would hold {row[over]} at hour {over}, may hold {cap}"
                return f"{key}: needs {row[over]} at hour {over}, the fleet has {cap}"
        return None


def _key(options: Sequence[Option], objective: Objective) -> tuple[float, ...]:
    cost = round(sum(o.cost_per_hour for o in options), 9)
    if objective == "latency":
        return (round(max((o.latency for o in options), default=0.0), 9), cost)
    return (cost,)


@dataclass
class _Best:
    """The best feasible configuration per tuple of profiles, and the cheapest rejected one where it beat it."""

    feasible: dict[tuple[str, ...], tuple[tuple[float, ...], tuple[Option, ...]]]
    rejected: dict[tuple[str, ...], tuple[tuple[float, ...], tuple[Option, ...], str]]


def _weigh(combos: Iterable[tuple[Option, ...]], limits: _Limits, objective: Objective) -> tuple[_Best, int]:
    best = _Best({}, {})
    count = 0
    for combo in combos:
        count += 1
        if any(o.missed is not None for o in combo):
            continue
        key = _key(combo, objective)
        profiles = tuple(o.choice.profile for o in combo)
        held = best.feasible.get(profiles)
        if held is not None and held[0] <= key:
            continue
        why = limits.violation(combo)
        if why is None:
            best.feasible[profiles] = (key, combo)
        elif profiles not in best.rejected or best.rejected[profiles][0] > key:
            best.rejected[profiles] = (key, combo, why)
    return best, count


def _pruned(options: Sequence[Option], objective: Objective, limits: _Limits) -> list[Option]:
    """What dominance leaves of one model's options that meet its objectives (see the module's words)."""
    kept = []
    for o in options:
        peak = o.choice.peak
        if o.missed is not None or peak is None or o.max != max(o.min, peak):
            continue
        if objective == "cost" and o.min != 1:
            continue
        kept.append(o)
    return [o for o in kept if not any(_dominates(other, o, objective, limits) for other in kept)]


def _dominates(a: Option, b: Option, objective: Objective, limits: _Limits) -> bool:
    """Whether `a` is at least as good as `b` in everything and better in something (ties: the earlier)."""
    if a is b:
        return False
    ka, kb = _key([a], objective), _key([b], objective)
    if any(x > y for x, y in zip(ka, kb, strict=True)):
        return False
    la, lb = dict(limits.load(a)), dict(limits.load(b))
    for key in la.keys() | lb.keys():
        held_a, held_b = la.get(key), lb.get(key)
        if held_a is not None and (held_b is None or any(x > y for x, y in zip(held_a, held_b, strict=True))):
            return False
    return ka < kb or la != lb or a.label() < b.label()


def _bound(
    partial: Sequence[Option], rest: Sequence[Sequence[Option]], objective: Objective
) -> tuple[float, ...]:
    """The best key any completion of `partial` could have: each remaining model its best option alone."""
    cost = sum(o.cost_per_hour for o in partial) + sum(min(o.cost_per_hour for o in r) for r in rest)
    if objective == "latency":
        worst = max([*(o.latency for o in partial), *(min(o.latency for o in r) for r in rest)], default=0.0)
        return (round(worst, 9), round(cost, 9))
    return (round(cost, 9),)


def _branch(
    kept: Mapping[str, list[Option]], models: Sequence[str], limits: _Limits, objective: Objective
) -> tuple[tuple[Option, ...] | None, int]:
    """Depth first over the kept options, each model's best first (the models whose best and second best
    differ most go first), cutting every branch whose bound cannot beat the best found; it stops after
    BRANCH_BUDGET nodes with the best found so far. Returned in the problem's model order."""
    ranked = {m: sorted(kept[m], key=lambda o: _key([o], objective)) for m in models}

    def regret(m: str) -> float:
        keys = [_key([o], objective)[0] for o in ranked[m][:2]]
        return keys[1] - keys[0] if len(keys) == 2 else 0.0

    order = sorted(models, key=lambda m: (-regret(m), m))
    lists = [ranked[m] for m in order]
    best: list[tuple[tuple[float, ...], tuple[Option, ...]]] = []
    visited = 0

    def down(partial: list[Option]) -> None:
        nonlocal visited
        depth = len(partial)
        if depth == len(lists):
            best[:] = [(_key(partial, objective), tuple(partial))]
            return
        for option in lists[depth]:
            visited += 1
            if visited > BRANCH_BUDGET:
                return
            trial = [*partial, option]
            if best and _bound(trial, lists[depth + 1 :], objective) >= best[0][0]:
                if objective == "cost":
                    break  # the options are in cost order: the rest bound no lower
                continue  # by latency first, a later option may still bound lower on cost
            if limits.violation(trial) is None:
                down(trial)

    down([])
    if not best:
        return None, visited
    by_model = dict(zip(order, best[0][1], strict=True))
    return tuple(by_model[m] for m in models), visited


def _local(
    current: tuple[Option, ...],
    ranked: Mapping[str, list[Option]],
    models: Sequence[str],
    limits: _Limits,
    objective: Objective,
) -> tuple[tuple[Option, ...], int]:
    """Single swaps, then paired swaps, taking the first that improves, until none does."""
    weighed = 0
    improved = True
    while improved:
        improved = False
        moves: Iterable[tuple[tuple[int, Option], ...]] = itertools.chain(
            (((i, o),) for i, m in enumerate(models) for o in ranked[m]),
            (
                ((i, a), (j, b))
                for i, j in itertools.combinations(range(len(models)), 2)
                for a in ranked[models[i]]
                for b in ranked[models[j]]
            ),
        )
        for move in moves:
            trial = list(current)
            for at, option in move:
                trial[at] = option
            weighed += 1
            if _key(trial, objective) < _key(current, objective) and limits.violation(trial) is None:
                current, improved = tuple(trial), True
                break
    return current, weighed


def _alternatives(
    problem: Problem, best: tuple[Option, ...], limits: _Limits, objective: Objective
) -> list[tuple[str, str]]:
    """Per model, each other profile's best option put in place of the chosen one, and why it lost; and the
    chosen profile with one replica less at the peak."""
    out: list[tuple[str, str]] = []
    for at, model in enumerate(problem.models):
        mine = best[at]
        for profile in dict.fromkeys(o.choice.profile for o in problem.options[model]):
            options = [o for o in problem.options[model] if o.choice.profile == profile]
            if profile == mine.choice.profile:
                fewer = next((o for o in options if o.min == mine.min and o.max == mine.max - 1), None)
                if fewer is not None and fewer.missed is not None:
                    out.append((fewer.label(), f"objective missed: {fewer.missed}"))
                continue
            meeting = [o for o in options if o.missed is None]
            if not meeting:
                worst = max(options, key=lambda o: o.max)
                out.append((worst.label(), f"objective missed even at {worst.max}: {worst.missed}"))
                continue
            pick = min(meeting, key=lambda o: _key([o], objective))
            trial = [*best[:at], pick, *best[at + 1 :]]
            why = limits.violation(trial)
            if why is None:
                more = _key(trial, objective)[-1] - _key(best, objective)[-1]
                why = f"costs {more:+.2f} per hour" if objective == "cost" else "higher p99 TTFT or cost"
            out.append((pick.label(), why))
    return out


def _exact(
    problem: Problem, options: Mapping[str, Sequence[Option]], limits: _Limits, objective: Objective
) -> tuple[list[tuple[tuple[float, ...], tuple[Option, ...]]], list[tuple[str, str]], int]:
    combos = itertools.product(*(options[m] for m in problem.models))
    found, count = _weigh(combos, limits, objective)
    ranked = sorted(found.feasible.values(), key=lambda kv: kv[0])
    top = ranked[0][0] if ranked else None
    rejected = [
        (" + ".join(o.label() for o in combo), why)
        for key, combo, why in sorted(found.rejected.values(), key=lambda kcw: kcw[0])
        if top is None or key < top
    ]
    return ranked, rejected[:5], count


def search(problem: Problem, objective: Objective = "cost") -> Result:
    """The best configuration of every model together (see the module's words)."""
    limits = _Limits(problem.limits)
    size = space_size(problem)
    if size <= EXHAUSTIVE_LIMIT:
        ranked, rejected, count = _exact(problem, problem.options, limits, objective)
        return _result("exhaustive", problem, size, count, ranked, rejected, None, limits, objective, "")
    kept = {m: _pruned(problem.options[m], objective, limits) for m in problem.models}
    lower = sum(min((o.cost_per_hour for o in kept[m]), default=0.0) for m in problem.models)
    pruned = 1
    for m in problem.models:
        pruned *= len(kept[m])
    words = f"dominance pruning left {pruned} of {size} configurations; "
    if pruned <= EXHAUSTIVE_LIMIT:
        ranked, rejected, count = _exact(problem, kept, limits, objective)
        words += "searched whole (exact under the evaluator)"
        return _result("heuristic", problem, size, count, ranked, rejected, lower, limits, objective, words)
    chosen, count = _branch(kept, problem.models, limits, objective)
    if chosen is not None:
        sorted_kept = {m: sorted(kept[m], key=lambda o: _key([o], objective)) for m in problem.models}
        chosen, more = _local(chosen, sorted_kept, problem.models, limits, objective)
        count += more
    ranked = [] if chosen is None else [(_key(chosen, objective), chosen)]
    if chosen is not None:
        ranked += _neighbours(chosen, kept, problem.models, limits, objective)
    words += f"branch and bound over them ({count} weighed"
    words += ", stopped at its budget: the best found, then local search)" if count > BRANCH_BUDGET else ")"
    return _result("heuristic", problem, size, count, ranked, [], lower, limits, objective, words)


def _neighbours(
    chosen: tuple[Option, ...],
    kept: Mapping[str, list[Option]],
    models: Sequence[str],
    limits: _Limits,
    objective: Objective,
) -> list[tuple[tuple[float, ...], tuple[Option, ...]]]:
    """The feasible single swaps from the chosen configuration, best first: its runners-up."""
    out = []
    for at, model in enumerate(models):
        for option in kept[model]:
            if option.choice.profile == chosen[at].choice.profile:
                continue
            trial = (*chosen[:at], option, *chosen[at + 1 :])
            if limits.violation(trial) is None:
                out.append((_key(trial, objective), trial))
    return sorted(out, key=lambda kv: kv[0])


def _result(
    method: Literal["exhaustive", "heuristic"],
    problem: Problem,
    size: int,
    count: int,
    ranked: Sequence[tuple[tuple[float, ...], tuple[Option, ...]]],
    rejected: list[tuple[str, str]],
    bound: float | None,
    limits: _Limits,
    objective: Objective,
    words: str,
) -> Result:
    if not ranked:
        return Result(method, size, count, None, (), tuple(_why_none(problem) + rejected), bound, words)
    best = ranked[0][1]
    runners: list[Candidate] = []
    for key, combo in ranked[1:]:
        if len(runners) == 2:
            break
        more = key[-1] - ranked[0][0][-1]
        lost = f"costs {more:+.2f} per hour" if objective == "cost" else f"p99 TTFT/objective {key[0]:.2f}"
        runners.append(Candidate(combo, lost))
    rejected = list(dict.fromkeys([*rejected, *_alternatives(problem, best, limits, objective)]))
    return Result(method, size, count, Candidate(best), tuple(runners), tuple(rejected), bound, words)


def _why_none(problem: Problem) -> list[tuple[str, str]]:
    """Why nothing was found: the models no option of which meets their objectives, else the limits."""
    out = []
    for model in problem.models:
        options = problem.options[model]
        if options and all(o.missed is not None for o in options):
            widest = max(options, key=lambda o: o.max)
            out.append((model, f"no profile meets its objectives even at {widest.max}: {widest.missed}"))
    return out or [("every configuration", "meets the objectives only by breaking a limit")]
