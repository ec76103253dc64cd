"""What a plan does to tenants' capacity: per scope and class with a guarantee or a limit, what it is
guaranteed, what it holds now and once the plan is applied, what of that is borrowed, and which replicas the
plan takes back from it for a tenant within its guarantee. Pure: the plan's replicas and starts in, lines out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from llmgw.core.fleet.views import GIB, ModelView, ReplicaView, ShardView
from llmgw.core.placement.preempt import TAKEN_BACK
from llmgw.core.placement.quota import Held, quota_use
from llmgw.core.plan.values import ReplicaStart, ReplicaStop, ScopeCapacity
from llmgw.core.tenancy.limits import QuotaScope, Resources

__all__ = ["ScopeCapacity", "scope_capacity"]


def _amounts(held: Held, cls: str, like: Resources | None = None) -> str:
    """`held` in words, the resources `like` declares (all that are non-zero when it is None)."""
    on = "" if cls == "cpu" else f" on {cls}"
    parts = []
    for name, unit, scale in (
        ("gpus", cls, 1),
        ("cpu_cores", f"CPU cores{on}", 1),
        ("memory_bytes", f"GB of memory{on}", GIB),
    ):
        value = getattr(held, name)
        if (like is None and value) or (like is not None and getattr(like, name) is not None):
            parts.append(f"{value / scale:g} {unit}")
    return ", ".join(parts) or "nothing"


def _declared(r: Resources | None, cls: str) -> str:
    if r is None:
        return ""
    return _amounts(Held(r.gpus or 0, r.cpu_cores or 0, r.memory_bytes or 0), cls, r)


def _beyond(held: Held, given: Resources | None, cls: str) -> str:
    if given is None:
        return _amounts(held, cls) if held != Held() else ""
    over = Held(
        max(0, held.gpus - (given.gpus if given.gpus is not None else held.gpus)),
        max(0, held.cpu_cores - (given.cpu_cores if given.cpu_cores is not None else held.cpu_cores)),
        max(
            0,
            held.memory_bytes - (given.memory_bytes if given.memory_bytes is not None else held.memory_bytes),
        ),
    )
    return _amounts(over, cls, given) if over != Held() else ""


def scope_capacity(
    desired: Mapping[str, ModelView],
    replicas: Iterable[ReplicaView],
    starts: Iterable[ReplicaStart],
    leaving: Iterable[str],
    stops: Iterable[ReplicaStop],
) -> tuple[ScopeCapacity, ...]:
    """Every scope of the desired models that declares a guarantee or a limit, per class it names."""
    replicas = tuple(replicas)
    gone = set(leaving)
    planned = [
        ReplicaView(
            s.replica_id,
            s.model,
            s.profile,
            shards=tuple(ShardView(n, i, g) for i, (n, g) in enumerate(zip(s.nodes, s.gpus, strict=False))),
        )
        for s in starts
    ]
    now = quota_use(desired, replicas)
    after = quota_use(desired, [*(r for r in replicas if r.id not in gone), *planned])
    scopes: dict[str, QuotaScope] = {}
    for view in desired.values():
        for scope in view.quotas:
            scopes.setdefault(scope.name, scope)
    owners = {r.id: desired[r.model].quotas for r in replicas if r.model in desired}
    out: list[ScopeCapacity] = []
    for name, scope in sorted(scopes.items()):
        for cls in sorted({*scope.gpus, *scope.limits, *scope.guaranteed}):
            given = scope.guaranteed.get(cls)
            limit = scope.limits.get(cls, Resources())
            if cls in scope.gpus:
                limit = Resources(scope.gpus[cls], limit.cpu_cores, limit.memory_bytes)
            taken = tuple(
                s.replica_id
                for s in stops
                if TAKEN_BACK.split("{")[0] in s.reason
                and any(q.name == name for q in owners.get(s.replica_id, ()))
            )
            out.append(
                ScopeCapacity(
                    name,
                    cls,
                    _declared(given, cls),
                    _declared(limit, cls) if limit != Resources() else "",
                    _amounts(now.of(scope, cls), cls, given),
                    _amounts(after.of(scope, cls), cls, given),
                    _beyond(after.of(scope, cls), given, cls),
                    taken,
                )
            )
    return tuple(out)
