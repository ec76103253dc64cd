"""The plan's renderings: `render_text` (Terraform's symbols and summary line), `render_json` (`to_dict`, stable
keys) and `render_markdown` (a pull-request comment: summary, table, details collapsed)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Literal

from llmgw.core.plan.impact import impact_dict, impact_lines, impact_markdown
from llmgw.core.plan.values import (
    UNKNOWN_DOCUMENTS,
    DocumentChange,
    FieldChange,
    Plan,
    ReplicaRestart,
    ReplicaStart,
    ReplicaStop,
    ScopeCapacity,
    SourceVerdict,
    StaleReplica,
)
from llmgw.core.weights.memory_fit import ProfileFit

__all__ = ["Format", "render", "render_json", "render_markdown", "render_text", "to_dict"]

Format = Literal["text", "json", "markdown"]


def render(plan: Plan, fmt: Format) -> str:
    if fmt == "json":
        return render_json(plan)
    if fmt == "markdown":
        return render_markdown(plan)
    return render_text(plan)


_SYMBOL = {"add": "+", "change": "~", "remove": "-"}


def _field_words(d: DocumentChange, f: FieldChange) -> str:
    """`old -> new` for a change; only the value that exists for an added or removed document."""
    if d.change == "add":
        return f.new
    if d.change == "remove":
        return f.old
    return f"{f.old} -> {f.new}"


def _where(nodes: tuple[str, ...]) -> str:
    return "+".join(nodes) if nodes else "(nowhere yet)"


def _lines(plan: Plan) -> list[str]:
    """The body shared by text and the markdown details: one line per change, Terraform's symbols."""
    out: list[str] = []
    if not plan.models_known:
        out += ["Models: the applied models are not in the live state; no model diff.", ""]
    if plan.models:
        out.append("Models:")
        for m in plan.models:
            symbol = {"add": "+", "change": "~", "remove": "-"}[m.change]
            out.append(f"  {symbol} model {m.model}" + (f" ({m.summary})" if m.summary else ""))
            out += [f"      ~ {f.path}: {f.old} -> {f.new}" for f in m.fields]
        out.append("")
    if not plan.documents_known:
        out += [f"Configuration: {UNKNOWN_DOCUMENTS}.", ""]
    if plan.documents:
        out.append("Configuration:")
        for d in plan.documents:
            out.append(f"  {_SYMBOL[d.change]} {d.kind} {d.name}")
            out += [f"      {_SYMBOL[d.change]} {f.path}: {_field_words(d, f)}" for f in d.fields]
        out.append("")
    out += _replica_lines(plan)
    if plan.adapters:
        out.append("Adapters (each replica of the base loads them at start):")
        for a in plan.adapters:
            on = ", ".join(a.replicas) or "no replica yet"
            out.append(f"  = {a.model}: {', '.join(a.adapters)} on {on}")
        out.append("")
    if plan.nodes:
        out.append("Nodes:")
        for n in plan.nodes:
            symbol = "+" if n.change == "bootstrap" else "-"
            out.append(f"  {symbol} {n.change} {n.node}: {n.reason}")
        out.append("")
    if plan.kept:
        out.append("Nodes left as they are:")
        out += [f"  = keep {n.node}: {n.reason}" for n in plan.kept]
        out.append("")
    if plan.unplaceable:
        out.append("Cannot be placed:")
        for u in plan.unplaceable:
            out.append(
                f"  ! {u.model}: {u.missing} replica{'s' * (u.missing != 1)}"
                + (f" ({u.problem})" if u.problem else "")
            )
            for profile, summary, rejected in u.profiles:
                out.append(f"      profile {profile} ({summary}):")
                out += [f"        {node}: {words}" for node, words in rejected]
        out.append("")
    out += _check_lines(plan)
    return out


def _check_lines(plan: Plan) -> list[str]:
    """Tenants' capacity, memory fit and weights sources: what the plan was checked against."""
    out: list[str] = []
    if plan.capacity:
        out.append("Capacity (guarantees and limits of the models' owners):")
        out += [f"  = {c.words()}" for c in plan.capacity]
        out.append("")
    if plan.fits:
        out.append("Memory fit (per GPU, from the model's headers):")
        for f in plan.fits:
            mark = {"fits": "=", "does not fit": "!", "not checked": "?"}[f.state]
            out.append(f"  {mark} {f.model}/{f.profile} on {f.gpu_class}: {f.words()}")
        out.append("")
    if plan.sources:
        out.append("Weights sources (new or changed):")
        out += [f"  {_source_line(v)}" for v in plan.sources]
        out += [f"      {p}" for v in plan.sources for p in v.problems[1:]]
        out.append("")
    return out


def _source_line(v: SourceVerdict) -> str:
    if v.state == "checked":
        return f"checked: {v.source} ({v.model}): {v.detail}"
    if v.state == "not checked":
        return f"not checked: {v.source} ({v.model}): {v.detail}"
    return f"! {v.where}: {v.model}: {v.source}: {v.detail}"


