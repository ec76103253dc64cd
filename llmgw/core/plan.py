"""`llmgw plan`: the difference between the cluster repo and the live fleet, as a value, and its renderings.

`make_plan(...)` is pure. It diffs the desired models against the applied ones (which fields changed), and every
other document the controller reads — Cluster, Node, RoutingPolicy, Organization, Team, Project, a Model's labels —
against the applied revision's documents (`catalog_documents`, which the controller's live state carries), field
by field; runs the reconciler in plan mode over the live snapshot (replicas to start and where and why, to stop,
to restart for a stale profile), compares declared nodes with the nodes seen (bootstrap, drain), and explains
every model that cannot be placed, node by node. A secret reference is shown as what it names (`{file: name}`,
`{env: NAME}`): the plan never resolves one, so no secret value can reach it; a literal under a secret-looking
key (engine env, args) is shown as `(secret)`. "No changes" means the two revisions are equal in everything the
controller reads.
Renderers: `render_text` (Terraform's symbols and summary line), `render_json` (stable keys),
`render_markdown` (a pull-request comment: summary, table, details collapsed).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ValidationError

from llmgw.core.config.models import (
    ClusterSpec,
    ModelSpec,
    NodeSpec,
    OrganizationSpec,
    ProjectSpec,
    RoutingPolicySpec,
    SecretRef,
    TeamSpec,
)
from llmgw.core.fleet import (
    DesiredNode,
    LiveState,
    ModelView,
    NodeView,
    ReplicaView,
    ShardView,
    desired_nodes,
    model_views,
    undeclared_words,
)
from llmgw.core.placement import Placer
from llmgw.core.reconcile import RestartReplica, StartReplica, StopReplica, is_stale, reconcile

__all__ = [
    "DocumentChange",
    "FieldChange",
    "ModelChange",
    "NodeChange",
    "Plan",
    "ReplicaRestart",
    "ReplicaStart",
    "ReplicaStop",
    "StaleReplica",
    "Unplaceable",
    "catalog_documents",
    "exit_code",
    "make_plan",
    "plan_for_catalog",
    "render",
    "render_json",
    "render_markdown",
    "render_text",
]

if TYPE_CHECKING:
    from llmgw.core.catalog import Catalog

SECRET = "(secret)"
ABSENT = "(absent)"
# Keys whose values are masked even where the schema allows a literal (engine env, args).
_SECRET_WORDS = re.compile(r"(key|token|secret|password|passwd|credential)", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class FieldChange:
    path: str
    old: str
    new: str


@dataclass(frozen=True, slots=True)
class ModelChange:
    model: str
    change: Literal["add", "change", "remove"]
    fields: tuple[FieldChange, ...] = ()
    summary: str = ""


@dataclass(frozen=True, slots=True)
class DocumentChange:
    """A document of the repo other than a model's spec, changed field by field (`path`s start `spec.` or
    `metadata.labels.`). The controller applies these without touching a replica, and they are still changes."""

    kind: str
    name: str
    change: Literal["add", "change", "remove"]
    fields: tuple[FieldChange, ...] = ()


@dataclass(frozen=True, slots=True)
class ReplicaStart:
    replica_id: str
    model: str
    profile: str
    nodes: tuple[str, ...]
    gpus: tuple[tuple[int, ...], ...]
    reason: str  # why a replica is started
    why_there: str  # why on these nodes


@dataclass(frozen=True, slots=True)
class ReplicaStop:
    replica_id: str
    model: str
    profile: str
    nodes: tuple[str, ...]
    reason: str
    drain: bool


@dataclass(frozen=True, slots=True)
class ReplicaRestart:
    replica_id: str
    model: str
    profile: str
    nodes: tuple[str, ...]
    reason: str
    new_nodes: tuple[str, ...]  # where its replacement goes; () when it cannot be placed yet


@dataclass(frozen=True, slots=True)
class StaleReplica:
    """A stale-profile replica that is kept: shown so the cluster never reads as matching its repo."""

    replica_id: str
    model: str
    profile: str
    nodes: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class NodeChange:
    """`keep`: a node the repo does not declare that the controller leaves as it is — not a change, shown so
    nobody reads "no changes" as "that machine is out of the fleet"."""

    node: str
    change: Literal["bootstrap", "drain", "keep"]
    reason: str


@dataclass(frozen=True, slots=True)
class Unplaceable:
    model: str
    missing: int
    # profile -> (summary, node -> reasons in words)
    profiles: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...]
    problem: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    revision: str | None
    live_revision: str | None
    live_state_hash: str
    models_known: bool  # False: the applied models were not in the live state, so no model diff
    models: tuple[ModelChange, ...]
    starts: tuple[ReplicaStart, ...]
    restarts: tuple[ReplicaRestart, ...]
    stops: tuple[ReplicaStop, ...]
    stale: tuple[StaleReplica, ...]
    nodes: tuple[NodeChange, ...]
    unplaceable: tuple[Unplaceable, ...]
    kept: tuple[NodeChange, ...] = ()  # undeclared nodes left as they are (change "keep")
    documents: tuple[DocumentChange, ...] = ()
    # False: the repo's documents were to be compared but the live state does not carry the applied ones (a
    # state saved by an older controller), so nothing can say they are equal.
    documents_known: bool = True

    @property
    def has_changes(self) -> bool:
        """Terraform's exit code 2: something would change (or, documents unknown, may change)."""
        return bool(
            self.models
            or self.documents
            or not self.documents_known
            or self.starts
            or self.restarts
            or self.stops
            or self.nodes
        )

    def configuration_words(self) -> str:
        """ " Configuration: 1 model, 2 Projects to change." for what changes without a replica action."""
        counts: dict[str, int] = {}
        for m in self.models:
            if m.change == "change":
                counts["model"] = counts.get("model", 0) + 1
        for d in self.documents:
            counts[d.kind] = counts.get(d.kind, 0) + 1
        if not counts:
            return ""
        order = sorted(counts, key=lambda k: (_KIND_ORDER.get(k, len(_KIND_ORDER)), k))
        parts = [f"{counts[k]} {k}{'s' * (counts[k] != 1)}" for k in order]
        return f" Configuration: {', '.join(parts)} to change."

    def summary(self) -> str:
        n = len(self.kept)
        kept = (
            f" {n} node{'s' * (n != 1)} not declared in the repo left as {'they are' if n != 1 else 'it is'}."
        )
        if not self.has_changes and not self.unplaceable:
            if self.kept:
                return "No changes." + kept
            return "No changes. The fleet matches the cluster repo."
        text = (
            f"Plan: {len(self.starts)} to start, {len(self.restarts)} to restart, {len(self.stops)} to stop."
        )
        text += self.configuration_words()
        if not self.documents_known:
            text += f" {UNKNOWN_DOCUMENTS}."
        if self.unplaceable:
            n = len(self.unplaceable)
            text += f" {n} model{'s' * (n != 1)} cannot be placed."
        return text + (kept if self.kept else "")


