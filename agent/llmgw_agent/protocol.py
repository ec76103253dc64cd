"""The wire protocol between an agent and the controller.

JSON messages over one WebSocket (`/agent/v1`), each carrying a `type` discriminator. The controller imports
these models, so they are the single definition of the protocol. Fields the machine may not report are
Optional: absent (None) means unknown, never zero or empty.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from llmgw_agent.origins import OriginRecord

PROTOCOL_VERSION = 1
AGENT_PATH = "/agent/v1"

EngineName = Literal["sim", "llamacpp", "vllm", "sglang", "trtllm"]
ENGINE_NAMES: tuple[str, ...] = ("sim", "llamacpp", "vllm", "sglang", "trtllm")
ShardState = Literal["fetching", "starting", "ready", "failed", "stopping", "stopped"]
ConditionType = Literal["EngineInstalling", "EngineInstallFailed", "EngineProbeFailed", "EngineCheckFailed"]
Action = Literal[
    "start_shard",
    "stop_shard",
    "list_shards",
    "engine_check",
    "collect_weights",
    "install_engines",
    "doctor",
    "logs",
]


class _Model(BaseModel):
    # Unknown fields are ignored so an older peer can read a newer peer's messages.
    model_config = ConfigDict(extra="ignore", defer_build=True)


# ---- inventory ----


class Disk(_Model):
    path: str
    filesystem_id: str | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    shared: bool | None = None
    fstype: str | None = None
    # The mount's source from /proc/mounts (`filer:/export`): what names a shared filesystem across nodes,
    # where st_dev numbers differ from node to node.
    mount_source: str | None = None
    # This filesystem holds the agent's weights cache (None: an agent that predates the field).
    holds_cache: bool | None = None


class Gpu(_Model):
    index: int
    uuid: str | None = None
    name: str | None = None
    memory_bytes: int | None = None
    gpu_class: str | None = Field(default=None, alias="class")
    utilisation: float | None = None
    # Why placement must leave it alone (uncorrectable ECC errors since the driver loaded, lost to an Xid):
    # None when healthy, or from an agent before the field.
    fault: str | None = None
    # A MIG instance (llmgw_agent.mig): the card it was carved from and its profile ("3g.40gb"); its uuid is the
    # `MIG-...` CUDA_VISIBLE_DEVICES takes. None: a whole card, or an agent before MIG.
    mig_card: int | None = None
    mig_profile: str | None = None
    # Why it cannot be given to an engine although healthy (a card in MIG mode with no instance carved): placement
    # leaves it out and says this. None: usable.
    unusable: str | None = None

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class EngineInstall(_Model):
    path: str | None = None
    version: str | None = None
    # How the agent came to have it: "installed" (by the agent, from the Cluster's install), "declared" (a
    # path in the agent's or the Cluster's configuration), "builtin" (sim). None: an agent before the field.
    origin: str | None = None
    # Which of the Cluster's builds of the version this is (cuda13, cpu). None: the engine declares no builds.
    build: str | None = None


class NodeCondition(_Model):
    """Something wrong (or under way) on the node, in the node's own words: an engine that failed to install
    or to run its probe, or one being installed. `tail` is the last lines the failing command printed."""

    type: ConditionType
    engine: str
    version: str | None = None
    message: str
    tail: list[str] = Field(default_factory=list)
    since: float | None = None


class CachedWeights(_Model):
    """One weights file or published directory on the node: fetched by the agent into its cache, or a node path
    a shard used.

    Named by the source's identity (`url` or `path`, and `sha256` when declared; a directory by its name and
    manifest digest): the controller computes the same key from a Model's source (llmgw.core.fleet.views)."""

    url: str | None = None
    path: str | None = None
    sha256: str | None = None
    # A published directory source: its name (`repo@revision` or the URL prefix) and its manifest's digest
    # (manifest_digest); url, path and sha256 are then None.
    directory: str | None = None
    manifest_sha256: str | None = None
    size_bytes: int | None = None
    # Where it lies on the node (in the cache for a fetched file).
    local_path: str
    # True: the agent fetched it, so `collect_weights` may delete it; False: the operator's, never deleted.
    fetched: bool
    used_by: list[str] = Field(default_factory=list)  # replica ids of shards running on it
    last_used: float | None = None
    # A fetched directory's llmgw-origin.json (llmgw_agent.origins): where each file came from. None: not
    # recorded (a single file, an operator's path, or a directory fetched before the record existed).
    origin: OriginRecord | None = None