def _replica_lines(plan: Plan) -> list[str]:
    """Drift against the applied revision, then what happens to replicas."""
    out: list[str] = []
    if plan.drift:
        out.append("Drift (where the fleet differs from the applied revision):")
        out += [f"  ! {d.words}" for d in plan.drift]
        out.append("")
    if plan.starts or plan.restarts or plan.stops or plan.stale:
        out.append("Replicas:")
        for s in plan.starts:
            out.append(f"  + start {s.replica_id} ({s.model}/{s.profile}) on {_where(s.nodes)}: {s.reason}")
            out.append(f"      why there: {s.why_there}")
        for r in plan.restarts:
            new = f"; replacement on {_where(r.new_nodes)}" if r.new_nodes else "; replaced once room is free"
            out.append(
                f"  -/+ restart {r.replica_id} ({r.model}/{r.profile}) on {_where(r.nodes)}: {r.reason}{new}"
            )
        for sp in plan.stops:
            drain = " (drain first)" if sp.drain else ""
            out.append(
                f"  - stop {sp.replica_id} ({sp.model}/{sp.profile}) on {_where(sp.nodes)}: {sp.reason}{drain}"
            )
        for st in plan.stale:
            out.append(
                f"  ~ stale {st.replica_id} ({st.model}/{st.profile}) on {_where(st.nodes)}: {st.reason}"
            )
        out.append("")
    return out


def render_text(plan: Plan) -> str:
    head = f"llmgw plan: revision {plan.revision or '(working tree)'} against applied {plan.live_revision or '(none)'}"
    body = _lines(plan)
    tail = [plan.source_summary()] if plan.sources else []
    impact = impact_lines(plan.impact) if plan.impact is not None else []
    return "\n".join([head, "", *body, *impact, plan.summary(), *tail]) + "\n"