# ---------------------------------------------------------------------------------------------- diff


def make_plan(
    desired: Mapping[str, ModelView],
    live: LiveState,
    *,
    nodes: Mapping[str, DesiredNode] | None = None,
    previous: Mapping[str, ModelSpec] | None = None,
    revision: str | None = None,
    documents: Mapping[str, Mapping[str, Any]] | None = None,
) -> Plan:
    """The plan from `live` to `desired`. `previous` (default: the live state's applied models) is what the
    model diff compares with; `nodes` are the declared nodes (None: not compared, live nodes used as they are);
    `documents` are the repo's documents as `catalog_documents` gives them, compared with the live state's
    (None: not compared)."""
    previous = previous if previous is not None else live.models
    node_views = _node_views(live, nodes)
    replicas = live.replica_views()
    decision = reconcile(desired, node_views, replicas, now=live.taken_at, rng=random.Random(0), mode="plan")
    by_id = {r.id: r for r in replicas}
    node_changes = _node_changes(live, nodes)
    starts, restarts = _starts_and_restarts(decision.of(StartReplica), decision.of(RestartReplica), by_id)
    stops = tuple(_stop(a, by_id[a.replica_id]) for a in decision.of(StopReplica))
    leaving = {r.replica_id for r in restarts} | {s.replica_id for s in stops}
    stale = tuple(
        StaleReplica(r.id, r.model, r.profile, r.nodes, _stale_words(r, desired[r.model]))
        for r in replicas
        if r.model in desired
        and r.id not in leaving
        and r.effective_state() not in ("stopping", "stopped")
        and is_stale(r, desired[r.model])
    )
    return Plan(
        revision=revision,
        live_revision=live.revision,
        live_state_hash=live.content_hash(),
        models_known=previous is not None,
        models=_model_changes(desired, previous) if previous is not None else (),
        starts=starts,
        restarts=restarts,
        stops=stops,
        stale=stale,
        nodes=tuple(n for n in node_changes if n.change != "keep"),
        unplaceable=_unplaceable(decision.unplaced, desired, node_views, replicas, decision.of(StartReplica)),
        kept=tuple(n for n in node_changes if n.change == "keep"),
        documents=(
            document_changes(live.documents, documents)
            if documents is not None and live.documents is not None
            else ()
        ),
        documents_known=documents is None or live.documents is not None,
    )


