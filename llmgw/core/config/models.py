"""Pydantic models of the cluster repo: the source the JSON Schemas in schemas/ are generated from.

Every document is `apiVersion: llmgw/v1`, `kind`, `metadata`, `spec`. Models are frozen and forbid unknown keys
so a typo is an error, never a silently ignored field. Checks that need one document only live here; checks that
need the whole repo (names unique, fallbacks resolve, ...) live in llmgw.core.desired.catalog.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, model_validator

from llmgw.core.config.base import (
    API_VERSION as API_VERSION,
    CPU_ENGINES as CPU_ENGINES,
    NAME_PATTERN as NAME_PATTERN,
    Budget as Budget,
    Duration as Duration,
    EngineName as EngineName,
    Metadata as Metadata,
    Name as Name,
    SecretRef as SecretRef,
    Strict as Strict,
)
from llmgw.core.config.disaggregation import (
    Disaggregation as Disaggregation,
    ProfileRole as ProfileRole,
)
from llmgw.core.config.specs.adapter_spec import LORA_ENGINES as LORA_ENGINES, AdapterSpec as AdapterSpec
from llmgw.core.config.specs.cluster_spec import (
    AdmissionSettings as AdmissionSettings,
    ClusterSpec as ClusterSpec,
    ControllerSettings as ControllerSettings,
    GpuClass as GpuClass,
    MirrorSettings as MirrorSettings,
    RouterSettings as RouterSettings,
    SecuritySettings as SecuritySettings,
    TenancySettings as TenancySettings,
)
from llmgw.core.config.specs.engine_build_spec import (
    EngineBuildCheck as EngineBuildCheck,
    EngineOverride as EngineOverride,
)
from llmgw.core.config.specs.engine_spec import (
    CpuFlag as CpuFlag,
    EngineArchive as EngineArchive,
    EngineBuild as EngineBuild,
    EngineInstallSettings as EngineInstallSettings,
    EngineRequires as EngineRequires,
    EngineSettings as EngineSettings,
    MetricMapping as MetricMapping,
)
from llmgw.core.config.specs.eval_spec import CanarySpec as CanarySpec, EvalSuiteSpec as EvalSuiteSpec
from llmgw.core.config.specs.facility_spec import (
    FACILITY_LABEL_PREFIX as FACILITY_LABEL_PREFIX,
    FACILITY_LEVELS as FACILITY_LEVELS,
    DomainRef as DomainRef,
    FacilityLevel as FacilityLevel,
    FacilitySettings as FacilitySettings,
)
from llmgw.core.config.specs.guardrail_spec import GuardrailSpec as GuardrailSpec
from llmgw.core.config.specs.listener_spec import ListenerSettings as ListenerSettings
from llmgw.core.config.specs.node_spec import (
    NodeAgentSettings as NodeAgentSettings,
    NodeSpec as NodeSpec,
    SshSettings as SshSettings,
)
from llmgw.core.config.specs.notification_spec import (
    NOTIFICATION_EVENTS as NOTIFICATION_EVENTS,
    NotificationEvent as NotificationEvent,
    NotificationFormat as NotificationFormat,
    NotificationRetry as NotificationRetry,
    NotificationSpec as NotificationSpec,
)
from llmgw.core.config.specs.plan_spec import (
    PlanSettings as PlanSettings,
    SimulateSettings as SimulateSettings,
)
from llmgw.core.config.specs.prefix_spec import PrefixSettings as PrefixSettings
from llmgw.core.config.specs.serving.slo_spec import Slo as Slo, SloTargets as SloTargets
from llmgw.core.config.specs.source_spec import (
    BUILTIN_WORKFLOWS as BUILTIN_WORKFLOWS,
    Provider as Provider,
    ProviderApi as ProviderApi,
    Source as Source,
)
from llmgw.core.config.specs.tenant.cache_spec import ResponseCacheSpec as ResponseCacheSpec
from llmgw.core.config.specs.tenant.person_spec import (
    MembershipSpec as MembershipSpec,
    PersonLimits as PersonLimits,
    PersonSpec as PersonSpec,
)
from llmgw.core.config.specs.tenant.quota_spec import (
    CAPACITY_DESCRIPTION as CAPACITY_DESCRIPTION,
    CPU_CLASS as CPU_CLASS,
    Amounts as Amounts,
    Capacity as Capacity,
    ClassCapacity as ClassCapacity,
)
from llmgw.core.config.specs.tenant.retention_spec import ContentRetention as ContentRetention
from llmgw.core.config.specs.tenant.tenant_spec import (
    GPU_QUOTA_DESCRIPTION as GPU_QUOTA_DESCRIPTION,
    PER_MEMBER_DESCRIPTION as PER_MEMBER_DESCRIPTION,
    GpuQuota as GpuQuota,
    Limits as Limits,
    OrganizationSpec as OrganizationSpec,
    ProjectSpec as ProjectSpec,
    TeamSpec as TeamSpec,
)

# ---------------------------------------------------------------------------------------------------- Model

Capability = Literal[
    "chat",
    "completions",
    "embeddings",
    "tools",
    "vision",
    "rerank",
    "score",
    "images",
    "transcriptions",
    "translations",
]
CAPABILITY_ORDER: tuple[Capability, ...] = get_args(Capability)
ArgValue = str | int | float | bool
ModelKind = Literal["chat", "embeddings", "rerank", "images", "audio"]
# What a model of each kind serves unless it says it lacks it (`without`); declared capabilities add to these.
# A chat model is assumed to take tools (the gateway forwards a tools array to any chat model; the model check
# verifies it on each engine version): docs/router.md, Capabilities.
KIND_CAPABILITIES: dict[ModelKind, tuple[Capability, ...]] = {
    "chat": ("chat", "completions", "tools"),
    "embeddings": ("embeddings",),
    "rerank": ("rerank", "score"),
    "images": ("images",),
    "audio": ("transcriptions", "translations"),
}
DEFAULT_CAPABILITIES: tuple[Capability, ...] = KIND_CAPABILITIES["chat"]
# The capabilities that are API endpoints: a model serves only those in its effective set (its kind's, plus
# what it declares). The others (tools, vision) are features of a chat request.
ENDPOINT_CAPABILITIES: frozenset[str] = frozenset(
    {"chat", "completions", "embeddings", "rerank", "score", "images", "transcriptions", "translations"}
)


def model_kind(declared: Sequence[str]) -> ModelKind:
    """A model's kind, from what it declares: chat unless it declares only embeddings or only rerank/score
    among the endpoints (an embedding or a rerank model)."""
    if "chat" in declared or "completions" in declared:
        return "chat"
    if "embeddings" in declared:
        return "embeddings"
    if "rerank" in declared or "score" in declared:
        return "rerank"
    if "images" in declared:
        return "images"
    if "transcriptions" in declared or "translations" in declared:
        return "audio"
    return "chat"


def effective_capabilities(declared: Sequence[str], without: Sequence[str]) -> list[Capability]:
    """What the model serves: its kind's defaults plus what it declares, less what it says it lacks; in
    the Capability order (a stable listing)."""
    has = {*KIND_CAPABILITIES[model_kind(declared)], *declared} - set(without)
    return [c for c in CAPABILITY_ORDER if c in has]


class Prices(Strict):
    """What a model costs, charged against tenant budgets."""

    input_per_million: float = Field(0.0, ge=0, description="Price of one million prompt tokens")
    output_per_million: float = Field(0.0, ge=0, description="Price of one million completion tokens")
    per_image: float = Field(0.0, ge=0, description="Price of one picture made (an images model)")
    per_audio_minute: float = Field(
        0.0, ge=0, description="Price of one minute of audio transcribed or translated"
    )


class Scaling(Strict):
    """How many replicas run: min <= max; min 0 makes the model on demand (needs idle_timeout)."""

    min: int = Field(1, ge=0, description="Replicas kept running; 0 makes the model on demand")
    max: int = Field(1, ge=0, description="Most replicas")
    idle_timeout: Duration | None = Field(None, description="Unused this long, replicas above min stop")


RolloutStrategy = Literal["rolling", "canary"]
RolloutOnChange = Literal["manual", "restart"]


class Rollout(Strict):
    """How a model's replicas are replaced: make-before-break, a few at a time."""

    strategy: RolloutStrategy = Field(
        "rolling", description="rolling: replace replicas a few at a time; canary: gate the change first"
    )
    canary: CanarySpec | None = Field(None, description="The canary's share, duration and gates")
    max_surge: int = Field(
        1, ge=0, description="Replicas started beside the old ones before they stop (above the target)"
    )
    max_unavailable: int = Field(
        0, ge=0, description="Ready replicas that may be missing below the target while rolling"
    )
    on_change: RolloutOnChange = Field(
        "manual",
        description="What a changed profile does: manual (replicas are shown stale until `llmgw restart`) "
        "or restart (they are rolled at once)",
    )


