"""The console's pages: each reads the facts (llmgw.controller.console.facts, the store) and renders them."""

from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp import web

from llmgw.controller.api import logs as logs_admin
from llmgw.controller.api.audited import audit_json
from llmgw.controller.api.capacity import posted_suggestions
from llmgw.controller.api.request_lookup import usage_total_json
from llmgw.controller.console import facts, suggested
from llmgw.controller.console.web import CONSOLE, controller, render, session_of
from llmgw.controller.parts.hub import AgentError
from llmgw.controller.status import fleet as views
from llmgw.store import AuditEntry, StoreError, UsageBucket

log = logging.getLogger("llmgw.controller.console")
LOG_TAIL = 50
EVENTS_READ = 500
USAGE_WINDOW_S = 24 * 3600.0
CHART_BUCKET_S = 3600.0


def _not_found(request: web.Request, what: str) -> web.Response:
    return render(request, "error.html", 404, title="Not found", message=what)


async def overview(request: web.Request) -> web.StreamResponse:
    return render(request, "overview.html", **facts.overview(controller(request)))


async def nodes(request: web.Request) -> web.StreamResponse:
    q = request.query
    flt = facts.NodeFilter(
        state=q.get("state", ""),
        gpu_class=q.get("gpu_class", ""),
        label=q.get("label", ""),
        fabric=q.get("fabric", ""),
    )
    return render(
        request, "nodes.html", **facts.nodes_page(controller(request), flt, facts.page_number(q.get("page")))
    )


async def node(request: web.Request) -> web.StreamResponse:
    c, name = controller(request), request.match_info["node"]
    found = facts.node_detail(c, name)
    if found is None:
        return _not_found(request, f"no node {name!r} is connected, declared or being removed")
    logs = await _log_tail(request, logs_admin.node_target(c, name, None))
    return render(request, "node.html", **found, logs=logs)


async def models(request: web.Request) -> web.StreamResponse:
    q = request.query
    page = facts.models_page(controller(request), q.get("q", ""), facts.page_number(q.get("page")))
    return render(request, "models.html", **page)


async def replica(request: web.Request) -> web.StreamResponse:
    c, replica_id = controller(request), request.match_info["replica_id"]
    found = facts.replica_detail(c, replica_id)
    if found is None:
        return _not_found(request, f"no replica {replica_id!r} (it may have stopped; see Models)")
    logs = await _log_tail(request, logs_admin.replica_target(c, replica_id))
    health = views.model_health(c, found["replica"]["model"])
    return render(request, "replica.html", **found, logs=logs, demand=health["autoscale"])


async def _log_tail(request: web.Request, target: logs_admin.Target | None) -> dict[str, Any]:
    """The newest lines, when the session may read logs (they can carry prompts: admin scope, as the API)."""
    if not session_of(request).may("admin"):
        return {"refused": "log lines need an admin token of scope admin (they can carry what clients sent)"}
    if target is None:
        return {"refused": "nothing runs there to read lines from"}
    ask = logs_admin.Ask(since=None, grep=None, limit=LOG_TAIL, positions=None, follow=False)
    try:
        page = await logs_admin.read_page(controller(request), target, ask)
    except AgentError as exc:
        return {"refused": str(exc)}
    return {"lines": page["lines"], "unavailable": page["unavailable"], "missed": page["missed"]}


async def plan(request: web.Request) -> web.StreamResponse:
    c = controller(request)
    revision, text, made_at = await facts.plan_text(c, request.app[CONSOLE].plan)
    try:
        history = await c.store.list_revisions(limit=50)
        posted = await posted_suggestions(c.store)
        history_error = ""
    except StoreError as exc:
        history, posted, history_error = [], [], f"the store is unavailable: {exc}"
    made_s = round(c.clock() - made_at)
    status = views.status_json(c)  # the source's HEAD (seen), and whether it was refused
    return render(
        request,
        "plan.html",
        revision=revision,
        plan=text,
        made_s=made_s,
        history=history,
        history_error=history_error,
        seen=status["seen"],
        refused=status["refused"],
        sync=status["sync"],
        suggestion=posted[0] if posted else None,
        suggestion_chart=suggested.chart(posted[0]) if posted else None,
        suggestions_more=len(posted) - 1,
        chart_size=(suggested.WIDTH, suggested.HEIGHT),
    )


async def events(request: web.Request) -> web.StreamResponse:
    c = controller(request)
    kind, text = request.query.get("kind", "").strip(), request.query.get("q", "").strip().lower()
    rows: list[dict[str, Any]] = []
    error = ""
    try:
        for e in await c.store.recent_events(limit=EVENTS_READ):
            rows.append(
                {
                    "time": e.time,
                    "stream": "event",
                    "kind": e.kind,
                    "object": e.object,
                    "message": e.message,
                    "actor": "",
                }
            )
        for a in map(audit_json, await c.store.list_audit(None, None, EVENTS_READ)):
            rows.append(
                {
                    "time": a["time"],
                    "stream": "audit",
                    "kind": a["action"],
                    "object": a["object"],
                    "message": f"{a['outcome']} {a['reason'] or ''}".strip(),
                    "actor": a["actor"],
                }
            )
    except StoreError as exc:
        error = f"the store is unavailable ({exc}): showing what this process saw"
        rows = [r | {"stream": "event", "actor": ""} for r in list(c.fleet.events.items)[-EVENTS_READ:]]
    kinds = sorted({r["kind"] for r in rows})
    if kind:
        rows = [r for r in rows if r["kind"] == kind]
    if text:
        rows = [r for r in rows if text in f"{r['object']} {r['message']} {r['actor']}".lower()]
    rows.sort(key=lambda r: -r["time"])
    page = facts.paginate(rows, facts.page_number(request.query.get("page")))
    return render(request, "events.html", page=page, kinds=kinds, kind=kind, q=text, error=error)


