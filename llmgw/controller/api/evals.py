"""The admin API's eval suites and model checks: `llmgw eval SUITE --model M [--replica R]` and `llmgw model
check MODEL [--replica R]` ask the controller, which runs them straight against a replica
(llmgw.controller.loops.evals says why). Scope `apply`: they spend an engine's time on the operator's word.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from llmgw.controller.api.audited import AUDIT_OBJECT
from llmgw.controller.api.guard import error
from llmgw.controller.loops.evals import EvalError, judges_for, run_suite, target_for
from llmgw.controller.loops.model_checks import run_model_check
from llmgw.controller.parts.fleet import EngineCaller
from llmgw.controller.wire.engine_http import engine_session
from llmgw.core import jsonsafe

__all__ = ["PARTS", "eval_run", "model_check", "model_checks"]

# What the handlers read: the fleet, and its engines through their keys (app.py puts the Controller here).
PARTS: web.AppKey[EngineCaller] = web.AppKey("evals_parts")


async def _body(request: web.Request) -> dict[str, Any] | None:
    try:
        body = jsonsafe.loads(await request.read() or b"{}")
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _replica(body: dict[str, Any]) -> str | None:
    replica = body.get("replica")
    if replica is not None and not isinstance(replica, str):
        raise EvalError("replica must be a replica id (a string) or left out")
    return replica


async def eval_run(request: web.Request) -> web.Response:
    """`{"suite": S, "model": M, "replica": R?}`: the suite's per-case results on one ready replica."""
    c = request.app[PARTS]
    body = await _body(request)
    if body is None or not isinstance(body.get("suite"), str) or not isinstance(body.get("model"), str):
        return error(400, 'body must be {"suite": SUITE, "model": MODEL, "replica": REPLICA (optional)}')
    d = c.desired
    if d is None:
        return error(409, "no revision is applied yet")
    suite = body["suite"]
    request[AUDIT_OBJECT] = suite
    spec = d.catalog.eval_suites.get(suite)
    if spec is None:
        known = ", ".join(sorted(d.catalog.eval_suites)) or "none"
        return error(404, f"EvalSuite {suite!r} is not in the applied revision (known: {known})")
    entry = d.resolve(body["model"])
    if entry is None:
        return error(404, f"model {body['model']!r} is not in the applied revision")
    try:
        target = target_for(c, entry.name, _replica(body))
    except EvalError as exc:
        return error(409, str(exc))
    async with engine_session() as session:
        result = await run_suite(session, suite, spec, target, judges_for(c, spec))
    await c.event("eval_run", entry.name, f"{result.words()} on {target.replica}")
    return web.json_response({**result.json(), "model": entry.name, "replica": target.replica})


async def model_check(request: web.Request) -> web.Response:
    """`{"replica": R?}`: the built-in probes of the model's capabilities on one replica; the verdict is
    recorded for the model and the replica's engine version."""
    c = request.app[PARTS]
    body = await _body(request)
    if body is None:
        return error(400, 'body must be {"replica": REPLICA (optional)}')
    d = c.desired
    model = request.match_info["model"]
    request[AUDIT_OBJECT] = model
    entry = d.resolve(model) if d else None
    if entry is None:
        return error(404, f"model {model!r} is not in the applied revision")
    try:
        verdict = await run_model_check(c, entry.name, _replica(body))
    except EvalError as exc:
        return error(409, str(exc))
    return web.json_response(verdict.json())


async def model_checks(request: web.Request) -> web.Response:
    """Every recorded verdict (the last per model, engine and engine version)."""
    c = request.app[PARTS]
    items = sorted(
        c.fleet.model_checks.verdicts.values(), key=lambda v: (v.model, v.engine, v.engine_version)
    )
    return web.json_response({"checks": [v.json() for v in items]})
