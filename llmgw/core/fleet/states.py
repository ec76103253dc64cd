"""The fleet's state vocabulary, in one place: the states a node, a shard and a replica can be in, the sets the
decisions and the views count by, and the one rule for "stale". Pure. docs/controller.md (States) says what each
state means to an operator; the agent's protocol keeps its own copy of the shard states, by design (it imports
nothing of llmgw's).
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "ACTIVE_STATES",
    "ADOPTABLE_SHARD_STATES",
    "GONE_STATES",
    "HELD_STATES",
    "NODE_STATES",
    "NODE_WORDS",
    "REPLICA_STATES",
    "NodeState",
    "NodeWord",
    "ReplicaState",
    "ShardState",
    "is_stale",
]

# A connected node: Ready; Unreachable after `unreachable_after` without a message (its replicas are kept,
# nothing new is placed there); Lost after `lost_after` (its replicas are forgotten and placed elsewhere).
NodeState = Literal["Ready", "Unreachable", "Lost"]
NODE_STATES: tuple[NodeState, ...] = ("Ready", "Unreachable", "Lost")
# What the views add for a node with no agent connected: declared in the repo but never joined (NotJoined), or
# no longer declared while the controller still removes it (Removed).
NodeWord = NodeState | Literal["NotJoined", "Removed"]
NODE_WORDS: tuple[NodeWord, ...] = (*NODE_STATES, "NotJoined", "Removed")

# A shard, as its agent reports it (the agent's protocol.ShardState is the same words).
ShardState = Literal["fetching", "starting", "ready", "failed", "stopping", "stopped"]

# The controller's own word for where a replica is in its life; a failed shard overrides it (effective_state).
ReplicaState = Literal["pending", "starting", "ready", "failed", "draining", "stopping", "stopped"]
REPLICA_STATES: tuple[ReplicaState, ...] = (
    "pending",  # sent to its agents, not reported yet
    "starting",  # weights being fetched or the engine loading
    "ready",  # every shard ready: serving
    "failed",  # a shard failed; stopped and replaced by the reconciler
    "draining",  # taken out of the routers, finishing what it was sent
    "stopping",  # asked to stop, not reported stopped yet
    "stopped",  # gone
)

# Counts towards a model's replicas: serving, or on its way to serving.
ACTIVE_STATES: frozenset[ReplicaState] = frozenset({"pending", "starting", "ready"})
# Holds its room on its nodes (GPUs, memory, cache disk) until it reports stopped: a failed or leaving replica
# still has its process.
HELD_STATES: frozenset[ReplicaState] = frozenset(
    {"pending", "starting", "ready", "failed", "draining", "stopping"}
)
# Leaving or left: never counted, never stopped again.
GONE_STATES: frozenset[ReplicaState] = frozenset({"draining", "stopping", "stopped"})
# A shard a controller adopts when its agent reports it at `register` (after a restart or a fail-over).
ADOPTABLE_SHARD_STATES: frozenset[ShardState] = frozenset({"fetching", "starting", "ready"})


def is_stale(fingerprint: str, wanted: str | None) -> bool:
    """Is a replica started with `fingerprint` stale against the repo's profile, whose fingerprint is `wanted`
    (None: the profile is no longer in the repo)?

    A profile gone is stale, whatever the replica reports. Otherwise stale is a difference of two known
    fingerprints: an empty one on either side is unknown (an older agent, a state saved without them), and
    unknown is not stale: a replica is never rolled on a guess.
    """
    if wanted is None:
        return True
    return bool(fingerprint) and bool(wanted) and fingerprint != wanted