class Profile(Strict):
    """One way to run a replica: engine, resources, parallelism. No gpu_class means a CPU profile."""

    name: Name = Field(description="Name of the profile, unique within the model")
    engine: EngineName = Field(description="Engine that runs the replica")
    gpu_class: str | None = Field(None, description="GPU class such as h100-80g; unset means CPU")
    gpus: int = Field(0, ge=0, description="GPUs per node")
    tp: int = Field(1, ge=1, description="Tensor parallel size")
    pp: int = Field(1, ge=1, description="Pipeline parallel size")
    nodes: int = Field(1, ge=1, description="Nodes per replica (multi-node profiles)")
    min_memory_gb: float | None = Field(None, ge=0, description="Host memory the replica needs per node")
    cpu_cores: int | None = Field(None, ge=1, description="CPU cores per node (llama.cpp threads)")
    disk_gb: float | None = Field(
        None, ge=0, description="Disk for the weights (skipped where already present)"
    )
    slots: int | None = Field(
        None, ge=1, description="Concurrent sequences (llama.cpp -np, vLLM max-num-seqs)"
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Labels a node must carry")
    engine_version: str | None = Field(None, description="Engine version the node must have installed")
    weight: float = Field(1.0, gt=0, description="Relative capacity, used by the `weight` scorer")
    role: ProfileRole = Field(
        "both",
        description="both: a plain replica; prefill or decode: a replica of a disaggregated model's pool "
        "(the model named by another's `disaggregation`)",
    )
    args: dict[str, ArgValue] = Field(default_factory=dict, description="Engine-specific options")
    keep_within: FacilityLevel | None = Field(
        None,
        description="A multi-node replica's nodes all stand in one domain of this level (rack, pdu, row, "
        "room, site; nodes say where with `llmgw.io/<level>` labels); unset: anywhere on one fabric",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Extra environment for the engine: only the engine's allowlisted tuning names (see the Engine"
            " environment section of docs/cluster-repo.md)"
        ),
    )