class Inventory(_Model):
    cpu_cores: int | None = None
    memory_bytes: int | None = None
    disks: list[Disk] | None = None
    # None: nvidia-smi absent or failed (unknown); []: it ran and reported no card.
    gpus: list[Gpu] | None = None
    # Engines installed or declared whose probe passed. None: not probed yet (unknown); {}: has none.
    engines: dict[str, EngineInstall] | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    # Weights on the node (the cache index). None: an agent that does not keep one.
    weights: list[CachedWeights] | None = None
    # CPU flags placement may ask for (avx2, avx512f, amx_tile, ...), from /proc/cpuinfo. None: not read.
    cpu_flags: list[str] | None = None
    arch: str | None = None  # platform.machine(): x86_64, aarch64
    glibc: str | None = None  # "2.36"; None: not glibc, or not known
    gpu_driver: str | None = None  # NVIDIA driver version, from nvidia-smi
    cuda_version: str | None = None  # the CUDA version the driver supports (nvidia-smi -q -x's cuda_version)
    conditions: list[NodeCondition] = Field(default_factory=list)


class GpuThermal(_Model):
    """One GPU's heat and power as nvidia-smi measured it; None: not measured (`[N/A]`, `[Not Supported]`)."""

    index: int
    temperature_c: float | None = None
    memory_temperature_c: float | None = None  # HBM; cards with GDDR report none
    power_draw_w: float | None = None
    power_limit_w: float | None = None  # the enforced limit
    # Why its clocks are held down now (sw_power_cap, hw_thermal_slowdown, ...); [] none; None: not measured.
    throttle_reasons: list[str] | None = None


class NodeThermals(_Model):
    """Heat and power of the node at `taken_at` (llmgw_agent.thermals). Absent is not measured, never zero."""

    taken_at: float
    gpus: list[GpuThermal] | None = None  # None: no nvidia-smi, or it failed
    cpu_temperature_c: float | None = None  # the hottest CPU package sensor (hwmon coretemp, k10temp, ...)
    inlet_temperature_c: float | None = None  # the hottest hwmon sensor labelled inlet or ambient
    # RAPL package power over the last sampling interval, by package zone ("package-0"); None: not readable.
    cpu_package_power_w: dict[str, float] | None = None

    def power_draw_watts(self) -> float | None:
        """What the node was measured to draw: its GPUs plus its CPU packages; None when nothing was."""
        parts = [g.power_draw_w for g in self.gpus or [] if g.power_draw_w is not None]
        parts += list((self.cpu_package_power_w or {}).values())
        return round(sum(parts), 3) if parts else None


# ---- shards ----


class WeightFile(_Model):
    """One file of a directory source, as its manifest lists it: a relative `/`-separated name."""

    name: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


def manifest_digest(files: Iterable[tuple[str, int, str]]) -> str:
    """The one name of a manifest's content: sha256 over each (name, size, sha256), in name order. The agent
    indexes a published directory by it and the controller computes it from the repo's manifest, so both name
    the same bytes alike; the order files are listed in does not change it."""
    digest = hashlib.sha256()
    for name, size, sha in sorted(files):
        digest.update(f"{name}\0{size}\0{sha}\n".encode())
    return digest.hexdigest()


class DirectoryManifest(_Model):
    """What `llmgw model manifest` writes and a mirror publishes as DIR/llmgw-manifest.json."""

    format: Literal["llmgw-manifest/1"] = "llmgw-manifest/1"
    files: list[WeightFile] = Field(min_length=1)


