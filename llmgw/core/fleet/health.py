"""Fleet health decisions: a node's clock offset from its heartbeats, and the controller side of `llmgw doctor`.

Pure: the controller measures (the store answered or not, certificate dates, routers subscribed) and these
functions say ok, warn or fail and what to fix. The node's own checks are the agent's (llmgw_agent.doctor);
both speak the same `{"name", "status", "message", "fix"}` shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = [
    "CERT_WARN_DAYS",
    "CLOCK_FAIL_S",
    "CLOCK_SAMPLES",
    "CLOCK_WARN_S",
    "Check",
    "certificate_check",
    "clock_check",
    "clock_offset",
    "routers_check",
    "source_check",
    "store_check",
    "worst",
]

Status = Literal["ok", "warn", "fail"]
CLOCK_SAMPLES = 16  # heartbeats the offset is estimated over (at the default 5s interval: 80s)
CLOCK_WARN_S = 1.0
CLOCK_FAIL_S = 5.0  # and the LlmgwNodeClockSkew alert's threshold
CERT_WARN_DAYS = 30  # the cluster CA reissues a leaf this close to expiry


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    message: str
    fix: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def clock_offset(samples: Iterable[float]) -> float | None:
    """The node's clock minus the controller's, from samples of `agent sent_at - controller received_at`.

    Each sample is the offset less that message's transit time, which is never negative; the largest sample is
    the one that travelled fastest, so it is the best estimate (NTP's minimum-delay filter). None: no sample."""
    values = list(samples)
    return max(values) if values else None


def clock_check(node: str, offset: float | None) -> Check:
    name = "clock (heartbeats)"
    if offset is None:
        return Check(
            name, "warn", f"no clock reading from {node} yet", "wait for a heartbeat, or upgrade the agent"
        )
    side = "ahead of" if offset >= 0 else "behind"
    text = f"{node}'s clock is {abs(offset):.2f}s {side} the controller's (seen on its heartbeats)"
    fix = "run NTP on the node and the controller (`timedatectl status` says whether each is synchronised)"
    if abs(offset) >= CLOCK_FAIL_S:
        return Check(name, "fail", text, fix)
    if abs(offset) >= CLOCK_WARN_S:
        return Check(name, "warn", text, fix)
    return Check(name, "ok", text)


def store_check(error: str | None, schema_version: int | None) -> Check:
    if error is not None:
        return Check(
            "store",
            "fail",
            f"the store does not answer: {error}",
            "check the database is up and reachable with the controller's --store DSN (`llmgw store migrate` "
            "tests the same connection)",
        )
    return Check("store", "ok", f"the store answers (schema version {schema_version})")


def source_check(
    source_error: str | None, applied: str | None, refused: str | None, refused_errors: Sequence[str]
) -> Check:
    if source_error is not None:
        return Check(
            "repo",
            "fail",
            f"the cluster repo cannot be read: {source_error}",
            "from the controller's machine, `git fetch` the repo with its credentials; check the branch exists",
        )
    if applied is None:
        return Check(
            "repo",
            "fail",
            "no revision of the cluster repo is applied",
            "`llmgw status` shows why (its errors)",
        )
    if refused is not None:
        first = refused_errors[0] if refused_errors else "see `llmgw status`"
        return Check(
            "repo",
            "warn",
            f"revision {refused} was refused ({first}); {applied} keeps serving",
            "fix the errors with a new commit; `llmgw validate` reproduces them",
        )
    return Check("repo", "ok", f"revision {applied} applied, the newest seen")


def certificate_check(what: str, not_after: float | None, error: str | None, now: float) -> Check:
    """One certificate file: unreadable or expired fails, near expiry warns."""
    name = f"certificate {what}"
    if error is not None or not_after is None:
        return Check(
            name, "fail", f"cannot be read: {error}", "put a PEM certificate there, or fix the setting"
        )
    until = datetime.fromtimestamp(not_after, UTC).strftime("%Y-%m-%d")
    fix = "renew it: the cluster CA reissues leaves at the next controller start or node bootstrap"
    days = (not_after - now) / 86400
    if days <= 0:
        return Check(name, "fail", f"expired on {until}", fix)
    if days < CERT_WARN_DAYS:
        return Check(name, "warn", f"expires on {until}, in {days:.0f} day(s)", fix)
    return Check(name, "ok", f"valid until {until}")


def routers_check(connected: int, leading: bool) -> Check:
    if not leading:
        return Check(
            "routers", "warn", "this controller is a standby: routers follow the leader", "ask the leader"
        )
    if connected == 0:
        return Check(
            "routers",
            "warn",
            "no router is subscribed to this controller's stream: nothing serves the revision",
            "start a router with --controller pointing here, or check its log for why it cannot connect",
        )
    return Check("routers", "ok", f"{connected} router(s) subscribed")


def worst(checks: Iterable[Check]) -> Status:
    statuses = {c.status for c in checks}
    return "fail" if "fail" in statuses else "warn" if "warn" in statuses else "ok"
