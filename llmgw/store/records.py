"""The small frozen records the store takes and returns. No SQL, no I/O."""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

RevisionStatus = Literal["accepted", "refused"]
KeyState = Literal["active", "revoked", "expired"]
UsageGroup = Literal["project", "team", "org", "key", "model", "router", "person"]
# `router`: the router_id that wrote the row; imported rows read `import:<source>` (docs/traffic.md).
USAGE_GROUPS: tuple[UsageGroup, ...] = ("project", "team", "org", "key", "model", "router", "person")
TAG_GROUP_PREFIX = "tag:"  # `usage --by tag:app` groups by the value of one request tag


def _revision_id() -> str:
    return "rev_" + uuid.uuid4().hex


@dataclass(frozen=True)
class Revision:
    """One application (or refusal) of a revision: an append-only history row.

    `sha` is the revision's label (a git commit SHA, a content hash `sha256:...`, or `apply:<hash>` for an
    admin apply); `applied_by` the authenticated actor (`controller`, or an admin token's name);
    `actor_detail` what the client said about itself (a CI run id), recorded but not trusted. `id` is made
    once, so retrying the write of the same record cannot add it twice."""

    sha: str
    source: str
    applied_at: float
    applied_by: str
    status: RevisionStatus
    errors: tuple[str, ...] = ()
    actor_detail: str = ""
    id: str = field(default_factory=_revision_id)


@dataclass(frozen=True)
class NodeRow:
    name: str
    first_seen: float
    last_seen: float
    state: str
    inventory: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FacilityHold:
    """A held facility domain (`rack=r1`): who held it and when, in words; `drain`: its replicas move too."""

    words: str
    drain: bool = False


@dataclass(frozen=True)
class ReplicaRecord:
    id: str
    model: str
    profile: str
    nodes: tuple[str, ...]
    state: str
    fingerprint: str
    created_at: float
    updated_at: float
    replaces: str | None = None  # the replica it was started to take the place of (a roll's surge)
    restart_asked: bool = False  # an operator asked for its restart (`llmgw restart`)


@dataclass(frozen=True)
class Event:
    id: str
    time: float
    kind: str
    object: str
    message: str


@dataclass(frozen=True)
class ApiKey:
    """A key as stored: never the key itself, only its hash (kept out of this record) and a display prefix."""

    id: str
    prefix: str
    project: str | None  # None: a personal key without a default project (names one per request)
    name: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    # The newest request recorded with this key, whatever its outcome (a revoked key still being tried shows
    # here); None when none was ever recorded.
    last_used_at: float | None = None
    owner: str | None = None  # the Person a personal key belongs to; None: a project key

    def state(self, now: float) -> KeyState:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"


@dataclass(frozen=True)
class KeyLookup:
    """What the router needs to answer a request's key: which project, and whether it may be used."""

    key_id: str
    project: str | None  # None: a personal key without a default project
    state: KeyState
    expires_at: float | None
    owner: str | None = None  # a personal key's Person; None: a project key


