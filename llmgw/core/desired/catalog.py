"""The immutable Catalog: what the cluster repo declares, checked as a whole, with lookups others need.

Built only by `Catalog.build(documents)`, which runs every whole-repo check and raises `CatalogError` (holding
every problem) instead of returning a catalog that could surprise someone later: a typo in a fallback stops a
deployment rather than surfacing during the outage that needs the fallback. A new revision of the repo is a new
Catalog; nothing in one ever changes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from llmgw.core.config.checks.semantic import Document, check
from llmgw.core.config.errors import SemanticError
from llmgw.core.config.models import (
    LORA_ENGINES,
    Adapter,
    AdapterSpec,
    ClassCapacity,
    Cluster,
    ClusterSpec,
    ContentRetention,
    EvalSuite,
    EvalSuiteSpec,
    Guardrail,
    GuardrailSpec,
    Limits,
    Model,
    ModelSpec,
    Node,
    NodeSpec,
    Notification,
    NotificationSpec,
    Organization,
    OrganizationSpec,
    Person,
    PersonLimits,
    PersonSpec,
    Profile,
    Project,
    ProjectSpec,
    ResponseCacheSpec,
    RoutingPolicy,
    RoutingPolicySpec,
    Team,
    TeamSpec,
    node_document,
)
from llmgw.core.config.specs.peer_spec import peer_of
from llmgw.core.errors import CatalogError
from llmgw.core.snapshot import PublishedGuard, Tenants
from llmgw.core.tenancy import projects as tenancy
from llmgw.core.tenancy.limits import QuotaScope, quota_scope
from llmgw.core.weights.manifest import ManifestFile, digest as manifest_digest
from llmgw.core.weights.model_headers import ModelShape

__all__ = [
    "Catalog",
    "CatalogError",
    "ModelEntry",
    "NodeEntry",
    "ProfileEntry",
    "TenantEntry",
    "profile_fingerprint",
]

_BUILD_KEY = object()  # only Catalog.build has it: no unchecked Catalog can exist


def profile_fingerprint(
    profile: Profile,
    spec: ModelSpec,
    manifest_digest: str | None = None,
    adapters: Sequence[tuple[str, AdapterSpec]] = (),
) -> str:
    """sha256 of what a running replica depends on: the profile, the model's source and context length, and
    a directory source's manifest from the repo (its digest): a manifest edited at the same path names other
    bytes, so its replicas are stale exactly as when a file source's sha256 changes.

    Fields left at their defaults are omitted, so spelling out a default does not change the fingerprint; a
    model without a repo manifest has no `manifest` key at all, so its fingerprint is what it always was.
    """
    canonical: dict[str, object] = {
        "profile": profile.model_dump(mode="json", by_alias=True, exclude_defaults=True),
        "source": spec.source.model_dump(mode="json", exclude_defaults=True) if spec.source else None,
        "context_length": spec.context_length,
    }
    if manifest_digest is not None:
        canonical["manifest"] = manifest_digest
    if adapters and profile.engine in LORA_ENGINES:  # loaded at start: another set is another replica
        canonical["adapters"] = [[n, a.model_dump(mode="json", exclude_defaults=True)] for n, a in adapters]
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class ProfileEntry:
    profile: Profile
    fingerprint: str

    @property
    def name(self) -> str:
        return self.profile.name


@dataclass(frozen=True)
class ModelEntry:
    name: str
    spec: ModelSpec
    labels: Mapping[str, str]
    profiles: tuple[ProfileEntry, ...]
    # A directory source's manifest from the repo (`spec.source.manifest`); None: none in the repo (the node
    # reads the one the mirror publishes) or not a directory source.
    manifest: tuple[ManifestFile, ...] | None = None
    # The model's shape its manifest records (`llmgw model manifest`); None: not recorded.
    shape: ModelShape | None = None

    @property
    def manifest_digest(self) -> str | None:
        return None if self.manifest is None else manifest_digest(self.manifest)

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(self.spec.aliases)

    @property
    def on_demand(self) -> bool:
        return self.spec.scaling.min == 0 and self.spec.scaling.max > 0

    def profile(self, name: str) -> ProfileEntry | None:
        return next((entry for entry in self.profiles if entry.name == name), None)


@dataclass(frozen=True)
class NodeEntry:
    name: str
    labels: Mapping[str, str]
    spec: NodeSpec

    def document(self) -> Node:
        """The Node document this entry was read from (what the SSH steps and upgrades read)."""
        return Node.model_validate(node_document(self.name, self.labels, self.spec))


@dataclass(frozen=True)
class TenantEntry:
    """An organization, team or project. `models` None means "as the parent" (all, at the top)."""

    kind: str  # Organization, Team or Project
    name: str
    parent: str | None  # team or organization name; None for an organization
    parent_kind: str | None  # Team or Organization; None for an organization
    models: tuple[str, ...] | None
    limits: Limits
    labels: Mapping[str, str]
    gpu_quota: Mapping[str, int] = field(default_factory=dict)  # GPU class -> most GPUs (Team, Organization)
    retention: ContentRetention | None = None  # a Project's content retention; None: keeps no content
    response_cache: ResponseCacheSpec | None = None  # a Project's, published to routers as written
    per_member: PersonLimits | None = None  # each member's own share here (docs/tenancy.md, People)
    capacity: Mapping[str, ClassCapacity] = field(default_factory=dict)  # class -> guaranteed and limit
    residency: tuple[str, ...] | None = None  # a Project's regions its requests may go to (Federation)
    no_store: bool = False  # a Project's: nothing of its requests kept, none sent to a peer


_DEFAULT_POLICY = RoutingPolicySpec()


@dataclass(frozen=True)
class Catalog:
    models: Mapping[str, ModelEntry]
    aliases: Mapping[str, str]  # alias -> model name
    policies: Mapping[str, RoutingPolicySpec]
    cluster: ClusterSpec
    cluster_name: str | None  # None: the repo has no Cluster document and defaults apply
    nodes: Mapping[str, NodeEntry]
    organizations: Mapping[str, TenantEntry]
    teams: Mapping[str, TenantEntry]
    projects: Mapping[str, TenantEntry]
    revision: str | None = None
    warnings: tuple[SemanticError, ...] = ()
    notifications: Mapping[str, NotificationSpec] = field(default_factory=lambda: MappingProxyType({}))
    guardrails: Mapping[str, GuardrailSpec] = field(default_factory=lambda: MappingProxyType({}))
    adapters: Mapping[str, AdapterSpec] = field(default_factory=lambda: MappingProxyType({}))  # docs/lora.md
    eval_suites: Mapping[str, EvalSuiteSpec] = field(default_factory=lambda: MappingProxyType({}))
    people: Mapping[str, PersonSpec] = field(default_factory=lambda: MappingProxyType({}))  # Person documents
    _key: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._key is not _BUILD_KEY:
            raise TypeError("build a Catalog with Catalog.build(documents)")

    # ------------------------------------------------------------------------------------------ construction

    @classmethod
    def build(
        cls,
        documents: Sequence[Document],
        revision: str | None = None,
        manifests: Mapping[str, tuple[ManifestFile, ...]] | None = None,
        shapes: Mapping[str, ModelShape] | None = None,
    ) -> Catalog:
        """The catalog of `documents`, or CatalogError holding every whole-repo problem (warnings do not stop
        it and are kept in `warnings`). `manifests` are the repo's directory manifests by model name (checked
        by core.repo); they are part of the models' fingerprints."""
        problems = check(documents)
        errors = [p for p in problems if p.severity == "error"]
        if errors:
            raise CatalogError(errors)
        # Kinds whose spec is kept as written, by name.
        adapters = {d.metadata.name: d.spec for d in documents if isinstance(d, Adapter)}
        policies = {d.metadata.name: d.spec for d in documents if isinstance(d, RoutingPolicy)}
        notifications = {d.metadata.name: d.spec for d in documents if isinstance(d, Notification)}
        guardrails = {d.metadata.name: d.spec for d in documents if isinstance(d, Guardrail)}
        suites = {d.metadata.name: d.spec for d in documents if isinstance(d, EvalSuite)}
        people = {d.metadata.name: d.spec for d in documents if isinstance(d, Person)}
        # Kinds made into entries.
        models: dict[str, ModelEntry] = {}
        aliases: dict[str, str] = {}
        nodes: dict[str, NodeEntry] = {}
        tenants: dict[str, dict[str, TenantEntry]] = {"Organization": {}, "Team": {}, "Project": {}}
        cluster: Cluster | None = None
        for doc in documents:
            name = doc.metadata.name
            labels = MappingProxyType(dict(doc.metadata.labels))
            if isinstance(doc, Model):
                manifest = (manifests or {}).get(name)
                models[name] = _model_entry(doc, labels, adapters, manifest, (shapes or {}).get(name))
                aliases.update({alias: name for alias in doc.spec.aliases})
            elif isinstance(doc, Node):
                nodes[name] = NodeEntry(name, labels, doc.spec)
            elif isinstance(doc, Cluster):
                cluster = doc
            elif isinstance(doc, Organization | Team | Project):
                tenants[doc.kind][name] = _tenant(doc, labels)
        return cls(
            models=MappingProxyType(models),
            aliases=MappingProxyType(aliases),
            policies=MappingProxyType(policies),
            cluster=cluster.spec if cluster else ClusterSpec(),
            cluster_name=cluster.metadata.name if cluster else None,
            nodes=MappingProxyType(nodes),
            organizations=MappingProxyType(tenants["Organization"]),
            teams=MappingProxyType(tenants["Team"]),
            projects=MappingProxyType(tenants["Project"]),
            revision=revision,
            warnings=tuple(problems),
            notifications=MappingProxyType(notifications),
            guardrails=MappingProxyType(guardrails),
            adapters=MappingProxyType(adapters),
            eval_suites=MappingProxyType(suites),
            people=MappingProxyType(people),
            _key=_BUILD_KEY,
        )

    def adapters_of(self, model: str) -> tuple[tuple[str, AdapterSpec], ...]:
        """The LoRA adapters `model`'s replicas load at start, in their order (llama.cpp's adapter ids)."""
        return _adapters_of(self.adapters, model)

    def with_revision(self, revision: str | None) -> Catalog:
        return dataclasses.replace(self, revision=revision, _key=_BUILD_KEY)

    # ------------------------------------------------------------------------------------------ models

    def resolve(self, name: str) -> ModelEntry | None:
        """The model a client's name (a model name or an alias) stands for."""
        entry = self.models.get(name)
        if entry is None and name in self.aliases:
            entry = self.models.get(self.aliases[name])
        return entry

    def fallback_chain(self, name: str) -> tuple[str, ...]:
        """Model names to try, in order, when `name` cannot serve: its own fallbacks first (in the order
        written), then theirs, each once, never `name` itself. Empty for an unknown name."""
        entry = self.resolve(name)
        if entry is None:
            return ()
        chain: list[str] = []
        seen = {entry.name}
        queue = [entry]
        while queue:
            current = queue.pop(0)
            for fallback in current.spec.fallbacks:
                target = self.resolve(fallback)
                if target is None and fallback not in seen and self.peer_model(fallback) is not None:
                    seen.add(fallback)  # a peer's model: its own fallbacks are the peer's, not followed here
                    chain.append(fallback)
                elif target is not None and target.name not in seen:
                    seen.add(target.name)
                    chain.append(target.name)
                    queue.append(target)
        return tuple(chain)

    def peer_model(self, name: str) -> tuple[str, str] | None:
        """(peer, model) when `name` is `PEER/MODEL` of a declared peer (docs/routing.md, Federation)."""
        return peer_of(name, {p.name for p in self.cluster.peers})

    def peer_fallbacks(self) -> dict[str, tuple[str, ...]]:
        """`PEER/MODEL` names the models' fallbacks hold, by peer: a peer's model a fallback names is kept
        (withdrawn) when the peer stops offering it, never vanishes."""
        named: dict[str, list[str]] = {}
        for entry in self.models.values():
            for fallback in entry.spec.fallbacks:
                found = self.peer_model(fallback) if self.resolve(fallback) is None else None
                if found is not None and fallback not in named.setdefault(found[0], []):
                    named[found[0]].append(fallback)
        return {peer: tuple(names) for peer, names in named.items()}

    def policy_name_for(self, model: str) -> str | None:
        """The RoutingPolicy a model uses: its own, else the cluster's default; None for built-in defaults."""
        entry = self.resolve(model)
        if entry is not None and entry.spec.routing_policy is not None:
            return entry.spec.routing_policy
        return self.cluster.router.default_policy

    def policy_for(self, model: str) -> RoutingPolicySpec:
        name = self.policy_name_for(model)
        return self.policies[name] if name is not None else _DEFAULT_POLICY

    # ------------------------------------------------------------------------------------------ tenants

    def quota_scopes(self, owner: str | None) -> tuple[QuotaScope, ...]:
        """The quotas (GPU quotas, capacity guarantees and limits) a model owned by `owner` counts against,
        nearest first: the Project of that name, its Team, their Organization; or the Team of that name and its
        Organization; or the Organization of that name. An owner naming no tenant counts against none."""
        if owner is None:
            return ()
        chain: list[TenantEntry] = []
        team = self.teams.get(owner)
        project = self.projects.get(owner)
        if project is not None:
            chain.append(project)
            owner = project.parent or ""
            team = self.teams.get(owner) if project.parent_kind == "Team" else None
        if team is not None:
            chain.append(team)
            owner = team.parent or ""
        if owner in self.organizations:
            chain.append(self.organizations[owner])
        return tuple(
            quota_scope(f"{t.kind} {t.name}", t.gpu_quota, t.capacity)
            for t in chain
            if t.gpu_quota or t.capacity
        )

    def project_limits(self, project: str) -> Limits:
        """The project's limits as enforced: its own, with the Cluster's tenancy defaults filling what it
        leaves unset. KeyError for an unknown project."""
        limits = self.projects[project].limits
        default = self.cluster.tenancy.default_project_concurrency
        if limits.concurrency is None and default is not None:
            limits = limits.model_copy(update={"concurrency": default})
        return limits

    def tenants(self) -> Tenants:
        """The tenant tree as routers are told it (the Cluster's tenancy defaults applied). Every question of
        who may use what is answered over it, by `llmgw.core.tenancy.projects`, for the catalog and the router alike.
        Built once per catalog (it is immutable), not on every `allowed()` or router publication."""
        return self._tenants

    @functools.cached_property
    def _tenants(self) -> Tenants:
        return Tenants(
            organizations={
                n: OrganizationSpec(models=_listed(t.models), limits=t.limits, per_member=t.per_member)
                for n, t in self.organizations.items()
            },
            teams={
                n: TeamSpec(
                    organization=t.parent or "",
                    models=_listed(t.models),
                    limits=t.limits,
                    per_member=t.per_member,
                )
                for n, t in self.teams.items()
            },
            projects={
                n: ProjectSpec(
                    team=t.parent if t.parent_kind == "Team" else None,
                    organization=t.parent if t.parent_kind == "Organization" else None,
                    models=_listed(t.models),
                    limits=self.project_limits(n),
                    retention=t.retention,
                    response_cache=t.response_cache,
                    per_member=t.per_member,
                    residency=None if t.residency is None else list(t.residency),
                    no_store=t.no_store,
                )
                for n, t in self.projects.items()
            },
            people=dict(self.people),
        )

    def allowed(self, project: str, model_name: str) -> bool:
        """May keys of `project` use `model_name` (a name or alias)? Every level that lists models must allow
        it (a level without a list inherits its parent's); unknown projects and models are refused."""
        entry = self.resolve(model_name)
        if entry is None:
            return False
        return tenancy.allowed(self.tenants(), project, (model_name, entry.name, *entry.spec.aliases))

    # ------------------------------------------------------------------------------------------ guardrails

    def project_guardrails(self, project: str) -> tuple[str, ...]:
        """The Guardrails a project's requests go through, inherited down the tenant tree: those attached to
        its organization, then its team, then the project itself, each once, in the repo's order."""
        tenant = self.projects.get(project)
        if tenant is None:
            return ()
        levels = [("projects", project)]
        org = tenant.parent if tenant.parent_kind == "Organization" else None
        if tenant.parent_kind == "Team" and tenant.parent is not None:
            levels.append(("teams", tenant.parent))
            team = self.teams.get(tenant.parent)
            org = team.parent if team is not None else None
        if org is not None:
            levels.append(("organizations", org))
        names: list[str] = []
        for level, who in reversed(levels):
            names += [
                n for n, g in self.guardrails.items() if who in getattr(g.attach, level) and n not in names
            ]
        return tuple(names)

    def model_guardrails(self, model: str) -> tuple[str, ...]:
        """The Guardrails attached to a model (by its name or any of its aliases)."""
        entry = self.models[model]
        names = {model, *entry.spec.aliases}
        return tuple(n for n, g in self.guardrails.items() if names & set(g.attach.models))

    def published_guard(self) -> PublishedGuard:
        """Guardrails as routers are told them: every chain resolved here, once, so a router only reads it."""
        projects = {p: list(self.project_guardrails(p)) for p in self.projects}
        models = {m: list(self.model_guardrails(m)) for m in self.models}
        return PublishedGuard(
            enabled=self.cluster.guardrails_enabled,
            guardrails=dict(self.guardrails),
            projects={p: names for p, names in projects.items() if names},
            models={m: names for m, names in models.items() if names},
        )


