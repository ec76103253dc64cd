"""Logs through the admin API: `GET /api/v1/nodes/{node}/logs` and `GET /api/v1/replicas/{id}/logs`.

The lines live in each agent's ring (llmgw_agent.logring); the controller asks for them over the hub with a
`logs` command and keeps nothing itself. Query: `since` (a duration: `10m`), `grep` (a regular expression,
searched in each line), `limit` (1-1000, default 200), `cursor` (the last answer's `next_cursor`: the lines after
it), `source` (node logs only: a replica id, or `agent`). Without cursor or since, the newest `limit` lines.

`follow=1` streams instead: newline-delimited JSON (`application/x-ndjson`, chunked), first the page the other
parameters select, then every new line as the agent reads it. Each object is one of
`{"line": {...}}`, `{"cursor": C}` (after each batch, and at least every FOLLOW_WAIT_S: resume from it) or
`{"notice": TEXT}` (a node went away or came back, lines were dropped before they were read). The agent
long-polls (it answers as soon as a line matches), so a line reaches the client within a fraction of a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from aiohttp import web
from llmgw_agent.protocol import Command, LogQuery

from llmgw.controller.parts.fleet import FleetReader
from llmgw.controller.parts.hub import AgentError, AgentHub
from llmgw.core.api.logpage import NodePage, Position, decode_cursor, encode_cursor, merge_pages
from llmgw.core.errors import LlmgwError
from llmgw.core.words import parse_duration

FOLLOW_WAIT_S = 10.0  # each long poll: the agent answers sooner when a line comes
RETRY_S = 2.0  # a node that is not connected is asked again this often while following
DEFAULT_LIMIT = 200
Write = Callable[[dict[str, Any]], Awaitable[None]]


class LogsParts(FleetReader, Protocol):
    """What the logs read besides a FleetReader: the hub (a follow ends when it closes)."""

    @property
    def hub(self) -> AgentHub: ...


PARTS: web.AppKey[LogsParts] = web.AppKey("logs_parts")


class BadQuery(LlmgwError, ValueError):
    """A query parameter the logs endpoints cannot use (a 400 that says what would be right)."""


@dataclass(frozen=True)
class Target:
    """What to read: per node, the ring's filter (source, shard) for it."""

    label: dict[str, str]
    nodes: tuple[str, ...]
    source: str | None


@dataclass(frozen=True)
class Ask:
    since: float | None
    grep: str | None
    limit: int
    positions: dict[str, Position] | None
    follow: bool


def parse_ask(query: Any, now: float) -> Ask:
    since = query.get("since")
    try:
        since_at = None if since is None else now - parse_duration(since, bare_seconds=False)
    except ValueError as exc:
        raise BadQuery(f"since={since!r}: {exc} (the lines of the last 10m: since=10m)") from None
    grep = query.get("grep") or None
    if grep is not None:
        if len(grep) > 500:
            raise BadQuery("grep: at most 500 characters")
        try:
            re.compile(grep)
        except re.error as exc:
            raise BadQuery(f"grep={grep!r} is not a regular expression: {exc}") from None
    try:
        limit = int(query.get("limit", DEFAULT_LIMIT))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 1000:
        raise BadQuery(
            f"limit={query.get('limit')!r}: a whole number from 1 to 1000 (default {DEFAULT_LIMIT})"
        )
    cursor = query.get("cursor")
    try:
        positions = None if not cursor else decode_cursor(cursor)
    except ValueError as exc:
        raise BadQuery(str(exc)) from None
    follow = query.get("follow", "0").lower() in ("1", "true", "yes")
    return Ask(since_at, grep, limit, positions, follow)


def _query(ask: Ask, target: Target, node: str, wait_s: float = 0.0) -> LogQuery:
    position = (ask.positions or {}).get(node)
    return LogQuery(
        boot=position.boot if position else None,
        # A node the cursor does not name (a shard placed since, a node that did not answer) is read as if
        # asked for the first time: its newest lines, or those since `since`; not its whole ring.
        after=position.after if position else None,
        since=ask.since,
        grep=ask.grep,
        source=target.source,
        limit=ask.limit,
        wait_s=wait_s,
    )


async def _ask_node(c: LogsParts, node: str, query: LogQuery) -> NodePage:
    wait = c.settings.command_timeout_s + query.wait_s
    reply = await c.agents.command(node, Command(id=uuid.uuid4().hex[:12], action="logs", logs=query), wait)
    if not reply.ok:
        raise AgentError(f"node {node} refused logs: {reply.error or 'no reason given'}")
    try:
        return NodePage.from_payload(reply.payload)
    except (KeyError, TypeError, ValueError) as exc:
        raise AgentError(f"node {node} answered logs with something else ({exc}): an older agent?") from None


