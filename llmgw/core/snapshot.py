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
    Disaggregation,
    GuardrailSpec,
    MetricMapping,
    OrganizationSpec,
    PersonSpec,
    Prices,
    ProjectSpec,
    RouterSettings,
    RoutingPolicySpec,
    SecretRef,
    TeamSpec,
)

__all__ = [
    "SNAPSHOT_SCHEMA_VERSION",
    "CanaryRoute",
    "Endpoint",
    "EndpointState",
    "PeerState",
    "PublishedAdapter",
    "PublishedGuard",
    "PublishedModel",
    "PublishedPeer",
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
    api: str = Field("openai", description="openai: sent the request as it came; comfyui: a ComfyUI server")
    workflow: str | None = Field(
        None, description="api comfyui: a built-in workflow's name or a JSON file's path"
    )


PeerState = Literal["up", "down", "withdrawn"]


class PublishedPeer(_Wire):
    """A peer's model offered here as PEER/MODEL (docs/routing.md, Federation): served through `provider`, the
    peer's router, with the hop header; `state` says whether it may be sent anything now."""

    name: str = Field(description="The peer (Cluster `peers[].name`)")
    region: str | None = Field(None, description="The peer's region, which a project's residency may list")
    state: PeerState = Field(
        "up",
        description="up: routed to; down: its /ready fails, out of routing until it answers again; withdrawn: "
        "the peer no longer offers the model, which a fallback still names",
    )
    why: str | None = Field(None, description="What made it down or withdrawn, in words")


class CanaryRoute(_Wire):
    """How a router splits a model's requests while a canary runs (the endpoints marked `canary`)."""

    weight: int = Field(0, ge=0, le=100, description="Percent of requests sent to the canary endpoints")
    header: str | None = Field(None, description="A request with this header goes to the canary")


class PublishedModel(_Wire):
    """A model as routers see it: what clients may ask for and how to route it."""

    aliases: list[str] = Field(default_factory=list)
    context_length: int = Field(ge=1)
    capabilities: list[Capability] = Field(
        default_factory=lambda: list(DEFAULT_CAPABILITIES),
        description="The effective set: its kind's defaults plus what it declares, less `without`",
    )
    without: list[Capability] = Field(
        default_factory=list, description="What it says it lacks: a request needing one is refused"
    )
    verified_only: bool = Field(
        False,
        description="A request needing a checked capability goes only to a replica whose check passed it "
        "(else: anywhere but a replica whose check failed it)",
    )
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
    peer: PublishedPeer | None = Field(
        None, description="Set on a peer's model (PEER/MODEL): whose, and its state"
    )
    canary: CanaryRoute | None = Field(None, description="While a canary runs: how its share is chosen")
    tokenizer_dir: str | None = Field(
        None,
        description="The Model's tokenizer_dir: a directory on the routers' machines with the model's "
        "tokenizer.json (and tokenizer_config.json), or a .gguf file, to hash prompts as its vLLM/SGLang replicas do; None: "
        "those replicas' prefixes are scored approximately",
    )
    disaggregation: Disaggregation | None = Field(
        None,
        description="Served in two steps: the prefill and decode pools' model names (never aliases) and what "
        "a failed decode does; None: a plain model",
    )


class PublishedAdapter(_Wire):
    """A LoRA adapter as routers see it (docs/lora.md): a model name served by its base model's replicas."""

    base: str = Field(description="The model whose replicas carry it")
    projects: list[str] | None = Field(None, description="Projects that may use it (None: as the base)")
    scale: float = Field(1.0, gt=0, description="llama.cpp: the scale it is applied with")
    path: str | None = Field(
        None, description="Its files' path on every node (a `path` source): what a runtime load names"
    )


class Tenants(_Wire):
    organizations: dict[str, OrganizationSpec] = Field(default_factory=dict)
    teams: dict[str, TeamSpec] = Field(default_factory=dict)
    projects: dict[str, ProjectSpec] = Field(default_factory=dict)
    people: dict[str, PersonSpec] = Field(
        default_factory=dict,
        description="The repo's Person documents: memberships and limits (docs/tenancy.md)",
    )


class PublishedGuard(_Wire):
    """The repo's Guardrails with every attachment resolved by the catalog: which apply to a project (its
    organization's, its team's and its own) and which to a model. A request goes through both lists."""

    enabled: bool = Field(True, description="The Cluster's guardrails_enabled: false turns every check off")
    guardrails: dict[str, GuardrailSpec] = Field(default_factory=dict)
    projects: dict[str, list[str]] = Field(default_factory=dict, description="Project -> guardrail names")
    models: dict[str, list[str]] = Field(default_factory=dict, description="Model -> guardrail names")


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
    adapters: list[str] = Field(
        default_factory=list, description="LoRA adapters it loaded at start, in order (llama.cpp's ids)"
    )
    canary: bool = Field(False, description="A canary replica: it takes only the model's canary share")
    verified: list[str] = Field(
        default_factory=list, description="Probes `llmgw model check` passed on this model and engine version"
    )
    failed: list[str] = Field(
        default_factory=list, description="Probes it failed: a request needing one is not sent here"
    )
    failed_details: dict[str, str] = Field(
        default_factory=dict, description="Per failed probe, what the check said (its hint), for refusals"
    )
    checking: bool = Field(
        False, description="A model check of this model and engine version is due or running (not yet known)"
    )
    kv_events: str | None = Field(
        None,
        description="http(s) URL of the replica's KV-cache event relay, read with its api_key (the agent's "
        "pass-through at /llmgw/kv-events; None: none)",
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
    guard: PublishedGuard = Field(default_factory=PublishedGuard)
    adapters: dict[str, PublishedAdapter] = Field(default_factory=dict, description="LoRA adapters by name")
    metric_mappings: dict[str, MetricMapping] = Field(
        default_factory=dict, description="Per-engine overrides of the built-in metric names"
    )
    reserved_secrets: list[str] = Field(
        default_factory=list,
        description="Names of the secrets the Cluster and Nodes use (the cluster secret, the agent token, SSH "
        "keys): a provider key naming one is refused whatever the binding map says (llmgw.core.config.secret_bindings)",
    )
    cluster: str | None = Field(
        None,
        description="This cluster's name (the Cluster document's): what the x-llmgw-hop header names it by, so "
        "a request that comes back to it through peers is refused (508)",
    )
    trace_salt: str | None = Field(
        None,
        description="What routers salt a usage row's prefix hash with (llmgw.core.traffic.recorded); None: each router "
        "uses a secret of its own, so hashes match only within one router process",
    )
