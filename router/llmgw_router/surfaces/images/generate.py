"""One request for pictures at one ComfyUI endpoint: its workflow chosen and filled, run, and answered as
OpenAI's images API answers (`{"created", "data": [{"b64_json"}]}`).

The request went down the same path as a chat (key, allowlist, limits, admission, the guardrails on its
prompt, the pick); only the call to the endpoint differs (llmgw_router.path.service sends it here).
"""

from __future__ import annotations

import base64
import os
import random
import time
from typing import Any

import aiohttp

from llmgw_router.decisions.media.images import BUILTIN, fill, history_images, image_request, parse_workflow
from llmgw_router.server.errors import ApiError
from llmgw_router.server.exchange import json_reply
from llmgw_router.upstream.comfyui import ComfyRun, run_workflow
from llmgw_router.upstream.proxy import ProxyResult, UpstreamCall

__all__ = ["WorkflowFiles", "generate_images"]

_SEED_RANGE = 2**32  # a seed drawn for a request that names none


class WorkflowFiles:
    """Workflow files read once and again only when they change (their modification time), per router."""

    def __init__(self) -> None:
        self._read: dict[str, tuple[float, dict[str, Any]]] = {}

    def workflow(self, ref: str | None) -> dict[str, Any]:
        """The workflow a model names: a built-in by name (flux-schnell when unset) or a JSON file's."""
        if ref is None or ref in BUILTIN:
            return BUILTIN[ref or "flux-schnell"]
        try:
            mtime = os.stat(ref).st_mtime
            known = self._read.get(ref)
            if known is None or known[0] != mtime:
                with open(ref, encoding="utf-8") as f:
                    known = (mtime, parse_workflow(f.read(), ref))
                self._read[ref] = known
        except (OSError, ValueError) as exc:
            raise ApiError(
                502,
                f"This model's ComfyUI workflow cannot be used: {exc}. The operator must fix `provider.workflow`.",
                "workflow_unusable",
                "server_error",
            ) from None
        return known[1]


async def generate_images(
    session: aiohttp.ClientSession,
    base: str,
    workflow: dict[str, Any],
    body: dict[str, Any],
    up: UpstreamCall,
    rng: random.Random,
) -> ProxyResult:
    """Run the request's workflow at the ComfyUI server at `base` and answer with its pictures."""
    asked = image_request(body)
    seed = asked.seed if asked.seed is not None else rng.randrange(_SEED_RANGE)
    headers = {k: v for k, v in up.headers.items() if k.lower() in ("authorization", "x-request-id")}
    run = ComfyRun()
    pictures = await run_workflow(session, base, fill(workflow, asked, seed), headers, history_images, run)
    if not pictures:
        raise ApiError(
            502,
            "The ComfyUI workflow ended without a saved picture: it needs a SaveImage node.",
            "workflow_failed",
            "server_error",
        )
    answer = {
        "created": int(time.time()),
        "data": [{"b64_json": base64.b64encode(p).decode("ascii")} for p in pictures],
    }
    return ProxyResult(json_reply(answer, headers=up.reply_headers), 200, images=len(pictures))
