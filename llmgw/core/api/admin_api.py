"""The admin API's bodies and answers as pydantic models: what the route table (llmgw.controller.api.routes)
declares each endpoint reads and answers with, what docs/admin-openapi.json is generated from, and what a
client (the CLI, the console) validates an answer against.

Answers allow fields beyond the ones named (`extra="allow"`): a newer controller may add one, and an older
client must keep reading the rest. Nested records that are still plain dicts in the handlers are `JsonObject`
here: the document says "an object" for them, no more (docs/controller.md, The admin API's document).
Requests are strict where the handler is: an unknown field in a body the handler validates is refused.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from llmgw.core.fleet.views import IfUndeclared

__all__ = [
    "Answer",
    "ApplyAnswer",
    "ApplyBody",
    "AuditAnswer",
    "AuditEntryView",
    "BenchTarget",
    "Body",
    "CapacityAnswer",
    "CapacitySaved",
    "DeliveriesAnswer",
    "DemandNoted",
    "DoctorAnswer",
    "DrainAnswer",
    "ErrorAnswer",
    "ErrorDetail",
    "EvalRunAnswer",
    "EvalRunBody",
    "EventView",
    "EventsAnswer",
    "ExplainAnswer",
    "HeldDomain",
    "HoldAnswer",
    "HoldBody",
    "HoldsAnswer",
    "JsonObject",
    "KeptBodyAnswer",
    "KeyCreateBody",
    "KeyCreated",
    "KeyRevoked",
    "KeyView",
    "KeysAnswer",
    "LogsPage",
    "ModelCheckBody",
    "ModelCheckVerdict",
    "ModelChecksAnswer",
    "ModelHealth",
    "ModelView",
    "ModelsAnswer",
    "NodeCredential",
    "NodeView",
    "NodesAnswer",
    "OpenApiDocument",
    "PollAsked",
    "ReleaseAnswer",
    "ReplayAnswer",
    "ReplayBody",
    "ReplicaView",
    "ReplicasAnswer",
    "RequestsAnswer",
    "RestartAnswer",
    "RestartBody",
    "RouterCredential",
    "StatusAnswer",
    "StoreLocation",
    "TargetGroup",
    "TargetGroups",
    "UncordonAnswer",
    "UpgradeAnswer",
    "UpgradeBody",
    "UsageAnswer",
    "UsageSeenAnswer",
    "UsageSeenBody",
    "UsageTotalView",
    "WeightsAnswer",
    "WeightsCollectBody",
    "WeightsCollected",
]

JsonObject = dict[str, Any]


class Answer(BaseModel):
    """An answer of the admin API: the fields named, and any a newer controller adds."""

    model_config = ConfigDict(extra="allow")


class Body(BaseModel):
    """A request body of the admin API."""

    model_config = ConfigDict(extra="allow")


class ErrorDetail(Answer):
    message: str = Field(description="What went wrong and what would be right")


class ErrorAnswer(Answer):
    """Every error of the admin API: `{"error": {"message": ...}}`, sometimes with more beside the message."""

    error: ErrorDetail


# ------------------------------------------------------------------------------------------------ reads


class ModelHealth(Answer):
    """A model's health in Argo CD's words, and the counts behind it."""

    model: str
    health: Literal["Healthy", "Progressing", "Degraded", "Missing", "Unknown"]
    ready: int = Field(ge=0)
    replicas: int = Field(ge=0, description="Replicas in any state")
    target: int = Field(ge=0, description="Replicas the controller aims for now")
    min: int = Field(ge=0)
    max: int = Field(ge=0)
    unplaceable: JsonObject = Field(description="Why a replica cannot be placed, per profile; empty: it can")
    failures: int = Field(ge=0)
    stale_replicas: int = Field(ge=0)
    restarting: int = Field(ge=0)
    rolling: bool
    canary: JsonObject | None


class StatusAnswer(Answer):
    applied: JsonObject | None = Field(description="The revision in force; null before the first")
    seen: JsonObject | None
    polled: JsonObject | None
    sync: str = Field(description="Synced, OutOfSync or Unknown")
    leadership: JsonObject
    source_error: str | None
    refused: JsonObject | None = Field(description="The last revision refused, with its errors")
    models: list[ModelHealth]
    nodes: JsonObject
    replicas: int = Field(ge=0)


class NodeView(Answer):
    """A node as the controller knows it; one whose agent has not connected (NotJoined, Removed) has no
    cordon fields."""

    name: str
    state: str
    connected: bool
    declared: bool = Field(description="The applied revision declares it")
    if_undeclared: IfUndeclared = Field(
        description="What the controller does while the repo does not declare it"
    )
    address: str | None
    agent_version: str | None
    clock_offset_s: float | None
    metrics_address: str | None
    last_seen_s: float | None = Field(description="Seconds since it was last heard; null: never connected")
    labels: dict[str, str]
    inventory: JsonObject | None
    thermals: JsonObject | None = Field(
        None, description="Heat and power, the agent's last sample (taken at most every 10 s); null: none yet"
    )
    power_draw_watts: float | None = Field(
        None, description="What the node was measured to draw: GPUs plus CPU packages; null: nothing measured"
    )
    shards: int = Field(ge=0)
    replicas: list[str]
    cordoned: bool | None = None
    cordon_reason: str | None = None
    drained: bool | None = None
    held: str | None = Field(None, description="The facility hold keeping new replicas off it, in words")
    bootstrap: JsonObject | None
    removal: JsonObject | None


class NodesAnswer(Answer):
    nodes: list[NodeView]


class ReplicaView(Answer):
    id: str
    model: str
    profile: str
    nodes: list[str]
    state: str
    last_output_lines: list[str] | None = Field(
        description="The engine's output tail, for an admin-scope token only; null: not shown"
    )


class ReplicasAnswer(Answer):
    replicas: list[ReplicaView]


class LogsPage(Answer):
    lines: list[JsonObject]
    next_cursor: str = Field(description="Pass back as cursor= for the lines after these")
    more: bool
    missed: int
    unavailable: dict[str, str] = Field(description="Node -> why it did not answer")


class ModelView(ModelHealth):
    aliases: list[str]
    profiles: list[JsonObject]
    provider: str | None = Field(description="The provider's URL, for a model served elsewhere")
    fallbacks: list[str]


class ModelsAnswer(Answer):
    models: list[ModelView]


class ExplainAnswer(Answer):
    model: str
    health: ModelHealth
    problem: str | None
    would_place: JsonObject | None
    profiles: list[JsonObject]


class WeightsAnswer(Answer):
    nodes: list[JsonObject]


class WeightsCollectBody(Body):
    dry_run: bool = Field(True, description="Only list what would be removed")
    node: str | None = Field(None, description="One node; all nodes when left out")


class WeightsCollected(Answer):
    dry_run: bool
    nodes: list[JsonObject]


class EventView(Answer):
    time: float
    kind: str
    object: str
    message: str


class EventsAnswer(Answer):
    events: list[EventView]


# ------------------------------------------------------------------------------------------------ changes


class ApplyBody(Body):
    """`path` (a directory) or `files` (at least one): `path` wins when both are given."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "anyOf": [
                {"required": ["path"], "properties": {"path": {"type": "string"}}},
                {"required": ["files"], "properties": {"files": {"type": "object", "minProperties": 1}}},
            ]
        },
    )

    path: str | None = Field(None, description="A directory the controller may read (its repo, apply_paths)")
    files: dict[str, str] | None = Field(None, description="Relative path -> YAML text")
    force: bool = Field(False, description="Apply even what a check would refuse")
    actor: str | None = Field(None, description="Who asks, in the client's words (a CI run); recorded")
    revision: str | None = Field(None, description="The git commit these files are, when they are one")
    source: str | None = Field(None, description="Where the files came from, in words")


