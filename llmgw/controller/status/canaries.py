"""Which replicas of a canary model are its canary: derived from the applied revision and the replicas, for the
snapshot routers get (llmgw.controller.wire.publisher) and the canary loop (llmgw.controller.loops.canary).

Each function takes the parts it reads (the revision, the replica records, the canary runs), not the Controller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from llmgw.core.fleet.states import is_stale

if TYPE_CHECKING:
    from llmgw.controller.parts.canary_record import CanaryBook, CanaryRun
    from llmgw.controller.parts.desired import Desired
    from llmgw.controller.parts.state import ReplicaRec

__all__ = ["changed", "live_canaries", "split"]


def split(
    desired: Desired | None, replicas: Mapping[str, ReplicaRec], name: str
) -> tuple[list[ReplicaRec], list[ReplicaRec]] | None:
    """A canary model's (stable, fresh) replicas, not stopping; None when it is not a canary model. Stable:
    stale ones (another fingerprint, or a profile gone), adopted ones too (a controller restart or a
    fail-over changes nothing a canary was doing)."""
    entry = desired.models.get(name) if desired is not None else None
    if entry is None or entry.spec.rollout.strategy != "canary" or entry.spec.rollout.canary is None:
        return None
    wanted = {p.profile.name: p.fingerprint for p in entry.profiles}
    mine = [r for r in replicas.values() if r.model == name and not r.stopping]

    def stale(r: ReplicaRec) -> bool:
        return is_stale(r.fingerprint, wanted.get(r.profile))

    return [r for r in mine if stale(r)], [r for r in mine if not stale(r)]


def live_canaries(
    desired: Desired | None, replicas: Mapping[str, ReplicaRec], canaries: CanaryBook
) -> dict[str, frozenset[str]]:
    """Per canary model whose canary is in progress (or about to be: stale replicas and no verdict for
    this change yet), its canary replicas: what the snapshot marks, from the first moment one exists."""
    out: dict[str, frozenset[str]] = {}
    if desired is None:
        return out
    for name in desired.models:
        found = split(desired, replicas, name)
        run = canaries.runs.get(name)
        if found is None or not found[0]:
            continue
        fresh = frozenset(r.id for r in found[1])
        if run is None or run.phase == "running" or changed(desired, name, run):
            out[name] = fresh
    return out


def changed(desired: Desired, name: str, run: CanaryRun) -> bool:
    """The run tries other fingerprints than the revision's: the model changed since it began."""
    return run.fingerprints != {p.profile.name: p.fingerprint for p in desired.models[name].profiles}