class FetchBase(_Model):
    """A place a directory's files are fetched from: `url` ends in `/` and a file is `url` + its quoted name.
    A mirror base carries no token (the agent presents its own node token there); an origin base may carry
    the origin's token, sent to that host only and never logged."""

    url: str
    kind: Literal["mirror", "origin"]
    token: str | None = Field(default=None, repr=False)


class WeightSource(_Model):
    path: str | None = None
    url: str | None = None
    sha256: str | None = None
    size: int | None = None
    # A directory source: `directory` names it (the cache key: "repo@revision" or the URL prefix); `files` is
    # its manifest from the cluster repo, or None when the first base that publishes one is to be read; the
    # bases are tried in order per file, the next only when one answers 404.
    directory: str | None = None
    files: list[WeightFile] | None = None
    bases: list[FetchBase] = Field(default_factory=list)
    # A `repo` source's repository and revision, recorded beside the fetched files (llmgw_agent.origins). None:
    # a URL directory, or a controller before the fields.
    repo: str | None = None
    revision: str | None = None
    # collect_weights' `keep` only: a kept directory's manifest digest (None: every digest under its name).
    manifest_sha256: str | None = None


class Rendezvous(_Model):
    """Where the shards of one multi-node replica meet: rank 0's address on the fabric and a port there (the
    Ray head for vLLM, the rendezvous for SGLang's `--dist-init-addr`)."""

    host: str
    port: int = Field(ge=1, le=65535)


class ShardAdapter(_Model):
    """A LoRA adapter the engine loads at start (docs/lora.md), its files fetched like the weights."""

    name: str  # what clients ask for: vLLM serves it under this name; llama.cpp by its place in the list
    source: WeightSource
    rank: int | None = None


class KvEventsRequest(_Model):
    """Publish the engine's KV-cache events (vLLM's `--kv-events-config`), asked for when the model's routing
    policy weighs prefixes: the router subscribes to them to score prefixes precisely."""

    # The root of the engine's block hashes (vLLM's PYTHONHASHSEED), the policy's `prefix.hash_seed`: without a
    # fixed seed vLLM draws a random one and no router can name its blocks.
    hash_seed: str = "0"
    topic: str = "kv-events"


class ShardSpec(_Model):
    replica_id: str
    shard_rank: int = 0
    shard_count: int = 1
    model: str
    profile: str = ""
    engine: EngineName
    engine_version: str | None = None
    source: WeightSource | None = None
    context_length: int | None = None
    slots: int | None = None
    cpu_cores: int | None = None
    gpus: list[int] = Field(default_factory=list)
    # What CUDA_VISIBLE_DEVICES names, one per entry of `gpus`, where a GPU is a MIG instance (`MIG-<uuid>`; a
    # whole card by its index). Empty: the indices of `gpus` (no MIG instance, or an older controller).
    cuda_devices: list[str] = Field(default_factory=list)
    # The profile's tensor and pipeline parallel sizes, which become the engine's own flags. None: a controller
    # before the fields (the agent then takes tensor parallelism from the GPU count, as it did).
    tp: int | None = Field(default=None, ge=1)
    pp: int | None = Field(default=None, ge=1)
    args: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    # The engine's own key: passed by environment where the engine allows, never logged.
    api_key: str | None = Field(default=None, repr=False)
    fingerprint: str = ""
    served_model_name: str | None = None
    # The Cluster grants this model `trust_remote_code` (spec.security.trust_remote_code); without it the agent
    # refuses the arg. An older controller never sends it, so the arg is refused: the safe default.
    trust_remote_code: bool = False
    # A multi-node replica (shard_count > 1): where its shards meet, and this node's own address on the fabric,
    # the only address its distributed sockets bind to. None on a single-node shard, or from an older controller
    # (the agent then refuses a multi-node shard, as it did).
    rendezvous: Rendezvous | None = None
    fabric_address: str | None = None
    # LoRA adapters loaded at start, in this order (llama.cpp's adapter ids). Empty from an older controller.
    adapters: list[ShardAdapter] = Field(default_factory=list)
    # Publish KV-cache events (an engine that cannot ignores it). None: none, or from an older controller.
    kv_events: KvEventsRequest | None = None

    @property
    def shard_id(self) -> str:
        return f"{self.replica_id}-{self.shard_rank}"


