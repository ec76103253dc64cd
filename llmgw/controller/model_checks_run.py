"""`llmgw model check MODEL`: the built-in probes (llmgw.core.model_checks) run against one replica, and the
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

import dataclasses
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from llmgw.controller.engine_http import EngineTarget, engine_session, post_json, post_stream
from llmgw.controller.evals_run import EvalError, target_for
from llmgw.core.model_checks import (
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
)
from llmgw.store.errors import StoreError

if TYPE_CHECKING:
    from llmgw.controller.core import Controller

log = logging.getLogger("llmgw.controller.model_checks")

__all__ = ["CheckBook", "CheckVerdict", "engine_version_of", "probe_target", "run_model_check"]

_TIMEOUT_S = 120.0  # a CPU engine's first answer can be slow; the probe asks for little


@dataclass(frozen=True, slots=True)
class CheckVerdict:
    model: str
    engine: str
    engine_version: str  # "unknown" when neither the repo nor the node's inventory says
    replica: str
    at: float  # controller wall time
    probes: tuple[ProbeResult, ...]

    @property
    def passed(self) -> bool:
        return all(p.passed for p in self.probes)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckVerdict:
        probes = tuple(
            ProbeResult(str(p["probe"]), bool(p["passed"]), str(p["detail"])) for p in data["probes"]
        )
        return cls(
            str(data["model"]),
            str(data["engine"]),
            str(data["engine_version"]),
            str(data["replica"]),
            float(data["at"]),
            probes,
        )

    def json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "engine": self.engine,
            "engine_version": self.engine_version,
            "replica": self.replica,
            "at": self.at,
            "passed": self.passed,
            "probes": [p.json() for p in self.probes],
        }


@dataclass
class CheckBook:
    """The last result of each probe per (model, engine, engine version), as one verdict per key."""

    verdicts: dict[tuple[str, str, str], CheckVerdict] = field(default_factory=dict)
    running: set[tuple[str, str, str]] = field(default_factory=set)  # checks under way, by key
    auto: bool = True  # the controller checks each new (model, engine, version) itself (auto_checks.py)

    def record(self, verdict: CheckVerdict) -> CheckVerdict:
        """Keep `verdict`'s probe results over the key's earlier ones, and the earlier results of the probes
        it did not run; the key's verdict as kept now (its replica and time: the last check's)."""
        key = (verdict.model, verdict.engine, verdict.engine_version)
        earlier = self.verdicts.get(key)
        ran = {p.probe for p in verdict.probes}
        kept = tuple(p for p in earlier.probes if p.probe not in ran) if earlier is not None else ()
        merged = dataclasses.replace(verdict, probes=(*kept, *verdict.probes))
        self.verdicts[key] = merged
        return merged

    def load(self, texts: list[str]) -> int:
        """Verdicts kept in the store (`CheckVerdict.json`); one that cannot be read is skipped, said once."""
        loaded = 0
        for text in texts:
            try:
                self.record(CheckVerdict.from_json(json.loads(text)))
                loaded += 1
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("a stored model-check verdict was skipped: %s", exc)
        return loaded

    def missing(self, model: str, engine: str, version: str, probes: Sequence[str]) -> list[str]:
        """The probes of `probes` that key has no result for (all of them: never checked)."""
        verdict = self.verdicts.get((model, engine, version))
        done = {p.probe for p in verdict.probes} if verdict is not None else set()
        return [p for p in probes if p not in done]

    def checking(self, model: str, engine: str, version: str, probes: Sequence[str]) -> bool:
        """A check of that key is running, or due: automatic checks are on and one of the model's `probes`
        has no result for the key yet (the next tick runs it). Routers say "in progress" rather than
        "never"."""
        key = (model, engine, version)
        return key in self.running or (self.auto and bool(self.missing(model, engine, version, probes)))

    def details_of(self, model: str, engine: str, version: str) -> dict[str, str]:
        """Per failed probe, what the check said."""
        verdict = self.verdicts.get((model, engine, version))
        return {p.probe: p.detail for p in verdict.probes if not p.passed} if verdict else {}

    def probes_of(self, model: str, engine: str, version: str) -> tuple[list[str], list[str]]:
        """(passed, failed) probe names for that model on that engine version; both empty: never checked."""
        verdict = self.verdicts.get((model, engine, version))
        if verdict is None:
            return [], []
        return [p.probe for p in verdict.probes if p.passed], [
            p.probe for p in verdict.probes if not p.passed
        ]


def engine_version_of(c: Controller, replica_id: str) -> str:
    """The repo's version for the replica's engine (profile, then Cluster), else its node's inventory's."""
    rec = c.replicas.get(replica_id)
    d = c.desired
    if rec is None or d is None:
        return "unknown"
    entry = d.models.get(rec.model)
    profile = entry.profile(rec.profile) if entry else None
    engine = profile.profile.engine if profile else None
    if profile is not None and profile.profile.engine_version:
        return profile.profile.engine_version
    declared = d.cluster.engines.get(engine) if engine else None
    if declared is not None and declared.version:
        return declared.version
    link = c.agents.nodes.get(rec.node)
    engines = link.inventory.engines if link is not None else None
    found = engines.get(engine) if engines and engine else None
    return found.version if found is not None and found.version else "unknown"


async def run_model_check(
    c: Controller,
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
        raise EvalError(f"model {model} serves no capability with a built-in probe (tools, chat)")
    target = target_for(c, model, replica)
    version = engine_version_of(c, target.replica)
    key = (model, target.engine, version)
    c.model_checks.running.add(key)
    c.notify("model check started")  # the snapshot says "in progress" to routers meanwhile
    try:
        results = await probe_target(target, probes)
    finally:
        c.model_checks.running.discard(key)
    ran = CheckVerdict(model, target.engine, version, target.replica, c.wall(), tuple(results))
    verdict = c.model_checks.record(ran)
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
    chunks, error = await post_stream(session, target, path, stream_usage_request(target.model), _TIMEOUT_S)
    return ProbeResult(probe, False, error) if error is not None else stream_usage_verdict(chunks)
