"""The admin API's OpenAPI document (issue 49): every route the controller serves under /api/ is in it, the
committed docs/admin-openapi.json is what the route table generates, and the controller serves that document."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
from aiohttp import web

from controller.helpers import Repo, cluster_yaml, model_yaml, settings_for, start
from llmgw.controller.api.routes import OPENAPI_PATH, openapi_document
from llmgw.core.api.openapi import render

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "docs" / "admin-openapi.json"


def undocumented(app: web.Application, doc: dict[str, object]) -> set[str]:
    """`METHOD /path` of every route `app` serves under /api/ that `doc` does not describe."""
    paths = doc["paths"]
    assert isinstance(paths, dict)
    served = {
        (r.method, r.resource.canonical)
        for r in app.router.routes()
        if r.method != "HEAD" and r.resource is not None and r.resource.canonical.startswith("/api/")
    }
    return {f"{m} {p}" for m, p in served if m.lower() not in paths.get(p, {})}


def test_the_committed_document_is_what_the_route_table_generates() -> None:
    expected = render(openapi_document())
    assert COMMITTED.read_text(encoding="utf-8") == expected, (
        "docs/admin-openapi.json is stale: regenerate it with `llmgw schemas openapi` (or `make schemas`)"
    )


def test_a_route_registered_outside_the_table_is_found() -> None:
    """The check below finds what it is meant to: a route added to the app by hand, not through the table."""
    app = web.Application()

    async def stray(_: web.Request) -> web.Response:
        return web.json_response({})

    app.router.add_get("/api/v1/stray", stray)
    app.router.add_post("/api/v1/status", stray)  # a method the document does not have on a known path
    assert undocumented(app, openapi_document()) == {"GET /api/v1/stray", "POST /api/v1/status"}


async def test_every_route_the_controller_serves_is_in_the_document_it_serves(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "models/m.yaml": model_yaml("m", min_=0)})
    running, admin = await start(settings_for(tmp_path, repo.path))
    try:
        served = await admin.get(OPENAPI_PATH)
        assert served == json.loads(COMMITTED.read_text(encoding="utf-8"))
        app = running._runners[0].app
        assert undocumented(app, served) == set()
        async with aiohttp.ClientSession() as s, s.get(running.url + OPENAPI_PATH) as r:
            assert r.status == 401  # served with the token, as every other admin endpoint
    finally:
        await running.stop()
