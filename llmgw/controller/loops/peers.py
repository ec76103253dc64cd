"""Peers kept in step (docs/routing.md, Federation): each peer the Cluster declares is asked its `/ready`, timed,
every `check_interval`, and while ready its `/v1/models` with its key. What is found is kept in
`fleet.peers` (llmgw.core.fleet.federation.PeerView), which the routers' snapshot publishes as `PEER/MODEL`;
a change (up, down, a model offered or gone) wakes the publisher and is an event.

Every controller checks (a standby's routers are its own too); nothing is stored: a restarted controller
knows a peer again at its first check.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Protocol

import aiohttp

from llmgw.adapters.egress import checked_connector, read_at_most
from llmgw.adapters.secrets import SecretError, read_bound_secret
from llmgw.controller.parts.fleet import FleetActor
from llmgw.core.config.secret_bindings import SecretUse
from llmgw.core.config.specs.peer_spec import Peer
from llmgw.core.errors import LlmgwError
from llmgw.core.fleet.federation import PeerView, parse_peer_models
from llmgw.core.words import parse_duration

__all__ = ["PeerWatch", "check_peer"]

log = logging.getLogger("llmgw.controller.loops.peers")

MODELS_PAGE_MAX = 4 * 1024 * 1024  # a /v1/models answer larger than this is not a peer's
TICK_S = 0.25  # how often the loop looks for a peer due a check


class PeerParts(FleetActor, Protocol):
    def reserved_secret_names(self) -> frozenset[str]: ...


async def check_peer(
    session: aiohttp.ClientSession, peer: Peer, key: str | None, previous: PeerView, now: float
) -> PeerView:
    """One check of `peer`: its /ready (timed), then, when ready, its /v1/models. A peer that does not answer in
    time, or not 200, is down and keeps its last listing."""
    timeout = aiohttp.ClientTimeout(total=parse_duration(peer.timeout))
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    began = time.monotonic()
    try:
        async with session.get(peer.url + "/ready", timeout=timeout, allow_redirects=False) as resp:
            await read_at_most(resp, 65536, f"peer {peer.name}'s /ready")
            latency = time.monotonic() - began
            if resp.status != 200:
                return PeerView(False, now, latency, f"its /ready answered {resp.status}", previous.models)
        async with session.get(
            peer.url + "/v1/models", headers=headers, timeout=timeout, allow_redirects=False
        ) as resp:
            body = await read_at_most(resp, MODELS_PAGE_MAX, f"peer {peer.name}'s /v1/models")
            if resp.status != 200:
                why = f"its /v1/models answered {resp.status}" + (
                    " (is peers[].key one of its projects' keys?)" if resp.status in (401, 403) else ""
                )
                return PeerView(False, now, latency, why, previous.models)
            models = parse_peer_models(json.loads(body))
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError, LlmgwError) as exc:
        why = f"no answer within {peer.timeout}" if isinstance(exc, TimeoutError) else _words(exc)
        return PeerView(False, now, None, why, previous.models)
    return PeerView(True, now, latency, None, models)


def _words(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _change(name: str, old: PeerView, new: PeerView) -> str | None:
    """What changed between two checks, in words; None when routing would not see a difference."""
    if old.up != new.up:
        return (
            f"peer {name} is up ({len(new.models)} models)" if new.up else f"peer {name} is down: {new.why}"
        )
    if set(old.models) != set(new.models) or old.models != new.models:
        added = sorted(set(new.models) - set(old.models))
        gone = sorted(set(old.models) - set(new.models))
        parts = ([f"offers {', '.join(added)}"] if added else []) + (
            [f"no longer offers {', '.join(gone)}"] if gone else []
        )
        return f"peer {name} " + ("; ".join(parts) or "changed its models")
    return None


class PeerWatch:
    """Checks every declared peer when it is due; one task for all of them."""

    def __init__(self, c: PeerParts) -> None:
        self.c = c
        self._due: dict[str, float] = {}  # peer -> monotonic time of its next check

    def _key(self, peer: Peer) -> str | None:
        if peer.key is None:
            return None
        use = SecretUse(peer.key, "provider-key", peer.url)
        return read_bound_secret(use, self.c.settings.secret_policy(), self.c.reserved_secret_names())

    async def check_due(self, session: aiohttp.ClientSession) -> None:
        d = self.c.desired
        peers = list(d.catalog.cluster.peers) if d is not None else []
        declared = {p.name for p in peers}
        for gone in set(self.c.fleet.peers) - declared:
            del self.c.fleet.peers[gone]
            self._due.pop(gone, None)
            self.c.notify(f"peer {gone} removed")
        now = time.monotonic()
        due = [p for p in peers if self._due.get(p.name, 0.0) <= now]
        for peer in due:
            self._due[peer.name] = now + parse_duration(peer.check_interval)
        found = await asyncio.gather(*(self._check(session, p) for p in due))
        for peer, view in zip(due, found, strict=True):
            old = self.c.fleet.peers.get(peer.name, PeerView())
            self.c.fleet.peers[peer.name] = view
            change = _change(peer.name, old, view)
            if change is not None:
                log.info("%s", change)
                self.c.notify(change)
                await self.c.event("peer", peer.name, change)

    async def _check(self, session: aiohttp.ClientSession, peer: Peer) -> PeerView:
        previous = self.c.fleet.peers.get(peer.name, PeerView())
        try:
            key = self._key(peer)
        except SecretError as exc:
            return PeerView(False, self.c.wall(), None, f"its key cannot be used: {exc}", previous.models)
        return await check_peer(session, peer, key, previous, self.c.wall())

    async def run(self) -> None:
        async with aiohttp.ClientSession(connector=checked_connector("the controller")) as session:
            while True:
                try:
                    await self.check_due(session)
                except Exception:  # a bug must not end the checks
                    log.exception("checking the peers failed")
                await asyncio.sleep(TICK_S)