class ApplyAnswer(Answer):
    result: str
    revision: str
    actor: str
    asked_revision: str | None = None
    errors: list[str] | None = Field(None, description="Why the revision was refused (422 only)")


class RestartBody(Body):
    target: str = Field(min_length=1, description="A model or a replica id")
    max_surge: int | None = Field(None, ge=0)
    max_unavailable: int | None = Field(None, ge=0)


class RestartAnswer(Answer):
    model: str
    replicas: list[str]
    max_surge: int
    max_unavailable: int


class EvalRunBody(Body):
    suite: str
    model: str
    replica: str | None = None


class EvalRunAnswer(Answer):
    model: str
    replica: str


class ModelCheckBody(Body):
    replica: str | None = None


class ModelCheckVerdict(Answer):
    model: str
    engine: str
    engine_version: str
    replica: str
    at: float
    passed: bool
    probes: list[JsonObject]


class ModelChecksAnswer(Answer):
    checks: list[ModelCheckVerdict]


class DrainAnswer(Answer):
    node: str
    drained: bool
    moving: list[str]


class UncordonAnswer(Answer):
    node: str
    was_drained: bool
    cordoned_in_repo: bool


class HoldBody(Body):
    drain: bool = Field(False, description="Move the domain's replicas elsewhere too (make-before-break)")


class HoldAnswer(Answer):
    domain: str
    drain: bool
    nodes: list[str]
    moving: list[str]


class ReleaseAnswer(Answer):
    domain: str
    was_held: bool
    nodes: list[str]


class HeldDomain(Answer):
    domain: str
    words: str
    drain: bool
    nodes: list[str]


class HoldsAnswer(Answer):
    holds: list[HeldDomain]


# ------------------------------------------------------------------------------------------------ keys


class KeyView(Answer):
    id: str
    prefix: str
    project: str | None = Field(
        description="The project it spends against; a personal key's default (null: none)"
    )
    owner: str | None = Field(None, description="The Person a personal key belongs to; null: a project key")
    name: str
    state: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    last_used_at: float | None


