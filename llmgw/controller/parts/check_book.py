"""The model checks' verdicts as the controller keeps them: the last result of each probe per model, engine and
engine version (llmgw.controller.loops.model_checks runs the checks; the store keeps the verdicts, read back when
the controller starts or takes the lead)."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llmgw.core.evals.model_checks import ProbeResult

log = logging.getLogger("llmgw.controller.model_checks")

__all__ = ["CheckBook", "CheckVerdict"]


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
