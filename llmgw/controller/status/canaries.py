"""Which replicas of a canary model are its canary: derived from the applied revision and the replicas, for the
snapshot routers get (llmgw.controller.wire.publisher) and the canary loop (llmgw.controller.loops.canary)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmgw.controller.core import Controller
    from llmgw.controller.parts.canary_record import CanaryRun
    from llmgw.controller.parts.state import ReplicaRec

__all__ = ["changed", "live_canaries", "split"]


def split(c: Controller, name: str) -> tuple[list[ReplicaRec], list[ReplicaRec]] | None:
    """A canary model's (stable, fresh) replicas, not stopping; None when it is not a canary model. Stable:
    stale ones (another fingerprint, or a profile gone), adopted ones too (a controller restart or a
    fail-over changes nothing a canary was doing)."""
    d = c.desired
    entry = d.models.get(name) if d is not None else None
    if entry is None or entry.spec.rollout.strategy != "canary" or entry.spec.rollout.canary is None:
        return None
    wanted = {p.profile.name: p.fingerprint for p in entry.profiles}
    mine = [r for r in c.replicas.values() if r.model == name and not r.stopping]

    def stale(r: ReplicaRec) -> bool:
        return r.profile not in wanted or (
            bool(r.fingerprint) and wanted[r.profile] not in ("", r.fingerprint)
        )

    return [r for r in mine if stale(r)], [r for r in mine if not stale(r)]


def live_canaries(c: Controller) -> dict[str, frozenset[str]]:
    """Per canary model whose canary is in progress (or about to be: stale replicas and no verdict for
    this change yet), its canary replicas: what the snapshot marks, from the first moment one exists."""
    d = c.desired
    out: dict[str, frozenset[str]] = {}
    for name in d.models if d is not None else ():
        found = split(c, name)
        run = c.canaries.runs.get(name)
        if found is None or not found[0]:
            continue
        fresh = frozenset(r.id for r in found[1])
        if run is None or run.phase == "running" or changed(c, name, run):
            out[name] = fresh
    return out


def changed(c: Controller, name: str, run: CanaryRun) -> bool:
    d = c.desired
    assert d is not None
    return run.fingerprints != {p.profile.name: p.fingerprint for p in d.models[name].profiles}
