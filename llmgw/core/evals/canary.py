"""A canary's gates, pure: the canary replicas' traffic against the stable replicas', and the eval suites.

Rules (docs/canaries.md):
- nothing is judged before a canary replica is ready;
- the error gate: once the canary answered `min_requests`, an error rate above the stable replicas' by more
  than `max_error_rate` fails it at once (a bad canary is not left serving its share for the whole duration);
  the stable rate with no stable traffic counts as 0 (the canary is held to the stricter bar);
- an eval suite that fails fails the canary at once; one still running is waited for;
- after `duration` of serving (and `min_requests`), the TTFT gate: the canary's p99 over the stable
  replicas' at most `max_ttft_ratio`; either side unknown (no first token in the routers' window) is not
  judged, and the verdict says so rather than count it as fast;
- all gates passed after `duration`: promoted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from llmgw.core.config.specs.eval_spec import CanarySpec
from llmgw.core.words import parse_duration

__all__ = ["CanaryVerdict", "Traffic", "judge_canary"]

VerdictState = Literal["wait", "pass", "fail"]


@dataclass(frozen=True, slots=True)
class Traffic:
    """What routers reported for a group of replicas since the canary started."""

    requests: int = 0
    errors: int = 0
    ttft_p99_ms: float | None = None  # None: unknown

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True, slots=True)
class CanaryVerdict:
    state: VerdictState
    reasons: tuple[str, ...]

    @property
    def words(self) -> str:
        return "; ".join(self.reasons)


def judge_canary(
    spec: CanarySpec,
    *,
    now: float,
    ready_since: float | None,
    canary: Traffic,
    stable: Traffic,
    evals: Mapping[str, bool | None],
) -> CanaryVerdict:
    """`evals`: suite -> passed (None: still running or not started)."""
    gates = spec.gates
    if ready_since is None:
        return CanaryVerdict("wait", ("the canary replica is not ready yet",))
    bad = _error_gate(spec, canary, stable)
    if bad is not None:
        return CanaryVerdict("fail", (bad,))
    failed = [name for name, ok in evals.items() if ok is False]
    if failed:
        return CanaryVerdict("fail", (f"eval suite {', '.join(sorted(failed))} failed",))
    duration = parse_duration(spec.duration)
    served = now - ready_since
    waits: list[str] = []
    if served < duration:
        waits.append(f"serving for {served:.0f}s of {spec.duration}")
    if canary.requests < gates.min_requests:
        waits.append(f"{canary.requests} of {gates.min_requests} requests answered")
    running = sorted(name for name, ok in evals.items() if ok is None)
    if running:
        waits.append(f"eval suite {', '.join(running)} running")
    if waits:
        return CanaryVerdict("wait", tuple(waits))
    reasons = [
        f"error rate {canary.error_rate:.1%} over {canary.requests} requests "
        f"(stable {stable.error_rate:.1%}, allowed +{gates.max_error_rate:.1%})"
    ]
    ttft = _ttft_gate(spec, canary, stable)
    if ttft is not None:
        ok, words = ttft
        if not ok:
            return CanaryVerdict("fail", (words,))
        reasons.append(words)
    reasons += [f"eval suite {name} passed" for name in sorted(evals)]
    return CanaryVerdict("pass", tuple(reasons))


def _error_gate(spec: CanarySpec, canary: Traffic, stable: Traffic) -> str | None:
    gates = spec.gates
    if canary.requests == 0 or canary.requests < gates.min_requests:
        return None
    if canary.error_rate - stable.error_rate > gates.max_error_rate:
        return (
            f"error rate {canary.error_rate:.1%} over {canary.requests} requests against the stable "
            f"replicas' {stable.error_rate:.1%} (allowed +{gates.max_error_rate:.1%})"
        )
    return None


def _ttft_gate(spec: CanarySpec, canary: Traffic, stable: Traffic) -> tuple[bool, str] | None:
    limit = spec.gates.max_ttft_ratio
    if limit is None:
        return None
    if canary.ttft_p99_ms is None or stable.ttft_p99_ms is None or stable.ttft_p99_ms <= 0:
        which = "the canary's" if canary.ttft_p99_ms is None else "the stable replicas'"
        return True, f"TTFT not judged: {which} p99 is unknown"
    ratio = canary.ttft_p99_ms / stable.ttft_p99_ms
    words = (
        f"TTFT p99 {canary.ttft_p99_ms:.0f} ms against the stable {stable.ttft_p99_ms:.0f} ms "
        f"(x{ratio:.2f}, allowed x{limit:g})"
    )
    return ratio <= limit, words
