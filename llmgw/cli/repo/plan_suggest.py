"""`llmgw plan --suggest [--trace T] [--objective cost|latency] [--write]`: the cheapest fleet the repo allows
that meets its models' objectives, as a change to review.

The search is pure (llmgw.core.suggest); this shell reads the trace (or makes the synthetic one `--simulate`
uses), fits the engine models from the stored measurements, replays the suggestion and its runners-up through
the router's own decisions (`llmgw_router.decisions.replay`) for the trace's busiest hour, and with `--write`
edits the Model files in place. docs/gitops.md, Suggested fleets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from llmgw_router.decisions.replay import Replay, replay

from llmgw.cli.admin_client import AdminError
from llmgw.cli.repo import plan_simulate as sim
from llmgw.cli.repo.plan_spread import BoundModels, PassModels
from llmgw.core.capacity.engine_spread import EngineSpread, fit_engine_spread
from llmgw.core.capacity.replay_spread import MODEL_BOUNDS, MODEL_ERROR_WORDS
from llmgw.core.capacity.spread import CONFIDENCE, Interval
from llmgw.core.desired.catalog import Catalog
from llmgw.core.desired.repo import LoadedDocument, LoadResult
from llmgw.core.errors import LlmgwError
from llmgw.core.fleet.states import ACTIVE_STATES
from llmgw.core.fleet.views import LiveState
from llmgw.core.suggest.build import NOT_CHECKED, build_problem, fleet_limits
from llmgw.core.suggest.demand import HOUR_S, busiest, demand_by_hour, periods_of
from llmgw.core.suggest.render import Confirmed, Report, document, render_markdown, render_text
from llmgw.core.suggest.search import Candidate, Objective, Result, search
from llmgw.core.suggest.served import SloRow, slo_rows
from llmgw.core.suggest.uncertainty import Judged, decided_at, interval_of, judge, no_spread_reason
from llmgw.core.suggest.yaml_edit import ModelEdit, edit_models, unified
from llmgw.core.traffic.synthetic_trace import DEFAULT_MINUTES
from llmgw.core.traffic.trace import TracedRequest

__all__ = [
    "Asked",
    "ObjectiveChoice",
    "Suggested",
    "confirm",
    "run",
    "spreads_of",
    "suggest",
    "undecided_exit",
]

MIN_SEARCHED = 8  # the most replicas searched per model: at least this, or twice the largest scaling.max


@dataclass(frozen=True)
class Suggested:
    text: str
    markdown: str
    writes: Mapping[Path, str]  # file -> its new text (what --write saves)
    found: bool  # a configuration met every objective in the search and in the replay (its whole interval)
    replayed: tuple[Confirmed, ...] = ()  # the suggestion and its runners-up, replayed for the busiest hour
    document: Mapping[str, object] | None = None  # what --post sends (llmgw.core.api.suggestions)
    undecided: bool = (
        False  # the suggestion's replay neither met nor missed an objective: its interval straddles it
    )


def _requests(
    catalog: Catalog, live: LiveState, trace: Path | None, models: sim.EngineModels, seed: int
) -> tuple[list[TracedRequest], float, str]:
    if trace is not None:
        read = sim.read_trace(trace)
        duration = read.header.duration_s or (read.requests[-1].t if read.requests else 1.0)
        return list(read.requests), duration, f"trace {trace}"
    current = [(r.id, r.model, r.profile) for r in live.replicas if r.state in ACTIVE_STATES]
    specs = {name: entry.spec for name, entry in catalog.models.items()}
    fleet = sim.sim_fleet(catalog, current, specs, models)
    requests, words = sim.synthetic(fleet, fleet, seed)
    return requests, DEFAULT_MINUTES * 60.0, words


def _window(requests: Sequence[TracedRequest], hour: int, periods: int) -> list[TracedRequest]:
    """The requests of one hour, their times from its start (all of a trace of one period)."""
    if periods == 1:
        return list(requests)
    start = hour * HOUR_S
    return [
        TracedRequest(
            r.t - start, r.model, r.project, r.prompt_tokens, r.completion_tokens, r.prefix, r.stream
        )
        for r in requests
        if start <= r.t < start + HOUR_S
    ]


Spreads = Mapping[tuple[str, str, int | None], EngineSpread]


def spreads_of(
    catalog: Catalog, measured: sim.Measurements
) -> tuple[dict[tuple[str, str, int | None], EngineSpread], int]:
    """Every profile's engine model with its spread over the bench's passes (`plan --simulate`'s,
    llmgw.core.capacity.engine_spread), and the most passes any has (below 2: no spread anywhere)."""
    out = {
        (name, p.name, p.slots): fit_engine_spread(measured.get((name, p.name)), p.slots, f"{name}/{p.name}")
        for name, entry in catalog.models.items()
        for p in entry.spec.profiles
    }
    return out, max((len(s.passes) for s in out.values()), default=0)


def _replay_rows(
    catalog: Catalog,
    replicas: list[tuple[str, str, str]],
    requests: Sequence[TracedRequest],
    seconds: float,
    models: sim.ModelSource,
    seed: int,
) -> tuple[Replay, list[SloRow]]:
    specs = {name: entry.spec for name, entry in catalog.models.items()}
    run = replay(sim.sim_fleet(catalog, replicas, specs, models), requests, seed=seed, duration_s=seconds)
    return run, slo_rows(catalog, sim.served(requests, run))


def _samples(requests: Sequence[TracedRequest], run: Replay) -> dict[tuple[str, str, str], list[float]]:
    """The pooled replay's TTFTs and TPOTs per model and project (and per model alone, project ""): what its
    percentiles are sampled from."""
    out: dict[tuple[str, str, str], list[float]] = {}
    for r, o in zip(requests, run.outcomes, strict=True):
        for project in (r.project, ""):
            if o.ttft_ms is not None:
                for objective in ("ttft_p90_ms", "ttft_p99_ms"):
                    out.setdefault((r.model, project, objective), []).append(o.ttft_ms)
            if o.tpot_ms is not None:
                out.setdefault((r.model, project, "tpot_p99_ms"), []).append(o.tpot_ms)
    return out


def _worst(judged: Sequence[Judged], objective: str) -> Interval | None:
    rows = [j.figure for j in judged if j.objective == objective and j.figure is not None]
    return max(rows, key=lambda i: i.mid, default=None)


def _decide(candidate: Candidate, hour: int, j: Judged) -> str:
    """What would make an undecided objective decided: more replicas, as the evaluator estimates them."""
    option = next(o for o in candidate.options if o.model == j.model)
    n = option.replicas[hour]
    more = decided_at(option.choice, hour, n, j)
    if more is None:
        return (
            f"no count of {option.choice.profile} replicas the search weighs decides it: a faster profile, "
            "or a bench with a narrower spread"
        )
    return f"~{more} replicas of {option.choice.profile} instead of {n} would decide it (the evaluator's estimate)"


def _mine(spreads: Spreads, candidate: Candidate) -> tuple[Spreads, int]:
    """The candidate's profiles' spreads, and the passes replayed (0 where none has two)."""
    passes = max((len(s.passes) for s in spreads.values()), default=0)
    used = {(o.model, o.choice.profile) for o in candidate.options}
    return {k: s for k, s in spreads.items() if (k[0], k[1]) in used}, passes if passes >= 2 else 0


def _p99s(model: str, runs: Sequence[Replay]) -> list[float | None]:
    return [r.models[model].ttft_p99_ms if model in r.models else None for r in runs]


def _worst_p99(
    run: Replay,
    passes: Sequence[Replay],
    samples: Mapping[tuple[str, str, str], Sequence[float]],
    known: Mapping[str, bool],
    bounds: Sequence[Replay],
) -> Interval | None:
    """The worst model's p99 TTFT (all its requests) with its interval."""
    p99 = [
        interval_of(
            o.ttft_p99_ms,
            _p99s(m, passes),
            samples.get((m, "", "ttft_p99_ms"), ()),
            0.99,
            known.get(m, False),
            _p99s(m, bounds),
        )
        for m, o in sorted(run.models.items())
        if o.requests
    ]
    return max((i for i in p99 if i is not None), key=lambda i: i.mid, default=None)