def plan_for_catalog(catalog: Catalog, live: LiveState) -> Plan:
    """The plan from `live` to a validated catalog (its models, declared nodes and other documents, its
    revision)."""
    return make_plan(
        model_views(catalog),
        live,
        nodes=desired_nodes(catalog),
        revision=catalog.revision,
        documents=catalog_documents(catalog),
    )


def exit_code(plan: Plan) -> int:
    """`--detailed-exitcode`, as Terraform: 0 nothing to change, 2 changes (1 is left for errors)."""
    return 2 if plan.has_changes else 0


def _node_views(live: LiveState, declared: Mapping[str, DesiredNode] | None) -> tuple[NodeView, ...]:
    """Live nodes with the repo's word on labels, fabric and cordon. An undeclared node takes nothing new
    unless the controller says it keeps such a node as it is (`LiveNode.if_undeclared`)."""
    views = []
    keep = {n.name for n in live.nodes if n.if_undeclared == "keep"}
    for node in live.node_views():
        if declared is None:
            views.append(node)
            continue
        d = declared.get(node.name)
        if d is None and node.name in keep:
            views.append(node)
        elif d is None:  # drained: its replicas are replaced elsewhere first, as the controller does
            views.append(replace(node, cordoned=True, cordon_reason="no longer declared", leaving=True))
        else:
            labels = {**node.labels, **d.labels}
            views.append(replace(node, labels=labels, fabric=d.fabric or node.fabric, cordoned=d.cordoned))
    return tuple(views)


def _starts_and_restarts(
    starts: list[StartReplica], restarts: list[RestartReplica], by_id: Mapping[str, ReplicaView]
) -> tuple[tuple[ReplicaStart, ...], tuple[ReplicaRestart, ...]]:
    replacement: dict[str, StartReplica] = {}
    plain: list[ReplicaStart] = []
    restarted = {r.replica_id for r in restarts}
    for s in starts:
        if s.replaces is not None and s.replaces in restarted:
            replacement[s.replaces] = s
            continue
        p = s.placement
        plain.append(
            ReplicaStart(
                p.replica_id, p.model, p.profile, p.nodes, tuple(x.gpus for x in p.shards), s.reason, p.why
            )
        )
    out = []
    for r in restarts:
        old = by_id[r.replica_id]
        new = replacement.get(r.replica_id)
        out.append(
            ReplicaRestart(
                r.replica_id, old.model, old.profile, old.nodes, r.reason, new.placement.nodes if new else ()
            )
        )
    return tuple(plain), tuple(out)


