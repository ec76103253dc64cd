"""Where the shards of a multi-node replica meet. Pure.

Rank 0's node is the meeting point (the Ray head): its address on the fabric and a port chosen from the replica
id, so every shard of the replica is told the same one without another round trip, and a restarted controller
tells a re-sent shard the same again.
"""

from __future__ import annotations

import hashlib

__all__ = ["RENDEZVOUS_PORTS", "fabric_address", "rendezvous_port"]

RENDEZVOUS_PORTS = (29500, 29999)  # torch.distributed's customary range; outside the agents' engine ports


def rendezvous_port(replica_id: str, ports: tuple[int, int] = RENDEZVOUS_PORTS) -> int:
    lo, hi = ports
    digest = int.from_bytes(hashlib.sha256(replica_id.encode()).digest()[:4], "big")
    return lo + digest % (hi - lo + 1)


def fabric_address(
    declared: str | None, address: str | None, local: bool, seen_from: str | None
) -> str | None:
    """A node's fabric address: the Node's `fabric_address`, else its `address`, else loopback for the local
    node, else the address its agent connected from; None when nothing says it."""
    if declared:
        return declared
    if address:
        return address
    if local:
        return "127.0.0.1"
    return seen_from
