"""The Cluster kind's spec: the controller, the routers, admission, tenancy defaults, security, the weights mirror
and the GPU classes (one document per repo)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from llmgw.core.config.base import (
    Duration,
    EngineName,
    Name,
    SecretRef,
    Strict,
)
from llmgw.core.config.specs.console_spec import ConsoleSettings
from llmgw.core.config.specs.engine_build_spec import EngineOverride
from llmgw.core.config.specs.engine_spec import (
    EngineSettings,
)
from llmgw.core.config.specs.facility_spec import FacilitySettings
from llmgw.core.config.specs.listener_spec import ListenerSettings
from llmgw.core.config.specs.peer_spec import Peer
from llmgw.core.config.specs.plan_spec import (
    PlanSettings,
)
from llmgw.core.config.specs.serving.cost_spec import Costs, unknown_gpu_classes
from llmgw.core.words import DURATION_PATTERN, parse_duration


class ControllerSettings(Strict):
    """Where the controller listens and how it judges node health."""

    address: str = Field(
        "127.0.0.1:7070", description="host:port where agents, routers and `llmgw plan` reach it"
    )
    metrics_listen: str = Field(
        "127.0.0.1:9090", description="host:port of the controller's Prometheus listener"
    )
    heartbeat_interval: Duration = Field("5s", description="How often agents heartbeat")
    unreachable_after: Duration = Field(
        "20s", description="Missed heartbeats for this long: node Unreachable"
    )
    lost_after: Duration = Field("5m", description="Unreachable for this long: node Lost, its replicas move")
    resync_interval: Duration = Field("30s", description="Full reconcile pass even when nothing changed")
    token: SecretRef | None = Field(
        None, description="Shared token agents and routers present (development mode)"
    )


class AdmissionSettings(Strict):
    """The router's queue for requests that find no free capacity."""

    queue_size: int = Field(256, ge=0, description="Requests that may wait across all models before 429")
    model_queue_size: int = Field(128, ge=0, description="Requests that may wait for one model before 429")
    timeout: Duration = Field(
        "30s", description="Longest a request waits for a busy model's replicas before 429 queue_timeout"
    )
    load_timeout: Duration = Field(
        "120s",
        description="Longest a request waits for a model with no replica yet (on demand, scaling up) before "
        "503 model_loading, when its load time is not measured (measured: 1.5 x the load time + 5 s)",
    )


RequestFieldName = Annotated[
    str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="A top-level request body field")
]
TagKey = Annotated[
    str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description="A request tag's key (llmgw_router.path.tags)")
]
MediaHost = Annotated[
    str,
    Field(
        pattern=r"^(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$",
        description="A host name (lowercase), or `*.` and a domain for every host beneath it",
    ),
]


class RouterSettings(Strict):
    """Where the router listens, its default routing policy and admission queue."""

    listen: str = Field("127.0.0.1:8080", description="host:port of the OpenAI API")
    metrics_listen: str = Field("127.0.0.1:9091", description="host:port of the router's Prometheus listener")
    workers: int = Field(
        1,
        ge=1,
        le=256,
        description="Router processes sharing the API port (SO_REUSEPORT), metrics summed on metrics_listen; "
        "above 1 needs a store (limits are pooled through it). Read at start by `llmgw-router --snapshot`; a "
        "router following a controller takes `--workers`",
    )
    default_policy: str | None = Field(None, description="RoutingPolicy used by models that name none")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Larger request bodies get 413")
    scrape_interval: Duration = Field("1s", description="How often each engine's metrics are scraped")
    stale_after: Duration = Field(
        "5s", description="An endpoint not scraped for this long counts as saturated"
    )
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings, description="Admission queue")
    listener: ListenerSettings = Field(
        default_factory=ListenerSettings,
        description="The API listener's bounds on clients not yet authenticated (body deadline, connection caps)",
    )
    allowed_request_fields: list[RequestFieldName] = Field(
        default_factory=list,
        description=(
            "Top-level request fields forwarded to engines besides OpenAI's and each engine's sampling "
            "parameters (e.g. chat_template_kwargs); others are dropped and named in x-llmgw-dropped-fields"
        ),
    )
    tag_labels: list[TagKey] = Field(
        default_factory=list,
        max_length=8,
        description=(
            "Request tag keys (from metadata, x-llmgw-tags, `user`) counted in the router's tag metrics as "
            "label values; other tags are kept with usage only"
        ),
    )
    tag_label_values: int = Field(
        20,
        ge=1,
        le=1000,
        description="Distinct values each tag_labels key is counted under per router; later ones count as `other`",
    )
    media_hosts: list[MediaHost] = Field(
        default_factory=list,
        description=(
            "Hosts whose http(s) URLs a request's media parts may name (image_url, video_url, audio_url, "
            "Responses input_image, Anthropic source.url): engines fetch them from the node network, so any "
            "other URL but `data:` is refused (400), and so is a host that resolves to a private, loopback, "
            "link-local or metadata address"
        ),
    )

    @model_validator(mode="after")
    def _tag_labels_once(self) -> RouterSettings:
        twice = sorted({k for k in self.tag_labels if self.tag_labels.count(k) > 1})
        if twice:
            raise ValueError(f"tag_labels names {', '.join(twice)} more than once (each key once)")
        return self


class TenancySettings(Strict):
    """Defaults for tenants that leave a limit unset."""

    default_project_concurrency: int | None = Field(
        None,
        ge=1,
        description="Requests in flight at once for a project that declares no `limits.concurrency` "
        "(unset: no limit)",
    )