class ShardStatus(_Model):
    replica_id: str
    shard_rank: int = 0
    model: str
    engine: EngineName
    state: ShardState
    pid: int | None = None
    host: str | None = None
    port: int | None = None
    base_url: str | None = None
    metrics_path: str | None = None
    fingerprint: str = ""
    # The GPU indices the shard was started on (its ShardSpec's), so a controller that adopts it after a
    # restart counts them as taken. Empty from an agent that predates the field: unknown, not "no GPU".
    gpus: list[int] = Field(default_factory=list)
    started_at: float | None = None
    exit_code: int | None = None
    last_output_lines: list[str] = Field(default_factory=list)
    fetch_bytes_done: int | None = None
    fetch_bytes_total: int | None = None
    message: str = ""
    # Memory the engine's process group holds: resident set (/proc) and GPU memory (nvidia-smi's compute
    # apps). None: not measured (no process, no nvidia-smi, an older agent), never 0 for "unknown".
    rss_bytes: int | None = None
    gpu_memory_bytes: int | None = None
    # What the engine said it computes on as it became ready ("gpu (19/19 layers offloaded)", "cpu (no usable
    # GPU)"). None: it did not say, or an agent before the field.
    compute: str | None = None
    # The port of the engine's KV-event publisher: on 127.0.0.1 (an agent before `kv_events_path`: on the
    # serving address, never subscribed to). None: it publishes none.
    kv_events_port: int | None = None
    # Where routers read those events: this path on the serving port (`base_url`), behind the engine key
    # (the pass-through's relay). None: no relay (none asked for, or an agent before the field).
    kv_events_path: str | None = None

    @property
    def shard_id(self) -> str:
        return f"{self.replica_id}-{self.shard_rank}"


class EngineOrder(_Model):
    """How the Cluster says one engine version is obtained on nodes (exactly one of the three ways)."""

    engine: EngineName
    version: str | None = None
    # A hash-locked requirements file's lines, installed with `pip install --require-hashes` into a virtual
    # environment of the agent's own, per engine version.
    requirements: list[str] | None = None
    find_links: str | None = None  # a wheelhouse URL or directory (pip --find-links)
    index_url: str | None = None  # a package index (pip --index-url); unset: pip's default
    extra_index_url: str | None = None  # a second index asked too (pip --extra-index-url), e.g. PyTorch's CPU
    # The requirements are the whole environment (pip --no-deps): a dependency the set leaves out on purpose
    # (vLLM CPU's CUDA-only torchvision) stays out instead of failing --require-hashes.
    no_deps: bool = False
    # A checksummed archive (tar or zip), unpacked refusing any member that leaves the install directory.
    archive_url: str | None = None
    archive_sha256: str | None = None
    # An executable already on the node.
    path: str | None = None
    # Inside an installed environment: the executable's path relative to it; or `module:function`, called by
    # the environment's python to print the path (and let the package finish its own setup).
    binary: str | None = None
    locate: str | None = None
    probe_timeout_s: float = 30.0
    # Which of the Cluster's builds this is (None: the engine declares no builds), and the check its install
    # passes on the device before it counts: argv (`{binary}` is the executable), a regex its output must match.
    build: str | None = None
    check_argv: list[str] | None = None
    check_expect: str | None = None
    check_timeout_s: float = 60.0