def _worst_share(judged: Sequence[Judged]) -> Interval | None:
    """The worst p99 TTFT objective's figure as a share of it, with its interval."""
    shares = [
        Interval(j.figure.low / j.target, j.figure.mid / j.target, j.figure.high / j.target, j.figure.n)
        for j in judged
        if j.objective == "ttft_p99_ms" and j.figure is not None and j.target > 0
    ]
    return max(shares, key=lambda i: i.mid, default=None)


def confirm(
    catalog: Catalog,
    candidate: Candidate,
    requests: Sequence[TracedRequest],
    hour: int,
    seconds: float,
    models: sim.EngineModels,
    seed: int,
    spreads: Spreads | None = None,
) -> Confirmed:
    """Replay `requests` (one hour's) against the candidate's replicas at that hour: with the pooled engine
    models, and where `spreads` has two passes or more once per bench pass's models and once at each bound of
    the model's own error (the intervals and verdicts of llmgw.core.suggest.uncertainty)."""
    replicas = [
        (f"{o.model}-{o.choice.profile}-{i}", o.model, o.choice.profile)
        for o in candidate.options
        for i in range(o.replicas[hour])
    ]
    run, rows = _replay_rows(catalog, replicas, requests, seconds, models, seed)
    mine, passes = _mine(spreads or {}, candidate)
    known = {model: passes > 0 and s.known and len(s.passes) == passes for (model, _, _), s in mine.items()}
    pass_runs = [
        _replay_rows(catalog, replicas, requests, seconds, PassModels(spreads or {}, k), seed)
        for k in range(passes)
    ]
    bound_runs = [
        _replay_rows(catalog, replicas, requests, seconds, BoundModels(spreads or {}, factor), seed)
        for factor in (MODEL_BOUNDS if passes else ())
    ]
    samples = _samples(requests, run)
    judged = judge(rows, [r for _, r in pass_runs], samples, known, [r for _, r in bound_runs])
    worst = _worst_p99(run, [p for p, _ in pass_runs], samples, known, [b for b, _ in bound_runs])
    available = [o.served / o.requests for o in run.models.values() if o.requests]
    share = _worst_share(judged)
    tpot = _worst(judged, "tpot_p99_ms")
    missed = tuple(j.words() for j in judged if j.state == "fail")
    undecided = tuple(j.words() for j in judged if j.state == "undecided")
    deciding = tuple(_decide(candidate, hour, j) for j in judged if j.state == "undecided")
    return Confirmed(
        candidate,
        worst.mid if worst is not None else None,
        tpot.mid if tpot is not None else None,
        min(available) if available else None,
        share.mid if share is not None else None,
        not missed and not undecided,
        missed,
        undecided,
        _worst(judged, "ttft_p90_ms"),
        worst,
        tpot,
        share,
        _spread_words(mine, passes),
        deciding,
    )


