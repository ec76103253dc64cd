"""The admin API's one edge for llmgw errors (admin.json_errors): what no handler answered becomes a JSON error
with the status it means; a traceback reaches only the log."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw.controller.api import admin
from llmgw.core.errors import LlmgwError
from llmgw.store import StoreError, StoreUnavailable


class PlanRefused(LlmgwError):
    """Stands for an llmgw error no handler expected."""


def _raising(exc: BaseException) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        raise exc

    return handler


@pytest.mark.parametrize(
    ("raised", "status", "message", "retry_after"),
    [
        (
            StoreUnavailable("PostgreSQL store db: gone", delay=2.5),
            503,
            "the store is unavailable: PostgreSQL store db: gone",
            "3",
        ),
        (
            StoreUnavailable("PostgreSQL store db: gone"),
            503,
            "the store is unavailable: PostgreSQL store db: gone",
            None,
        ),
        (
            StoreError("schema 9 is newer than this llmgw"),
            503,
            "the store is unavailable: schema 9 is newer than this llmgw",
            None,
        ),
        (
            PlanRefused("the plan is stale: revision abc moved"),
            500,
            "the plan is stale: revision abc moved",
            None,
        ),
        (
            RuntimeError("a bug with a secret in it"),
            500,
            "internal error in the controller (its log has the details)",
            None,
        ),
    ],
)
async def test_an_error_no_handler_answered_is_json_with_its_status(
    raised: BaseException, status: int, message: str, retry_after: str | None
) -> None:
    app = web.Application(middlewares=[admin.json_errors])
    app.router.add_get("/api/v1/thing", _raising(raised))
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/api/v1/thing")
        assert response.status == status
        assert await response.json() == {"error": {"message": message}}
        assert response.headers.get("Retry-After") == retry_after
