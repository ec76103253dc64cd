"""`make_plan`: the difference between the cluster repo and the live fleet, as a value.

It diffs the desired models against the applied ones (which fields changed), and every other document the
controller reads — Cluster, Node, RoutingPolicy, Organization, Team, Project, a Model's labels — against the
applied revision's documents (`catalog_documents`, which the controller's live state carries), field by field;
runs the reconciler in plan mode over the live snapshot (replicas to start and where and why, to stop, to
restart for a stale profile), compares declared nodes with the nodes seen (bootstrap, drain), and explains every
model that cannot be placed, node by node. A secret reference is shown as what it names (`{file: name}`,
`{env: NAME}`): the plan never resolves one, so no secret value can reach it; a literal under a secret-looking
key (engine env, args) is shown as `(secret)`. "No changes" means the two revisions are equal in everything the
controller reads.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from llmgw.core.config.models import (
    ClusterSpec,
    GuardrailSpec,
    ModelSpec,
    NodeSpec,
    OrganizationSpec,
    PersonSpec,
    ProjectSpec,
    RoutingPolicySpec,
    SecretRef,
    TeamSpec,
)
from llmgw.core.fleet.views import (
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
from llmgw.core.placement.facility import node_power_caps
from llmgw.core.plan.capacity import scope_capacity
from llmgw.core.plan.values import (
    KIND_ORDER,
    AdapterCarry,
    DocumentChange,
    Drift,
    FieldChange,
    ModelChange,
    NodeChange,
    Plan,
    ReplicaRestart,
    ReplicaStart,
    ReplicaStop,
    StaleReplica,
    Unplaceable,
)
from llmgw.core.reconcile import RestartReplica, StartReplica, StopReplica, reconcile, replica_stale
from llmgw.core.weights.memory_fit import GIB, class_memory, profile_fits

__all__ = [
    "catalog_documents",
    "document_changes",
    "exit_code",
    "make_plan",
    "plan_for_catalog",
]

if TYPE_CHECKING:
    from llmgw.core.desired.catalog import Catalog, TenantEntry

SECRET = "(secret)"
ABSENT = "(absent)"
# Keys whose values are masked even where the schema allows a literal (engine env, args).
_SECRET_WORDS = re.compile(r"(key|token|secret|password|passwd|credential)", re.IGNORECASE)


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
        and replica_stale(r, desired[r.model])
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
        drift=_drift(live, replicas),
        capacity=scope_capacity(desired, replicas, starts, leaving, stops),
    )


_RUNNING = frozenset({"pending", "starting", "ready"})


def _drift(live: LiveState, replicas: Sequence[ReplicaView]) -> tuple[Drift, ...]:
    """Against what was applied (the live state's models): replicas that stopped running without the
    controller asking (failed: an engine killed or stopped by hand, a crash), and models short of `min`."""
    applied = live.models or {}
    out: list[Drift] = []
    for r in replicas:
        spec = applied.get(r.model)
        if spec is None or r.effective_state() != "failed":
            continue
        failed = [f"shard {s.rank} on {s.node}" for s in r.shards if s.state == "failed"] or ["its engine"]
        words = (
            f"{r.id} ({r.model}/{r.profile}) on {', '.join(r.nodes)} is not running ({', '.join(failed)} "
            f"failed: stopped or killed outside llmgw, or crashed); the revision declares "
            f"{spec.scaling.min} replica(s) of {r.model}: replaced"
        )
        out.append(Drift(r.model, r.id, words))
    said = {d.model for d in out}
    for name, spec in sorted(applied.items()):
        running = [r for r in replicas if r.model == name and r.effective_state() in _RUNNING]
        if spec.profiles and len(running) < spec.scaling.min and name not in said:
            least = spec.scaling.min
            words = f"{name} has {len(running)} replica(s) running; the revision declares at least {least}"
            out.append(Drift(name, None, words))
    return tuple(out)


def plan_for_catalog(catalog: Catalog, live: LiveState) -> Plan:
    """The plan from `live` to a validated catalog (its models, declared nodes and other documents, its
    revision), with the memory fit of every GPU profile whose model's shape the repo's manifest records."""
    made = make_plan(
        model_views(catalog),
        live,
        nodes=desired_nodes(catalog),
        revision=catalog.revision,
        documents=catalog_documents(catalog),
    )
    declared = {name: int(c.memory_gb * GIB) for name, c in catalog.cluster.gpu_classes.items()}
    reported = class_memory((g.gpu_class, g.memory_bytes) for n in live.node_views() for g in n.gpus or ())
    cards = {**declared, **reported}  # what the fleet reports wins; the declaration stands in where none does
    shapes = {name: (entry.spec, entry.shape) for name, entry in catalog.models.items()}
    return replace(made, fits=profile_fits(shapes, cards), adapters=_adapter_carry(catalog, live, made))


def _adapter_carry(catalog: Catalog, live: LiveState, made: Plan) -> tuple[AdapterCarry, ...]:
    """Which replicas will carry which adapters: each base's kept replicas (not stopped or restarted by the
    plan) and those it starts; every one loads all of its base's adapters at start."""
    leaving = {r.replica_id for r in made.restarts} | {s.replica_id for s in made.stops}
    out = []
    for model in sorted(catalog.models):
        adapters = tuple(name for name, _ in catalog.adapters_of(model))
        if not adapters:
            continue
        kept = [r.id for r in live.replica_views() if r.model == model and r.id not in leaving]
        started = [s.replica_id for s in made.starts if s.model == model]
        out.append(AdapterCarry(model, adapters, tuple(sorted(kept) + started)))
    return tuple(out)