def to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as JSON values with stable keys (`render_json`, and what a saved plan's digest is over)."""
    return (
        {
            "revision": plan.revision,
            "live_revision": plan.live_revision,
            "live_state_hash": plan.live_state_hash,
            "has_changes": plan.has_changes,
            "summary": plan.summary(),
            "models_known": plan.models_known,
            "drift": [{"model": d.model, "replica": d.replica_id, "words": d.words} for d in plan.drift],
            "models": [
                {
                    "model": m.model,
                    "change": m.change,
                    "summary": m.summary,
                    "fields": [_field_dict(f) for f in m.fields],
                }
                for m in plan.models
            ],
            "replicas": _replicas_dict(plan),
            "documents_known": plan.documents_known,
            "documents": [
                {
                    "kind": d.kind,
                    "name": d.name,
                    "change": d.change,
                    "fields": [_field_dict(f) for f in d.fields],
                }
                for d in plan.documents
            ],
            "nodes": [{"node": n.node, "change": n.change, "reason": n.reason} for n in plan.nodes],
            "kept_nodes": [{"node": n.node, "change": n.change, "reason": n.reason} for n in plan.kept],
            "unplaceable": [
                {
                    "model": u.model,
                    "missing": u.missing,
                    "problem": u.problem,
                    "profiles": [
                        {"profile": p, "summary": s, "rejected": {node: words for node, words in rejected}}
                        for p, s, rejected in u.profiles
                    ],
                }
                for u in plan.unplaceable
            ],
        }
        | ({"sources": [_source_dict(v) for v in plan.sources]} if plan.sources else {})
        | _optional_dict(plan)
    )


def _optional_dict(plan: Plan) -> dict[str, Any]:
    """The keys a plan has only when they say something (plans without them keep their old JSON)."""
    adapters = [
        {"model": a.model, "adapters": list(a.adapters), "replicas": list(a.replicas)} for a in plan.adapters
    ]
    return (
        ({"memory_fit": [_fit_dict(f) for f in plan.fits]} if plan.fits else {})
        | ({"capacity": [_capacity_dict(c) for c in plan.capacity]} if plan.capacity else {})
        | ({"impact": impact_dict(plan.impact)} if plan.impact is not None else {})
        | ({"adapters": adapters} if plan.adapters else {})
    )


def _capacity_dict(c: ScopeCapacity) -> dict[str, Any]:
    return {
        "scope": c.scope,
        "class": c.cls,
        "guaranteed": c.guaranteed or None,
        "limit": c.limit or None,
        "holds": c.held,
        "holds_once_applied": c.after,
        "borrowed": c.borrowed or None,
        "taken_back": list(c.taken_back),
    }


def _fit_dict(f: ProfileFit) -> dict[str, Any]:
    numbers = (
        {}
        if f.fit is None
        else {
            "gpus": f.fit.gpus,
            "gpu_memory": f.fit.gpu_memory,
            "usable": f.fit.usable,
            "weights": f.fit.weights,
            "kv_cache": f.fit.kv_cache,
            "overhead": f.fit.overhead,
            "headroom": f.fit.headroom,
        }
    )
    return {
        "model": f.model,
        "profile": f.profile,
        "gpu_class": f.gpu_class,
        "state": f.state,
        "words": f.words(),
    } | numbers


def _source_dict(v: SourceVerdict) -> dict[str, Any]:
    return {
        "model": v.model,
        "source": v.source,
        "state": v.state,
        "detail": v.detail,
        "where": v.where,
        "problems": list(v.problems),
    }


def _field_dict(f: FieldChange) -> dict[str, Any]:
    return {"path": f.path, "old": f.old, "new": f.new}


def _replicas_dict(plan: Plan) -> dict[str, list[dict[str, Any]]]:
    def base(r: ReplicaStart | ReplicaRestart | ReplicaStop | StaleReplica) -> dict[str, Any]:
        return {
            "id": r.replica_id,
            "model": r.model,
            "profile": r.profile,
            "nodes": list(r.nodes),
            "reason": r.reason,
        }

    return {
        "start": [
            {**base(s), "gpus": [list(g) for g in s.gpus], "why_there": s.why_there} for s in plan.starts
        ],
        "restart": [{**base(r), "new_nodes": list(r.new_nodes)} for r in plan.restarts],
        "stop": [{**base(s), "drain": s.drain} for s in plan.stops],
        "stale": [base(s) for s in plan.stale],
    }


def render_json(plan: Plan) -> str:
    return json.dumps(to_dict(plan), indent=2, sort_keys=True) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(plan: Plan) -> str:
    """For a pull-request comment: the summary, one table row per change, the full text folded away."""
    out = ["### llmgw plan", "", f"**{plan.summary()}**", ""]
    if plan.sources:
        out += [f"**{plan.source_summary()}**", ""]
    rows = [*_change_rows(plan), *_action_rows(plan), *_finding_rows(plan)]
    if rows:
        out += ["| | change | where | why |", "| --- | --- | --- | --- |"]
        out += [f"| `{a}` | {_cell(b)} | {_cell(c)} | {_cell(d)} |" for a, b, c, d in rows]
        out.append("")
    if plan.impact is not None:
        out += impact_markdown(plan.impact)
    revision = plan.revision or "(working tree)"
    out += [
        "<details><summary>Details</summary>",
        "",
        "```text",
        render_text(replace(plan, impact=None)).rstrip("\n"),  # the Impact is above, once
        "```",
        "",
        "</details>",
        "",
        f"<sub>revision {revision}, live state {plan.live_state_hash[:12]}</sub>",
    ]
    return "\n".join(out) + "\n"


# A row of the pull-request table: symbol, change, where, why.
_Row = tuple[str, str, str, str]


def _change_rows(plan: Plan) -> list[_Row]:
    """What the repo changes: its documents and models, and where the fleet drifted from it."""
    rows: list[_Row] = []
    for d in plan.documents:
        detail = "; ".join(f"`{f.path}`: {_field_words(d, f)}" for f in d.fields) or d.change
        rows.append((_SYMBOL[d.change], f"{d.kind} `{d.name}`", "", detail))
    if not plan.documents_known:
        rows.append(("?", "Cluster, nodes, policies, tenants", "", UNKNOWN_DOCUMENTS))
    for m in plan.models:
        detail = m.summary or "; ".join(f"`{f.path}`: {f.old} -> {f.new}" for f in m.fields)
        rows.append((_SYMBOL[m.change], f"model `{m.model}`", "", detail))
    for dr in plan.drift:
        rows.append(("!", f"drift `{dr.replica_id or dr.model}`", "", dr.words))
    return rows


def _action_rows(plan: Plan) -> list[_Row]:
    """What applying does to replicas and nodes."""
    rows: list[_Row] = []
    for s in plan.starts:
        rows.append(("+", f"start `{s.replica_id}`", _where(s.nodes), f"{s.reason}; {s.why_there}"))
    for r in plan.restarts:
        rows.append(("-/+", f"restart `{r.replica_id}`", _where(r.nodes), r.reason))
    for sp in plan.stops:
        rows.append(
            (
                "-",
                f"stop `{sp.replica_id}`",
                _where(sp.nodes),
                sp.reason + (" (drain first)" if sp.drain else ""),
            )
        )
    for st in plan.stale:
        rows.append(("~", f"stale `{st.replica_id}`", _where(st.nodes), st.reason))
    for n in plan.nodes:
        rows.append(("+" if n.change == "bootstrap" else "-", f"{n.change} `{n.node}`", n.node, n.reason))
    for n in plan.kept:
        rows.append(("=", f"keep `{n.node}`", n.node, n.reason))
    return rows


def _finding_rows(plan: Plan) -> list[_Row]:
    """What cannot be placed or fit, and what was found checking the sources."""
    rows: list[_Row] = []
    for u in plan.unplaceable:
        rows.append(
            (
                "!",
                f"cannot place `{u.model}`",
                "",
                f"{u.missing} replica{'s' * (u.missing != 1)}; see details",
            )
        )
    for f in plan.misfits:
        rows.append(("!", f"`{f.model}/{f.profile}` does not fit {f.gpu_class}", "", f.words()))
    for c in plan.capacity:
        if c.borrowed or c.taken_back:
            rows.append(("=", f"capacity `{c.scope}` {c.cls}", "", c.words()))
    for v in plan.sources:
        symbol = {"checked": "=", "not checked": "?", "error": "!"}[v.state]
        rows.append((symbol, f"{v.state} source `{v.source}` of `{v.model}`", v.where, v.detail))
    return rows