async def tenants(request: web.Request) -> web.StreamResponse:
    c, session = controller(request), session_of(request)
    only = session.project  # a tenant sees its own project, nothing else
    d = c.desired
    tree = _tenant_tree(c, only)
    since = c.wall() - USAGE_WINDOW_S
    usage: dict[str, list[dict[str, Any]]] = {}
    error = ""
    try:
        keys = [k for k in await c.store.list_keys(only) if only in (None, k.project)]
        for by in ("project", "model", "key", "person"):
            totals = [usage_total_json(t, by) for t in await c.store.usage_totals(by, since=since)]
            usage[by] = totals if only is None else []
        buckets = await c.store.usage_per_bucket(since, c.wall() + CHART_BUCKET_S, CHART_BUCKET_S, only)
        if only is not None:
            usage["project"] = _own_totals(buckets, only)
    except StoreError as exc:
        keys, buckets, error = [], [], f"the store is unavailable: {exc}"
    now = c.wall()
    key_rows = [{"key": k, "state": k.state(now)} for k in keys]
    chart = _chart(buckets, since, now)
    return render(
        request,
        "tenants.html",
        tree=tree,
        usage=usage,
        keys=key_rows,
        chart=chart,
        error=error,
        only=only,
        applied=d is not None,
    )


def _tenant_tree(c: Any, only: str | None) -> list[dict[str, Any]]:
    d = c.desired
    if d is None:
        return []
    cat = d.catalog
    out = []
    for name in sorted(cat.projects):
        if only is not None and name != only:
            continue
        p = cat.projects[name]
        team = cat.teams.get(p.parent or "") if p.parent_kind == "Team" else None
        org_name = (
            team.parent if team is not None else (p.parent if p.parent_kind == "Organization" else None)
        )
        org = cat.organizations.get(org_name or "")
        out.append(
            {
                "project": name,
                "limits": cat.project_limits(name),
                "models": p.models,
                "team": team,
                "org": org,
            }
        )
    return out


def _own_totals(buckets: list[UsageBucket], project: str) -> list[dict[str, Any]]:
    mine = [b for b in buckets if b.project == project]
    return [
        {
            "group": project,
            "requests": sum(b.requests for b in mine),
            "errors": sum(b.errors for b in mine),
            "tokens_in": sum(b.tokens_in for b in mine),
            "tokens_out": sum(b.tokens_out for b in mine),
            "cost": sum(b.cost for b in mine),
            "avg_latency_ms": None,
        }
    ]


CHART_GROUPS = {"project": "(no project)", "model": "(no model)", "key": "(no key)"}


def _chart(rows: list[UsageBucket], since: float, now: float) -> dict[str, Any]:
    """Requests, tokens and cost per hour, by project, model and key: uPlot's columns (x first), summed by
    the store over every request of the window."""
    buckets = int((now - since) // CHART_BUCKET_S) + 1
    xs = [since + i * CHART_BUCKET_S for i in range(buckets)]
    groups: dict[str, dict[str, dict[str, list[float]]]] = {by: {} for by in CHART_GROUPS}
    for r in rows:
        i = min(buckets - 1, max(0, r.bucket))
        for by, absent in CHART_GROUPS.items():
            name = {"project": r.project, "model": r.model, "key": r.key_id}[by] or absent
            zero = {"requests": [0.0] * buckets, "tokens": [0.0] * buckets, "cost": [0.0] * buckets}
            series = groups[by].setdefault(name, zero)
            series["requests"][i] += r.requests
            series["tokens"][i] += r.tokens_in + r.tokens_out
            series["cost"][i] += r.cost
    return {"x": xs, "groups": groups, "generated": time.time()}


async def revoke_key(request: web.Request) -> web.StreamResponse:
    c, session = controller(request), session_of(request)
    key_id = request.match_info["key_id"]
    try:
        revoked = await c.store.revoke_key(key_id, c.wall())
    except StoreError as exc:
        return render(
            request, "error.html", 503, title="Not revoked", message=f"the store is unavailable: {exc}"
        )
    if not revoked:
        return _not_found(request, f"no active key with id {key_id!r}")
    await c.event("key_revoked", key_id, f"by {session.name} (console)")
    c.audit.record(
        AuditEntry(
            time=c.wall(),
            actor=session.name,
            action="key.revoke",
            object=key_id,
            outcome="accepted",
            reason="",
            actor_detail="",
            via="console",
        )
    )
    raise web.HTTPSeeOther("/ui/tenants#keys")
