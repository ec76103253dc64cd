"""The small frozen records the store takes and returns. No SQL, no I/O."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

RevisionStatus = Literal["accepted", "refused"]
KeyState = Literal["active", "revoked", "expired"]
UsageGroup = Literal["project", "team", "org", "key", "model"]
USAGE_GROUPS: tuple[UsageGroup, ...] = ("project", "team", "org", "key", "model")


@dataclass(frozen=True)
class Revision:
    sha: str
    source: str
    applied_at: float
    applied_by: str
    status: RevisionStatus
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeRecord:
    name: str
    first_seen: float
    last_seen: float
    state: str
    inventory: dict[str, Any] = field(default_factory=dict)


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
    project: str
    name: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None

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
    project: str
    state: KeyState
    expires_at: float | None


@dataclass(frozen=True)
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
    id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(frozen=True)
class UsageTotal:
    group: str
    requests: int
    tokens_in: int
    tokens_out: int
    cost: float
    avg_latency_ms: float
    errors: int


@dataclass(frozen=True)
class ShareGrant:
    """The answer to "take up to n": how many were granted, and the window's total taken after it."""

    granted: int
    taken: int


@dataclass(frozen=True)
class Lease:
    name: str
    holder: str
    expires_at: float


@dataclass(frozen=True)
class LeaseResult:
    """`held` is true when the caller holds the lease after the call; `current` is whoever does."""

    held: bool
    current: Lease | None