def _spread_words(mine: Spreads, passes: int) -> str:
    """Where the candidate's intervals come from, and each profile whose figures have none, and why."""
    gaps = []
    for (model, profile, _), spread in sorted(mine.items()):
        if passes and spread.known and len(spread.passes) < passes:
            gaps.append(f"{model}/{profile}: fewer bench passes than {passes}, its spread is not known")
        elif (why := no_spread_reason(spread)) is not None:
            gaps.append(f"{model}/{profile}: {why}")
    if passes == 0:
        return f"no spread measured, the figures are points: {'; '.join(gaps)}" if gaps else ""
    head = (
        f"{CONFIDENCE:.0%}, one replay per bench pass ({passes} passes), the trace's own sampling of its "
        f"percentiles and {MODEL_ERROR_WORDS}, around the pooled fit's replay"
    )
    return head + (f"; no interval for {'; '.join(gaps)}" if gaps else "")


def _changes(
    catalog: Catalog, documents: Sequence[LoadedDocument], best: Candidate | None
) -> tuple[dict[Path, str], list[str], str]:
    """(file -> new text, the changes in words, the unified diff) that make `best` the repo's."""
    if best is None:
        return {}, [], ""
    edits: dict[str, list[ModelEdit]] = {}
    words: list[str] = []
    for option in best.options:
        doc = next(d for d in documents if d.kind == "Model" and d.name == option.model)
        spec = catalog.models[option.model].spec
        first = spec.profiles[0].name if spec.profiles else None
        same = (spec.scaling.min, spec.scaling.max) == (option.min, option.max)
        if same and first == option.choice.profile:
            continue
        edits.setdefault(doc.file, []).append(
            ModelEdit(doc.index, option.model, option.choice.profile, option.min, option.max)
        )
        moved = "" if first == option.choice.profile else f"; profile {option.choice.profile} first"
        words.append(
            f"{doc.file}: {option.model} scaling {spec.scaling.min}..{spec.scaling.max} -> "
            f"{option.min}..{option.max}{moved}"
        )
    writes: dict[Path, str] = {}
    diff = ""
    for file, file_edits in sorted(edits.items()):
        before = Path(file).read_text(encoding="utf-8")
        after = edit_models(before, file_edits, file)
        writes[Path(file)] = after
        diff += unified(file, before, after)
    return writes, words, diff


def _most(catalog: Catalog) -> int:
    return max([MIN_SEARCHED, *(2 * e.spec.scaling.max for e in catalog.models.values())])


