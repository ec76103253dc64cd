"""The controller runs `llmgw model check` by itself: once a second the leader looks for a ready replica
whose (model, engine, engine version) has no verdict yet and checks it, so a request needing a capability
(tools, a json_schema response_format) finds a verified replica without an operator's step, and a new
engine version is checked again (a new key: the verdict of the old one says nothing about it).

One check per key at a time, each in the background (a slow CPU engine does not hold the others). A verdict,
passed or failed, is kept until the key changes or an operator checks again (`llmgw model check`): a failed
probe is not retried on every new replica (it would fail the same way and flap the routers). A check that
cannot start (the replica went away meanwhile) is tried again at the next tick. The setting
`model_checks_auto: false` turns this off (then only `llmgw model check` records verdicts, and routers
refuse requests needing an unverified capability until it has).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from llmgw.controller.evals_run import EvalError, ready_targets
from llmgw.controller.model_checks_run import engine_version_of, run_model_check
from llmgw.core.model_checks import probes_for

if TYPE_CHECKING:
    from llmgw.controller.core import Controller

log = logging.getLogger("llmgw.controller.auto_checks")

__all__ = ["auto_check_loop", "due_checks"]

TICK_S = 1.0


def due_checks(c: Controller) -> dict[tuple[str, str, str], tuple[str, str]]:
    """Per (model, engine, version) with a ready replica, no verdict and no check running: the (model,
    replica) to check, the oldest ready replica of that key."""
    d = c.desired
    book = c.model_checks
    out: dict[tuple[str, str, str], tuple[str, str]] = {}
    if d is None:
        return out
    for name, entry in d.models.items():
        if not probes_for(entry.spec.capabilities):
            continue
        for target in ready_targets(c, name):
            key = (name, target.engine, engine_version_of(c, target.replica))
            if key not in book.verdicts and key not in book.running and key not in out:
                out[key] = (name, target.replica)
    return out


async def auto_check_loop(c: Controller) -> None:
    tasks: dict[tuple[str, str, str], asyncio.Task[None]] = {}
    try:
        while True:
            if c.leading() and c.model_checks.auto:
                try:
                    for key, (model, replica) in due_checks(c).items():
                        if key not in tasks:
                            tasks[key] = asyncio.get_running_loop().create_task(
                                _check(c, model, replica), name=f"llmgw-model-check-{model}"
                            )
                except Exception:  # a bug here must not stop the next tick
                    log.exception("finding the replicas to check failed; trying again")
            for key in [k for k, t in tasks.items() if t.done()]:
                tasks.pop(key)
            await asyncio.sleep(TICK_S)
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)


async def _check(c: Controller, model: str, replica: str) -> None:
    try:
        await run_model_check(c, model, replica, automatic=True)
    except EvalError as exc:  # gone or no longer ready: the next tick finds another replica
        log.info("the automatic model check of %s waits: %s", model, exc)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("the automatic model check of %s on %s failed to run", model, replica)
