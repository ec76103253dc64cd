"""Measured capacity in the admin API: where `llmgw bench` drives its load, what it saves, what is known.

- `GET /api/v1/bench/{model}[?profile=P]` (scope admin): a ready replica of the model to drive, with its engine
  key (so the run measures the replica, not the router in front of it), its profile, GPU class, engine, the
  model's objective and how long the replica took from its start to ready.
- `POST /api/v1/capacity` (scope admin): a run's conclusion, stored (replacing the one before for that model,
  profile and GPU class) and used by the autoscaler from then on.
- `GET /api/v1/capacity` (scope plan): per model and profile of the applied revision, what is measured and
  when, else what is assumed (slots), else unknown.
- `POST /api/v1/suggestions` (scope plan: a report to read, it changes nothing the controller does) and
  `GET /api/v1/suggestions`: the fleets `llmgw plan --suggest --post` proposed from those measurements, the
  newest per revision, kept in the store for the console's plan page (llmgw.store.queries.suggestions).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmgw.controller.api.guard import error, principal, require_parts
from llmgw.controller.loops.autoscaler import gpu_class_of, remember
from llmgw.controller.parts.fleet import EngineCaller
from llmgw.controller.status import fleet as views
from llmgw.core.api.suggestions import PostedSuggestion, SuggestionBody
from llmgw.core.fleet.autoscale import assumed_capacity
from llmgw.core.security import engine_key
from llmgw.store.queries.capacity import CapacityRecord
from llmgw.store.queries.suggestions import StoredSuggestion, SuggestionQueries

if TYPE_CHECKING:
    pass

__all__ = [
    "PARTS",
    "BenchResult",
    "bench_target",
    "capacity_list",
    "capacity_save",
    "posted_suggestions",
    "suggestion_save",
    "suggestions_list",
]

# What the handlers read: the fleet, its engines' keys, the store (app.py puts the Controller here).
PARTS: web.AppKey[EngineCaller] = web.AppKey("capacity_parts")

log = logging.getLogger("llmgw.controller.capacity")


async def bench_target(request: web.Request) -> web.Response:
    c = require_parts(request, "admin", PARTS)
    d = c.desired
    name = request.match_info["model"]
    entry = d.resolve(name) if d else None
    if d is None or entry is None:
        return error(404, f"model {name!r} is not in the applied revision")
    profile = request.query.get("profile")
    if profile is not None and entry.profile(profile) is None:
        names = ", ".join(p.name for p in entry.profiles) or "none"
        return error(404, f"model {entry.name} has no profile {profile!r} (its profiles: {names})")
    for rec in sorted(c.fleet.replicas.values(), key=lambda r: r.id):
        if rec.model != entry.name or (profile is not None and rec.profile != profile):
            continue
        shard = views.shard_status(c, rec)
        if views.replica_state(c, rec) != "ready" or shard is None or shard.base_url is None:
            continue
        slo = entry.spec.slo
        load_s = (
            None if rec.ready_since is None or rec.adopted else round(rec.ready_since - rec.created_at, 3)
        )
        return web.json_response(
            {
                "model": entry.name,
                "replica": rec.id,
                "profile": rec.profile,
                "gpu_class": gpu_class_of(c.desired, entry.name, rec.profile),
                "engine": shard.engine,
                "base_url": shard.base_url,
                "api_key": engine_key(c.cluster_secret().encode(), rec.id),
                "objective_ms": slo.ttft_p99_ms if slo is not None else None,
                "load_s": load_s,
            }
        )
    which = f"profile {profile} of " if profile else ""
    return error(
        409, f"no ready replica of {which}{entry.name} to measure (llmgw replicas --model {entry.name})"
    )


class _Step(BaseModel):
    model_config = ConfigDict(extra="forbid")
    concurrency: int = Field(ge=1)
    requests: int = Field(ge=0)
    failed: int = Field(ge=0)
    seconds: float = Field(ge=0)
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    tokens_per_s: float = Field(ge=0)
    prompt_tokens: float | None = Field(None, ge=0)  # what the engine counted; absent from older benches
    itl_mean_ms: float | None = Field(None, ge=0)  # absent from older benches
    role: Literal["ladder", "short", "long"] = "ladder"  # older benches name none
    repeat: int | None = Field(None, ge=1)  # one pass of `llmgw bench --repeats`; None: the passes pooled


class BenchResult(BaseModel):
    """A bench run's conclusion (`llmgw bench` posts it)."""

    model_config = ConfigDict(extra="forbid")
    model: str
    profile: str
    replica: str = ""
    engine: str
    objective_ms: float | None = Field(None, gt=0)
    concurrency: int | None = Field(None, ge=1)
    tokens_per_s: float | None = Field(None, ge=0)
    prefill_ms_per_token: float | None = Field(None, ge=0)
    decode_ms_per_token: float | None = Field(None, ge=0)
    load_s: float | None = Field(None, ge=0)
    curve: list[_Step] = Field(default_factory=list, max_length=64)