class ModelSpec(Strict):
    """What the model is and how it may run."""

    aliases: list[Name] = Field(default_factory=list, description="Other names clients may ask for")
    source: Source | None = Field(None, description="Where the weights come from (not needed by sim)")
    provider: Provider | None = Field(None, description="Served by an external provider instead of replicas")
    context_length: int = Field(ge=1, description="Longest prompt plus completion, in tokens")
    max_output_tokens: int | None = Field(
        None,
        ge=1,
        description="Longest completion a request may ask for; also what a request that names no "
        "max_tokens reserves and is sent (unset: the context length minus the prompt)",
    )
    tokenizer_dir: str | None = Field(
        None,
        description="A directory on the routers' machines holding the model's tokenizer.json and "
        "tokenizer_config.json (the source's tokenizer files), or a .gguf file there (its vocabulary), so "
        "precise prefix routing hashes prompts as its vLLM/SGLang replicas do; unset or unloadable: their "
        "prefixes are scored approximately",
    )
    capabilities: list[Capability] = Field(
        default_factory=list,
        description="What the model serves beyond its kind's defaults, which these add to (a chat model: chat, "
        "completions, tools; declaring only embeddings makes an embedding model: embeddings; only rerank or "
        "score, a rerank model: rerank, score)",
    )
    without: list[Capability] = Field(
        default_factory=list,
        description="What the model lacks, removed from its kind's defaults: a request needing one is refused "
        "(e.g. [vision], or [tools] for a base model)",
    )
    verified_only: bool | None = Field(
        None,
        description="Send a request needing a checked capability (tools, a json_schema answer) only to a "
        "replica whose model check passed it (unset: the Cluster's `verified_only`; false: forwarded unless "
        "the check failed)",
    )
    prices: Prices = Field(default_factory=Prices)
    scaling: Scaling = Field(default_factory=Scaling)
    slo: Slo | None = Field(
        None, description="Latency objective (unset: capacity is the profile's slots, no TTFT target)"
    )
    fallbacks: list[str] = Field(
        default_factory=list, description="Models tried in order when this one cannot"
    )
    model_class: str | None = Field(
        None,
        alias="class",
        description="Capacity class: one of the Cluster's `classes` when it declares them (free-form otherwise)",
    )
    owner: str | None = Field(
        None,
        description="Project, Team or Organization responsible; the GPU quotas and capacity (guarantees, "
        "limits) of the tenant of this name, and of those above it, count this model's replicas",
    )
    routing_policy: str | None = Field(
        None, description="RoutingPolicy for this model (default: the cluster's)"
    )
    rollout: Rollout = Field(default_factory=Rollout, description="How replicas are restarted and rolled")
    restart_on_profile_change: bool | None = Field(
        None,
        description="Deprecated: write `rollout: {on_change: restart}` (true) or leave it out (false)",
    )
    profiles: list[Profile] = Field(
        default_factory=list, description="Ways this model can run, in preference order"
    )
    role: Literal["guard"] | None = Field(
        None, description="guard: a judge model Guardrails may ask (prompted in Llama Guard 3's format)"
    )
    disaggregation: Disaggregation | None = Field(
        None,
        description="Serve requests in two steps: prefill on one model's replicas, decode on another's "
        "(docs/routing.md, Disaggregated serving)",
    )

    @model_validator(mode="after")
    def _pictures_from_comfyui(self) -> ModelSpec:
        # Only a ComfyUI server makes pictures here, and it makes nothing else.
        comfyui = self.provider is not None and self.provider.api == "comfyui"
        if comfyui and self.capabilities != ["images"]:
            raise ValueError(
                "a model with `provider.api: comfyui` makes pictures only: write `capabilities: [images]`"
            )
        if "images" in self.capabilities and not comfyui:
            raise ValueError(
                "`images` is served only through a ComfyUI server: give the model "
                "`provider: {api: comfyui, url: http://HOST:8188, model: NAME}`"
            )
        return self

    @property
    def effective_capabilities(self) -> list[Capability]:
        """Its kind's defaults plus `capabilities`, less `without` (`effective_capabilities`)."""
        return effective_capabilities(self.capabilities, self.without)

    @property
    def restarts_on_change(self) -> bool:
        """Whether a changed profile rolls at once: `rollout.on_change`, or the deprecated flag when the
        block does not say (validate warns about the flag and says what to write instead)."""
        if "on_change" in self.rollout.model_fields_set:
            return self.rollout.on_change == "restart"
        return bool(self.restart_on_profile_change)


