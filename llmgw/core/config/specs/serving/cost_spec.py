"""The Cluster's `spec.costs`: what each GPU class and CPU node kind costs per hour, so `llmgw plan` says what a
fleet costs per hour and per million tokens and `plan --suggest` can look for the cheapest one.

A GPU replica costs its class's price per card times its cards (`gpus` x `nodes`, at least one); a CPU replica
costs its node kind's price per node it runs on (its kind is its profile's `node_selector` value for
`llmgw.io/kind`, else `default`). A class or kind without a price takes the default; without a default its cost
is unknown, and the plan says so rather than counting it as free.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

from pydantic import Field

from llmgw.core.config.base import Strict

__all__ = ["CPU_KIND_LABEL", "DEFAULT_CPU_KIND", "Costs", "unknown_gpu_classes"]

CPU_KIND_LABEL = "llmgw.io/kind"  # the node label a CPU profile's node_selector names its node kind by
DEFAULT_CPU_KIND = "default"

Price = Annotated[float, Field(ge=0, description="Cost per hour")]


class Costs(Strict):
    """Prices per hour, in one currency."""

    currency: str = Field("USD", pattern=r"^[A-Z]{3}$", description="ISO 4217 code the prices are in")
    gpu_per_hour: dict[str, Price] = Field(
        default_factory=dict,
        description="Cost of one card of the GPU class per hour, by class (e.g. h100-80g: 2.4)",
    )
    cpu_node_per_hour: dict[str, Price] = Field(
        default_factory=dict,
        description="Cost of one CPU node per hour, by node kind (the `llmgw.io/kind` label a CPU profile's "
        "node_selector names; `default` for a profile that names none)",
    )
    default_gpu_per_hour: Price | None = Field(
        None, description="Cost of one card per hour for a GPU class not in gpu_per_hour (unset: unknown)"
    )
    default_cpu_node_per_hour: Price | None = Field(
        None, description="Cost of one CPU node per hour for a kind not in cpu_node_per_hour (unset: unknown)"
    )

    def gpu_price(self, gpu_class: str) -> float | None:
        return self.gpu_per_hour.get(gpu_class, self.default_gpu_per_hour)

    def cpu_price(self, kind: str) -> float | None:
        return self.cpu_node_per_hour.get(kind, self.default_cpu_node_per_hour)

    @property
    def declared(self) -> bool:
        """Whether any price is set (a Cluster that sets none asks for no costs)."""
        return bool(
            self.gpu_per_hour
            or self.cpu_node_per_hour
            or self.default_gpu_per_hour is not None
            or self.default_cpu_node_per_hour is not None
        )


def unknown_gpu_classes(costs: Costs, gpu_classes: Iterable[str]) -> list[str]:
    """The priced GPU classes the Cluster's `gpu_classes` does not declare (none when it declares none)."""
    known = set(gpu_classes)
    return sorted(c for c in costs.gpu_per_hour if known and c not in known)
