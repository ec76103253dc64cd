"""`llmgw model check MODEL`: the built-in probes (llmgw.core.evals.model_checks) run against one replica, and the
verdicts kept per model, engine and engine version, one result per probe: a check that runs some probes
replaces those and keeps the others, so a capability declared later is checked by itself (the probes never
run for a key are due) and never hidden by a verdict that did not cover it.

The verdicts reach the routers in the snapshot: each endpoint carries the probes its (model, engine,
version) passed and failed, and whether a check of it is due or running, so a request offering tools goes
nowhere its engine failed the tools probe (with `verified_only`, only where it passed), and /v1/models lists
the probes verified on a ready replica. The controller runs a check by itself for each new key and each probe
a key has no result for (auto_checks.py) and keeps the verdicts in memory and in the store (read back when it
starts or takes the lead).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import aiohttp

from llmgw.controller.loops.evals import EvalError, target_for
from llmgw.controller.parts.check_book import CheckVerdict
from llmgw.controller.status.fleet import engine_version_of
from llmgw.controller.wire.engine_http import EngineTarget, engine_session, post_json, post_stream
from llmgw.core.evals.model_checks import (
    ProbeResult,
    probes_for,
    response_format_request,
    response_format_verdict,
    stream_usage_request,
    stream_usage_verdict,
    tools_request,
    tools_result_request,
    tools_result_verdict,
    tools_verdict,
    vision_request,
    vision_verdict,
)
from llmgw.store.errors import StoreError

if TYPE_CHECKING:
    from llmgw.controller.parts.fleet import EngineCaller

log = logging.getLogger("llmgw.controller.model_checks")

__all__ = ["probe_target", "run_model_check"]

_TIMEOUT_S = 120.0  # a CPU engine's first answer can be slow; the probe asks for little


async def run_model_check(
    c: EngineCaller,
    model: str,
    replica: str | None,
    *,
    automatic: bool = False,
    only: Sequence[str] | None = None,
) -> CheckVerdict:
    """Probe one replica of `model` for each capability it serves (`only`: those of them; the automatic
    check runs the ones the key has no result for); the results are recorded over the key's earlier ones and
    an event says them. Returns the key's verdict as kept. EvalError when the model or the replica cannot
    be checked."""
    d = c.desired
    entry = d.models.get(model) if d else None
    if entry is None:
        raise EvalError(f"model {model} is not in the applied revision")
    probes = probes_for(entry.spec.effective_capabilities)
    if only is not None:
        probes = [p for p in probes if p in only]
    if not probes:
        raise EvalError(f"model {model} serves no capability with a built-in probe (tools, chat, vision)")
    target = target_for(c, model, replica)
    version = engine_version_of(c, target.replica)
    key = (model, target.engine, version)
    c.fleet.model_checks.running.add(key)
    c.notify("model check started")  # the snapshot says "in progress" to routers meanwhile
    try:
        results = await probe_target(target, probes)
    finally:
        c.fleet.model_checks.running.discard(key)
    ran = CheckVerdict(model, target.engine, version, target.replica, c.wall(), tuple(results))
    verdict = c.fleet.model_checks.record(ran)
    try:  # kept across a restart; the store down loses only that
        await c.store.save_model_check(
            model, verdict.engine, verdict.engine_version, json.dumps(verdict.json()), verdict.at
        )
    except StoreError as exc:
        log.warning("the model-check verdict of %s is not kept in the store: %s", model, exc)
    words = "; ".join(f"{p.probe}: {'ok' if p.passed else p.detail}" for p in results)
    await c.event(
        "model_checked",
        model,
        f"{target.engine} {verdict.engine_version} on {target.replica}"
        f"{' (automatic: a new model, engine version or capability)' if automatic else ''}: {words}",
    )
    c.notify("model checked")  # the snapshot carries the verdicts
    return verdict


async def probe_target(target: EngineTarget, probes: list[str]) -> list[ProbeResult]:
    """Each probe in turn against one engine."""
    async with engine_session() as session:
        return [await _probe(session, target, p) for p in probes]


async def _probe(session: aiohttp.ClientSession, target: EngineTarget, probe: str) -> ProbeResult:
    path = "/v1/chat/completions"
    if probe == "tools":
        response, error = await post_json(session, target, path, tools_request(target.model), _TIMEOUT_S)
        if error is not None:
            return ProbeResult(probe, False, error)
        first, call = tools_verdict(response, target.engine)
        if call is None:
            return first
        response, error = await post_json(
            session, target, path, tools_result_request(target.model, call), _TIMEOUT_S
        )
        return ProbeResult(probe, False, error) if error is not None else tools_result_verdict(response)
    if probe == "response_format":
        response, error = await post_json(
            session, target, path, response_format_request(target.model), _TIMEOUT_S
        )
        return ProbeResult(probe, False, error) if error is not None else response_format_verdict(response)
    if probe == "vision":
        response, error = await post_json(session, target, path, vision_request(target.model), _TIMEOUT_S)
        return vision_verdict(response, error, target.engine)
    chunks, error = await post_stream(session, target, path, stream_usage_request(target.model), _TIMEOUT_S)
    return ProbeResult(probe, False, error) if error is not None else stream_usage_verdict(chunks)