class LogQuery(_Model):
    """What a `logs` command asks of the agent's log ring (llmgw_agent.logring).

    `after` is a sequence number of the agent process `boot` names: from another boot (the agent restarted) the
    reader gets the new process's lines from its first. Without `after`, `since` (Unix time) reads forward from
    then; with neither, the newest `limit` lines. `wait_s` > 0 makes it a long poll: when nothing past the
    cursor matches yet, the agent waits up to that long for a line before it answers (how `follow` streams)."""

    boot: str | None = None
    after: int | None = Field(default=None, ge=0)
    since: float | None = None
    grep: str | None = Field(default=None, max_length=500)
    source: str | None = None  # a replica id, or "agent"
    shard: int | None = None
    limit: int = Field(default=200, ge=1, le=1000)
    wait_s: float = Field(default=0.0, ge=0, le=60)


# ---- agent -> controller ----


class Register(_Model):
    type: Literal["register"] = "register"
    node: str
    agent_version: str
    protocol_version: int = PROTOCOL_VERSION
    inventory: Inventory
    shards: list[ShardStatus] = Field(default_factory=list)
    # host:port of the agent's node-health metrics listener (for Prometheus http_sd); None: it opens none.
    metrics_address: str | None = None
    # The agent's wall clock (Unix time) when it sent this; the controller estimates the node's clock offset.
    sent_at: float | None = None


class Heartbeat(_Model):
    type: Literal["heartbeat"] = "heartbeat"
    shards: list[ShardStatus] = Field(default_factory=list)
    inventory: Inventory | None = None
    # Heat and power, sampled at most every 10 s (the latest sample rides each beat). None: an older agent.
    thermals: NodeThermals | None = None
    sent_at: float | None = None  # as in Register


class ShardUpdate(_Model):
    type: Literal["shard_update"] = "shard_update"
    shard: ShardStatus


class Reply(_Model):
    type: Literal["reply"] = "reply"
    id: str
    ok: bool
    error: str = ""
    payload: dict[str, Any] = Field(default_factory=dict)


# ---- controller -> agent ----


class Welcome(_Model):
    type: Literal["welcome"] = "welcome"
    heartbeat_interval_s: float = 5.0
    protocol_version: int = PROTOCOL_VERSION


class Refused(_Model):
    type: Literal["refused"] = "refused"
    reason: str


class Command(_Model):
    type: Literal["command"] = "command"
    id: str
    action: Action
    spec: ShardSpec | None = None
    replica_id: str | None = None
    shard_rank: int | None = None
    engine: EngineName | None = None
    # collect_weights: the sources declared models still reference (kept), and whether only to say what would go.
    keep: list[WeightSource] = Field(default_factory=list)
    dry_run: bool = True
    # install_engines: the Cluster's engine orders (the agent converges on them; an engine not named keeps
    # what the agent's own configuration declares).
    engines: list[EngineOrder] = Field(default_factory=list)
    # doctor: the controller's wall clock when it sent the command, for the node's clock check.
    controller_time: float | None = None
    logs: LogQuery | None = None


AgentMessage = Annotated[Register | Heartbeat | ShardUpdate | Reply, Field(discriminator="type")]
ControllerMessage = Annotated[Welcome | Refused | Command, Field(discriminator="type")]

_AGENT_ADAPTER: TypeAdapter[AgentMessage] = TypeAdapter(AgentMessage)
_CONTROLLER_ADAPTER: TypeAdapter[ControllerMessage] = TypeAdapter(ControllerMessage)


def parse_agent_message(data: str | bytes) -> Register | Heartbeat | ShardUpdate | Reply:
    """Parse a message an agent sent (used by the controller). Raises pydantic.ValidationError."""
    return _AGENT_ADAPTER.validate_json(data)


def parse_controller_message(data: str | bytes) -> Welcome | Refused | Command:
    """Parse a message the controller sent (used by the agent). Raises pydantic.ValidationError."""
    return _CONTROLLER_ADAPTER.validate_json(data)


def dump(message: BaseModel) -> str:
    """Serialise a message for the wire (aliases used, e.g. Gpu.class)."""
    return message.model_dump_json(by_alias=True)