def _stop(a: StopReplica, r: ReplicaView) -> ReplicaStop:
    return ReplicaStop(a.replica_id, r.model, r.profile, r.nodes, a.reason, a.drain)


def _stale_words(r: ReplicaView, view: ModelView) -> str:
    if r.adopted:
        return "profile changed; kept (adopted replicas are never restarted)"
    if view.spec.restart_on_profile_change:
        return "profile changed; restarted once the model's other replicas are ready"
    return "profile changed; kept (restart_on_profile_change is off)"


def _node_changes(live: LiveState, declared: Mapping[str, DesiredNode] | None) -> tuple[NodeChange, ...]:
    if declared is None:
        return ()
    seen = {n.name: n for n in live.nodes}
    out = [NodeChange(n, "bootstrap", "declared, never seen") for n in sorted(declared) if n not in seen]
    for n in sorted(set(seen) - set(declared)):
        count = sum(1 for r in live.replicas if any(s.node == n for s in r.shards))
        action = seen[n].if_undeclared
        out.append(NodeChange(n, "keep" if action == "keep" else "drain", undeclared_words(action, count)))
    return tuple(out)


def _unplaceable(
    unplaced: Mapping[str, int],
    desired: Mapping[str, ModelView],
    nodes: Iterable[NodeView],
    replicas: Iterable[ReplicaView],
    starts: list[StartReplica],
) -> tuple[Unplaceable, ...]:
    if not unplaced:
        return ()
    # Explain against the fleet as it will be once the planned replicas are started.
    planned = [
        ReplicaView(
            s.placement.replica_id,
            s.placement.model,
            s.placement.profile,
            shards=tuple(ShardView(x.node, x.rank, x.gpus) for x in s.placement.shards),
        )
        for s in starts
    ]
    placer = Placer(desired, nodes, [*replicas, *planned])
    out = []
    for model, missing in sorted(unplaced.items()):
        exp = placer.explain(model)
        profiles = tuple(
            (p.profile, p.summary, tuple((v.node, v.words()) for v in p.verdicts if not v.accepted))
            for p in exp.profiles
        )
        out.append(Unplaceable(model, missing, profiles, exp.problem))
    return tuple(out)


def _model_changes(
    desired: Mapping[str, ModelView], previous: Mapping[str, ModelSpec]
) -> tuple[ModelChange, ...]:
    out = []
    for name in sorted(set(desired) | set(previous)):
        if name not in previous:
            out.append(ModelChange(name, "add", summary=_model_summary(desired[name].spec)))
        elif name not in desired:
            out.append(ModelChange(name, "remove", summary=_model_summary(previous[name])))
        else:
            fields = _field_changes(previous[name], desired[name].spec)
            if fields:
                out.append(ModelChange(name, "change", fields))
    return tuple(out)


def _model_summary(spec: ModelSpec) -> str:
    profiles = ", ".join(p.name for p in spec.profiles) or "none (provider)"
    return f"profiles: {profiles}; scaling {spec.scaling.min}..{spec.scaling.max}"


def _field_changes(old: ModelSpec, new: ModelSpec) -> tuple[FieldChange, ...]:
    return _field_diff(_flatten(old), _flatten(new))


def _field_diff(
    before: Mapping[str, tuple[str, bool]],
    after: Mapping[str, tuple[str, bool]],
    *,
    absent_old: bool = False,
    absent_new: bool = False,
) -> tuple[FieldChange, ...]:
    """The paths whose values differ, sorted; a secret-looking literal on either side is shown as `(secret)`.
    `absent_old`/`absent_new`: that side is a document that does not exist (its defaults were compared)."""
    changes = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a == b:
            continue
        secret = (a is not None and a[1]) or (b is not None and b[1])
        shown_old = ABSENT if a is None or absent_old else (SECRET if secret else a[0])
        shown_new = ABSENT if b is None or absent_new else (SECRET if secret else b[0])
        changes.append(FieldChange(path, shown_old, shown_new))
    return tuple(changes)


