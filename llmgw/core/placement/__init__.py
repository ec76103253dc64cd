"""Placement: choosing nodes for replicas, a pure function with a reason for every node it rejects.

See docs/placement.md for the filters, their words, and why GPU replicas bin-pack while CPU replicas spread.
"""

from llmgw.core.placement.place import (
    ACTIVE_STATES,
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
from llmgw.core.placement.rooms import NodeVerdict, version_matches

__all__ = [
    "ACTIVE_STATES",
    "Explanation",
    "IdFactory",
    "NodeVerdict",
    "Placement",
    "PlacementResult",
    "Placer",
    "ProfileExplanation",
    "ShardPlacement",
    "Unplaced",
    "active_count",
    "explain",
    "place",
    "sequential_ids",
    "version_matches",
]
