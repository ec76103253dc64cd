"""What the controller publishes to routers, and what a static snapshot file holds.

`RouterSnapshot` is the whole state a router needs: router settings, the models as clients see them, routing
policies, tenants and the ready endpoints. The controller fills it from the Catalog and its live replicas; a
router with no controller reads it from a JSON (or YAML) file. It is self-contained on purpose: parsing it needs
only the config models, never the Catalog, so the router does not need the cluster repo.

Every push is a complete snapshot (never a delta): a router that missed one is correct again after the next.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from llmgw.core.config.models import (
    DEFAULT_CAPABILITIES,
    Capability,
    MetricMapping,
    OrganizationSpec,
    Prices,
    ProjectSpec,
    RouterSettings,
    RoutingPolicySpec,
    SecretRef,
    TeamSpec,
)

__all__ = [
    "SNAPSHOT_SCHEMA_VERSION",
    "Endpoint",
    "EndpointState",
    "PublishedModel",
    "PublishedProvider",
    "RouterSnapshot",
    "Tenants",
]

SNAPSHOT_SCHEMA_VERSION = 1

EndpointState = Literal["ready", "draining", "starting"]


class _Wire(BaseModel):
    # Unknown keys are ignored on the wire: a newer controller may publish fields an older router does not
    # know, and the router must keep serving rather than refuse the snapshot.
    model_config = ConfigDict(extra="ignore", frozen=True)


class PublishedProvider(_Wire):
    """An external OpenAI-compatible service serving a model (or a fallback) instead of replicas."""

    url: str = Field(description="Base URL including /v1, e.g. https://api.example.com/v1")
    model: str = Field(description="Model name at the provider; the router rewrites requests to it")
    key: SecretRef | None = Field(None, description="Where the provider's key is; read by the router")


class PublishedModel(_Wire):
    """A model as routers see it: what clients may ask for and how to route it."""

    aliases: list[str] = Field(default_factory=list)
    context_length: int = Field(ge=1)
    capabilities: list[Capability] = Field(default_factory=lambda: list(DEFAULT_CAPABILITIES))
    prices: Prices = Field(default_factory=Prices)
    max_output_tokens: int | None = Field(
        None, ge=1, description="Completion cap: reserved and sent when a request names no max_tokens"
    )
    fallbacks: list[str] = Field(
        default_factory=list,
        description="The resolved fallback chain (Catalog.fallback_chain): model names, never aliases, "
        "transitive, in order. The router tries exactly these, skipping the ones a project may not use",
    )
    routing_policy: str | None = Field(None, description="Policy name; None means the router's default")
    on_demand: bool = Field(
        False, description="Catalog's on_demand (scaling min 0, max > 0): the first request asks for a load"
    )
    simulated: bool = Field(False, description="Served by the sim engine (published as such in /v1/models)")
    load_seconds: float | None = Field(
        None, ge=0, description="Measured time from start to ready of a replica; None: not measured"
    )
    starting: int = Field(
        0,
        ge=0,
        description="Replicas of it starting now (a load or a scale-up): routers hold requests for them",
    )
    class_rank: int | None = Field(
        None,
        ge=0,
        description="The model's class's place in the Cluster's ordered classes (0 first): its admission "
        "band; None: unranked, after every ranked class",
    )
    provider: PublishedProvider | None = None


class Tenants(_Wire):
    organizations: dict[str, OrganizationSpec] = Field(default_factory=dict)
    teams: dict[str, TeamSpec] = Field(default_factory=dict)
    projects: dict[str, ProjectSpec] = Field(default_factory=dict)


class Endpoint(_Wire):
    """A replica the router may send requests to."""

    replica_id: str
    model: str
    engine: str = Field(description="sim, llamacpp, vllm, sglang or trtllm: picks the metric mapping")
    base_url: str = Field(description="http://host:port of the engine (without /v1)")
    metrics_path: str | None = Field(None, description="Path of Prometheus metrics (default: the engine's)")
    api_key: str | None = Field(None, description="The engine's own key; never the client's")
    weight: float = Field(1.0, gt=0)
    slots: int | None = Field(None, ge=1, description="Concurrent sequences; None when unknown")
    simulated: bool = False
    state: EndpointState = "ready"
    kv_events: str | None = Field(
        None, description="tcp://host:port of the engine's KV-cache event publisher (None: none)"
    )
    kv_block_size: int = Field(16, ge=1, description="Tokens per KV-cache block, to hash prompts as it does")


class RouterSnapshot(_Wire):
    schema_version: int = SNAPSHOT_SCHEMA_VERSION
    revision: str = Field(description="Cluster repo revision this snapshot was built from")
    router: RouterSettings = Field(default_factory=RouterSettings)
    models: dict[str, PublishedModel] = Field(default_factory=dict)
    policies: dict[str, RoutingPolicySpec] = Field(default_factory=dict)
    tenants: Tenants = Field(default_factory=Tenants)
    endpoints: list[Endpoint] = Field(default_factory=list)
    metric_mappings: dict[str, MetricMapping] = Field(
        default_factory=dict, description="Per-engine overrides of the built-in metric names"
    )
