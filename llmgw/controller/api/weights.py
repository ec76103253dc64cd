"""Weights on nodes, for the admin API: what each node holds (`GET /api/v1/weights`), collecting what no
declared model references (`POST /api/v1/weights/collect`), and the controller's last check for new weights
upstream (`GET /api/v1/weights/updates`, llmgw.controller.loops.update_checks).

The controller knows the catalog and the node knows its disk, so each does its half: the controller sends the
sources every declared model still names, and the agent deletes only files it fetched itself, that no running
shard uses and that no kept source names (llmgw_agent.cache_index checks each path again). Without an applied
revision nothing is collected: every model's weights would look unreferenced.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

from aiohttp import web
from llmgw_agent.protocol import Command, WeightSource

from llmgw.controller.api.guard import require_parts
from llmgw.controller.loops.update_checks import UPDATE_CHECKS
from llmgw.controller.parts.hub import AgentError
from llmgw.core.errors import LlmgwError
from llmgw.core.fleet.views import held_weights_keys, weights_key
from llmgw.core.weights.fetch_plan import directory_key

if TYPE_CHECKING:
    from llmgw.controller.parts.fleet import FleetReader

COLLECT_WAIT_S = 60.0  # deleting files of a hundred GB is not instant on every filesystem


class NothingApplied(LlmgwError, ValueError):
    """No revision is applied: what is referenced is not known."""


def declared_by(c: FleetReader) -> dict[str, list[str]]:
    """weights key -> the declared models whose source it is."""
    out: dict[str, list[str]] = {}
    d = c.desired
    for name, entry in sorted((d.models if d else {}).items()):
        key = weights_key(entry.spec.source, entry.manifest_digest)
        if key is not None:
            out.setdefault(key, []).append(name)
    return out


def weights_json(c: FleetReader) -> list[dict[str, Any]]:
    declared = declared_by(c)
    out: list[dict[str, Any]] = []
    for name, link in sorted(c.agents.nodes.items()):
        inv = link.inventory
        cache = next((d for d in inv.disks or [] if d.holds_cache), None)
        files = None
        if inv.weights is not None:
            files = []
            for w in inv.weights:
                keys = held_weights_keys(w.url, w.path, w.sha256, w.directory, w.manifest_sha256)
                by = sorted({m for k in keys for m in declared.get(k, [])})
                files.append(w.model_dump(mode="json") | {"key": keys[0], "declared_by": by})
        out.append(
            {
                "node": name,
                "connected": link.connected,
                "cache_disk": None if cache is None else cache.model_dump(mode="json"),
                "files": files,  # None: the agent keeps no index (too old), not "holds nothing"
            }
        )
    return out


def kept_sources(c: FleetReader) -> list[WeightSource]:
    d = c.desired
    if d is None:
        raise NothingApplied("no revision is applied: nothing is collected until one is")
    kept: list[WeightSource] = []
    for entry in d.models.values():
        s = entry.spec.source
        if s is not None and s.directory:
            # By name and, with a repo manifest, digest: the bytes an older manifest named are collectable.
            kept.append(WeightSource(directory=directory_key(s), manifest_sha256=entry.manifest_digest))
        elif s is not None:
            kept.append(WeightSource(path=s.path, url=s.url, sha256=s.sha256, size=s.size_bytes))
    return kept


async def collect(c: FleetReader, dry_run: bool, node: str | None = None) -> list[dict[str, Any]]:
    """Ask every connected node (or one) to collect; each node's answer, or why it gave none."""
    keep = kept_sources(c)
    names = [n for n, link in sorted(c.agents.nodes.items()) if link.connected and node in (None, n)]
    if node is not None and not names:
        raise AgentError(f"node {node} is not connected")

    async def one(name: str) -> dict[str, Any]:
        cmd = Command(id=uuid.uuid4().hex[:12], action="collect_weights", keep=keep, dry_run=dry_run)
        try:
            reply = await c.agents.command(name, cmd, COLLECT_WAIT_S)
        except AgentError as exc:
            return {"node": name, "error": str(exc)}
        if not reply.ok:
            return {"node": name, "error": reply.error or "refused without a reason"}
        return {"node": name, **reply.payload}

    return list(await asyncio.gather(*(one(n) for n in names)))


async def update_checks(request: web.Request) -> web.Response:
    """The last periodic check against the origin, as it was answered: nothing is asked here."""
    return web.json_response(require_parts(request, "plan", UPDATE_CHECKS).answer())
