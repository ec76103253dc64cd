"""Which engine builds a connected node runs (llmgw.core.placement.engine_builds), from what its agent reported
and the applied Cluster: one function both the placement view (the refusals) and the engine orders (what the
node installs) read, so the two cannot differ."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw_agent.protocol import Inventory

from llmgw.core.placement import PlatformFacts
from llmgw.core.placement.engine_builds import BuildChoice, BuildNode, choose_builds

if TYPE_CHECKING:
    from llmgw.controller.parts.fleet import FleetReader

__all__ = ["build_choices", "node_labels", "platform_facts"]


def platform_facts(inv: Inventory) -> PlatformFacts:
    return PlatformFacts(
        cpu_flags=None if inv.cpu_flags is None else frozenset(inv.cpu_flags),
        arch=inv.arch,
        glibc=inv.glibc,
        gpu_driver=inv.gpu_driver,
        cuda=inv.cuda_version,
    )


def node_labels(c: FleetReader, name: str, inv: Inventory) -> dict[str, str]:
    """The agent's labels with the repo's Node document's over them."""
    d = c.desired
    declared = d.catalog.nodes.get(name) if d else None
    labels = dict(inv.labels)
    if declared is not None:
        labels.update(declared.labels)
    return labels


def build_choices(c: FleetReader, name: str, inv: Inventory) -> dict[str, BuildChoice]:
    """Engine -> the node's build (or why none) under the applied Cluster; {} before a revision is applied."""
    d = c.desired
    if d is None:
        return {}
    classes = frozenset(g.gpu_class for g in inv.gpus or [] if g.gpu_class)
    node = BuildNode(name, node_labels(c, name, inv), classes, platform_facts(inv))
    engines = {str(k): v for k, v in d.cluster.engines.items()}
    return choose_builds(engines, d.cluster.engine_overrides, node)
