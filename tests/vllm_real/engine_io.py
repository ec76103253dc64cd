"""Talking to the real vLLM replicas of the session's fleet, through their agent's pass-through (with the engine
key the controller derives), and to its router: metrics pages, model lists, KV events, decisions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgpack
from llmgw_agent.kv_relay import RELAY_PATH
from llmgw_router.fleet.kv_events import read_record

from .fleet import DEBUG, KEY, Fleet

__all__ = [
    "BlockLog",
    "decision_of",
    "engine_get",
    "engine_post",
    "metric_types",
    "metric_value",
    "reading_events",
    "routed",
]


def _request(fleet: Fleet, replica: dict[str, Any], path: str, body: Any = None) -> tuple[int, str]:
    headers = {
        "Authorization": f"Bearer {fleet.engine_key(replica['id'])}",
        "Content-Type": "application/json",
    }
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(replica["base_url"] + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def engine_get(fleet: Fleet, replica: dict[str, Any], path: str) -> str:
    status, text = _request(fleet, replica, path)
    assert status == 200, f"GET {path} on {replica['id']}: {status} {text[:500]}"
    return text


def engine_post(fleet: Fleet, replica: dict[str, Any], path: str, body: Any) -> tuple[int, str]:
    return _request(fleet, replica, path, body)


def metric_types(text: str) -> dict[str, str]:
    """Each family's `# TYPE` on a Prometheus page: name -> gauge, counter, histogram, ..."""
    return dict(m.groups() for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M))


def metric_value(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of `name`'s samples on the page (every label set, or those carrying all of `labels`);
    AssertionError when it has none."""
    wanted = [f'{k}="{v}"' for k, v in (labels or {}).items()]
    values = [
        float(m.group(2))
        for m in re.finditer(rf"^{re.escape(name)}(?:{{([^}}]*)}})? (\S+)$", text, re.M)
        if all(w in (m.group(1) or "").split(",") for w in wanted)
    ]
    assert values, f"no sample of {name} with {labels or 'any labels'} on the page"
    return sum(values)


def decision_of(headers: Any) -> tuple[str, str]:
    """(the endpoint chosen, the whole rationale) from a debug answer's x-llmgw-decision header."""
    decision = str(headers["x-llmgw-decision"])
    return decision.split(";")[0].removeprefix("endpoint="), decision


def routed(
    fleet: Fleet, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> tuple[dict[str, Any], str]:
    """One request through the router with the debug token: its JSON answer and the rationale."""
    headers = {"Authorization": f"Bearer {KEY}", "x-llmgw-debug": DEBUG, "Content-Type": "application/json"}
    req = urllib.request.Request(fleet.router.api + path, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read()), str(r.headers["x-llmgw-decision"])


@dataclass
class BlockLog:
    """Every BlockStored event each replica published since reading began (vLLM 0.32's maps), and the frames."""

    stored: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    frames: dict[str, list[list[bytes]]] = field(default_factory=dict)

    def hashes(self, replica_id: str) -> set[int]:
        return {h for event in self.stored.get(replica_id, []) for h in event["block_hashes"]}


async def _read(
    http: aiohttp.ClientSession, fleet: Fleet, replica: dict[str, Any], log: BlockLog, opened: asyncio.Event
) -> None:
    rid = replica["id"]
    headers = {"Authorization": f"Bearer {fleet.engine_key(rid)}"}
    async with http.get(replica["base_url"] + RELAY_PATH, headers=headers) as r:
        assert r.status == 200, f"relay of {rid}: {r.status} {await r.text()}"
        opened.set()  # the relay answers once its subscription to the publisher is made
        while True:
            parts = await read_record(r.content)
            if parts is None:
                continue  # a heartbeat
            log.frames.setdefault(rid, []).append(parts)
            batch = msgpack.unpackb(parts[2], strict_map_key=False)
            stored = [e for e in batch[1] if isinstance(e, dict) and e.get("type") == "BlockStored"]
            log.stored.setdefault(rid, []).extend(stored)


async def _opened(tasks: list[asyncio.Task[None]], opened: list[asyncio.Event]) -> None:
    """Every relay answered; a reader that failed first raises its error here."""
    answered: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*(o.wait() for o in opened)))
    watched: list[asyncio.Future[Any]] = [answered, *tasks]
    done, _ = await asyncio.wait(watched, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if answered in done:
        return
    answered.cancel()
    for t in done:
        t.result()  # a reader that ended raises why
    raise AssertionError(f"a KV-event relay did not answer within 30 s (or its stream ended): {done}")


@contextlib.asynccontextmanager
async def reading_events(fleet: Fleet) -> AsyncIterator[BlockLog]:
    """Each replica's KV events as its agent relays them (the engine's ZMQ frames, untouched) for the block,
    entered once every relay has answered. A publisher may still drop what it sends in the moment after a
    subscription is made (ZMQ's late joiner): a test that needs every event waits until a batch was heard."""
    log = BlockLog()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as http:
        opened = {r["id"]: asyncio.Event() for r in fleet.replicas}
        tasks = [asyncio.create_task(_read(http, fleet, r, log, opened[r["id"]])) for r in fleet.replicas]
        try:
            await _opened(tasks, list(opened.values()))
            yield log
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
