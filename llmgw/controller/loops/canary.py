"""Canaries: the controller's record of each model's canary, and the loop that judges it (llmgw.core.evals.canary).

A change to a model with `rollout.strategy: canary` (a profile, its engine version, the weights source: what
the profile fingerprint covers) starts one new replica beside the stable ones (llmgw.core.reconcile holds the
roll). This loop, once a second:
- opens a run when the model has stale replicas and no run for the catalog's fingerprints, and notes the
  stable replicas' request counts then (the gates compare what happened since);
- keeps the run's canary replicas (the model's fresh replicas while it runs), which the snapshot marks, so
  routers send them the canary's share (weight, or the header);
- runs the gate's eval suites against a canary replica once it is ready, and judges the gates with the
  routers' load reports; the verdict is an event, a metric, a webhook for Notifications that ask for it, and
  the phase the reconciler reads: promoted (the roll goes on) or failed (the canary is drained and stopped,
  the stable replicas serve on until the repo changes).
Each run is kept in the store (`canary_runs`, llmgw.controller.parts.canary_record) as it moves on, and read back by
a restarted controller or a new leader, which goes on from where it was: a running canary keeps its start and
baseline, a verdict stays given (no second `canary_started`, no second status), a held model stays held.
A held model (its canary failed) is reconciled against the model as it was before the change (`held_views`),
so a stable replica that fails comes back with the stable profile, not the rejected one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from llmgw.controller.loops.evals import judges_for, ready_targets, run_suite
from llmgw.controller.parts.canary_record import CanaryBook, CanaryRun, run_record, stable_json
from llmgw.controller.status.canaries import changed, split
from llmgw.controller.wire.engine_http import engine_session
from llmgw.core.desired.catalog import ModelEntry
from llmgw.core.errors import Outage
from llmgw.core.evals.canary import Traffic, judge_canary
from llmgw.core.fleet.views import ModelView
from llmgw.store.errors import StoreError

if TYPE_CHECKING:
    from llmgw.controller.parts.fleet import EngineCaller

log = logging.getLogger("llmgw.controller.loops.canary")

__all__ = [
    "canary_loop",
    "canary_tick",
    "held_views",
]

TICK_S = 1.0


async def canary_loop(c: EngineCaller) -> None:
    failing = Outage(log, "judging the canaries")
    try:
        while True:
            # Not before the runs the last leader left are read: a canary would start a second time.
            if c.leading() and c.fleet.worker_state.earlier_state_read:
                try:
                    await canary_tick(c)
                    failing.recovered()
                except (
                    Exception
                ) as exc:  # a bug here must not stop the next tick; the stable replicas serve on
                    failing.failed(exc, TICK_S)
            await asyncio.sleep(TICK_S)
    finally:
        c.fleet.canaries.cancel()


async def canary_tick(c: EngineCaller) -> None:
    d = c.desired
    if d is None:
        return
    book: CanaryBook = c.fleet.canaries
    for name in [m for m in book.runs if m not in d.models]:
        await _forget(c, name)
    for name, entry in d.models.items():
        found = split(d, c.fleet.replicas, name)
        spec = entry.spec.rollout.canary
        if found is None or spec is None:
            await _forget(c, name)
            continue
        stale, fresh = found
        run = book.runs.get(name)
        if run is None or changed(d, name, run):
            if run is not None and run.eval_task is not None:
                run.eval_task.cancel()
            if not stale:
                await _forget(c, name)
                continue
            wanted = {p.profile.name: p.fingerprint for p in entry.profiles}
            before = book.before.pop(name, None)
            stable = before[1] if before is not None and before[0] == wanted else None
            run = CanaryRun(name, wanted, c.wall(), _counts(c, {r.id for r in stale}), stable=stable)
            book.runs[name] = run
            await _save(c, run, with_stable=True)
            await c.event("canary_started", name, f"{len(stale)} stable replica(s); {_share(spec)}")
            c.notify("canary started")
        if run.phase != "running":
            continue
        before_ids = set(run.replicas)
        run.replicas = {r.id for r in fresh}
        if run.replicas != before_ids:
            c.notify("canary replicas changed")  # the snapshot marks them
        await _judge(c, run, {r.id for r in stale})
        await _save(c, run)


async def _forget(c: EngineCaller, name: str) -> None:
    run = c.fleet.canaries.runs.pop(name, None)
    if run is None:
        return
    if run.eval_task is not None:
        run.eval_task.cancel()
    try:
        await c.store.delete_canary_run(name)
    except StoreError as exc:  # a row left behind is read back as a run whose fingerprints changed: replaced
        log.warning("the canary run of %s could not be deleted from the store: %s", name, exc)


async def _save(c: EngineCaller, run: CanaryRun, *, with_stable: bool = False) -> None:
    """Write the run when it changed since it was last written; a store that is down is tried again at the
    next tick (the run goes on in memory meanwhile)."""
    record = run_record(run)
    if record == run.saved and not with_stable:
        return
    try:
        await c.store.save_canary_run(
            run.model, record, stable_json(run.stable) if with_stable else None, c.wall()
        )
        run.saved = record
    except StoreError as exc:
        log.warning(
            "the canary run of %s could not be written to the store (tried again): %s", run.model, exc
        )


def held_views(c: EngineCaller) -> dict[str, tuple[ModelEntry, ModelView]]:
    """Per held model (its canary failed, the revision unchanged since) whose stable model is known: that
    model, and its view as the reconciler reads it (the revision's class and quotas, the stable profiles)."""
    d = c.desired
    out: dict[str, tuple[ModelEntry, ModelView]] = {}
    if d is None:
        return out
    for name, run in c.fleet.canaries.runs.items():
        current = d.fleet_models.get(name)
        if run.stable is None or current is None or not c.fleet.canaries.held(name, d):
            continue
        prints = {p.name: p.fingerprint for p in run.stable.profiles}
        out[name] = (
            run.stable,
            current._replace(spec=run.stable.spec, fingerprints=prints, manifest_digest=None),
        )
    return out


async def _judge(c: EngineCaller, run: CanaryRun, stable: set[str]) -> None:
    d = c.desired
    assert d is not None
    spec = d.models[run.model].spec.rollout.canary
    assert spec is not None
    ready = [c.fleet.replicas[i] for i in sorted(run.replicas) if i in c.fleet.replicas]
    since = min((r.ready_since for r in ready if r.ready_since is not None), default=None)
    if since is not None and spec.gates.evals and run.eval_task is None:
        run.evals = {s: None for s in spec.gates.evals}
        run.eval_task = asyncio.get_running_loop().create_task(
            _run_evals(c, run), name=f"canary-evals-{run.model}"
        )
    verdict = judge_canary(
        spec,
        now=c.wall(),
        ready_since=since,
        canary=_traffic(c, run.replicas, {}),
        stable=_traffic(c, stable, run.baseline),
        evals=run.evals,
    )
    if verdict.state == "wait":
        run.waiting = verdict.words
        return
    run.phase = "promoted" if verdict.state == "pass" else "failed"
    run.verdict, run.decided_at = verdict.words, c.wall()
    if run.eval_task is not None and not run.eval_task.done():
        run.eval_task.cancel()
    kind = "canary_promoted" if run.phase == "promoted" else "canary_failed"
    words = "promoted" if run.phase == "promoted" else "failed: rolled back, the stable replicas keep serving"
    c.metrics.canary_verdicts.labels(run.model, run.phase).inc()
    await _save(c, run)  # the verdict is kept before it is told: a new leader never judges it again
    await c.event(kind, run.model, f"canary {words} ({verdict.words})")
    c.notify(kind)


async def _run_evals(c: EngineCaller, run: CanaryRun) -> None:
    try:
        await _evals_on_canary(c, run)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a suite that cannot run is not a pass: the canary fails, saying why
        log.exception("the eval suites of %s's canary could not run", run.model)
        for suite, passed in run.evals.items():
            if passed is None:
                run.evals[suite] = False
                run.eval_results.append({"suite": suite, "passed": False, "detail": f"could not run: {exc}"})


async def _evals_on_canary(c: EngineCaller, run: CanaryRun) -> None:
    d = c.desired
    assert d is not None
    targets = [t for t in ready_targets(c, run.model) if t.replica in run.replicas]
    if not targets:
        run.eval_task = None  # tried again at the next tick
        return
    async with engine_session() as session:
        for suite in list(run.evals):
            spec = d.catalog.eval_suites.get(suite)
            if spec is None:
                run.evals[suite] = False
                run.eval_results.append(
                    {"suite": suite, "passed": False, "detail": "not in the applied revision"}
                )
                continue
            result = await run_suite(session, suite, spec, targets[0], judges_for(c, spec))
            run.evals[suite] = result.passed
            run.eval_results.append({**result.json(), "replica": targets[0].replica})
            await c.event("canary_eval", run.model, f"{result.words()} on {targets[0].replica}")


def _counts(c: EngineCaller, replicas: set[str]) -> dict[str, tuple[int, int]]:
    """Requests and errors per replica, summed over the routers' last reports."""
    out: dict[str, tuple[int, int]] = {}
    for load in c.fleet.worker_state.loads.values():
        for rid, seen in load.replicas.items():
            if rid in replicas:
                req, err = out.get(rid, (0, 0))
                out[rid] = (req + seen.requests, err + seen.errors)
    return out


def _traffic(c: EngineCaller, replicas: set[str], baseline: dict[str, tuple[int, int]]) -> Traffic:
    counts = _counts(c, replicas)
    requests = errors = 0
    for rid, (req, err) in counts.items():
        base_req, base_err = baseline.get(rid, (0, 0))
        # A router restarted since counts from zero again: what it reports is all there is.
        requests += req - base_req if req >= base_req else req
        errors += err - base_err if err >= base_err else err
    p99s = [
        seen.ttft_p99_ms
        for load in c.fleet.worker_state.loads.values()
        for rid, seen in load.replicas.items()
        if rid in replicas and seen.ttft_p99_ms is not None
    ]
    return Traffic(requests, errors, max(p99s) if p99s else None)


def _share(spec: Any) -> str:
    parts = []
    if spec.weight:
        parts.append(f"{spec.weight}% of requests")
    if spec.header:
        parts.append(f"requests with header {spec.header}")
    return " and ".join(parts) + f" for {spec.duration}"
