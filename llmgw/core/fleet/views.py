"""Value types of the live fleet, as the pure decision modules see it.

Two layers. `NodeView`, `ReplicaView` and friends are small frozen dataclasses the decisions read (placement,
reconcile, plan); `LiveState` is the pydantic model at the boundary: the admin API returns it and
`llmgw plan --state FILE` reads it, and it converts to the views.

Unknown is not zero: every inventory field is Optional and None means "the agent did not report it"; the
decisions accept a node on an unknown field and say so, they never read None as 0 or as empty.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from llmgw.core.config.models import ModelSpec, Rollout, Source
from llmgw.core.fleet.states import GONE_STATES, NodeState, ReplicaState, ShardState
from llmgw.core.tenancy.limits import QuotaScope
from llmgw.core.weights.fetch_plan import directory_key

if TYPE_CHECKING:  # only for annotations: the adapters below read two attributes of a Catalog
    from llmgw.core.desired.catalog import Catalog

__all__ = [
    "GIB",
    "DesiredNode",
    "GpuView",
    "IfUndeclared",
    "LiveGpu",
    "LiveNode",
    "LivePeer",
    "LiveReplica",
    "LiveShard",
    "LiveState",
    "ModelState",
    "ModelView",
    "NodeView",
    "ReplicaView",
    "ShardView",
    "class_rank",
    "desired_nodes",
    "held_weights_key",
    "held_weights_keys",
    "model_views",
    "undeclared_words",
    "weights_key",
]

GIB = 1024**3
_DEFAULT_ROLLOUT = Rollout().model_dump(mode="json")


class ModelView(NamedTuple):
    """One desired model: its spec, the fingerprint of each of its profiles (by profile name), its capacity
    class's rank (0 is the highest; every model ranks 0 when the Cluster declares no classes), the GPU
    quotas its owner counts against (nearest first) and the digest of its directory source's manifest when
    the repo holds one (what names its weights on a node)."""

    spec: ModelSpec
    fingerprints: Mapping[str, str]
    rank: int = 0
    quotas: tuple[QuotaScope, ...] = ()
    manifest_digest: str | None = None

    @property
    def class_name(self) -> str:
        return self.spec.model_class or "(unclassed)"

    @property
    def weights_key(self) -> str | None:
        return weights_key(self.spec.source, self.manifest_digest)


def class_rank(classes: list[str] | None, model_class: str | None) -> int:
    """A model's rank among the Cluster's `classes` (0 is the highest); an unclassed model, or one naming
    an undeclared class (validate refuses that), ranks as the last class. No classes: everything ranks 0."""
    if not classes:
        return 0
    if model_class in classes:
        return classes.index(model_class)
    return len(classes) - 1


def model_views(catalog: Catalog) -> dict[str, ModelView]:
    """The catalog's models as the decisions read them: spec, profile fingerprints, rank, quotas and the
    manifest digest."""
    classes = catalog.cluster.classes
    return {
        name: ModelView(
            entry.spec,
            {p.name: p.fingerprint for p in entry.profiles},
            class_rank(classes, entry.spec.model_class),
            catalog.quota_scopes(entry.spec.owner),
            entry.manifest_digest,
        )
        for name, entry in sorted(catalog.models.items())
    }


def desired_nodes(catalog: Catalog) -> dict[str, DesiredNode]:
    """The catalog's Node documents as `plan` reads them."""
    facilities = catalog.cluster.facilities
    gpu_watts = {name: c.watts for name, c in catalog.cluster.gpu_classes.items() if c.watts is not None}
    return {
        name: DesiredNode(
            name,
            dict(node.labels),
            node.spec.fabric,
            node.spec.cordoned,
            node.spec.power_watts,
            dict(facilities.power_caps),
            gpu_watts,
        )
        for name, node in sorted(catalog.nodes.items())
    }


def weights_key(source: Source | None, manifest_digest: str | None = None) -> str | None:
    """The name a model's weights go by in a node's `weights` set: the sha256 when given, else a hash of
    where they come from. A directory source goes by its repo manifest's digest (`manifest:DIGEST`), or by its
    name (`dir:repo@revision`, `dir:URL`) when the repo holds no manifest: the node then has whatever the
    mirror publishes under that name. None for a model without a source (sim)."""
    if source is None:
        return None
    if source.directory:
        if manifest_digest is not None:
            return f"manifest:{manifest_digest}"
        return f"dir:{directory_key(source)}"
    return held_weights_key(source.url, source.path, source.sha256)