def time_ordered_id() -> str:
    """A UUIDv7 (RFC 9562) as 32 hex digits: milliseconds since the epoch, then random bits.

    Usage ids are the table's primary key. Random ids (UUIDv4) land all over its index, so every batch
    touches pages across the whole index and inserts slow down as the table grows (measured here: 18 -> 35
    µs per row by 300,000 rows in SQLite); ids that grow with time append at its end.
    """
    rand = random.getrandbits(80)  # unique, not secret: no getrandom() system call per id
    value = (time.time_ns() // 1_000_000) << 80 | 0x7 << 76 | (rand >> 68) << 64 | 0b10 << 62
    return f"{value | rand & ((1 << 62) - 1):032x}"


# Not frozen: built on every request, and a frozen dataclass costs about three times as much to construct
# (object.__setattr__ per field). Nothing mutates these after construction.
@dataclass(slots=True)
class UsageRecord:
    """One request. `id` is made when the record is, so a retried batch is not counted twice."""

    time: float
    request_id: str
    project: str
    model: str
    status: int
    team: str = ""
    org: str = ""
    key_id: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0
    fallback_used: bool = False
    router_id: str = ""
    id: str = field(default_factory=time_ordered_id)
    person: str | None = None  # who spent it: a personal key's owner; None for a project key or none
    # What `llmgw request ID` shows of the way the request went (migration 0006). None: not known (an
    # answer sent whole has no time to first token; a request refused before the queue waited for nothing).
    endpoint: str = ""  # the replica (or provider endpoint) that served; "" when none was picked
    queue_ms: float | None = None  # waiting for an endpoint with room (the pick, the admission line)
    ttft_ms: float | None = None  # to the first streamed bytes sent to the client
    # Kept as values, encoded to JSON by the spool's one line and by the store's writer, off the request path.
    attempts: list[dict[str, str]] | None = None  # the endpoints that failed first: endpoint, model, reason
    decision: dict[str, Any] | None = None  # the scheduling decision, compact (llmgw_router.path.lookup)
    code: str = ""  # the error code the client was given ("" on success)
    tags: dict[str, str] | None = (
        None  # metadata, x-llmgw-tags and `user` (llmgw_router.path.tags); None: none
    )
    # The request's shape for a traffic trace (migration 0009, llmgw.core.traffic.trace). None: not known.
    stream: bool | None = None  # the client asked for a stream
    prefix: str | None = (
        None  # salted hash of its session/prefix key (llmgw.core.traffic.recorded.prefix_hash)
    )
    # The guardrails' verdicts by stage (migration 0012): {"input": {"action": ..., "rules": [...]}, ...}.
    # None: no guardrail applied to the request.
    guard: dict[str, Any] | None = None


@dataclass(frozen=True)
class UsageTotal:
    """One group's totals. Grouped by key, `group` is the key id ("" for requests made without a key) and
    `key_name`/`key_project` come from api_keys: None when the key is not there (deleted by hand), so an
    unknown name is not mistaken for a key whose name is empty. Other groupings leave them None."""

    group: str
    requests: int
    tokens_in: int
    tokens_out: int
    cost: float
    avg_latency_ms: float
    errors: int
    key_name: str | None = None
    key_project: str | None = None


@dataclass(frozen=True)
class UsageBucket:
    """Requests of one project, model and key in one time bucket (`bucket` counts buckets from the query's
    `since`). `key_id` None: requests made without a key."""

    bucket: int
    project: str
    model: str
    key_id: str | None
    requests: int
    errors: int
    tokens_in: int
    tokens_out: int
    cost: float


@dataclass(frozen=True)
class ShareGrant:
    """The answer to "take up to n": how many were granted, and the window's total taken after it."""

    granted: int
    taken: int


@dataclass(frozen=True)
class LeaseRow:
    name: str
    holder: str
    expires_at: float
    epoch: int = 0  # raised each time the lease changes hands (0: a row from before epochs)


@dataclass(frozen=True)
class Fence:
    """What a leader's write carries: the lease it acts under, as it won it. The store refuses the write
    (`LeaseFenced`) unless the lease still has this holder at this epoch."""

    name: str
    holder: str
    epoch: int
    # How long the lease's claim lasts unrenewed (it bounds a silent client's lock); None: the default's bound.
    ttl_s: float | None = None


@dataclass(frozen=True)
class LeaseResult:
    """`held` is true when the caller holds the lease after the call; `current` is whoever does."""

    held: bool
    current: LeaseRow | None


AuditOutcome = Literal["accepted", "refused"]


def _audit_id() -> str:
    return "aud_" + time_ordered_id()


@dataclass(frozen=True)
class AuditEntry:
    """One admin action that changes something, as the audit log keeps it (append-only).

    `actor` is who was authenticated (an admin token's name, `local:<user>` for a command that opened the
    store itself); `actor_detail` what the client said about itself, not trusted; `outcome` accepted or
    refused, and `reason` why it was refused. Never a secret: no key, no token. `id` is made once, so a
    retried write is kept once."""

    time: float
    actor: str
    action: str
    object: str
    outcome: AuditOutcome
    reason: str = ""
    actor_detail: str = ""
    via: str = ""
    id: str = field(default_factory=_audit_id)


def _delivery_id() -> str:
    return "ntf_" + time_ordered_id()


@dataclass(frozen=True)
class Delivery:
    """A notification waiting in the outbox (or dead-lettered: `dead_at` set). `body` is what is sent."""

    notification: str
    event: str
    object: str
    body: str
    created_at: float
    next_at: float
    attempts: int = 0
    last_error: str = ""
    dead_at: float | None = None
    id: str = field(default_factory=_delivery_id)
