"""A tenant's capacity: per class, what it is guaranteed and what it may hold at most (Organization, Team and
Project `spec.capacity`). docs/placement.md, Quotas with guarantees, argues the shape.

A class is a GPU class (`h100-80g`) for replicas of GPU profiles, or `cpu` for replicas of CPU profiles: a GPU
replica's host cores and memory come from GPU nodes, a pool apart from the CPU nodes', so they are counted
under its GPU class. Apart from llmgw.core.config.models so that file stays one concept per screen.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from llmgw.core.config.base import Strict

CPU_CLASS = "cpu"  # the class of replicas whose profile names no gpu_class


class Amounts(Strict):
    """GPUs, CPU cores and memory; unset means not said (no guarantee, or no limit, of that resource)."""

    gpus: int | None = Field(None, ge=0, description="GPUs of the class")
    cpu_cores: int | None = Field(None, ge=0, description="CPU cores (a profile's cpu_cores, per node)")
    memory_gb: float | None = Field(
        None, ge=0, description="Host memory in GiB (a profile's min_memory_gb, per node)"
    )


class ClassCapacity(Strict):
    """One class's guarantee and limit for a tenant."""

    guaranteed: Amounts = Field(
        default_factory=Amounts,
        description="What the tenant's replicas keep whatever else wants room: a replica within it is never "
        "preempted for another tenant, and replicas of other tenants holding room beyond their own guarantees "
        "are taken back for it",
    )
    limit: Amounts = Field(
        default_factory=Amounts,
        description="The most the tenant's replicas hold; what they hold beyond the guarantee is borrowed",
    )

    @model_validator(mode="after")
    def _guarantee_within_limit(self) -> ClassCapacity:
        for field in ("gpus", "cpu_cores", "memory_gb"):
            given, most = getattr(self.guaranteed, field), getattr(self.limit, field)
            if given is not None and most is not None and given > most:
                raise ValueError(
                    f"guaranteed.{field} {given:g} is above limit.{field} {most:g}: a guarantee the limit "
                    f"refuses is no guarantee (raise the limit to at least {given:g} or lower the guarantee)"
                )
        return self


Capacity = dict[str, ClassCapacity]
CAPACITY_DESCRIPTION = (
    "Per class (a GPU class such as h100-80g, or `cpu` for CPU profiles): GPUs, cores and memory guaranteed to "
    "the replicas of the models whose `owner` is this tenant or beneath it, and the most they may hold "
    "(docs/placement.md, Quotas with guarantees)"
)