# ---------------------------------------------------------------------------------------------------- Routing

Picker = Literal["max_score", "p2c", "softmax", "round_robin", "random"]


class ScorerWeights(Strict):
    """Weights of the scorers the router adds up for each endpoint (0 turns one off)."""

    queue: float = Field(0.0, ge=0, description="Prefer endpoints with fewer waiting requests")
    kv: float = Field(0.0, ge=0, description="Prefer endpoints with free KV cache")
    inflight: float = Field(0.0, ge=0, description="Prefer endpoints with fewer requests in flight from us")
    load: float = Field(0.0, ge=0, description="Prefer endpoints with lower running/slots")
    weight: float = Field(0.0, ge=0, description="Prefer endpoints whose profile weight is higher")
    session: float = Field(0.0, ge=0, description="Prefer the endpoint a session hashes to (bounded load)")
    prefix: float = Field(
        0.0, ge=0, description="Prefer endpoints holding more of the prompt's leading blocks in their cache"
    )


class SessionSettings(Strict):
    """How the session scorer recognises a conversation."""

    header: str = Field("x-session-id", description="Request header that names a session")
    use_user_field: bool = Field(True, description="Use the request's `user` field when no header is sent")
    prefix_messages: int = Field(2, ge=1, description="Else hash the conversation's first N messages")
    load_bound: float = Field(
        1.25,
        gt=1.0,
        description="A session moves when its endpoint's in-flight requests pass this times the mean "
        "(or, when larger, this times the endpoint's slots)",
    )


