"""Shared by the request-path security tests: a catalog built from documents, published the way the controller
publishes it, served by a router in the test's loop in front of real sim engine processes."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from llmgw_router.app import Listeners, serve
from llmgw_router.path.auth import Authenticator, KeyStore, StaticKeys
from llmgw_router.path.ratelimit import Limiter, memory_limiter
from llmgw_router.path.service import Router, RouterOptions

from llmgw.adapters.keys import hash_key
from llmgw.controller.wire.publisher import published_models, published_tenants
from llmgw.core.config.models import Cluster, Model, Organization, Project
from llmgw.core.config.secretrefs import SecretPolicy
from llmgw.core.desired.catalog import Catalog
from llmgw.core.snapshot import RouterSnapshot

KEY = "sk-llmgw-" + "s" * 43  # project `tenant`


def _doc(cls: Any, name: str, spec: dict[str, Any]) -> Any:
    return cls.model_validate(
        {"apiVersion": "llmgw/v1", "kind": cls.__name__, "metadata": {"name": name}, "spec": spec}
    )


def model(name: str, **spec: Any) -> Model:
    spec.setdefault("context_length", 2048)
    spec.setdefault("profiles", [{"name": "sim", "engine": "sim"}])
    return _doc(Model, name, spec)  # type: ignore[no-any-return]


def catalog(
    *models: Model, project: dict[str, Any] | None = None, cluster: dict[str, Any] | None = None
) -> Catalog:
    """The models, an organization `org` and a project `tenant` under it (spec `project`, default: no lists)."""
    docs: list[Any] = [*models, _doc(Organization, "org", {})]
    docs.append(_doc(Project, "tenant", {"organization": "org", **(project or {})}))
    if cluster is not None:
        docs.append(_doc(Cluster, "cluster", cluster))
    return Catalog.build(docs)


def published(cat: Catalog, endpoints: list[dict[str, Any]], **router: Any) -> RouterSnapshot:
    """What the controller would push for `cat` with these endpoints ready."""
    return RouterSnapshot.model_validate(
        {
            "revision": "sec-1",
            "router": router,
            "models": {k: v.model_dump() for k, v in published_models(cat).items()},
            "tenants": published_tenants(cat).model_dump(),
            "endpoints": endpoints,
        }
    )


class Loads:
    """The controller's side of on-demand loads: records what the router asked for."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def request_load(self, model: str) -> None:
        self.asked.append(model)


def tenant_keys() -> StaticKeys:
    return StaticKeys.from_file_lines([f"{hash_key(KEY)} tenant key-1"])


async def start_router(
    snap: RouterSnapshot,
    *,
    keys: KeyStore | None = None,
    limiter: Limiter | None = None,
    on_demand_wait: float = 30.0,
    secrets: SecretPolicy | None = None,
) -> tuple[Router, Listeners, Loads, str]:
    """A router serving `snap`; `secrets`: where it reads provider keys and their binding map."""
    loads = Loads()
    options = RouterOptions(on_demand_wait=on_demand_wait)
    if secrets is not None:
        options = dataclasses.replace(options, secrets=secrets)
    router = Router(
        options,
        auth=Authenticator(keys if keys is not None else tenant_keys()),
        limiter=limiter if limiter is not None else memory_limiter(time.time),
        controller=loads,
    )
    router.apply_snapshot(snap)
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    return router, listeners, loads, f"http://127.0.0.1:{listeners.api_port}"
