"""Stored responses on the vault: load one to continue from, keep one, and `GET` / `DELETE /v1/responses/{id}`.

The router seals and opens them itself, with the content key it was given at start (`--content-key-file`,
read once at its edge like its other secrets) through `llmgw.store.queries.content.ContentVault` on the store it
already writes usage to (docs/traffic.md, Where content is sealed). The vault is reached through the `Vault`
protocol here, so the request path imports no store driver; app.py builds the real one.

Every lookup is by the asking key's project: another project's id reads as absent, answered as an unknown or
expired one is (kept.not_found), so a response's existence does not leak across projects.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from llmgw.core.errors import LlmgwError
from llmgw.core.snapshot import Tenants
from llmgw.core.traffic.recorded import content_ttl
from llmgw.store.errors import StoreError
from llmgw_router.server.errors import ApiError, error_response
from llmgw_router.server.exchange import Exchange, json_reply
from llmgw_router.surfaces.responses.kept import KIND, not_found, read_record

__all__ = ["Asker", "KeyCheck", "ResponseKeeper", "Vault", "kept_routes"]

log = logging.getLogger(__name__)


class Opened(Protocol):
    @property
    def data(self) -> bytes: ...


class Vault(Protocol):
    """llmgw.store.queries.content.ContentVault's surface, as the router uses it."""

    async def put(
        self, kind: str, project: str, id_: str, data: bytes, ttl_s: float, now: float
    ) -> float: ...

    async def get(self, kind: str, project: str, id_: str, now: float) -> Opened | None: ...

    async def delete(self, kind: str, project: str, id_: str) -> bool: ...


def _unavailable(exc: Exception) -> ApiError:
    return ApiError(
        503,
        f"Stored responses cannot be read now: the store did not answer ({str(exc)[:200]}). Retry shortly.",
        "store_unavailable",
        "server_error",
        headers={"Retry-After": "1"},
    )


class ResponseKeeper:
    """Kept responses of every project, on one vault; `clock` is the wall clock TTLs are read on."""

    def __init__(self, vault: Vault, clock: Callable[[], float] = time.time) -> None:
        self.vault = vault
        self.clock = clock
        self._failing = False  # a failed keep is warned once, and said again when one works

    async def load(self, project: str, response_id: str, param: str) -> dict[str, Any]:
        """The kept record of `response_id` in `project`, or OpenAI's not-found naming `param` (`not_found`)."""
        try:
            kept = await self.vault.get(KIND, project, response_id, self.clock())
        except StoreError as exc:
            raise _unavailable(exc) from None
        except LlmgwError as exc:  # sealed under another content key, or altered in the store
            raise ApiError(500, f"{exc}.", "content_unreadable", "server_error", param=param) from None
        if kept is None:
            raise not_found(response_id, param)
        try:
            return read_record(kept.data)
        except ValueError:
            raise ApiError(
                500,
                f"Response {response_id} was kept in a form this router does not read.",
                "content_unreadable",
                "server_error",
                param=param,
            ) from None

    async def keep(self, project: str, response_id: str, record: bytes, ttl_s: float) -> bool:
        """Seal and keep a response; False when the store refused (warned once: the Response then says
        `store: false`, which is the truth)."""
        try:
            await self.vault.put(KIND, project, response_id, record, ttl_s, self.clock())
        except Exception as exc:  # whatever failed, the answer is made and charged: it still goes out
            if not self._failing:
                log.warning(
                    "cannot keep stored responses (%s): answered with store false until it works", exc
                )
                self._failing = True
            return False
        if self._failing:
            log.info("stored responses are kept again")
            self._failing = False
        return True

    async def delete(self, project: str, response_id: str) -> None:
        """Forget a kept response, or 404 when there is none to forget (expired counts as none)."""
        await self.load(project, response_id, "response_id")
        try:
            await self.vault.delete(KIND, project, response_id)
        except StoreError as exc:
            raise _unavailable(exc) from None


class Asker(Protocol):
    """Who asks, as these routes read it (path/auth.py's KeyPrincipal)."""

    @property
    def project(self) -> str | None: ...


class KeyCheck(Protocol):
    """The router's key check (path/auth.py's Authenticator): who sent the request, 401 as an ApiError when
    the key is refused (a caller known stops counting as anonymous against the listener's caps)."""

    async def caller(self, exchange: Exchange) -> Asker: ...


def _keeps(tenants: Tenants | None, project: str | None) -> bool:
    spec = tenants.projects.get(project) if tenants is not None and project is not None else None
    return spec is not None and content_ttl(spec.retention) is not None


def kept_routes(
    auth: KeyCheck, keeper: ResponseKeeper | None, tenants: Callable[[], Tenants | None]
) -> dict[str, Callable[[Exchange], Any]]:
    """`GET` and `DELETE /v1/responses/{id}` (the listener's `/v1/responses/*`). `keeper`: None on a router
    without the content key; `tenants`: today's projects (the snapshot's), read at each request."""

    async def answer(exchange: Exchange, delete: bool) -> None:
        try:
            principal = await auth.caller(exchange)
            response_id = exchange.path.removeprefix("/v1/responses/").split("?", 1)[0]
            if "/" in response_id or keeper is None or not _keeps(tenants(), principal.project):
                # No project, one that keeps no content (now), or a router without the content key: nothing
                # is kept for it here (what a withdrawn project kept waits for the controller's deletion).
                raise not_found(response_id, "response_id")
            assert principal.project is not None, "_keeps"
            if delete:
                await keeper.delete(principal.project, response_id)
                exchange.respond(json_reply({"id": response_id, "object": "response", "deleted": True}))
                return
            record = await keeper.load(principal.project, response_id, "response_id")
            exchange.respond(json_reply(record["response"]))
        except ApiError as err:
            exchange.respond(error_response(err))

    async def get(exchange: Exchange) -> None:
        await answer(exchange, delete=False)

    async def remove(exchange: Exchange) -> None:
        await answer(exchange, delete=True)

    return {"GET": get, "DELETE": remove}