def suggest(
    catalog: Catalog,
    documents: Sequence[LoadedDocument],
    live: LiveState,
    trace: Path | None,
    measured: sim.Measurements,
    *,
    objective: Objective = "cost",
    seed: int = 0,
    revision: str = "",
) -> Suggested:
    """Search, replay the best three for the busiest hour, and say it all (see the module's words)."""
    models = sim.EngineModels(measured)
    requests, duration, source = _requests(catalog, live, trace, models, seed)
    periods = periods_of(requests, duration)
    limits, notes = fleet_limits(catalog, live)
    built = build_problem(
        catalog, demand_by_hour(requests, duration), periods, measured, limits, _most(catalog)
    )
    result: Result = search(built.problem, objective)
    hour = busiest(requests, duration)
    window = _window(requests, hour, periods)
    seconds = HOUR_S if periods > 1 else duration
    top = [c for c in (result.best, *result.runners_up) if c is not None]
    spreads, _ = spreads_of(catalog, measured)
    replayed = [confirm(catalog, c, window, hour, seconds, models, seed, spreads) for c in top]
    writes, changes, diff = _changes(catalog, documents, result.best)
    report = Report(
        result,
        objective,
        catalog.cluster.costs.currency,
        periods,
        hour,
        replayed,
        f"{source}; hour {hour}, {len(window)} requests, seed {seed}",
        built.provenance,
        [*notes, *built.unchecked, *NOT_CHECKED],
        changes,
        diff,
        limits.resources,
    )
    found = result.best is not None and bool(replayed) and replayed[0].met
    undecided = result.best is not None and bool(replayed) and replayed[0].verdict == "undecided"
    posted = document(report, revision, found) if revision else None
    return Suggested(
        render_text(report), render_markdown(report), writes, found, tuple(replayed), posted, undecided
    )


# ------------------------------------------------------------------------------------------------ the command


class ObjectiveChoice(StrEnum):
    cost = "cost"
    latency = "latency"


SuggestOpt = Annotated[
    bool,
    typer.Option(
        "--suggest",
        help="Propose the cheapest fleet the repo allows that meets its models' objectives in replay (with "
        "--trace: that trace; else the synthetic one --simulate uses; docs/gitops.md, Suggested fleets); exit 4 "
        "when the bench's spread leaves the suggestion undecided",
    ),
]
ObjectiveOpt = Annotated[
    ObjectiveChoice,
    typer.Option(
        "--objective",
        help="What --suggest minimizes: cost, or latency (the worst p99 TTFT; cost breaks ties)",
    ),
]
WriteOpt = Annotated[
    bool, typer.Option("--write", help="Edit the repo's Model files to the --suggest fleet (comments kept)")
]
PostOpt = Annotated[
    bool,
    typer.Option(
        "--post",
        help="With --suggest: send its candidates to the controller, whose console's Plan page draws them "
        "(a plan-scope token suffices: it changes nothing the controller does)",
    ),
]


@dataclass(frozen=True)
class Asked:
    """What the command line asked of --suggest."""

    objective: ObjectiveChoice = ObjectiveChoice.cost
    write: bool = False
    post: bool = False


def run(
    loaded: LoadResult,
    live: LiveState,
    trace: Path | None,
    capacity: Path | None,
    client: Any,
    output: str,
    asked: Asked,
) -> Suggested:
    """The `--suggest` section after the plan (stderr beside JSON, so stdout stays one document); `--write`
    saves the edited files and says which; `--post` sends the candidates to the controller. The caller exits
    4 when the suggestion is undecided (`undecided_exit`), after `--simulate` had its say."""
    assert loaded.repo is not None  # the plan refused an invalid repo before
    catalog, documents, revision = loaded.repo.catalog, loaded.documents, loaded.repo.revision or ""
    if asked.post and client is None:
        typer.echo("error: --post sends the suggestion to the controller: drop --state", err=True)
        raise typer.Exit(1)
    try:
        measured = sim.fetch_measurements(capacity, client)
        found = suggest(
            catalog, documents, live, trace, measured, objective=asked.objective.value, revision=revision
        )
        if asked.write:
            for path, text in found.writes.items():
                path.write_text(text, encoding="utf-8")
    except (AdminError, LlmgwError, OSError) as exc:
        typer.echo(f"error: --suggest: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(found.markdown if output == "markdown" else found.text, nl=False, err=output == "json")
    if asked.write:
        written = ", ".join(str(p) for p in found.writes) or "nothing (the repo already runs it)"
        typer.echo(f"--write: edited {written}", err=True)
    if asked.post:
        _post(client, found, revision)
    return found


def undecided_exit(found: Suggested | None) -> None:
    """Exit 4, as `plan --simulate` does for a verdict the measured spread leaves undecided, when the
    suggestion's replay neither meets nor misses an objective for certain."""
    if found is not None and found.undecided:
        typer.echo(
            "warning: --suggest: the suggestion's replay is undecided (its interval straddles an objective); "
            "exit 4",
            err=True,
        )
        raise typer.Exit(4)


def _post(client: Any, found: Suggested, revision: str) -> None:
    """After the suggestion is printed (a PR comment keeps it even when the controller refuses it)."""
    try:
        client.post("/api/v1/suggestions", found.document)
    except AdminError as exc:
        typer.echo(f"error: --post: the controller did not keep the suggestion: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"--post: the console's plan page shows the suggestion for {revision}", err=True)