def secret_ref_words(ref: SecretRef) -> str:
    """`{file: name}` or `{env: NAME}`: what a reference names, never what it resolves to."""
    return f"{{file: {ref.file}}}" if ref.file is not None else f"{{env: {ref.env}}}"


def _flatten(value: Any, path: str = "") -> dict[str, tuple[str, bool]]:
    """path -> (value as JSON, is secret). Profiles are keyed by name so a reorder reads as one change. A secret
    reference is not secret: it is shown as what it names, so a reviewer sees a key moved to another file."""
    if isinstance(value, SecretRef):
        return {path: (secret_ref_words(value), False)}
    if isinstance(value, BaseModel):
        out: dict[str, tuple[str, bool]] = {}
        for name, info in type(value).model_fields.items():
            key = info.alias or name
            # getattr's default: `model_construct()` leaves required fields unset (the defaults of a kind).
            out.update(_flatten(getattr(value, name, None), f"{path}.{key}" if path else key))
        return out
    if isinstance(value, dict):
        out = {}
        for k in sorted(value):
            sub = _flatten(value[k], f"{path}.{k}")
            if _SECRET_WORDS.search(str(k)) and not isinstance(value[k], SecretRef):
                sub = {p: (v, True) for p, (v, _) in sub.items()}
            out.update(sub)
        return out
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, BaseModel) and hasattr(v, "name") for v in value)
    ):
        out = {}
        for v in value:
            out.update(_flatten(v, f"{path}[{v.name}]"))
        if [v.name for v in value] != sorted(v.name for v in value):
            out[f"{path}.order"] = (json.dumps([v.name for v in value]), False)
        return out
    if isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
        return {path: (json.dumps([v.model_dump(mode="json") for v in value], sort_keys=True), False)}
    return {path: (json.dumps(value, sort_keys=True, default=str), False)}


# ---------------------------------------------------------------------------------------------- documents

UNKNOWN_DOCUMENTS = (
    "The applied Cluster, nodes, routing policies and tenants are not in the live state (saved by an older "
    "controller?): they were not compared"
)
# The order a reviewer reads a plan in: cluster-wide first, tenants from the top, models last.
_KIND_ORDER = {
    k: i
    for i, k in enumerate(
        ("Cluster", "Node", "RoutingPolicy", "Organization", "Team", "Project", "Model", "model")
    )
}
_SPECS: dict[str, type[BaseModel]] = {
    "Cluster": ClusterSpec,
    "Node": NodeSpec,
    "Model": ModelSpec,
    "RoutingPolicy": RoutingPolicySpec,
    "Organization": OrganizationSpec,
    "Team": TeamSpec,
    "Project": ProjectSpec,
}