def _listed(models: tuple[str, ...] | None) -> list[str] | None:
    return None if models is None else list(models)


def _adapters_of(adapters: Mapping[str, AdapterSpec], model: str) -> tuple[tuple[str, AdapterSpec], ...]:
    return tuple(sorted((n, a) for n, a in adapters.items() if a.base == model))


def _model_entry(
    doc: Model,
    labels: Mapping[str, str],
    adapters: Mapping[str, AdapterSpec],
    manifest: tuple[ManifestFile, ...] | None,
    shape: ModelShape | None,
) -> ModelEntry:
    """`doc` with each profile's fingerprint (its manifest and the adapters it carries are part of it)."""
    name = doc.metadata.name
    digest = None if manifest is None else manifest_digest(manifest)
    carried = _adapters_of(adapters, name)
    entries = tuple(
        ProfileEntry(p, profile_fingerprint(p, doc.spec, digest, carried)) for p in doc.spec.profiles
    )
    return ModelEntry(name, doc.spec, labels, entries, manifest, shape)


def _tenant(doc: Organization | Team | Project, labels: Mapping[str, str]) -> TenantEntry:
    parent: str | None = None
    parent_kind: str | None = None
    if isinstance(doc, Team):
        parent, parent_kind = doc.spec.organization, "Organization"
    elif isinstance(doc, Project):
        if doc.spec.team is not None:
            parent, parent_kind = doc.spec.team, "Team"
        else:
            parent, parent_kind = doc.spec.organization, "Organization"
    models = tuple(doc.spec.models) if doc.spec.models is not None else None
    quota = dict(doc.spec.gpu_quota) if isinstance(doc, Organization | Team) else {}
    retention = doc.spec.retention if isinstance(doc, Project) else None
    cache = doc.spec.response_cache if isinstance(doc, Project) else None
    return TenantEntry(
        doc.kind,
        doc.metadata.name,
        parent,
        parent_kind,
        models,
        doc.spec.limits,
        labels,
        quota,
        retention,
        cache,
        doc.spec.per_member,
        dict(doc.spec.capacity),
        tuple(doc.spec.residency) if isinstance(doc, Project) and doc.spec.residency is not None else None,
        isinstance(doc, Project) and doc.spec.no_store,
    )
