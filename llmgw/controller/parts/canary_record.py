"""A canary run as the store keeps it (`canary_runs`), and the stable model it rolls back to.

What a run carries across a controller restart or a fail-over: its phase, the fingerprints it tries, when it
began, the stable replicas' counts then (the gates compare what happened since), its canary replicas, its
verdict and the eval suites' results. Not kept: what it waits for (said again at the next tick) and an eval
suite still running (run again on the canary replica).

The stable model is the model as it was before the change (spec, profiles and their fingerprints), taken when
the revision that changed it was applied; a held model (canary failed) places a crashed stable replica's
replacement from it, not from the rejected revision. Unknown ('' in the store) when the controller that began
the run never saw the revision before the change (it started on the changed one).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from llmgw.core.config.models import ModelSpec
from llmgw.core.desired.catalog import ModelEntry, ProfileEntry
from llmgw.core.reconcile import CanaryPhase

if TYPE_CHECKING:
    from llmgw.controller.parts.desired import Desired
    from llmgw.store.queries.intent import CanaryRunRow

__all__ = [
    "CanaryBook",
    "CanaryRun",
    "Phase",
    "run_from_record",
    "run_record",
    "stable_from_json",
    "stable_json",
    "unread_json",
]

log = logging.getLogger("llmgw.controller.loops.canary")

Phase = Literal["running", "promoted", "failed"]


@dataclass
class CanaryRun:
    model: str
    fingerprints: dict[str, str]  # the catalog's profile fingerprints this canary tries
    started_at: float  # controller wall time
    baseline: dict[str, tuple[int, int]]  # stable replica -> (requests, errors) when it started
    phase: Phase = "running"
    replicas: set[str] = field(default_factory=set)  # the canary replicas
    waiting: str = "starting the canary replica"
    verdict: str = ""
    decided_at: float | None = None
    evals: dict[str, bool | None] = field(default_factory=dict)  # suite -> passed (None: not yet)
    eval_results: list[dict[str, Any]] = field(default_factory=list)
    eval_task: asyncio.Task[None] | None = None
    stable: ModelEntry | None = None  # the model before the change: what a held model's stable replicas run
    saved: str = ""  # the record last written to the store ('' never)

    def json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "replicas": sorted(self.replicas),
            "started_at": self.started_at,
            "waiting": self.waiting if self.phase == "running" else "",
            "verdict": self.verdict,
            "decided_at": self.decided_at,
            "evals": self.eval_results,
        }


def unread_json() -> dict[str, Any]:
    """A canary model's status while this controller has not read the canary runs from the store (taking over
    as leader, or standing by after leading): whether a canary runs, or held the model, is unknown, not none."""
    return {
        "phase": "unknown",
        "replicas": [],
        "started_at": None,
        "waiting": "not read yet: this controller reads the canary runs from the store when it takes the lead",
        "verdict": "",
        "decided_at": None,
        "evals": [],
    }


def run_record(run: CanaryRun) -> str:
    """The run's JSON as the store keeps it (stable keys: equal runs give equal text)."""
    data: dict[str, Any] = {
        "fingerprints": run.fingerprints,
        "started_at": run.started_at,
        "baseline": {rid: list(counts) for rid, counts in run.baseline.items()},
        "phase": run.phase,
        "replicas": sorted(run.replicas),
        "verdict": run.verdict,
        "decided_at": run.decided_at,
        "evals": {suite: passed for suite, passed in run.evals.items() if passed is not None},
        "eval_results": run.eval_results,
    }
    return json.dumps(data, sort_keys=True)


