"""LoRA adapters on the request path (docs/lora.md): an adapter's name resolves to its base model, the
project's right to it is checked, the base's replicas are narrowed by adapter affinity (adapter_affinity.py),
an adapter is loaded at runtime on a vLLM replica when affinity says so, and the body each engine is sent
names the adapter its own way.

- vLLM serves a loaded adapter under its name: the request's `model` is the adapter's name.
- llama.cpp loads its adapters unapplied at start and takes a per-request `lora` list of `{id, scale}` (id: the
  adapter's place in the replica's start order). Every request to a replica that carries adapters names all of
  them, the asked-for one at its scale and the others at 0, so a base-model request is answered by the base
  alone whatever the server's global scales are. Such requests also carry `cache_prompt: false`: build 11434
  was seen reusing a prompt's cached state across requests with different adapters (different answers).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from llmgw.core.snapshot import PublishedAdapter
from llmgw_router.decisions.adapter_affinity import AdapterReplica, choose
from llmgw_router.decisions.scheduler import RequestInfo
from llmgw_router.fleet.table import LiveEndpoint, RoutingTable
from llmgw_router.server.errors import ApiError
from llmgw_router.upstream.proxy import UpstreamUnavailable

__all__ = ["Adapters"]

log = logging.getLogger(__name__)
_LOAD_TIMEOUT = aiohttp.ClientTimeout(total=120)


class Adapters:
    """The router's view of which adapters its runtime loads put where (what it started with is published)."""

    def __init__(self) -> None:
        self.loaded: dict[str, set[str]] = {}  # endpoint id -> adapters this router loaded there at runtime

    def forget(self, table: RoutingTable) -> None:
        """Drop what was loaded on endpoints the new snapshot no longer has (a replacement starts fresh)."""
        live = {ep.id for ep in table.all_endpoints()}
        self.loaded = {k: v for k, v in self.loaded.items() if k in live}

    @staticmethod
    def resolve(table: RoutingTable, name: str) -> PublishedAdapter | None:
        adapter = table.snapshot.adapters.get(name)
        return adapter if adapter is not None and adapter.base in table.models else None

    @staticmethod
    def check(name: str, adapter: PublishedAdapter, project: str | None) -> None:
        """403 for a project the adapter does not list (the base's allowlist is checked as for any model)."""
        if adapter.projects is not None and project not in adapter.projects:
            raise ApiError(
                403,
                f"Project `{project}` may not use adapter `{name}`.",
                "model_not_allowed",
                "permission_error",
                param="model",
            )

    def holds(self, ep: LiveEndpoint, name: str) -> bool:
        return name in ep.spec.adapters or name in self.loaded.get(ep.id, ())

    def steer(
        self, table: RoutingTable, base: str, name: str, adapter: PublishedAdapter, info: RequestInfo
    ) -> tuple[RequestInfo, str | None]:
        """The request's endpoints narrowed to what affinity allows, and the endpoint to load it on first."""
        candidates = [
            AdapterReplica(
                ep.id,
                self.holds(ep, name),
                ep.spec.engine == "vllm" and adapter.path is not None,
                ep.inflight / ep.spec.slots if ep.spec.slots else float(ep.inflight),
                ep.spec.slots is not None and ep.inflight >= ep.spec.slots,
            )
            for ep in table.endpoints.get(base, ())
            if ep.id not in info.exclude and not ep.is_provider
        ]
        choice = choose(candidates)
        others = {c.id for c in candidates} - choice.allowed
        return dataclasses.replace(info, exclude=info.exclude | others), choice.load_on

    async def ensure_loaded(
        self, session: aiohttp.ClientSession, ep: LiveEndpoint, name: str, adapter: PublishedAdapter
    ) -> None:
        """vLLM's runtime load (`POST /v1/load_lora_adapter`); UpstreamUnavailable when it fails, so the
        request is tried once more elsewhere like any endpoint that could not serve."""
        if self.holds(ep, name):
            return
        headers = {"Content-Type": "application/json"}
        if ep.spec.api_key:
            headers["Authorization"] = f"Bearer {ep.spec.api_key}"
        body = {"lora_name": name, "lora_path": adapter.path}
        try:
            async with session.post(
                ep.api_base + "/load_lora_adapter", json=body, headers=headers, timeout=_LOAD_TIMEOUT
            ) as answer:
                text = await answer.text()
                status = answer.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise UpstreamUnavailable(f"loading adapter {name}: {type(exc).__name__}") from None
        # Another router may have loaded it first: vLLM then answers 400 saying it is already loaded.
        if status != 200 and not (status == 400 and "already" in text.lower()):
            raise UpstreamUnavailable(f"loading adapter {name}: engine answered {status} {text[:200]}")
        log.info("loaded adapter %s on %s", name, ep.id)
        self.loaded.setdefault(ep.id, set()).add(name)

    @staticmethod
    def rewrite(sent: bytes, ep: LiveEndpoint, name: str | None, adapter: PublishedAdapter | None) -> bytes:
        """The body as this engine must see it to serve `name` (None: the base model itself)."""
        if ep.spec.engine == "llamacpp" and ep.spec.adapters:
            body: dict[str, Any] = json.loads(sent)
            scale = adapter.scale if adapter is not None else 0.0
            body["lora"] = [
                {"id": i, "scale": scale if loaded == name else 0.0}
                for i, loaded in enumerate(ep.spec.adapters)
            ]
            body["cache_prompt"] = False
            return json.dumps(body).encode()
        if name is not None and ep.spec.engine != "llamacpp":
            body = json.loads(sent)
            body["model"] = name
            return json.dumps(body).encode()
        return sent

    @staticmethod
    def cards(
        table: RoutingTable, one: str | None, project: str | None, may_see: Callable[[str, str], bool]
    ) -> list[dict[str, Any]]:
        """`/v1/models` entries of the adapters the caller may use: `may_see(base, adapter name)` says whether
        the base would be listed to it under that name; the adapter's own project list applies on top."""
        out = []
        for name, adapter in table.snapshot.adapters.items():
            if (one is not None and name != one) or adapter.base not in table.models:
                continue
            if adapter.projects is not None and project not in adapter.projects:
                continue
            if not may_see(adapter.base, name):
                continue
            base = table.models[adapter.base]
            out.append(
                {
                    "id": name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "llmgw",
                    "context_length": base.context_length,
                    "capabilities": list(base.capabilities),
                    "aliases": [],
                    "on_demand": base.on_demand,
                    "parent": adapter.base,  # vLLM's field for an adapter's base model
                }
            )
        return out