class RoutingPolicySpec(Strict):
    """How the router picks an endpoint among a model's ready replicas."""

    picker: Picker = Field("p2c", description="How to choose among scored endpoints")
    weights: ScorerWeights = Field(default_factory=ScorerWeights)
    kv_ceiling: float = Field(0.9, gt=0, le=1, description="KV use above this is a hard penalty")
    softmax_temperature: float = Field(1.0, gt=0, description="Temperature of the softmax picker")
    session: SessionSettings = Field(default_factory=SessionSettings)
    prefix: PrefixSettings = Field(default_factory=PrefixSettings)


# ---------------------------------------------------------------------------------------------------- Documents


class _Document(Strict):
    api_version: Literal["llmgw/v1"] = Field(alias="apiVersion", description="Always llmgw/v1")
    metadata: Metadata


class Cluster(_Document):
    """Cluster-wide settings: controller, router, engines, cluster secret. Exactly one per repo."""

    kind: Literal["Cluster"]
    spec: ClusterSpec = Field(default_factory=ClusterSpec)


class Node(_Document):
    """A machine with an agent."""

    kind: Literal["Node"]
    spec: NodeSpec


def node_document(name: str, labels: Mapping[str, str], spec: Mapping[str, Any] | NodeSpec) -> dict[str, Any]:
    """A Node document as the repo holds it: what `llmgw node add` writes, and what the controller rebuilds from
    a catalog entry to reach the node (`NodeEntry.document`). `Node.model_validate` checks it."""
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = dict(labels)
    return {"apiVersion": API_VERSION, "kind": "Node", "metadata": metadata, "spec": spec}


class Model(_Document):
    """A name clients ask for, and the ways it may run."""

    kind: Literal["Model"]
    spec: ModelSpec


class RoutingPolicy(_Document):
    """Scorer weights and a picker: how the router chooses an endpoint."""

    kind: Literal["RoutingPolicy"]
    spec: RoutingPolicySpec = Field(default_factory=RoutingPolicySpec)


class Organization(_Document):
    """Top of the tenant tree; its limits pool everything beneath it."""

    kind: Literal["Organization"]
    spec: OrganizationSpec = Field(default_factory=OrganizationSpec)


class Team(_Document):
    """A team in an organization; its limits pool its projects."""

    kind: Literal["Team"]
    spec: TeamSpec


class Project(_Document):
    """What an API key is bound to."""

    kind: Literal["Project"]
    spec: ProjectSpec


class Person(_Document):
    """A person: their email and the organizations, teams and projects they belong to. Never a credential."""

    kind: Literal["Person"]
    spec: PersonSpec


class Adapter(_Document):
    """A LoRA adapter on a base model, asked for by its own name (docs/lora.md)."""

    kind: Literal["Adapter"]
    spec: AdapterSpec


class Notification(_Document):
    """A webhook for events operators want to be told of (signed, retried, never lost across a restart)."""

    kind: Literal["Notification"]
    spec: NotificationSpec


class Guardrail(_Document):
    """Input and output checks (deterministic ones and a judge model), attached to tenants or models."""

    kind: Literal["Guardrail"]
    spec: GuardrailSpec


class EvalSuite(_Document):
    """Prompts with checks: run by `llmgw eval` and as a canary's gates."""

    kind: Literal["EvalSuite"]
    spec: EvalSuiteSpec


Document = Annotated[
    Cluster
    | Node
    | Model
    | RoutingPolicy
    | Organization
    | Team
    | Project
    | Person
    | Notification
    | Guardrail
    | Adapter
    | EvalSuite,
    Field(discriminator="kind"),
]
DOCUMENT_KINDS: dict[str, type[_Document]] = {
    "Cluster": Cluster,
    "Node": Node,
    "Model": Model,
    "RoutingPolicy": RoutingPolicy,
    "Organization": Organization,
    "Team": Team,
    "Project": Project,
    "Person": Person,
    "Notification": Notification,
    "Guardrail": Guardrail,
    "Adapter": Adapter,
    "EvalSuite": EvalSuite,
}


def document_kind(raw: Any) -> str | None:
    """The `kind` of a raw document, when it names a known one."""
    if isinstance(raw, dict):
        kind = raw.get("kind")
        if isinstance(kind, str) and kind in DOCUMENT_KINDS:
            return kind
    return None
