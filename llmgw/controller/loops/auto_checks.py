"""The controller runs `llmgw model check` by itself: once a second the leader looks for a ready replica
whose (model, engine, engine version) has no result yet for a probe its model's capabilities call for, and
runs those probes on it. So a new model and a new engine version (a new key: the verdict of the old one says
nothing about it) are checked, and so is a capability declared later (a verdict recorded before it covers
other probes only): an operator learns which replicas serve what, and a `verified_only` model finds a
verified replica, without a step of their own.

One check per key at a time, each in the background (a slow CPU engine does not hold the others). A probe's
result, passed or failed, is kept until the key changes or an operator checks again (`llmgw model check`): a
failed probe is not retried on every new replica (it would fail the same way and flap the routers). A check that
cannot start (the replica went away meanwhile) is tried again at the next tick. The setting
`model_checks_auto: false` turns this off (then only `llmgw model check` records verdicts, and routers
refuse requests a `verified_only` model needs verified until it has).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmgw.controller.loops.evals import EvalError, ready_targets
from llmgw.controller.loops.model_checks import run_model_check
from llmgw.controller.status.fleet import engine_version_of
from llmgw.core.errors import Outage
from llmgw.core.evals.model_checks import probes_for

if TYPE_CHECKING:
    from llmgw.controller.parts.fleet import EngineCaller

log = logging.getLogger("llmgw.controller.loops.auto_checks")

__all__ = ["DueCheck", "auto_check_loop", "due_checks"]

TICK_S = 1.0


@dataclass(frozen=True, slots=True)
class DueCheck:
    model: str
    replica: str  # the oldest ready replica of the key
    probes: tuple[str, ...]  # the ones the key has no result for


def due_checks(c: EngineCaller) -> dict[tuple[str, str, str], DueCheck]:
    """Per (model, engine, version) with a ready replica, a probe of its model's capabilities without a
    result and no check running: what to run where."""
    d = c.desired
    book = c.fleet.model_checks
    out: dict[tuple[str, str, str], DueCheck] = {}
    if d is None:
        return out
    for name, entry in d.models.items():
        probes = probes_for(entry.spec.effective_capabilities)
        if not probes:
            continue
        for target in ready_targets(c, name):
            key = (name, target.engine, engine_version_of(c, target.replica))
            if key in book.running or key in out:
                continue
            missing = book.missing(*key, probes)
            if missing:
                out[key] = DueCheck(name, target.replica, tuple(missing))
    return out


async def auto_check_loop(c: EngineCaller) -> None:
    tasks: dict[tuple[str, str, str], asyncio.Task[None]] = {}
    failing = Outage(log, "finding the replicas to check")
    try:
        while True:
            if c.leading() and c.fleet.model_checks.auto:
                try:
                    for key, due in due_checks(c).items():
                        if key not in tasks:
                            tasks[key] = asyncio.get_running_loop().create_task(
                                _check(c, due), name=f"llmgw-model-check-{due.model}"
                            )
                    failing.recovered()
                except Exception as exc:  # a bug here must not stop the next tick
                    failing.failed(exc, TICK_S)
            for key in [k for k, t in tasks.items() if t.done()]:
                tasks.pop(key)
            await asyncio.sleep(TICK_S)
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)


async def _check(c: EngineCaller, due: DueCheck) -> None:
    try:
        await run_model_check(c, due.model, due.replica, automatic=True, only=due.probes)
    except EvalError as exc:  # gone or no longer ready: the next tick finds another replica
        log.info("the automatic model check of %s waits: %s", due.model, exc)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("the automatic model check of %s on %s failed to run", due.model, due.replica)
