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
from llmgw_router.decisions.replay import replay

from llmgw.cli.admin_client import AdminError
from llmgw.cli.repo import plan_simulate as sim
from llmgw.core.desired.catalog import Catalog
from llmgw.core.desired.repo import LoadedDocument, LoadResult
from llmgw.core.errors import LlmgwError
from llmgw.core.fleet.states import ACTIVE_STATES
from llmgw.core.fleet.views import LiveState
from llmgw.core.suggest.build import NOT_CHECKED, build_problem, fleet_limits
from llmgw.core.suggest.demand import HOUR_S, busiest, demand_by_hour, periods_of
from llmgw.core.suggest.render import Confirmed, Report, document, render_markdown, render_text
from llmgw.core.suggest.search import Candidate, Objective, Result, search
from llmgw.core.suggest.served import slo_rows
from llmgw.core.suggest.yaml_edit import ModelEdit, edit_models, unified
from llmgw.core.traffic.synthetic_trace import DEFAULT_MINUTES
from llmgw.core.traffic.trace import TracedRequest

__all__ = ["Asked", "ObjectiveChoice", "Suggested", "confirm", "run", "suggest"]

MIN_SEARCHED = 8  # the most replicas searched per model: at least this, or twice the largest scaling.max


@dataclass(frozen=True)
class Suggested:
    text: str
    markdown: str
    writes: Mapping[Path, str]  # file -> its new text (what --write saves)
    found: bool  # a configuration met every objective in the search and in the replay
    replayed: tuple[Confirmed, ...] = ()  # the suggestion and its runners-up, replayed for the busiest hour
    document: Mapping[str, object] | None = None  # what --post sends (llmgw.core.api.suggestions)


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


def confirm(
    catalog: Catalog,
    candidate: Candidate,
    requests: Sequence[TracedRequest],
    hour: int,
    seconds: float,
    models: sim.EngineModels,
    seed: int,
) -> Confirmed:
    """Replay `requests` (one hour's) against the candidate's replicas at that hour."""
    replicas = [
        (f"{o.model}-{o.choice.profile}-{i}", o.model, o.choice.profile)
        for o in candidate.options
        for i in range(o.replicas[hour])
    ]
    specs = {name: entry.spec for name, entry in catalog.models.items()}
    run = replay(sim.sim_fleet(catalog, replicas, specs, models), requests, seed=seed, duration_s=seconds)
    rows = slo_rows(catalog, sim.served(requests, run))
    by_model = {m: o for m, o in run.models.items() if o.requests}
    ttft = [o.ttft_p99_ms for o in by_model.values() if o.ttft_p99_ms is not None]
    tpot = [r.figure for r in rows if r.objective == "tpot_p99_ms" and r.figure is not None]
    available = [o.served / o.requests for o in by_model.values()]
    shares = [r.figure / r.target for r in rows if r.objective == "ttft_p99_ms" and r.figure is not None]
    missed = tuple(f"{r.model} ({r.project}) {r.objective} {r.figure}" for r in rows if r.met is not True)
    return Confirmed(
        candidate,
        max(ttft) if ttft else None,
        max(tpot) if tpot else None,
        min(available) if available else None,
        max(shares) if shares else None,
        not missed,
        missed,
    )


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
    replayed = [confirm(catalog, c, window, hour, seconds, models, seed) for c in top]
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
    posted = document(report, revision, found) if revision else None
    return Suggested(render_text(report), render_markdown(report), writes, found, tuple(replayed), posted)


# ------------------------------------------------------------------------------------------------ the command


class ObjectiveChoice(StrEnum):
    cost = "cost"
    latency = "latency"


SuggestOpt = Annotated[
    bool,
    typer.Option(
        "--suggest",
        help="Propose the cheapest fleet the repo allows that meets its models' objectives in replay (with "
        "--trace: that trace; else the synthetic one --simulate uses; docs/gitops.md, Suggested fleets)",
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
) -> None:
    """The `--suggest` section after the plan (stderr beside JSON, so stdout stays one document); `--write`
    saves the edited files and says which; `--post` sends the candidates to the controller."""
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


def _post(client: Any, found: Suggested, revision: str) -> None:
    """After the suggestion is printed (a PR comment keeps it even when the controller refuses it)."""
    try:
        client.post("/api/v1/suggestions", found.document)
    except AdminError as exc:
        typer.echo(f"error: --post: the controller did not keep the suggestion: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"--post: the console's plan page shows the suggestion for {revision}", err=True)