class SecuritySettings(Strict):
    """Permissions the platform grants to named models, beyond what a Model document may ask for itself."""

    trust_remote_code: list[Name] = Field(
        default_factory=list,
        description=(
            "Models (by name) whose profiles may set `args.trust_remote_code`, which runs Python shipped with the"
            " model's weights on the node; any other model setting it is refused"
        ),
    )


class MirrorSettings(Strict):
    """A weights mirror with the HF layout (/{repo}/resolve/{revision}/{file}, Range GETs): nodes fetch a
    `repo` source's files here first and from `origin` only when the mirror answers 404."""

    url: str | None = Field(
        None,
        pattern=r"^https?://[^\s/]+(/[^\s]*)?$",
        description="Base URL nodes reach the mirror at (`llmgw controller --mirror-dir` serves one; any HTTP "
        "server with the HF layout will do)",
    )
    origin: str = Field(
        "https://huggingface.co",
        pattern=r"^(none|https?://[^\s/]+(/[^\s]*)?)$",
        description="Where files the mirror lacks come from; `none`: every node is air-gapped (mirror only)",
    )
    check_every: str = Field(
        "24h",
        pattern=rf"^(off|{DURATION_PATTERN.strip('^$')})$",
        description="How often the leading controller asks `origin` whether the files each model pins changed "
        "there (`llmgw model updates --controller` shows its last answer, and each change is an event); "
        "`off`: never (run `llmgw model updates` yourself)",
    )

    @field_validator("check_every")
    @classmethod
    def _positive(cls, value: str) -> str:
        if value != "off" and parse_duration(value) <= 0:
            raise ValueError(f"check_every must be longer than zero (got {value!r}; e.g. 24h, or off)")
        return value


class GpuClass(Strict):
    """What a GPU class is, for checks made before any node reports one (offline `validate`)."""

    memory_gb: float = Field(gt=0, description="Memory of one card, in GiB (80 for an 80 GB A100)")
    watts: float | None = Field(
        None,
        gt=0,
        description="Power one busy card draws (its TDP), counted against facility power caps (unset: the "
        "class's draw is not known; a node's measured draw still counts)",
    )


class ClusterSpec(Strict):
    """Cluster-wide settings; every field has a default."""

    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    router: RouterSettings = Field(default_factory=RouterSettings)
    tenancy: TenancySettings = Field(default_factory=TenancySettings, description="Tenant defaults")
    engines: dict[EngineName, EngineSettings] = Field(
        default_factory=dict, description="Engines nodes run, by name (sim, llamacpp, vllm, sglang, trtllm)"
    )
    engine_overrides: list[EngineOverride] = Field(
        default_factory=list,
        description="Which build of an engine some nodes run, or that they run none (by node, labels or GPU class)",
    )
    secret: SecretRef | None = Field(
        None, description="Cluster secret: engine keys are an HMAC of the replica id under it"
    )
    security: SecuritySettings = Field(
        default_factory=SecuritySettings, description="Permissions granted to named models"
    )
    classes: list[Name] | None = Field(
        None,
        description="Capacity classes, highest first (e.g. [critical, interactive, batch]): a model of a higher "
        "class that cannot be placed preempts replicas of strictly lower classes; a model without `class` "
        "ranks as the last one. Unset: `class` is free-form and nothing is preempted",
    )
    preemption_grace: Duration = Field(
        "10s",
        description="How long a preempted replica's in-flight requests may run after it stops taking new "
        "ones; what is still running then is cut (and counted in the event)",
    )
    mirror: MirrorSettings = Field(
        default_factory=MirrorSettings, description="Weights mirror and origin for `repo` sources"
    )
    gpu_classes: dict[str, GpuClass] = Field(
        default_factory=dict,
        description="GPU classes by name, with their memory: `validate` checks each GPU profile's memory fit "
        "against them (`plan` uses the smallest card the fleet reports, these where none does)",
    )
    plan: PlanSettings = Field(default_factory=PlanSettings, description="What `llmgw plan` checks")
    costs: Costs = Field(
        default_factory=Costs,
        description="What each GPU class and CPU node kind costs per hour: `plan` says what a fleet costs, "
        "`plan --suggest` looks for the cheapest that meets the models' objectives",
    )
    console: ConsoleSettings = Field(
        default_factory=ConsoleSettings,
        description="The web console: how people sign in, how long chats are kept",
    )
    facilities: FacilitySettings = Field(
        default_factory=FacilitySettings,
        description="Spread across racks and PDUs, and power caps per domain (docs/placement.md, Facilities)",
    )
    guardrails_enabled: bool = Field(
        True, description="false turns every Guardrail's checks off at once (an emergency switch; live)"
    )
    verified_only: bool = Field(
        False,
        description="Every model's default for `verified_only`: true sends a request needing a checked "
        "capability (tools, a json_schema answer) only to replicas whose model check passed it",
    )
    peers: list[Peer] = Field(
        default_factory=list,
        description="Other llmgw clusters whose models are offered here as PEER/MODEL (docs/routing.md, "
        "Federation)",
    )
    region: Name | None = Field(
        None, description="Where this cluster serves, for the peers that name it and for reports"
    )

    @model_validator(mode="after")
    def _peers_unique(self) -> ClusterSpec:
        seen: set[str] = set()
        for peer in self.peers:
            if peer.name in seen:
                raise ValueError(f"peers: `{peer.name}` is declared twice; give each peer one entry")
            seen.add(peer.name)
        return self

    @model_validator(mode="after")
    def _priced_classes_declared(self) -> ClusterSpec:
        unknown = unknown_gpu_classes(self.costs, self.gpu_classes)
        if unknown:
            raise ValueError(
                f"costs.gpu_per_hour prices {', '.join(unknown)}, not among gpu_classes "
                f"({', '.join(sorted(self.gpu_classes))}): price a declared class or declare it"
            )
        return self
