"""The router's view of the world: the routing table built from one snapshot, and live endpoint records.

A `RoutingTable` is immutable and replaced whole on every snapshot, so a request that started under one
revision finishes under it. `LiveEndpoint` records outlive snapshots (same replica id, same address): their
inflight count, last scrape and breaker carry over, so a push does not make every endpoint look idle.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from llmgw_agent.engines import metric_mapping

from llmgw.core.config.models import Disaggregation, RoutingPolicySpec
from llmgw.core.snapshot import Endpoint, PublishedModel, RouterSnapshot
from llmgw.core.tenancy.people import person_chain
from llmgw.core.tenancy.projects import TenantChain, allowed, tenant_chain
from llmgw.core.words import parse_duration
from llmgw_router.decisions.breaker import BreakerState
from llmgw_router.decisions.capabilities import vision_matters
from llmgw_router.decisions.scheduler import Candidate
from llmgw_router.decisions.scrape_parse import MetricNames, Sample

__all__ = ["LiveEndpoint", "RoutingTable", "metric_names_for"]

log = logging.getLogger(__name__)
_DEFAULT_POLICY = RoutingPolicySpec()


def metric_names_for(snapshot: RouterSnapshot, engine: str) -> tuple[MetricNames, str]:
    """The names and default metrics path of `engine`: the snapshot's override, else the agent's mapping."""
    try:
        builtin = metric_mapping(engine)
        path = builtin.metrics_path
        names = MetricNames(
            builtin.running, builtin.waiting, builtin.kv_usage, tuple(builtin.kv_usage_alternatives)
        )
    except KeyError:
        path, names = "/metrics", MetricNames("vllm:num_requests_running", "vllm:num_requests_waiting")
    override = snapshot.metric_mappings.get(engine)
    if override is not None:  # an override is a complete statement: blanks stay blank
        names = MetricNames(override.running, override.waiting, override.kv_usage)
    return names, path


@dataclass(eq=False)
class LiveEndpoint:
    """One endpoint as the router lives with it. Providers are endpoints too: never scraped, never stale."""

    spec: Endpoint
    api_base: str  # URL prefix that /chat/completions etc. are appended to
    names: MetricNames | None  # None: not scraped (an external provider)
    metrics_url: str | None
    added_at: float
    upstream_model: str | None = None  # a provider's own name for the model
    provider_key: str | None = None
    sample: Sample | None = None
    last_scraped: float | None = None
    inflight: int = 0
    breaker: BreakerState = field(default_factory=BreakerState)
    violation: tuple[str, ...] = ()
    scrape_error: str | None = None

    @property
    def id(self) -> str:
        return self.spec.replica_id

    @property
    def is_provider(self) -> bool:
        return self.names is None

    def stale(self, now: float, stale_after: float) -> bool:
        if self.is_provider:
            return False
        return now - (self.last_scraped if self.last_scraped is not None else self.added_at) > stale_after

    def candidate(self, now: float, stale_after: float) -> Candidate:
        s, spec = self.sample, self.spec
        # `stale` inline: once per endpoint on every request.
        scraped = self.last_scraped if self.last_scraped is not None else self.added_at
        return Candidate(
            id=spec.replica_id,
            inflight=self.inflight,
            running=None if s is None else s.running,
            waiting=None if s is None else s.waiting,
            kv_usage=None if s is None else s.kv_usage,
            slots=spec.slots,
            weight=spec.weight,
            ready=spec.state == "ready",
            breaker_open=self.breaker.is_open(now),
            stale=self.names is not None and now - scraped > stale_after,
        )


@dataclass(frozen=True)
class RoutingTable:
    snapshot: RouterSnapshot
    lookup: dict[str, str]  # name or alias -> model name
    names_of: dict[str, tuple[str, ...]]  # model -> its name and aliases
    endpoints: dict[str, tuple[LiveEndpoint, ...]]  # model -> endpoints (providers included)
    scrape_interval: float
    stale_after: float
    admission_timeout: float
    load_timeout: float  # the hold for a model with no replica yet, when its load time is not measured
    peered: bool = False  # a model is a peer's (PEER/MODEL): the request path asks the federation rules
    # The models served in two steps, with their pairings: read on every request (most snapshots: none).
    disaggregated: dict[str, Disaggregation] = field(default_factory=dict)
    # The models whose chat requests are searched for images (`vision_matters`): decided once per snapshot,
    # not walked down the fallback chain on every request.
    vision_checked: frozenset[str] = frozenset()
    # The snapshot's models, read a dozen times a request: a field of the table, not a property reading the
    # snapshot's (whose every attribute read goes through pydantic's __getattr__ hook).
    models: dict[str, PublishedModel] = field(init=False, compare=False, repr=False)
    # Decisions that depend only on this snapshot, memoised: the request path asks the same few questions.
    _allowed: dict[tuple[str, str, str], bool] = field(default_factory=dict, compare=False, repr=False)
    _chains: dict[str, TenantChain | None] = field(default_factory=dict, compare=False, repr=False)
    _person_chains: dict[tuple[str, str], TenantChain] = field(
        default_factory=dict, compare=False, repr=False
    )
    _policies: dict[str, RoutingPolicySpec] = field(default_factory=dict, compare=False, repr=False)
    _steered: dict[tuple[str, ...], tuple[bool, bool]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", self.snapshot.models)  # in __init__: the same keys as every table

    def allowed(self, project: str, model: str, asked_as: str) -> bool:
        """May `project` use `model` (asked for by the name `asked_as`)? Per the snapshot's tenants."""
        key = (project, model, asked_as)
        found = self._allowed.get(key)
        if found is None:
            if len(self._allowed) > 100_000:
                self._allowed.clear()
            names = self.names_of[model] + ((asked_as,) if asked_as != model else ())
            found = self._allowed[key] = allowed(self.snapshot.tenants, project, names)
        return found

    def chain(self, project: str) -> TenantChain | None:
        if project not in self._chains:
            if len(self._chains) > 100_000:
                self._chains.clear()
            self._chains[project] = tenant_chain(self.snapshot.tenants, project)
        return self._chains[project]

    def person_chain(self, project: str, person: str) -> TenantChain:
        """`project`'s chain with `person`'s shares and own limits after it (the project is in the tenants).
        One object per (project, person) and snapshot: the limiter keys its plans by the chain's identity."""
        key = (project, person)
        found = self._person_chains.get(key)
        if found is None:
            base = self.chain(project)
            assert base is not None, "a project of the snapshot's tenants"
            if len(self._person_chains) > 100_000:
                self._person_chains.clear()
            found = self._person_chains[key] = person_chain(base, person, self.snapshot.tenants)
        return found

    def steered(self, chain: tuple[str, ...]) -> tuple[bool, bool]:
        """Whether a model of `chain` declares vision (its check decides images), and whether one has a
        canary: what path.steering asks of every request, once per chain and snapshot."""
        found = self._steered.get(chain)
        if found is None:
            if len(self._steered) > 100_000:
                self._steered.clear()
            models = [self.models[m] for m in chain if m in self.models]
            found = self._steered[chain] = (
                any("vision" in m.capabilities for m in models),
                any(m.canary is not None for m in models),
            )
        return found

    def resolve(self, name: str) -> str | None:
        return self.lookup.get(name)

    def policy_for(self, model: str) -> RoutingPolicySpec:
        """`model`'s routing policy (its own, else the router's default, else the built-in), once per model
        and snapshot: asked three times a request."""
        found = self._policies.get(model)
        if found is None:
            if len(self._policies) > 100_000:
                self._policies.clear()
            published = self.snapshot.models.get(model)
            name = (published.routing_policy if published else None) or self.snapshot.router.default_policy
            found = _DEFAULT_POLICY if name is None else self.snapshot.policies.get(name, _DEFAULT_POLICY)
            self._policies[model] = found
        return found

    def all_endpoints(self) -> list[LiveEndpoint]:
        return [ep for eps in self.endpoints.values() for ep in eps]

    @classmethod
    def build(
        cls,
        snapshot: RouterSnapshot,
        previous: dict[str, LiveEndpoint],
        now: float,
        provider_keys: dict[str, str | None],
    ) -> RoutingTable:
        lookup: dict[str, str] = {}
        names_of: dict[str, tuple[str, ...]] = {}
        for name, model in snapshot.models.items():
            names_of[name] = (name, *model.aliases)
            lookup[name] = name
        for name, model in snapshot.models.items():
            for alias in model.aliases:
                lookup.setdefault(alias, name)  # a model's own name wins over another's alias
        by_model: dict[str, list[LiveEndpoint]] = {name: [] for name in snapshot.models}
        for ep in snapshot.endpoints:
            if ep.model not in by_model:
                log.warning("endpoint %s serves unknown model %r; ignored", ep.replica_id, ep.model)
                continue
            by_model[ep.model].append(_live(snapshot, ep, previous.get(ep.replica_id), now))
        for name, model in snapshot.models.items():
            # A peer's model while its peer is down or it is withdrawn: no endpoint, out of routing (its
            # fallbacks serve; llmgw_router.decisions.federation says why when none can).
            if model.provider is not None and (model.peer is None or model.peer.state == "up"):
                kind = "provider" if model.peer is None else "peer"  # usage's endpoint names the peer
                spec = Endpoint(
                    replica_id=f"{kind}:{name}", model=name, engine=kind, base_url=model.provider.url
                )
                old = previous.get(spec.replica_id)
                live = LiveEndpoint(
                    spec,
                    model.provider.url.rstrip("/"),
                    None,
                    None,
                    now,
                    upstream_model=model.provider.model,
                    provider_key=provider_keys.get(name),
                )
                if old is not None and old.spec == spec:
                    live.inflight, live.breaker = old.inflight, old.breaker
                by_model[name].append(live)
        settings = snapshot.router
        return cls(
            snapshot=snapshot,
            lookup=lookup,
            names_of=names_of,
            endpoints={k: tuple(v) for k, v in by_model.items()},
            scrape_interval=parse_duration(settings.scrape_interval),
            stale_after=parse_duration(settings.stale_after),
            admission_timeout=parse_duration(settings.admission.timeout),
            load_timeout=parse_duration(settings.admission.load_timeout),
            peered=any(m.peer is not None for m in snapshot.models.values()),
            disaggregated={n: m.disaggregation for n, m in snapshot.models.items() if m.disaggregation},
            vision_checked=frozenset(n for n in snapshot.models if vision_matters(snapshot.models, n)),
        )


def _live(snapshot: RouterSnapshot, ep: Endpoint, old: LiveEndpoint | None, now: float) -> LiveEndpoint:
    names, default_path = metric_names_for(snapshot, ep.engine)
    base = ep.base_url.rstrip("/")
    metrics_url = base + (ep.metrics_path or default_path)
    if old is not None and old.spec.base_url == ep.base_url and old.spec.engine == ep.engine:
        old.spec = ep  # weight, slots, state and key may change; live readings carry over
        old.names, old.metrics_url = names, metrics_url
        return old
    return LiveEndpoint(ep, base + "/v1", names, metrics_url, now)