class KeysAnswer(Answer):
    keys: list[KeyView]


class KeyCreateBody(Body):
    # A key spends against a project, or is a person's own: the schema says one of the two is given.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["project"], "properties": {"project": {"type": "string"}}},
                {"required": ["owner"], "properties": {"owner": {"type": "string"}}},
            ]
        }
    )

    project: str | None = Field(
        None,
        min_length=1,
        description="The project the key spends against (a personal key's default; a project key needs one)",
    )
    owner: str | None = Field(
        None, min_length=1, description="A Person: the key is theirs, charged to them (docs/tenancy.md)"
    )
    name: str | None = Field(None, description="A label")
    expires_in_s: float | None = Field(
        None, gt=0, description="Seconds until it expires; never when left out"
    )


class KeyCreated(KeyView):
    key: str = Field(description="The key itself, shown this once (the store keeps its hash)")


class KeyRevoked(Answer):
    revoked: str


# ------------------------------------------------------------------------------------------------ records


class AuditEntryView(Answer):
    id: str = Field(description="aud_ and 32 hex digits")
    time: float
    actor: str
    actor_detail: str
    action: str
    object: str
    outcome: str
    reason: str
    via: str


class AuditAnswer(Answer):
    entries: list[AuditEntryView]
    unwritten: int = Field(ge=0, description="Entries not yet in the store")


class RequestsAnswer(Answer):
    requests: list[JsonObject]


class KeptBodyAnswer(Answer):
    """A request's kept bodies (docs/tenancy.md, Bodies kept and replayed)."""

    request_id: str
    project: str
    model: str = Field(description="The model asked for")
    served: str | None = Field(description="The model that answered; null: none did")
    status: int
    stream: bool
    request: str = Field(
        description="The request body as the client sent it (redacted unless `redacted` false)"
    )
    answer: str | None = Field(description="The answer body (a stream's events as text); null: none")
    request_cut: bool = Field(description="The request was longer than max_bytes: kept cut")
    answer_cut: bool
    redacted: bool
    time: float
    answer_text: str | None = Field(description="The answer's text (a stream's deltas put together)")


class ReplayBody(Body):
    model: str = Field(description="The model to send the kept request to (a ready replica of it)")


class ReplayAnswer(Answer):
    request_id: str
    original: KeptBodyAnswer
    replay: JsonObject = Field(description="model, replica, answer (null on failure), answer_text, error")


class UsageTotalView(Answer):
    group: str | None = Field(description="null: no such group (no key, no such tag)")
    requests: int
    errors: int
    tokens_in: int
    tokens_out: int
    cost: float
    avg_latency_ms: float
    key_name: str | None = Field(None, description="by=key only: the key's name")
    key_project: str | None = Field(None, description="by=key only: the key's project")


class UsageAnswer(Answer):
    by: str
    totals: list[UsageTotalView]


class DeliveriesAnswer(Answer):
    deliveries: list[JsonObject]
    waiting: int
    dead: int


class TargetGroup(Answer):
    targets: list[str]
    labels: dict[str, str]


class TargetGroups(RootModel[list[TargetGroup]]):
    """Prometheus http_sd: a list of target groups."""


class DoctorAnswer(Answer):
    subject: str
    status: Literal["ok", "warn", "fail"]
    checks: list[JsonObject]


class UpgradeBody(Body):
    nodes: list[str] | None = Field(None, description="The nodes; every managed node when left out")
    parallel: int = Field(1, ge=1)
    wheelhouse: str | None = Field(None, description="An absolute directory on the controller's machine")
    timeout_s: float | None = Field(None, gt=0, le=3600)


class UpgradeAnswer(Answer):
    ok: bool
    agent_version: str
    wheelhouse: str
    nodes: list[JsonObject]


class CapacityAnswer(Answer):
    capacity: list[JsonObject]


class CapacitySaved(Answer):
    saved: JsonObject


class BenchTarget(Answer):
    model: str
    replica: str
    profile: str
    gpu_class: str | None
    engine: str
    base_url: str
    api_key: str
    objective_ms: float | None
    load_s: float | None


class RouterCredential(Answer):
    token: str


class NodeCredential(Answer):
    node: str
    token: str


class StoreLocation(Answer):
    store: str = Field(
        description="A @file reference, a SQLite file's path, or a PostgreSQL DSN without password"
    )
    dialect: Literal["sqlite", "postgres"]


# ------------------------------------------------------------------------------------------------ routers


class PollAsked(Answer):
    polling: bool


class DemandNoted(Answer):
    model: str
    health: ModelHealth


class UsageSeenBody(Body):
    models: list[str] | dict[str, int] = Field(description="Model names used, or name -> count")


class UsageSeenAnswer(Answer):
    known: int = Field(ge=0, description="How many of them the applied revision has")


class OpenApiDocument(Answer):
    openapi: str
    info: JsonObject
    paths: JsonObject
