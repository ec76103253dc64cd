"""The sim's prefill/decode disaggregation, following vLLM's documented P/D protocol (`kv_transfer_params`).

A request whose `kv_transfer_params` say `do_remote_decode: true` is a prefill for a decode elsewhere: the sim
prefills as usual, keeps the prompt's "KV" (its tokens) under fresh block ids, and answers with the parameters
a decode engine needs to take it, as vLLM's NIXL connector does: `do_remote_prefill: true`,
`do_remote_decode: false`, `remote_engine_id`, `remote_block_ids`, `remote_host`, `remote_port`, `tp_size`.

A request whose `kv_transfer_params` say `do_remote_prefill: true` is that decode: the sim pulls the KV from
the engine named (`POST /llmgw_sim/kv` on `remote_host:remote_port`, standing in for NIXL's side channel; the
held KV is handed over once and then freed) and, when it is this prompt's, skips the prompt's prefill time.
A pull that fails, or brings another prompt's KV, is recomputed (vLLM's `kv_load_failure_policy: recompute`)
and counted. Held KV nobody takes is freed after `HOLD_SECONDS` (vLLM frees it after a timeout too).

The counts are on the sim's /metrics as `llmgw_sim_kv_transfers_total{direction="sent|received|failed"}`.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web

__all__ = ["HOLD_SECONDS", "KV_PATH", "Disaggregation"]

KV_PATH = "/llmgw_sim/kv"
HOLD_SECONDS = 60.0
_PULL_TIMEOUT = aiohttp.ClientTimeout(total=10)


def _params(body: Mapping[str, Any]) -> Mapping[str, Any]:
    params = body.get("kv_transfer_params")
    return params if isinstance(params, dict) else {}


class Disaggregation:
    """One sim engine's side of the protocol: the KV it holds for remote decodes, and its pulls."""

    def __init__(self) -> None:
        self.engine_id = uuid.uuid4().hex
        self.host = "127.0.0.1"  # where decodes reach this engine: set from --host/--port when it serves
        self.port = 0
        self._held: dict[tuple[int, ...], tuple[list[str], float]] = {}
        self.counts = {"sent": 0, "received": 0, "failed": 0}

    # ---- the prefill side

    def keeps_kv(self, body: Mapping[str, Any]) -> bool:
        return _params(body).get("do_remote_decode") is True

    def hold(self, prompt: list[str]) -> dict[str, Any]:
        """Keep `prompt`'s KV for a remote decode; the parameters the answer carries."""
        now = time.monotonic()
        for key in [k for k, (_, at) in self._held.items() if now - at > HOLD_SECONDS]:
            del self._held[key]
        blocks = tuple(secrets.randbits(62) for _ in range(max(1, -(-len(prompt) // 16))))
        self._held[blocks] = (list(prompt), now)
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_block_ids": list(blocks),
            "remote_host": self.host,
            "remote_port": self.port,
            "tp_size": 1,
        }

    async def serve_pull(self, request: web.Request) -> web.Response:
        """Hand over held KV once (a decode engine's pull), then free it."""
        try:
            asked = await request.json()
        except ValueError:
            return web.json_response({"error": "body must be JSON"}, status=400)
        blocks = asked.get("remote_block_ids") if isinstance(asked, dict) else None
        if asked.get("remote_engine_id") != self.engine_id or not isinstance(blocks, list):
            return web.json_response({"error": "not this engine's KV"}, status=404)
        held = self._held.pop(tuple(b for b in blocks if isinstance(b, int)), None)
        if held is None:
            return web.json_response({"error": "no such KV held (taken, or freed)"}, status=404)
        self.counts["sent"] += 1
        return web.json_response({"tokens": held[0]})

    # ---- the decode side

    async def take(self, body: Mapping[str, Any], prompt: list[str]) -> int:
        """The prompt tokens whose KV a decode request brought from its prefill (0: none, computed here)."""
        params = _params(body)
        if params.get("do_remote_prefill") is not True:
            return 0
        url = f"http://{params.get('remote_host')}:{params.get('remote_port')}{KV_PATH}"
        ask = {
            "remote_engine_id": params.get("remote_engine_id"),
            "remote_block_ids": params.get("remote_block_ids"),
        }
        try:
            async with (
                aiohttp.ClientSession(timeout=_PULL_TIMEOUT) as session,
                session.post(url, json=ask) as answer,
            ):
                got = await answer.json() if answer.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            got = None
        if not isinstance(got, dict) or got.get("tokens") != prompt:
            self.counts["failed"] += 1
            return 0
        self.counts["received"] += 1
        return len(prompt)

    def metric_lines(self, labels: str) -> list[str]:
        name = "llmgw_sim_kv_transfers_total"
        lines = [
            f"# HELP {name} KV handed to (sent), taken from (received) or not taken from another engine (failed).",
            f"# TYPE {name} counter",
        ]
        lines += [f'{name}{{{labels},direction="{d}"}} {float(n)!r}' for d, n in self.counts.items()]
        return lines
