"""The plan as a value: what `make_plan` returns and every renderer reads. Frozen, no behaviour but words."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmgw.core.plan.source_check import SourceVerdict
from llmgw.core.weights.memory_fit import ProfileFit
from llmgw.core.words import count

__all__ = [
    "KIND_ORDER",
    "UNKNOWN_DOCUMENTS",
    "DocumentChange",
    "FieldChange",
    "Impact",
    "ImpactItem",
    "ModelChange",
    "NodeChange",
    "Plan",
    "ReplicaRestart",
    "ReplicaStart",
    "ReplicaStop",
    "ScopeCapacity",
    "SourceVerdict",
    "StaleReplica",
    "Unplaceable",
]

UNKNOWN_DOCUMENTS = (
    "The applied Cluster, nodes, routing policies and tenants are not in the live state (saved by an older "
    "controller?): they were not compared"
)
# The order a reviewer reads a plan in: cluster-wide first, tenants from the top, models last.
KIND_ORDER = {
    k: i
    for i, k in enumerate(
        ("Cluster", "Node", "RoutingPolicy", "Organization", "Team", "Project", "Model", "Adapter", "model")
    )
}


# The Impact (impact.plan_impact: what each change does to a recent window's traffic) is part of the plan's value.
Severity = Literal["loss", "note"]
Topic = Literal["access", "limit", "capacity", "cost"]


@dataclass(frozen=True, slots=True)
class ImpactItem:
    severity: Severity
    topic: Topic
    subject: str  # what it is about: `project playground`, `model gemma`, `team research`
    words: str  # the sentence a reviewer reads


@dataclass(frozen=True, slots=True)
class Impact:
    """The items, losses first; `known` False: no usage to judge by, and `reason` says why."""

    known: bool
    reason: str = ""
    window: str = ""  # "the last 7 days"
    coverage: str = ""  # "" when the records cover the window, else what they cover
    requests: int = 0
    items: tuple[ImpactItem, ...] = ()

    @property
    def losses(self) -> tuple[ImpactItem, ...]:
        return tuple(i for i in self.items if i.severity == "loss")

    def headline(self) -> str:
        if not self.known:
            return self.reason
        n = len(self.losses)
        more = f"; {self.coverage}" if self.coverage else ""
        base = f"traffic of {self.window} ({count(self.requests)} requests{more})"
        if n:
            return f"{n} change{'s' * (n != 1)} would cut off, refuse or queue {base}."
        if self.items:
            return (
                f"Nothing used is lost against {base}; {len(self.items)} note{'s' * (len(self.items) != 1)}."
            )
        return f"No change touches {base}."


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
class ScopeCapacity:
    """One scope's one class, in words (`4 CPU cores`, `8 h100-80g, 64 CPU cores on h100-80g`)."""

    scope: str
    cls: str
    guaranteed: str  # "" when none
    limit: str  # "" when none
    held: str  # now
    after: str  # once the plan is applied
    borrowed: str  # once applied, beyond the guarantee; "" when nothing is
    taken_back: tuple[str, ...]  # its replicas this plan stops for a tenant within its guarantee

    def words(self) -> str:
        terms = [f"guaranteed {self.guaranteed}" if self.guaranteed else "no guarantee"]
        if self.limit:
            terms.append(f"limit {self.limit}")
        text = f"{self.scope}, {self.cls}: {'; '.join(terms)}; holds {self.held}, {self.after} once applied"
        if self.borrowed:
            text += f" ({self.borrowed} borrowed)"
        if self.taken_back:
            text += f"; taken back: {', '.join(self.taken_back)}"
        return text


@dataclass(frozen=True, slots=True)
class StaleReplica:
    """A stale-profile replica that is kept: shown so the cluster never reads as matching its repo."""

    replica_id: str
    model: str
    profile: str
    nodes: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Drift:
    """Where the fleet differs from the applied revision without a repo change: a replica stopped or an
    engine killed by hand, a model short of its replicas. The controller heals it (the plan's starts and
    stops show how); shown so nobody reads the plan's actions as a change of the repo."""

    model: str
    replica_id: str | None  # None: the model as a whole (short of replicas)
    words: str


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
class AdapterCarry:
    """A base model's LoRA adapters (docs/lora.md) and the replicas that will carry them once applied."""

    model: str
    adapters: tuple[str, ...]  # in the order each replica loads them
    replicas: tuple[str, ...]  # its replicas kept or started by the plan; a restart's replacement is new


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
    # New or changed weights sources, checked against their servers by the CLI (llmgw.core.plan.source_check);
    # empty when none changed. Not part of what the plan would do (its digest): a server's answer is no action.
    sources: tuple[SourceVerdict, ...] = ()
    # Every GPU profile of a model whose shape its manifest records, against its class's memory in the fleet.
    fits: tuple[ProfileFit, ...] = ()
    # What the changes do to the traffic of a recent window (llmgw.core.plan.impact); None: not asked. Not
    # part of the plan's digest: usage moves on while the actions stay the same.
    impact: Impact | None = None
    adapters: tuple[AdapterCarry, ...] = ()  # base models with Adapter documents, and who carries them
    drift: tuple[Drift, ...] = ()  # the fleet against the applied revision (healed by the controller)
    # Tenants' guarantees and limits, what they hold now and once applied, borrowed, and taken back.
    capacity: tuple[ScopeCapacity, ...] = ()

    @property
    def misfits(self) -> tuple[ProfileFit, ...]:
        return tuple(f for f in self.fits if f.state == "does not fit")

    @property
    def source_errors(self) -> tuple[SourceVerdict, ...]:
        return tuple(s for s in self.sources if s.state == "error")

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
        order = sorted(counts, key=lambda k: (KIND_ORDER.get(k, len(KIND_ORDER)), k))
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

    def source_summary(self) -> str:
        """ "Weights sources: 1 wrong, 2 not checked, 3 checked." — its own line, not part of summary(): what
        servers said is not what applying does (a saved plan's digest covers the summary)."""
        if not self.sources:
            return ""
        counts = {
            state: sum(1 for s in self.sources if s.state == state) for state in ("error", "not checked")
        }
        checked = len(self.sources) - sum(counts.values())
        parts = [f"{counts['error']} wrong"] * bool(counts["error"])
        parts += [f"{counts['not checked']} not checked"] * bool(counts["not checked"])
        parts += [f"{checked} checked"] * bool(checked)
        return f"Weights sources: {', '.join(parts)}."
