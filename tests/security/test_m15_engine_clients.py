"""M15: the controller's engine clients (model checks, canary and admin evals) follow no redirect, connect to no
forbidden address, read a bounded answer, and quote no arbitrary page into results a `plan` token reads.

The exploit as the review sketches it: a compromised node reports its replica's `base_url` as a server of its
own. That server redirects the controller's POST to an internal service (here a loopback recorder), or answers
with an endless body, or with a page whose text the node wants to read back through `llmgw model checks`.
"""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from support import answering

from llmgw.controller.loops.evals import run_suite
from llmgw.controller.loops.model_checks import probe_target
from llmgw.controller.wire.engine_http import MAX_ANSWER_BYTES, EngineTarget, engine_session
from llmgw.core.config.specs.eval_spec import EvalSuiteSpec

pytestmark = pytest.mark.integration


def _target(base_url: str) -> EngineTarget:
    return EngineTarget("r-evil", "m", base_url, "engine-key-of-r-evil", "vllm")


def _suite() -> EvalSuiteSpec:
    return EvalSuiteSpec.model_validate(
        {"cases": [{"name": "c", "prompt": "hi", "check": {"contains": "x"}}]}
    )


async def test_a_redirect_from_an_engine_is_not_followed() -> None:
    internal_seen: list[str] = []

    async def internal(request: web.Request) -> web.Response:
        internal_seen.append(request.path)
        return web.Response(status=500, text="internal-secret-page")

    async with answering(internal) as internal_url:

        async def engine(request: web.Request) -> web.Response:
            raise web.HTTPSeeOther(internal_url + "/admin/secrets")

        async with answering(engine) as engine_url:
            results = await probe_target(_target(engine_url), ["tools", "stream_usage"])
            async with engine_session() as session:
                suite = await run_suite(session, "s", _suite(), _target(engine_url), {})
    assert internal_seen == [], "the controller followed the engine's redirect"
    for result in results:
        assert not result.passed and "303, a redirect (not followed" in result.detail, result
    assert "303, a redirect (not followed" in suite.cases[0].detail


async def test_an_engine_at_a_metadata_address_is_refused_before_connecting() -> None:
    results = await probe_target(_target("http://169.254.169.254:80"), ["response_format"])
    assert not results[0].passed
    assert "forbidden address for the controller" in results[0].detail, results[0].detail


async def test_an_endless_answer_is_cut_at_the_bound() -> None:
    sent = 0
    chunk = b"x" * (1 << 20)
    hundred_mb = 100 * (1 << 20)

    async def engine(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        try:
            while sent < hundred_mb:
                await resp.write(chunk)
                sent += len(chunk)
        except (ConnectionResetError, ConnectionError):
            pass
        return resp

    async with answering(engine) as engine_url:
        results = await probe_target(_target(engine_url), ["tools"])
    assert not results[0].passed
    assert f"more than {MAX_ANSWER_BYTES} bytes" in results[0].detail, results[0].detail
    assert sent < hundred_mb, "the controller read the whole 100 MB answer"


async def test_a_refusal_quotes_the_engine_error_message_only() -> None:
    async def page(request: web.Request) -> web.Response:
        return web.Response(status=500, text="<html>internal-secret-page</html>")

    async def openai_error(request: web.Request) -> web.Response:
        body = {"error": {"message": "tools are not supported by this model", "type": "invalid_request"}}
        return web.Response(status=400, text=json.dumps(body), content_type="application/json")

    async with answering(page) as page_url, answering(openai_error) as error_url:
        [from_page] = await probe_target(_target(page_url), ["response_format"])
        [from_engine] = await probe_target(_target(error_url), ["response_format"])
    assert "internal-secret-page" not in from_page.detail
    assert "500 (no engine error message in its body)" in from_page.detail
    assert "400: tools are not supported by this model" in from_engine.detail
