"""Adoption: the replicas an agent reports at Register that this controller does not know (a controller
restart, a fail-over), taken back as they were; and the ones it no longer reports, failed at once."""

from __future__ import annotations

import logging

from llmgw_agent.protocol import Register

from llmgw.controller.parts.background import Background
from llmgw.controller.parts.fleet import FleetActor
from llmgw.controller.parts.hub import NodeLink
from llmgw.controller.parts.state import ReplicaRec
from llmgw.core.fleet.states import ADOPTABLE_SHARD_STATES
from llmgw.core.placement import ShardPlacement

log = logging.getLogger("llmgw.controller.reconcile")


def adopt(c: FleetActor, background: Background, link: NodeLink, register: Register) -> None:
    """Shards an agent reports at Register that this controller does not know. One the store knows is
    that replica again: its profile, age and part in a roll (what it replaces, a restart asked) as the
    last leader wrote them, and the fingerprint the agent says it runs; so a controller restart changes
    nothing a commit asked for, and a stale one is rolled like any other. `adopted` only says that this
    controller did not start it (its load time is unknown). Replicas the node ran that its agent no longer
    reports: failed now (`vanished`)."""
    vanished(c, background, link, register)
    for shard in register.shards:
        if shard.state not in ADOPTABLE_SHARD_STATES:
            continue
        existing = c.fleet.replicas.get(shard.replica_id)
        if existing is not None:
            # Another shard of a multi-node replica adopted from another node: add where this one runs.
            if existing.adopted and shard.shard_rank not in {s.rank for s in existing.shards}:
                placed = ShardPlacement(link.name, shard.shard_rank, tuple(shard.gpus))
                existing.shards = tuple(sorted((*existing.shards, placed), key=lambda s: s.rank))
            continue
        known = c.fleet.worker_state.known_records.get(shard.replica_id)
        profile = known.profile if known else profile_by_fingerprint(c, shard.model, shard.fingerprint)
        rec = ReplicaRec(
            id=shard.replica_id,
            model=shard.model,
            profile=profile,
            fingerprint=shard.fingerprint or (known.fingerprint if known else ""),
            created_at=known.created_at if known else c.wall(),
            # The GPUs the agent says the shard holds: placement counts them as taken (with none, a
            # restarted controller would place another replica on the same cards).
            shards=(ShardPlacement(link.name, shard.shard_rank, tuple(shard.gpus)),),
            adopted=True,
            start_sent_at=c.clock(),
            replaces=known.replaces if known else None,
            restart=known.restart_asked if known else False,
        )
        c.fleet.replicas[rec.id] = rec
        log.info("adopted replica %s (%s, pid %s) on %s", rec.id, rec.model, shard.pid, link.name)
        where = "known to the store" if known else "not in the store"
        background.spawn(
            c.event("replica_adopted", rec.id, f"found running on {link.name} (pid {shard.pid}; {where})")
        )


def vanished(c: FleetActor, background: Background, link: NodeLink, register: Register) -> None:
    """A replica that ran on this node (seen ready, or adopted from it) and that its agent, registering
    again, does not report: its engine died with the agent (the host rebooted, the agent's state was lost).
    It is failed at once, and replaced like any failed replica, instead of waiting out the grace a start
    not yet reported gets (a minute and more)."""
    reported = {s.shard_id for s in register.shards}
    for rec in list(c.fleet.replicas.values()):
        if rec.stopping or rec.error or (rec.ready_since is None and not rec.adopted):
            continue
        gone = [s for s in rec.shards if s.node == link.name and f"{rec.id}-{s.rank}" not in reported]
        if not gone:
            continue
        rec.error = f"gone from {link.name}: its agent registered again without it (the host restarted?)"
        log.warning("replica %s %s", rec.id, rec.error)
        background.spawn(c.event("replica_vanished", rec.id, rec.error))


def profile_by_fingerprint(c: FleetActor, model: str, fingerprint: str) -> str:
    d = c.desired
    entry = d.models.get(model) if d else None
    if entry is None:
        return ""
    match = next((p.name for p in entry.profiles if p.fingerprint == fingerprint), None)
    return match or (entry.profiles[0].name if entry.profiles else "")