def catalog_documents(catalog: Catalog) -> dict[str, dict[str, Any]]:
    """Every document of a validated catalog, as canonical JSON keyed `Kind/name`: what the controller reads of
    it (spec with its defaults filled in, labels), so two revisions the controller treats alike compare equal.
    The controller's live state carries these for its applied revision; `plan` diffs them with the repo's."""
    out: dict[str, dict[str, Any]] = {}

    def put(kind: str, name: str, spec: BaseModel, labels: Mapping[str, str]) -> None:
        out[f"{kind}/{name}"] = {
            "kind": kind,
            "name": name,
            "labels": dict(sorted(labels.items())),
            "spec": spec.model_dump(mode="json", by_alias=True),
        }

    put("Cluster", catalog.cluster_name or "default", catalog.cluster, {})
    for name, node in catalog.nodes.items():
        put("Node", name, node.spec, node.labels)
    for name, policy in catalog.policies.items():
        put("RoutingPolicy", name, policy, {})
    for name, model in catalog.models.items():
        put("Model", name, model.spec, model.labels)
    for tenants in (catalog.organizations, catalog.teams, catalog.projects):
        for name, t in tenants.items():
            models = list(t.models) if t.models is not None else None
            spec: BaseModel
            if t.kind == "Organization":
                spec = OrganizationSpec(models=models, limits=t.limits)
            elif t.kind == "Team":
                spec = TeamSpec(organization=t.parent or "", models=models, limits=t.limits)
            else:
                team = t.parent if t.parent_kind == "Team" else None
                org = t.parent if t.parent_kind == "Organization" else None
                spec = ProjectSpec(team=team, organization=org, models=models, limits=t.limits)
            put(t.kind, name, spec, t.labels)
    return dict(sorted(out.items()))


def document_changes(
    applied: Mapping[str, Mapping[str, Any]], desired: Mapping[str, Mapping[str, Any]]
) -> tuple[DocumentChange, ...]:
    """Per-document field changes from the applied documents to the desired ones, sorted by kind and name.
    A Model's spec is the model diff's (`ModelChange`); here only its labels, and no add/remove of models."""
    out = []
    for key in set(applied) | set(desired):
        old, new = applied.get(key), desired.get(key)
        doc = new if new is not None else old
        assert doc is not None
        kind, name = str(doc.get("kind")), str(doc.get("name"))
        model = kind == "Model"
        if model and (old is None or new is None):
            continue
        before = _document_fields(kind, old, with_spec=not model) if old is not None else None
        after = _document_fields(kind, new, with_spec=not model) if new is not None else None
        if before is None:
            fields = _field_diff(_default_fields(kind), after or {}, absent_old=True)
            out.append(DocumentChange(kind, name, "add", fields))
        elif after is None:
            fields = _field_diff(before, _default_fields(kind), absent_new=True)
            out.append(DocumentChange(kind, name, "remove", fields))
        elif fields := _field_diff(before, after):
            out.append(DocumentChange(kind, name, "change", fields))
    return tuple(sorted(out, key=lambda d: (_KIND_ORDER.get(d.kind, len(_KIND_ORDER)), d.kind, d.name)))


def _document_fields(kind: str, doc: Mapping[str, Any], *, with_spec: bool) -> dict[str, tuple[str, bool]]:
    labels = doc.get("labels") or {}
    out = {f"metadata.labels.{k}": (json.dumps(labels[k]), False) for k in sorted(labels)}
    if not with_spec:
        return out
    spec = doc.get("spec") or {}
    spec_type = _SPECS.get(kind)
    try:
        if spec_type is None:
            raise ValueError(kind)
        out.update(_flatten(spec_type.model_validate(spec), "spec"))
    except (ValidationError, ValueError):
        # Written by another version of llmgw: compared as JSON, every value under a secret-looking key masked.
        out.update(_flatten_json(spec, "spec", secret=False))
    return out


def _default_fields(kind: str) -> dict[str, tuple[str, bool]]:
    """The fields a kind has before anything is written: an added or removed document lists what differs."""
    spec_type = _SPECS.get(kind)
    return {} if spec_type is None else _flatten(spec_type.model_construct(), "spec")


def _flatten_json(value: Any, path: str, *, secret: bool) -> dict[str, tuple[str, bool]]:
    if isinstance(value, dict) and value:
        out: dict[str, tuple[str, bool]] = {}
        for k in sorted(value):
            out.update(_flatten_json(value[k], f"{path}.{k}", secret=secret or bool(_SECRET_WORDS.search(k))))
        return out
    return {path: (json.dumps(value, sort_keys=True), secret)}


# ---------------------------------------------------------------------------------------------- rendering

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
    return out


