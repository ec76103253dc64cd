"""Which of a base model's replicas may take a request for one of its LoRA adapters. Pure.

The rule: a replica that has the adapter loaded and room is preferred (it answers at once, and one replica's
adapter slots are not spent on what another already holds). When every replica holding it is saturated, or
none holds it, one replica with room that can load it at runtime (vLLM, the adapter's files on every node) is
chosen: the least loaded, ties broken by id, so routers that see the same loads choose the same one and the
adapter is loaded once rather than everywhere. When none can load it, the holders take it even saturated
(they queue); with no holder at all, every replica is left (an engine that lacks the adapter answers 404).
The scheduler then picks among what is left as for any request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["AdapterReplica", "AffinityChoice", "choose"]


@dataclass(frozen=True, slots=True)
class AdapterReplica:
    id: str
    holds: bool  # the adapter is loaded there (at start, or by a runtime load this router made)
    loadable: bool  # it can load the adapter now (vLLM with the runtime API, the adapter's path known)
    load: float  # in flight over slots (0 idle, 1 full); what "least loaded" compares
    saturated: bool  # no room for one more request


@dataclass(frozen=True, slots=True)
class AffinityChoice:
    allowed: frozenset[str]  # the replicas the scheduler may pick among
    load_on: str | None  # a replica to load the adapter on first (the only one allowed then)


def choose(candidates: Sequence[AdapterReplica]) -> AffinityChoice:
    holders = [c for c in candidates if c.holds]
    with_room = [c for c in holders if not c.saturated]
    if with_room:
        return AffinityChoice(frozenset(c.id for c in with_room), None)
    loaders = [c for c in candidates if not c.holds and c.loadable and not c.saturated]
    if loaders:
        target = min(loaders, key=lambda c: (c.load, c.id))
        return AffinityChoice(frozenset({target.id}), target.id)
    if holders:
        return AffinityChoice(frozenset(c.id for c in holders), None)
    return AffinityChoice(frozenset(c.id for c in candidates), None)