def held_weights_keys(
    url: str | None,
    path: str | None,
    sha256: str | None,
    directory: str | None = None,
    manifest_sha256: str | None = None,
) -> tuple[str, ...]:
    """Every weights_key() an entry of a node's weights index answers to: a published directory both by its
    manifest's digest and by its name (a Model without a repo manifest knows only the name)."""
    if directory is not None:
        by_name = f"dir:{directory}"
        return (f"manifest:{manifest_sha256}", by_name) if manifest_sha256 else (by_name,)
    return (held_weights_key(url, path, sha256),)


def held_weights_key(url: str | None, path: str | None, sha256: str | None) -> str:
    """weights_key() of what an agent reports holding (its weights index names the source the same way)."""
    if sha256:
        return sha256
    where = url if url is not None else f"path:{path}"
    return hashlib.sha256(where.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------- views


@dataclass(frozen=True, slots=True)
class GpuView:
    index: int
    gpu_class: str | None = None
    memory_bytes: int | None = None
    # In use by something other than a replica the controller knows (a foreign process, a fault).
    allocated: bool = False
    # Why nothing may be placed on it, as the agent saw it (uncorrectable ECC errors, lost): None when healthy or
    # not reported. A replica already on it keeps running; the node's health alerts say what to do.
    fault: str | None = None
    # What one busy card of its class draws (the Cluster's gpu_classes[class].watts); None: not declared.
    watts: float | None = None
    # Why it cannot be given to an engine although healthy, in the agent's words (a card in MIG mode with no
    # instance carved): left out of placement like a fault, said as such. None: usable.
    unusable: str | None = None


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as placement sees it. Inventory fields are None when the agent did not report them."""

    name: str
    state: NodeState = "Ready"
    labels: Mapping[str, str] = field(default_factory=dict)
    cordoned: bool = False
    cordon_reason: str = ""  # words shown instead of plain "cordoned", e.g. "no longer declared"
    fabric: str | None = None
    cpu_cores: int | None = None
    memory_bytes: int | None = None
    # Free bytes on the filesystem the weights cache lives on.
    disk_free_bytes: int | None = None
    # The shared filesystem (a filer: `nfs4:filer:/export`) that holds the weights cache, None when it is the
    # node's own. Nodes naming the same one draw on one pool of free bytes and hold the same weights.
    shared_disk: str | None = None
    gpus: tuple[GpuView, ...] | None = None
    # Engine name -> version (None: installed, version not reported). None: engines not reported at all.
    engines: Mapping[str, str | None] | None = None
    # Engine name -> why this node cannot run it (its install or probe failed, a requirement it lacks).
    engine_refusals: Mapping[str, str] = field(default_factory=dict)
    # Engine name -> what to know of the build this node runs of it (a CPU without AVX2 for a CPU build).
    engine_warnings: Mapping[str, str] = field(default_factory=dict)
    # weights_key() of the weights the node already holds. None: the node was never asked to look.
    weights: frozenset[str] | None = None
    # Removed from the repo: its replicas are replaced elsewhere first, then stopped (make-before-break).
    leaving: bool = False
    # Drained by an operator (`llmgw node drain`): replaced elsewhere first, then stopped; unlike a leaving
    # node, a replica nothing can replace keeps serving here.
    drained: bool = False
    # Held by an operator (`llmgw facility hold rack=r1`): nothing new is placed here; the hold in words.
    held: str = ""
    # Declared draw with GPUs idle (Node spec.power_watts) and measured draw (the agent's heartbeat); None: not
    # known (unmeasured is absent, never zero).
    power_watts: float | None = None
    power_draw_watts: float | None = None
    # The power caps of the facility domains the node stands in: `pdu=pdu-a1` -> watts (Cluster facilities).
    power_caps: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ShardView:
    node: str
    rank: int = 0
    gpus: tuple[int, ...] = ()
    state: ShardState = "starting"


@dataclass(frozen=True, slots=True)
class ReplicaView:
    id: str
    model: str
    profile: str
    fingerprint: str = ""  # "" = unknown (adopted from an older agent): never stale
    shards: tuple[ShardView, ...] = ()
    state: ReplicaState = "starting"
    created_at: float = 0.0
    adopted: bool = False  # found running after a controller restart: kept, never restarted
    stale: bool = False  # already marked "stale profile" by the controller
    ready_since: float | None = None
    restart: bool = False  # an operator asked for it to be restarted (`llmgw restart`), not yet replaced
    replaces: str | None = None  # the replica this one was started to take the place of, while that one runs

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.shards)

    def effective_state(self) -> ReplicaState:
        """The replica's state with its shards taken into account: one failed shard fails the replica."""
        if self.state in GONE_STATES:
            return self.state
        if any(s.state == "failed" for s in self.shards):
            return "failed"
        if self.shards and all(s.state == "ready" for s in self.shards):
            return "ready"
        return self.state if self.state in ("failed", "pending") else "starting"


@dataclass(frozen=True, slots=True)
class ModelState:
    """Backoff carried on the model, not on the replica that was destroyed (a new replica starts at zero)."""

    failures: int = 0
    not_before: float = 0.0  # no replacement placed before this time
    counted: frozenset[str] = frozenset()  # failed replica ids already counted


@dataclass(frozen=True, slots=True)
class DesiredNode:
    """A node as the cluster repo declares it (for `plan`: bootstrap, drain, labels, cordon)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    fabric: str | None = None
    cordoned: bool = False
    power_watts: float | None = None
    # The Cluster's power caps (every domain's) and its GPU classes' watts, as this revision declares them.
    power_caps: Mapping[str, float] = field(default_factory=dict)
    gpu_watts: Mapping[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- boundary


IfUndeclared = Literal["remove", "keep"]


def undeclared_words(action: IfUndeclared | None, replicas: int) -> str:
    """What happens to a node the repo does not declare, in words for status and plan (one rule, one text)."""
    there = f"{replicas} replica{'s' * (replicas != 1)}"
    if action == "remove":
        return (
            f"no longer declared: cordoned, its {there} drained and placed elsewhere, then its agent removed"
        )
    if action == "keep":
        running = (
            f"its {there} {'keeps' if replicas == 1 else 'keep'} running" if replicas else "no replicas there"
        )
        return (
            f"not declared in the repo, left as it is: {running} and it takes new ones like any agent with "
            "the token; the controller removes only remote nodes its applied revision declared (declare it "
            "and remove it again while a controller runs, or stop its agent)"
        )
    return f"seen, no longer declared ({there} there)" if replicas else "seen, no longer declared"


class _Live(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LiveGpu(_Live):
    index: int
    gpu_class: str | None = None
    memory_bytes: int | None = None
    allocated: bool = False
    fault: str | None = None  # as GpuView: `plan` leaves a faulty or unusable GPU out as placement does
    unusable: str | None = None
    watts: float | None = None


class LiveNode(_Live):
    name: str
    state: NodeState = "Ready"
    labels: dict[str, str] = Field(default_factory=dict)
    cordoned: bool = False
    fabric: str | None = None
    cpu_cores: int | None = None
    memory_bytes: int | None = None
    disk_free_bytes: int | None = None
    shared_disk: str | None = None
    gpus: list[LiveGpu] | None = None
    engines: dict[str, str | None] | None = None
    engine_refusals: dict[str, str] = Field(default_factory=dict)
    engine_warnings: dict[str, str] = Field(default_factory=dict)
    weights: list[str] | None = None
    held: str = Field("", description="The facility hold that keeps new replicas off it, in words")
    power_watts: float | None = None
    power_draw_watts: float | None = Field(None, description="Measured draw; None: not measured")
    power_caps: dict[str, float] = Field(default_factory=dict)
    if_undeclared: IfUndeclared | None = Field(
        None,
        description="What the controller does while the repo does not declare this node: remove (drain its "
        "replicas, then remove its agent over SSH: a remote node its applied revision declares, or one being "
        "removed now) or keep (left as it is, taking replicas like any agent with the token); None: not said",
    )

    @classmethod
    def from_view(cls, n: NodeView) -> LiveNode:
        return cls(
            name=n.name,
            state=n.state,
            labels=dict(n.labels),
            cordoned=n.cordoned,
            fabric=n.fabric,
            cpu_cores=n.cpu_cores,
            memory_bytes=n.memory_bytes,
            disk_free_bytes=n.disk_free_bytes,
            shared_disk=n.shared_disk,
            engine_refusals=dict(n.engine_refusals),
            engine_warnings=dict(n.engine_warnings),
            gpus=None
            if n.gpus is None
            else [
                LiveGpu(
                    index=g.index,
                    gpu_class=g.gpu_class,
                    memory_bytes=g.memory_bytes,
                    allocated=g.allocated,
                    fault=g.fault,
                    unusable=g.unusable,
                    watts=g.watts,
                )
                for g in n.gpus
            ],
            engines=None if n.engines is None else dict(n.engines),
            weights=None if n.weights is None else sorted(n.weights),
            held=n.held,
            power_watts=n.power_watts,
            power_draw_watts=n.power_draw_watts,
            power_caps=dict(n.power_caps),
        )

    def view(self) -> NodeView:
        return NodeView(
            name=self.name,
            state=self.state,
            labels=dict(self.labels),
            cordoned=self.cordoned,
            fabric=self.fabric,
            cpu_cores=self.cpu_cores,
            memory_bytes=self.memory_bytes,
            disk_free_bytes=self.disk_free_bytes,
            shared_disk=self.shared_disk,
            engine_refusals=dict(self.engine_refusals),
            engine_warnings=dict(self.engine_warnings),
            gpus=None
            if self.gpus is None
            else tuple(
                GpuView(
                    g.index,
                    g.gpu_class,
                    g.memory_bytes,
                    g.allocated,
                    fault=g.fault,
                    unusable=g.unusable,
                    watts=g.watts,
                )
                for g in self.gpus
            ),
            engines=None if self.engines is None else dict(self.engines),
            weights=None if self.weights is None else frozenset(self.weights),
            held=self.held,
            power_watts=self.power_watts,
            power_draw_watts=self.power_draw_watts,
            power_caps=dict(self.power_caps),
        )


class LiveShard(_Live):
    node: str
    rank: int = 0
    gpus: list[int] = Field(default_factory=list)
    state: ShardState = "starting"


class LiveReplica(_Live):
    id: str
    model: str
    profile: str
    fingerprint: str = ""
    shards: list[LiveShard] = Field(default_factory=list)
    state: ReplicaState = "starting"
    created_at: float = 0.0
    adopted: bool = False
    stale: bool = False
    ready_since: float | None = None

    @classmethod
    def from_view(cls, r: ReplicaView) -> LiveReplica:
        return cls(
            id=r.id,
            model=r.model,
            profile=r.profile,
            fingerprint=r.fingerprint,
            shards=[LiveShard(node=s.node, rank=s.rank, gpus=list(s.gpus), state=s.state) for s in r.shards],
            state=r.state,
            created_at=r.created_at,
            adopted=r.adopted,
            stale=r.stale,
            ready_since=r.ready_since,
        )

    def view(self) -> ReplicaView:
        return ReplicaView(
            id=self.id,
            model=self.model,
            profile=self.profile,
            fingerprint=self.fingerprint,
            shards=tuple(ShardView(s.node, s.rank, tuple(s.gpus), s.state) for s in self.shards),
            state=self.state,
            created_at=self.created_at,
            adopted=self.adopted,
            stale=self.stale,
            ready_since=self.ready_since,
        )


class LivePeer(_Live):
    """A peer as the controller last found it (docs/routing.md, Federation)."""

    up: bool | None = Field(None, description="Its /ready answered at the last check; None: not checked yet")
    models: list[str] = Field(default_factory=list, description="What its /v1/models listed last")


class LiveState(_Live):
    """What the fleet is running, as the controller knows it: the input of `llmgw plan`."""

    revision: str | None = Field(None, description="Applied revision of the cluster repo (commit SHA)")
    catalog_fingerprint: str | None = Field(None, description="Fingerprint of the applied catalog")
    taken_at: float = Field(0.0, description="Unix time the snapshot was taken")
    nodes: list[LiveNode] = Field(default_factory=list)
    replicas: list[LiveReplica] = Field(default_factory=list)
    models: dict[str, ModelSpec] | None = Field(
        None, description="Models of the applied revision (what `plan` diffs against); None: not known"
    )
    documents: dict[str, dict[str, Any]] | None = Field(
        None,
        description="Every document of the applied revision as canonical JSON keyed `Kind/name` (what `plan` "
        "diffs tenants, policies, nodes and Cluster settings against; secret references by name, never values); "
        "None: not known",
    )
    peers: dict[str, LivePeer] | None = Field(
        None, description="The declared peers as last checked (what they offer now); None: not known"
    )

    @classmethod
    def from_views(
        cls,
        nodes: Iterable[NodeView],
        replicas: Iterable[ReplicaView],
        *,
        revision: str | None,
        taken_at: float,
        models: Mapping[str, ModelSpec] | None = None,
        catalog_fingerprint: str | None = None,
        documents: Mapping[str, dict[str, Any]] | None = None,
    ) -> LiveState:
        """The snapshot of the views the controller already builds for placement."""
        return cls(
            revision=revision,
            catalog_fingerprint=catalog_fingerprint,
            taken_at=taken_at,
            nodes=[LiveNode.from_view(n) for n in nodes],
            replicas=[LiveReplica.from_view(r) for r in replicas],
            models=None if models is None else dict(models),
            documents=None if documents is None else dict(documents),
        )

    def node_views(self) -> tuple[NodeView, ...]:
        return tuple(n.view() for n in sorted(self.nodes, key=lambda n: n.name))

    def replica_views(self) -> tuple[ReplicaView, ...]:
        return tuple(r.view() for r in sorted(self.replicas, key=lambda r: r.id))

    def content_hash(self) -> str:
        """A hash of everything but the time it was taken: a saved plan is stale when this changes."""
        body = self.model_dump(mode="json", exclude={"taken_at"})
        body["nodes"].sort(key=lambda n: n["name"])  # the order the controller lists them in is not state
        for node in body["nodes"]:
            if node.get("if_undeclared") is None:  # as before the field existed: saved plans stay current
                node.pop("if_undeclared", None)
            _as_before_facilities(node)
        body["replicas"].sort(key=lambda r: r["id"])
        if body.get("documents") is None:  # as before the field existed: saved plans stay current
            body.pop("documents", None)
        for spec in (body.get("models") or {}).values():
            if spec.get("slo") is None:  # as before the field existed: saved plans stay current
                spec.pop("slo", None)
        _as_before_capacity(body)
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def _as_before_facilities(node: dict[str, Any]) -> None:
    """A live node's body as before holds and power existed, where they are at their defaults (saved plans
    stay current)."""
    for key, default in (("held", ""), ("power_watts", None), ("power_draw_watts", None), ("power_caps", {})):
        if node.get(key, default) == default:
            node.pop(key, None)
    for gpu in node.get("gpus") or ():
        if gpu.get("watts") is None:
            gpu.pop("watts", None)


def _as_before_capacity(body: dict[str, Any]) -> None:
    """A live state's body as before classes, quotas, the rollout block and facilities existed, where they are
    at their defaults: a plan saved by an earlier llmgw stays current (its hash is the same)."""

    def model(spec: dict[str, Any]) -> None:
        if spec.get("rollout") == _DEFAULT_ROLLOUT:
            spec.pop("rollout")
        if spec.get("restart_on_profile_change") is None:
            spec["restart_on_profile_change"] = False
        for profile in spec.get("profiles") or ():
            if isinstance(profile, dict) and profile.get("keep_within", 0) is None:
                profile.pop("keep_within")

    for spec in (body.get("models") or {}).values():
        model(spec)
    for doc in (body.get("documents") or {}).values():
        spec = doc.get("spec")
        if not isinstance(spec, dict):
            continue
        kind = doc.get("kind")
        if kind == "Model":
            model(spec)
        elif kind == "Cluster":
            if spec.get("classes") is None:
                spec.pop("classes", None)
            if spec.get("preemption_grace") == "10s":
                spec.pop("preemption_grace", None)
            if spec.get("facilities") == {"power_caps": {}}:
                spec.pop("facilities")
            for gpu_class in (spec.get("gpu_classes") or {}).values():
                if isinstance(gpu_class, dict) and gpu_class.get("watts", 0) is None:
                    gpu_class.pop("watts")
        elif kind == "Node" and spec.get("power_watts", 0) is None:
            spec.pop("power_watts")
        elif kind in ("Organization", "Team") and spec.get("gpu_quota") == {}:
            spec.pop("gpu_quota", None)
        if kind in ("Organization", "Team", "Project") and spec.get("capacity", 0) == {}:
            spec.pop("capacity")