async def read_page(c: LogsParts, target: Target, ask: Ask) -> dict[str, Any]:
    """One page across the target's nodes; a node that cannot answer is named in `unavailable`."""
    answers = await asyncio.gather(
        *(_ask_node(c, node, _query(ask, target, node)) for node in target.nodes), return_exceptions=True
    )
    pages: dict[str, NodePage] = {}
    unavailable: dict[str, str] = {}
    for node, answer in zip(target.nodes, answers, strict=True):
        if isinstance(answer, AgentError):
            unavailable[node] = str(answer)
        elif isinstance(answer, BaseException):
            raise answer
        else:
            pages[node] = answer
    tail = ask.positions is None and ask.since is None
    merged = merge_pages(pages, ask.limit, tail=tail)
    positions = {**(ask.positions or {}), **merged.positions}
    return {
        **target.label,
        "lines": merged.lines,
        "next_cursor": encode_cursor(positions),
        "more": merged.more,
        "missed": merged.missed,
        "unavailable": unavailable,
    }


def _refusal(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def node_target(c: LogsParts, node: str, source: str | None) -> Target | None:
    if node not in c.agents.nodes:
        return None
    return Target({"node": node}, (node,), source or None)


def replica_target(c: LogsParts, replica_id: str) -> Target | None:
    """The nodes of a replica the controller keeps, or (forgotten already) of any shard an agent reports."""
    rec = c.fleet.replicas.get(replica_id)
    nodes = list(dict.fromkeys(rec.nodes)) if rec is not None else []
    if not nodes:
        nodes = sorted(
            name
            for name, link in c.agents.nodes.items()
            if any(s.replica_id == replica_id for s in link.shards.values())
        )
    return Target({"replica": replica_id}, tuple(nodes), replica_id) if nodes else None


async def serve(request: web.Request, target: Target) -> web.StreamResponse:
    c = request.app[PARTS]
    try:
        ask = parse_ask(request.query, c.wall())
    except BadQuery as exc:
        return _refusal(400, str(exc))
    if ask.follow:
        return await _follow(request, c, target, ask)
    page = await read_page(c, target, ask)
    if page["unavailable"] and len(page["unavailable"]) == len(target.nodes):
        reasons = "; ".join(page["unavailable"].values())
        return _refusal(503, f"no node answered ({reasons}): the logs are in each node's agent")
    return web.json_response(page)


async def _follow(request: web.Request, c: LogsParts, target: Target, ask: Ask) -> web.StreamResponse:
    first = await read_page(c, target, ask)
    response = web.StreamResponse(
        headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache"}
    )
    response.enable_chunked_encoding()
    await response.prepare(request)
    lock = asyncio.Lock()

    async def write(obj: dict[str, Any]) -> None:
        async with lock:
            await response.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    positions = decode_cursor(first["next_cursor"])
    try:
        for line in first["lines"]:
            await write({"line": line})
        for node, why in first["unavailable"].items():
            await write({"notice": f"{why}; waiting for node {node}"})
        await write({"cursor": first["next_cursor"]})
        async with asyncio.TaskGroup() as nodes:  # one failing write (the client gone) ends them all
            for node in target.nodes:
                nodes.create_task(_follow_node(c, target, ask, node, positions, write))
    except* ConnectionError:
        pass  # the client went away: nothing more to send
    with contextlib.suppress(ConnectionError):
        await response.write_eof()
    return response


async def _follow_node(
    c: LogsParts, target: Target, ask: Ask, node: str, positions: dict[str, Position], write: Write
) -> None:
    """Long-polls one node's ring past its position until the client goes (a write then raises)."""
    down: str | None = None
    while True:
        ask_now = replace(ask, positions=positions)
        try:
            page = await _ask_node(c, node, _query(ask_now, target, node, FOLLOW_WAIT_S))
        except AgentError as exc:
            if c.hub.closing:
                return  # the controller is stopping: the stream ends with it
            if down is None:
                await write({"notice": f"{exc}; waiting for node {node}"})
            down = str(exc)
            await write({"cursor": encode_cursor(positions)})  # also what notices a client gone
            await asyncio.sleep(RETRY_S)
            continue
        if down is not None:
            await write({"notice": f"node {node} answers again"})
            down = None
        if page.missed:
            await write(
                {"notice": f"node {node} dropped {page.missed} line(s) from its ring before they were read"}
            )
        for line in page.lines:
            await write({"line": {**line, "node": node}})
        positions[node] = Position(page.boot, page.next_after)
        await write({"cursor": encode_cursor(positions)})


async def node_logs(request: web.Request) -> web.StreamResponse:
    c = request.app[PARTS]
    node = request.match_info["node"]
    target = node_target(c, node, request.query.get("source"))
    if target is None:
        known = ", ".join(sorted(c.agents.nodes)) or "none"
        return _refusal(404, f"no node {node!r} has connected to this controller (nodes: {known})")
    return await serve(request, target)


async def replica_logs(request: web.Request) -> web.StreamResponse:
    c = request.app[PARTS]
    replica_id = request.match_info["replica_id"]
    target = replica_target(c, replica_id)
    if target is None:
        return _refusal(
            404,
            f"no replica {replica_id!r} is known to this controller or reported by a node (`llmgw replicas` "
            "lists them); the lines of one long gone may still be in its node's ring: "
            f"`llmgw logs NODE --source {replica_id}`",
        )
    return await serve(request, target)
