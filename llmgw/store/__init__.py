"""The llmgw store: SQLite by default, PostgreSQL by DSN; one set of queries, versioned migrations."""

from llmgw.store.db import DEFAULT_DSN, DEFAULT_STATE_DIR, Dsn, parse_dsn
from llmgw.store.errors import StoreError, StoreUnavailable
from llmgw.store.records import (
    USAGE_GROUPS,
    ApiKey,
    AuditEntry,
    Delivery,
    Event,
    KeyLookup,
    KeyState,
    Lease,
    LeaseResult,
    NodeRecord,
    ReplicaRecord,
    Revision,
    ShareGrant,
    UsageBucket,
    UsageGroup,
    UsageRecord,
    UsageTotal,
)
from llmgw.store.store import TABLES, Store

__all__ = [
    "DEFAULT_DSN",
    "DEFAULT_STATE_DIR",
    "TABLES",
    "USAGE_GROUPS",
    "ApiKey",
    "AuditEntry",
    "Delivery",
    "Dsn",
    "Event",
    "KeyLookup",
    "KeyState",
    "Lease",
    "LeaseResult",
    "NodeRecord",
    "ReplicaRecord",
    "Revision",
    "ShareGrant",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "UsageBucket",
    "UsageGroup",
    "UsageRecord",
    "UsageTotal",
    "parse_dsn",
]