def exit_code(plan: Plan) -> int:
    """`--detailed-exitcode`, as Terraform: 0 nothing to change, 2 changes (1 is left for errors)."""
    return 2 if plan.has_changes else 0


def _node_views(live: LiveState, declared: Mapping[str, DesiredNode] | None) -> tuple[NodeView, ...]:
    """Live nodes with the repo's word on labels, fabric, cordon and power (declared draw, caps, cards' watts). An undeclared node takes nothing new
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
            views.append(
                replace(
                    node,
                    labels=labels,
                    fabric=d.fabric or node.fabric,
                    cordoned=d.cordoned,
                    power_watts=d.power_watts,
                    power_caps=node_power_caps(labels, d.power_caps),
                    gpus=None
                    if node.gpus is None
                    else tuple(replace(g, watts=d.gpu_watts.get(g.gpu_class or "")) for g in node.gpus),
                )
            )
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
    if view.spec.restarts_on_change:
        pace = view.spec.rollout
        return (
            f"profile changed; rolled (max_surge {pace.max_surge}, max_unavailable {pace.max_unavailable}): "
            "replacements ready before the old ones stop"
        )
    return "profile changed; kept until `llmgw restart` (rollout.on_change is manual)"


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
_SPECS: dict[str, type[BaseModel]] = {
    "Cluster": ClusterSpec,
    "Node": NodeSpec,
    "Model": ModelSpec,
    "RoutingPolicy": RoutingPolicySpec,
    "Organization": OrganizationSpec,
    "Team": TeamSpec,
    "Project": ProjectSpec,
    "Guardrail": GuardrailSpec,
    "Person": PersonSpec,
}


def _tenant_spec(t: TenantEntry) -> BaseModel:
    """An Organization, Team or Project as the controller reads it (catalog_documents)."""
    models = list(t.models) if t.models is not None else None
    if t.kind == "Organization":
        return OrganizationSpec(
            models=models,
            limits=t.limits,
            per_member=t.per_member,
            gpu_quota=dict(t.gpu_quota),
            capacity=dict(t.capacity),
        )
    if t.kind == "Team":
        return TeamSpec(
            organization=t.parent or "",
            models=models,
            limits=t.limits,
            per_member=t.per_member,
            gpu_quota=dict(t.gpu_quota),
            capacity=dict(t.capacity),
        )
    team = t.parent if t.parent_kind == "Team" else None
    org = t.parent if t.parent_kind == "Organization" else None
    return ProjectSpec(
        team=team,
        organization=org,
        models=models,
        limits=t.limits,
        per_member=t.per_member,
        response_cache=t.response_cache,
        capacity=dict(t.capacity),
        residency=None if t.residency is None else list(t.residency),
        no_store=t.no_store,
    )


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
        if model.manifest_digest is not None:  # a repo manifest's bytes, which the spec names only by path
            out[f"Model/{name}"]["manifest_sha256"] = model.manifest_digest
    for tenants in (catalog.organizations, catalog.teams, catalog.projects):
        for name, t in tenants.items():
            put(t.kind, name, _tenant_spec(t), t.labels)
    for name, guardrail in catalog.guardrails.items():  # reviewed like the rest: plan shows what changes
        put("Guardrail", name, guardrail, {})
    for name, adapter in catalog.adapters.items():
        put("Adapter", name, adapter, {})
    for name, person in catalog.people.items():  # a membership removed is access taken away: reviewed
        put("Person", name, person, {})
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
    return tuple(sorted(out, key=lambda d: (KIND_ORDER.get(d.kind, len(KIND_ORDER)), d.kind, d.name)))


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