def render_text(plan: Plan) -> str:
    head = f"llmgw plan: revision {plan.revision or '(working tree)'} against applied {plan.live_revision or '(none)'}"
    body = _lines(plan)
    return "\n".join([head, "", *body, plan.summary()]) + "\n"


def to_dict(plan: Plan) -> dict[str, Any]:
    return {
        "revision": plan.revision,
        "live_revision": plan.live_revision,
        "live_state_hash": plan.live_state_hash,
        "has_changes": plan.has_changes,
        "summary": plan.summary(),
        "models_known": plan.models_known,
        "models": [
            {
                "model": m.model,
                "change": m.change,
                "summary": m.summary,
                "fields": [{"path": f.path, "old": f.old, "new": f.new} for f in m.fields],
            }
            for m in plan.models
        ],
        "replicas": {
            "start": [
                {
                    "id": s.replica_id,
                    "model": s.model,
                    "profile": s.profile,
                    "nodes": list(s.nodes),
                    "gpus": [list(g) for g in s.gpus],
                    "reason": s.reason,
                    "why_there": s.why_there,
                }
                for s in plan.starts
            ],
            "restart": [
                {
                    "id": r.replica_id,
                    "model": r.model,
                    "profile": r.profile,
                    "nodes": list(r.nodes),
                    "reason": r.reason,
                    "new_nodes": list(r.new_nodes),
                }
                for r in plan.restarts
            ],
            "stop": [
                {
                    "id": s.replica_id,
                    "model": s.model,
                    "profile": s.profile,
                    "nodes": list(s.nodes),
                    "reason": s.reason,
                    "drain": s.drain,
                }
                for s in plan.stops
            ],
            "stale": [
                {
                    "id": s.replica_id,
                    "model": s.model,
                    "profile": s.profile,
                    "nodes": list(s.nodes),
                    "reason": s.reason,
                }
                for s in plan.stale
            ],
        },
        "documents_known": plan.documents_known,
        "documents": [
            {
                "kind": d.kind,
                "name": d.name,
                "change": d.change,
                "fields": [{"path": f.path, "old": f.old, "new": f.new} for f in d.fields],
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


def render_json(plan: Plan) -> str:
    return json.dumps(to_dict(plan), indent=2, sort_keys=True) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(plan: Plan) -> str:
    """For a pull-request comment: the summary, one table row per change, the full text folded away."""
    out = ["### llmgw plan", "", f"**{plan.summary()}**", ""]
    rows: list[tuple[str, str, str, str]] = []
    for d in plan.documents:
        detail = "; ".join(f"`{f.path}`: {_field_words(d, f)}" for f in d.fields) or d.change
        rows.append((_SYMBOL[d.change], f"{d.kind} `{d.name}`", "", detail))
    if not plan.documents_known:
        rows.append(("?", "Cluster, nodes, policies, tenants", "", UNKNOWN_DOCUMENTS))
    for m in plan.models:
        detail = m.summary or "; ".join(f"`{f.path}`: {f.old} -> {f.new}" for f in m.fields)
        rows.append((_SYMBOL[m.change], f"model `{m.model}`", "", detail))
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
    for u in plan.unplaceable:
        rows.append(
            (
                "!",
                f"cannot place `{u.model}`",
                "",
                f"{u.missing} replica{'s' * (u.missing != 1)}; see details",
            )
        )
    if rows:
        out += ["| | change | where | why |", "| --- | --- | --- | --- |"]
        out += [f"| `{a}` | {_cell(b)} | {_cell(c)} | {_cell(d)} |" for a, b, c, d in rows]
        out.append("")
    revision = plan.revision or "(working tree)"
    out += [
        "<details><summary>Details</summary>",
        "",
        "```text",
        render_text(plan).rstrip("\n"),
        "```",
        "",
        "</details>",
        "",
        f"<sub>revision {revision}, live state {plan.live_state_hash[:12]}</sub>",
    ]
    return "\n".join(out) + "\n"