async def capacity_save(request: web.Request) -> web.Response:
    c = require_parts(request, "admin", PARTS)
    try:
        body = BenchResult.model_validate(await request.json())
    except (ValueError, ValidationError) as exc:
        return error(400, f"not a bench result: {exc}")
    d = c.desired
    entry = d.models.get(body.model) if d else None
    if entry is None or entry.profile(body.profile) is None:
        return error(
            404, f"model {body.model!r} with profile {body.profile!r} is not in the applied revision"
        )
    rec = CapacityRecord(
        model=body.model,
        profile=body.profile,
        gpu_class=gpu_class_of(c.desired, body.model, body.profile),
        engine=body.engine,
        measured_at=c.wall(),
        objective_ms=body.objective_ms,
        concurrency=body.concurrency,
        tokens_per_s=body.tokens_per_s,
        prefill_ms_per_token=body.prefill_ms_per_token,
        decode_ms_per_token=body.decode_ms_per_token,
        load_s=body.load_s,
        replica=body.replica,
        curve=[s.model_dump() for s in body.curve],
    )
    await c.store.save_capacity(rec)
    remember(c.fleet, rec)
    c.notify(f"capacity of {rec.model}/{rec.profile} measured")
    await c.event("capacity_measured", f"{rec.model}/{rec.profile}", _words(rec))
    return web.json_response({"saved": _record_json(rec)})


def _words(rec: CapacityRecord) -> str:
    where = f" on {rec.gpu_class}" if rec.gpu_class else ""
    slo = f"p99 TTFT under {rec.objective_ms:g} ms" if rec.objective_ms is not None else "no objective (knee)"
    if rec.concurrency is None:
        return f"{rec.engine}{where}: no concurrency met {slo}"
    return f"{rec.engine}{where}: {rec.concurrency} concurrent sequences, {rec.tokens_per_s or 0:.1f} tokens/s ({slo})"


def _record_json(rec: CapacityRecord) -> dict[str, Any]:
    return {
        "model": rec.model,
        "profile": rec.profile,
        "gpu_class": rec.gpu_class or None,
        "engine": rec.engine,
        "measured_at": rec.measured_at,
        "objective_ms": rec.objective_ms,
        "concurrency": rec.concurrency,
        "tokens_per_s": rec.tokens_per_s,
        "prefill_ms_per_token": rec.prefill_ms_per_token,
        "decode_ms_per_token": rec.decode_ms_per_token,
        "load_s": rec.load_s,
        "replica": rec.replica,
        "curve": rec.curve,
    }


async def capacity_list(request: web.Request) -> web.Response:
    c = require_parts(request, "plan", PARTS)
    d = c.desired
    stored = {(r.model, r.profile, r.gpu_class): r for r in await c.store.list_capacity()}
    out: list[dict[str, Any]] = []
    for name, entry in sorted((d.models if d else {}).items()):
        for p in entry.profiles:
            rec = stored.get((name, p.name, p.profile.gpu_class or ""))
            slots = assumed_capacity(p.profile.slots, p.profile.engine, p.profile.args)
            row: dict[str, Any] = {
                "model": name,
                "profile": p.name,
                "gpu_class": p.profile.gpu_class,
                "source": "measured" if rec is not None else "slots" if slots is not None else "unknown",
                "assumed_slots": slots,
                "measured": None if rec is None else _record_json(rec),
            }
            out.append(row)
    return web.json_response({"capacity": out})


async def posted_suggestions(store: SuggestionQueries) -> list[PostedSuggestion]:
    """The kept suggestions, the most recently posted first. One kept by an older llmgw whose shape this one
    no longer reads is left out, said once per read in the log, rather than failing the page."""
    found: list[PostedSuggestion] = []
    for kept in await store.list_suggestions():
        try:
            body = SuggestionBody.model_validate_json(kept.document)
        except ValidationError as exc:
            log.warning("the suggestion kept for revision %s no longer reads: %s", kept.revision, exc)
            continue
        found.append(PostedSuggestion(suggestion=body, posted_at=kept.posted_at, posted_by=kept.posted_by))
    return found


async def suggestion_save(request: web.Request) -> web.Response:
    c = require_parts(request, "plan", PARTS)
    try:
        body = SuggestionBody.model_validate(await request.json())
    except (ValueError, ValidationError) as exc:
        return error(400, f"not a suggestion of llmgw plan --suggest --post: {exc}")
    posted = PostedSuggestion(suggestion=body, posted_at=c.wall(), posted_by=principal(request).name)
    document = body.model_dump_json()
    await c.store.save_suggestion(
        StoredSuggestion(body.revision, posted.posted_at, posted.posted_by, document)
    )
    chosen = next((x for x in body.candidates if x.chosen), None)
    words = f"{chosen.configuration}, {chosen.cost_per_hour:.2f} {body.currency}/h" if chosen else "none met"
    await c.event("fleet_suggested", body.revision, f"by {posted.posted_by}: {words}")
    return web.json_response(posted.model_dump(mode="json"))


async def suggestions_list(request: web.Request) -> web.Response:
    c = require_parts(request, "plan", PARTS)
    found = await posted_suggestions(c.store)
    return web.json_response({"suggestions": [p.model_dump(mode="json") for p in found]})
