"""A ComfyUI server as the router talks to it: one workflow queued, waited on, its pictures fetched.

ComfyUI's own API (its server.py): `POST /prompt {"prompt": workflow, "client_id": id}` queues a workflow and
answers its `prompt_id`; the websocket `/ws?clientId=id` tells that client `execution_start` when it starts,
`executing` with `node: null` when it is done, `execution_error` or `execution_interrupted` when it failed;
`GET /history/{prompt_id}` lists the pictures its save nodes wrote and `GET /view?filename=&subfolder=&type=`
serves each. A workflow whose client left is taken off the queue (`POST /queue {"delete": [id]}`) or, once it
runs, interrupted (`POST /interrupt {"prompt_id": id}`: ComfyUI stops that prompt only).

The websocket is opened before the workflow is queued, so its end cannot be missed. Connections go through the
router's aiohttp session, whose connector makes the egress check (upstream/egress.py).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from llmgw_router.server.errors import ApiError
from llmgw_router.upstream.proxy import UpstreamUnavailable

__all__ = ["ComfyRun", "run_workflow"]

log = logging.getLogger(__name__)

_ACTION_TIMEOUT = aiohttp.ClientTimeout(total=10)  # a queue delete or an interrupt on the way out


@dataclass(slots=True)
class ComfyRun:
    """One workflow's progress at the server: what cancelling it must do."""

    prompt_id: str | None = None
    started: bool = False
    pictures: list[bytes] = field(default_factory=list)


def _ws_url(base: str, client_id: str) -> str:
    scheme = "wss" if base.startswith("https://") else "ws"
    return f"{scheme}://{base.split('://', 1)[1]}/ws?clientId={client_id}"


async def run_workflow(
    session: aiohttp.ClientSession,
    base: str,
    workflow: dict[str, Any],
    headers: dict[str, str],
    pick: Callable[[Any, str], list[dict[str, str]]],
    run: ComfyRun,
) -> list[bytes]:
    """Queue `workflow` at the ComfyUI server at `base`, wait for it, and return its pictures' bytes (`pick`
    finds them in the history). A server that cannot be reached before the workflow was queued is
    UpstreamUnavailable (tried elsewhere); a workflow it refuses or fails is a 502 naming why. Cancelled (the
    client left): the workflow is taken off the queue or interrupted, then the cancellation goes on."""
    client_id = uuid.uuid4().hex
    try:
        ws = await session.ws_connect(_ws_url(base, client_id), headers=headers, heartbeat=30)
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamUnavailable(f"ComfyUI websocket: {exc}") from None
    try:
        run.prompt_id = await _queue(session, base, workflow, headers, client_id)
        await _wait(ws, run)
        history = await _get_json(session, f"{base}/history/{run.prompt_id}", headers)
        for image in pick(history, run.prompt_id):
            run.pictures.append(await _view(session, base, image, headers))
    except asyncio.CancelledError:
        if run.prompt_id is not None and not run.pictures:
            await asyncio.shield(_cancel(session, base, run, headers))
        raise
    finally:
        await ws.close()
    return run.pictures


async def _queue(
    session: aiohttp.ClientSession,
    base: str,
    workflow: dict[str, Any],
    headers: dict[str, str],
    client_id: str,
) -> str:
    try:
        async with session.post(
            f"{base}/prompt", json={"prompt": workflow, "client_id": client_id}, headers=headers
        ) as response:
            answer = await response.json(content_type=None)
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise UpstreamUnavailable(f"ComfyUI /prompt: {exc}") from None
    prompt_id = answer.get("prompt_id") if isinstance(answer, dict) else None
    if response.status != 200 or not isinstance(prompt_id, str):
        why = answer.get("error", answer) if isinstance(answer, dict) else answer
        raise ApiError(
            502,
            f"The ComfyUI server refused the workflow (status {response.status}): {str(why)[:500]}. Check the "
            "model's `provider.workflow` against the nodes and checkpoints that server has.",
            "workflow_refused",
            "server_error",
        )
    return prompt_id


async def _wait(ws: aiohttp.ClientWebSocketResponse, run: ComfyRun) -> None:
    """Read the websocket until this workflow is done (`executing`, node null), or raise why it is not."""
    async for message in ws:
        if message.type != aiohttp.WSMsgType.TEXT:
            continue  # binary frames are previews of the picture being made
        event = message.json()
        kind, data = event.get("type"), event.get("data")
        if not isinstance(data, dict) or data.get("prompt_id") != run.prompt_id:
            continue
        if kind == "execution_start":
            run.started = True
        elif kind == "executing" and data.get("node") is None:
            return
        elif kind in ("execution_error", "execution_interrupted"):
            why = data.get("exception_message") or kind
            raise ApiError(
                502, f"The ComfyUI workflow failed: {str(why)[:500]}", "workflow_failed", "server_error"
            )
    raise ApiError(
        502,
        "The ComfyUI server closed its websocket before the workflow ended.",
        "workflow_failed",
        "server_error",
    )


async def _get_json(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    within: aiohttp.ClientTimeout | None = None,
) -> Any:
    async with session.get(url, headers=headers, timeout=within) as response:
        response.raise_for_status()
        return await response.json(content_type=None)


async def _view(
    session: aiohttp.ClientSession, base: str, image: dict[str, str], headers: dict[str, str]
) -> bytes:
    async with session.get(f"{base}/view", params=image, headers=headers) as response:
        response.raise_for_status()
        return await response.read()


async def _cancel(session: aiohttp.ClientSession, base: str, run: ComfyRun, headers: dict[str, str]) -> None:
    """Take the workflow off the queue, or interrupt it once it runs. Best effort: the client is gone.

    Not seen starting, it is deleted from the queue; it may have started unseen (its `execution_start` still on
    the way), so the queue is read once more and a workflow found running is interrupted as well."""
    try:
        if not run.started:
            await _post(session, f"{base}/queue", {"delete": [run.prompt_id]}, headers)
            queue = await _get_json(session, f"{base}/queue", headers, _ACTION_TIMEOUT)
            running = queue.get("queue_running", []) if isinstance(queue, dict) else []
            run.started = any(isinstance(item, list) and run.prompt_id in item[:2] for item in running)
        if run.started:
            await _post(session, f"{base}/interrupt", {"prompt_id": run.prompt_id}, headers)
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
        log.warning("ComfyUI: could not cancel workflow %s at %s: %s", run.prompt_id, base, exc)


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> None:
    async with session.post(url, json=body, headers=headers, timeout=_ACTION_TIMEOUT) as response:
        response.raise_for_status()