def run_from_record(model: str, text: str, stable: ModelEntry | None) -> CanaryRun:
    data = json.loads(text)
    phase = data["phase"]
    if phase not in ("running", "promoted", "failed"):
        raise ValueError(f"canary run of {model}: phase {phase!r} is none of running, promoted, failed")
    return CanaryRun(
        model=model,
        fingerprints={str(k): str(v) for k, v in data["fingerprints"].items()},
        started_at=float(data["started_at"]),
        baseline={str(k): (int(v[0]), int(v[1])) for k, v in data["baseline"].items()},
        phase=phase,
        replicas={str(r) for r in data["replicas"]},
        verdict=str(data["verdict"]),
        decided_at=None if data["decided_at"] is None else float(data["decided_at"]),
        evals={str(k): bool(v) for k, v in data["evals"].items()},
        eval_results=list(data["eval_results"]),
        stable=stable,
    )


def stable_json(entry: ModelEntry | None) -> str:
    """The stable model's JSON ('' when unknown). A repo manifest is not kept: the node reads the one the
    mirror publishes for a directory source."""
    if entry is None:
        return ""
    data = {
        "name": entry.name,
        "spec": entry.spec.model_dump(mode="json", by_alias=True, exclude_unset=True),
        "labels": dict(entry.labels),
        "fingerprints": {p.name: p.fingerprint for p in entry.profiles},
    }
    return json.dumps(data, sort_keys=True)


def stable_from_json(text: str) -> ModelEntry | None:
    if not text:
        return None
    data = json.loads(text)
    spec = ModelSpec.model_validate(data["spec"])
    prints: dict[str, str] = data["fingerprints"]
    profiles = tuple(ProfileEntry(p, prints[p.name]) for p in spec.profiles if p.name in prints)
    return ModelEntry(str(data["name"]), spec, dict(data["labels"]), profiles)


@dataclass
class CanaryBook:
    runs: dict[str, CanaryRun] = field(default_factory=dict)
    # Per canary model a revision changed: the model as it was (the stable one), for the run that change
    # begins, with the fingerprints of the change.
    before: dict[str, tuple[dict[str, str], ModelEntry]] = field(default_factory=dict)

    def note_revision(self, previous: Desired | None, desired: Desired) -> None:
        """A revision is applied: for each canary model whose fingerprints it changes, keep the model it
        replaces as the stable one (a held model's stable one stays: the stable replicas still run it)."""
        if previous is None:
            return
        for name, entry in desired.models.items():
            old = previous.models.get(name)
            spec = entry.spec.rollout
            wanted = {p.name: p.fingerprint for p in entry.profiles}
            if (
                old is None
                or spec.strategy != "canary"
                or wanted == {p.name: p.fingerprint for p in old.profiles}
            ):
                continue
            run = self.runs.get(name)
            held = run.stable if run is not None and run.phase == "failed" else None
            self.before[name] = (wanted, held or old)

    def load(self, rows: list[CanaryRunRow]) -> None:
        """The runs the store holds (at start, on taking over); a row that cannot be read is said and left."""
        self.cancel()
        self.runs.clear()
        for row in rows:
            try:
                run = run_from_record(row.model, row.run, stable_from_json(row.stable))
            except (ValueError, KeyError, TypeError) as exc:
                log.warning(
                    "the canary run of %s in the store cannot be read (%s): it starts again", row.model, exc
                )
                continue
            run.saved = run_record(run)
            self.runs[row.model] = run

    def held(self, name: str, desired: Desired | None) -> bool:
        """The model's canary of the applied revision failed: it is held on its stable replicas."""
        run = self.runs.get(name)
        entry = desired.models.get(name) if desired is not None else None
        if run is None or run.phase != "failed" or entry is None:
            return False
        return run.fingerprints == {p.profile.name: p.fingerprint for p in entry.profiles}

    def phases(self) -> dict[str, CanaryPhase]:
        return {m: CanaryPhase(r.phase, frozenset(r.replicas)) for m, r in self.runs.items()}

    def json(self, model: str) -> dict[str, Any] | None:
        run = self.runs.get(model)
        return None if run is None else run.json()

    def cancel(self) -> None:
        for run in self.runs.values():
            if run.eval_task is not None:
                run.eval_task.cancel()
