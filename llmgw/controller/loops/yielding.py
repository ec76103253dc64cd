"""A preempted replica's grace: routers already stopped sending it requests; those in flight get up to the
Cluster's `preemption_grace` to finish, read from the engine's own running gauge. It stops as soon as
nothing runs there (the model it yields to is waiting); what still runs when the grace ends is cut, and the
event says how many (or that the engine could not be asked: unknown is not zero).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import aiohttp
from llmgw_agent.engines import metric_mapping

from llmgw.adapters.egress import read_at_most
from llmgw.controller.status import fleet as views
from llmgw.controller.wire.engine_http import MAX_ANSWER_BYTES, engine_session
from llmgw.core.security import engine_key
from llmgw.core.words import parse_duration

if TYPE_CHECKING:
    from llmgw.controller.parts.fleet import EngineCaller
    from llmgw.controller.parts.state import ReplicaRec

log = logging.getLogger("llmgw.controller.reconcile")

POLL_S = 0.25
SCRAPE_TIMEOUT_S = 2.0


def running_from_text(text: str, name: str) -> float | None:
    """The sum of gauge `name`'s samples in a Prometheus text page; None when the page has none."""
    total: float | None = None
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name) : len(name) + 1] not in (" ", "{"):
            continue
        try:
            value = float(line.rsplit(" ", 1)[-1])
        except ValueError:
            continue
        total = value if total is None else total + value
    return total


async def in_flight(c: EngineCaller, rec: ReplicaRec, session: aiohttp.ClientSession) -> int | None:
    """Requests running on the replica's engine now (rank 0 serves them); None when it cannot be asked."""
    d = c.desired
    status = views.shard_status(c, rec)
    if d is None or status is None or not status.base_url:
        return None
    entry = d.models.get(rec.model)
    profile = entry.profile(rec.profile) if entry else None
    if profile is None:
        return None
    engine = profile.profile.engine
    mapping = metric_mapping(engine)
    override = d.cluster.engines.get(engine)
    name = (
        override.metrics.running if override is not None and override.metrics is not None else mapping.running
    )
    path = status.metrics_path or mapping.metrics_path
    try:
        key = engine_key(c.cluster_secret().encode(), rec.id)
        async with session.get(
            status.base_url.rstrip("/") + path,
            headers={"Authorization": f"Bearer {key}"},
            allow_redirects=False,
        ) as resp:
            if resp.status != 200:
                return None
            page = await read_at_most(resp, MAX_ANSWER_BYTES, f"{rec.id}'s metrics")
            value = running_from_text(page.decode("utf-8", "replace"), name)
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        log.debug("cannot read %s's running requests: %s", rec.id, exc)
        return None
    return None if value is None else int(value)


async def grace(c: EngineCaller, rec: ReplicaRec) -> None:
    """Wait until the replica's in-flight requests finish or the grace ends; say what was cut."""
    d = c.desired
    grace_s = parse_duration(d.cluster.preemption_grace) if d is not None else 10.0
    started = c.clock()
    running: int | None = None
    timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
    async with engine_session(timeout) as session:
        while True:
            running = await in_flight(c, rec, session)
            if running == 0 or c.clock() - started >= grace_s:
                break
            await asyncio.sleep(min(POLL_S, max(0.0, grace_s - (c.clock() - started))))
    waited = c.clock() - started
    if running is None:
        cut = "requests cut unknown (its engine's metrics could not be read)"
    else:
        cut = f"{running} request{'s' * (running != 1)} cut"
    words = f"yielded to {rec.preempted_by} after {waited:.1f}s of its {grace_s:g}s grace; {cut}"
    await c.event("replica_yielded", rec.id, words)
