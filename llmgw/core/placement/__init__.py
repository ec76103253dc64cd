"""Placement: choosing nodes for replicas, a pure function with a reason for every node it rejects.

See docs/placement.md for the filters, their words, and why GPU replicas bin-pack while CPU replicas spread.
"""

from llmgw.core.placement.node_facts import (
    CacheDisk,
    ConditionFact,
    PlatformFacts,
    cache_disk,
    engine_refusals,
    requires_problems,
)
from llmgw.core.placement.place import (
    Explanation,
    IdFactory,
    Placement,
    PlacementResult,
    Placer,
    ProfileExplanation,
    ShardPlacement,
    Unplaced,
    active_count,
    explain,
    place,
    sequential_ids,
)
from llmgw.core.placement.preempt import Preemption, commit_preemption, find_preemption
from llmgw.core.placement.quota import QuotaUse, quota_refusal, quota_room, quota_use, replica_gpus
from llmgw.core.placement.rooms import NodeVerdict, version_matches

__all__ = [
    "CacheDisk",
    "ConditionFact",
    "Explanation",
    "IdFactory",
    "NodeVerdict",
    "Placement",
    "PlacementResult",
    "Placer",
    "PlatformFacts",
    "Preemption",
    "ProfileExplanation",
    "QuotaUse",
    "ShardPlacement",
    "Unplaced",
    "active_count",
    "cache_disk",
    "commit_preemption",
    "engine_refusals",
    "explain",
    "find_preemption",
    "place",
    "quota_refusal",
    "quota_room",
    "quota_use",
    "replica_gpus",
    "requires_problems",
    "sequential_ids",
    "version_matches",
]
