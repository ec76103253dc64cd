"""Facilities in placement: where a node stands (site, room, row, rack, PDU from its `llmgw.io/<level>` labels),
spreading a model's replicas across racks and PDUs, holds on a domain, and power caps. Pure.

- Spread is a preference: among nodes that fit, one in a rack (then a PDU) holding fewer of the model's
  replicas ranks first. When only a crowded one fits, it is taken and the placement's reason says so.
- A hold (`llmgw facility hold rack=r1`) keeps every node of the domain from taking new replicas.
- A power cap refuses a shard whose GPUs would take one of its node's domains past the cap. A domain draws
  what its nodes draw; a node draws the larger of what its agent measured and what is declared: its
  `power_watts` (GPUs idle) plus each busy card at its class's `watts`. What is not known is not counted as
  zero in words: the explanation names it (`power: ... (n3 declares no power_watts)`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from llmgw.core.config.models import FACILITY_LABEL_PREFIX, FACILITY_LEVELS, FacilityLevel
from llmgw.core.fleet.states import HELD_STATES
from llmgw.core.fleet.views import NodeView, ReplicaView

__all__ = [
    "SPREAD_LEVELS",
    "PowerBook",
    "SpreadBook",
    "domain",
    "domain_refs",
    "hold_words",
    "node_power_caps",
    "power_book",
    "watts",
]

SPREAD_LEVELS: tuple[FacilityLevel, ...] = ("rack", "pdu")


def domain(labels: Mapping[str, str], level: FacilityLevel) -> str | None:
    """The value of the node's `llmgw.io/<level>` label; None when it does not say."""
    return labels.get(FACILITY_LABEL_PREFIX + level)


def domain_refs(labels: Mapping[str, str]) -> tuple[str, ...]:
    """Every domain the node stands in, as `level=value` (site first, PDU last)."""
    out: list[str] = []
    for level in FACILITY_LEVELS:
        value = domain(labels, level)
        if value is not None:
            out.append(f"{level}={value}")
    return tuple(out)


def hold_words(labels: Mapping[str, str], holds: Mapping[str, str]) -> str:
    """Why a node is held, in words (`facility hold: rack=r1 (by ann at ...)`); "" when no hold covers it.
    `holds` maps a domain (`rack=r1`) to the words recorded with its hold."""
    found = [f"{ref} ({holds[ref]})" if holds[ref] else ref for ref in domain_refs(labels) if ref in holds]
    return f"facility hold: {'; '.join(found)}" if found else ""


def node_power_caps(labels: Mapping[str, str], caps: Mapping[str, float]) -> dict[str, float]:
    """The caps (`pdu=a1` -> watts) of the domains a node stands in."""
    return {ref: caps[ref] for ref in domain_refs(labels) if ref in caps}


def watts(value: float) -> str:
    return f"{value:,.0f} W"


# ---------------------------------------------------------------------------------------------- spread


_NOWHERE = (0,) * len(SPREAD_LEVELS)


@dataclass(slots=True)
class SpreadBook:
    """Replicas of each model per rack and per PDU during a pass (placements add to it). A replica counts
    once per domain, however many of its shards stand there."""

    by_model: dict[str, dict[tuple[str, str], int]] = field(default_factory=dict)  # model -> domain -> n
    # node -> its (level, value) for each spread level, None where it does not say (worked out once a pass)
    where: dict[str, tuple[tuple[str, str] | None, ...]] = field(default_factory=dict)

    def _where(self, node: NodeView) -> tuple[tuple[str, str] | None, ...]:
        found = self.where.get(node.name)
        if found is None:
            found = tuple(
                None if (value := domain(node.labels, level)) is None else (level, value)
                for level in SPREAD_LEVELS
            )
            self.where[node.name] = found
        return found

    def add(self, model: str, nodes: Iterable[NodeView]) -> None:
        seen = {d for node in nodes for d in self._where(node) if d is not None}
        counts = self.by_model.setdefault(model, {})
        for key in seen:
            counts[key] = counts.get(key, 0) + 1

    def key(self, model: str, node: NodeView) -> tuple[int, ...]:
        """The model's replicas in the node's rack, then its PDU (0 where the node does not say)."""
        counts = self.by_model.get(model)
        if not counts:
            return _NOWHERE
        return tuple(0 if d is None else counts.get(d, 0) for d in self._where(node))

    def crowded(self, model: str, nodes: Sequence[NodeView]) -> list[str]:
        """Words for the domains of `nodes` that already hold a replica of `model` (for a placement's why)."""
        counts = self.by_model.get(model, {})
        out: list[str] = []
        for i, level in enumerate(SPREAD_LEVELS):
            values = {where[i] for n in nodes if (where := self._where(n))[i] is not None}
            for d in sorted(v for v in values if v is not None):
                n = counts.get(d, 0)
                if n:
                    out.append(f"{level} {d[1]} holds {n} already")
        return out


def spread_book(nodes: Mapping[str, NodeView], replicas: Iterable[ReplicaView]) -> SpreadBook:
    book = SpreadBook()
    for r in replicas:
        if r.state in HELD_STATES:
            book.add(r.model, [nodes[s.node] for s in r.shards if s.node in nodes])
    return book


# ---------------------------------------------------------------------------------------------- power


@dataclass(slots=True)
class PowerBook:
    """What each capped domain draws during a pass: placements add their GPUs' watts."""

    caps: dict[str, float]  # domain -> cap
    drawn: dict[str, float]  # domain -> watts counted
    unknown: dict[str, list[str]]  # domain -> words about the draw of its nodes that is not known

    def shard_watts(self, node: NodeView, gpu_class: str | None, gpus: int) -> float | None:
        """What `gpus` busy cards of the class draw on `node`; None when its class declares no watts."""
        if not gpus:
            return 0.0
        per = [g.watts for g in node.gpus or () if gpu_class is None or g.gpu_class == gpu_class]
        known = [w for w in per if w is not None]
        return max(known) * gpus if known else None

    def refusal(self, node: NodeView, gpu_class: str | None, gpus: int, extra: float = 0.0) -> str | None:
        """Why a shard of `gpus` cards may not go to `node`: the first of its domains it would take past a
        cap, in words. `extra`: watts other shards of the same replica add to the node's domains."""
        if not node.power_caps or not gpus:
            return None
        need = self.shard_watts(node, gpu_class, gpus)
        if need is None:
            return None
        for ref, cap in sorted(node.power_caps.items()):
            now = self.drawn.get(ref, 0.0) + extra
            if now + need > cap:
                return (
                    f"power: {ref} would draw {watts(now + need)} of its {watts(cap)} cap "
                    f"({watts(now)} now, the shard {watts(need)})"
                )
        return None

    def notes(self, node: NodeView, gpu_class: str | None, gpus: int) -> list[str]:
        """What the cap check could not count, for a node the check accepted."""
        if not node.power_caps or not gpus:
            return []
        out: list[str] = []
        if self.shard_watts(node, gpu_class, gpus) is None:
            what = gpu_class or "its GPUs"
            out.append(f"power: {what} declares no watts, {', '.join(sorted(node.power_caps))} not checked")
        for ref in sorted(node.power_caps):
            if self.unknown.get(ref):
                out.append(f"power: {ref} counted without {'; '.join(self.unknown[ref])}")
        return out

    def take(self, node: NodeView, gpu_class: str | None, gpus: int) -> None:
        need = self.shard_watts(node, gpu_class, gpus)
        if need is None:
            return
        for ref in node.power_caps:
            self.drawn[ref] = self.drawn.get(ref, 0.0) + need


def node_draw(node: NodeView, busy: Iterable[int]) -> tuple[float, list[str]]:
    """(watts counted for the node, words for what could not be counted): the larger of the measured draw
    and the declared one (base plus each busy card at its class's watts). The larger, because a replica
    still loading draws little now and its card's full draw soon."""
    unknown: list[str] = []
    declared = node.power_watts if node.power_watts is not None else 0.0
    if node.power_watts is None and node.power_draw_watts is None:
        unknown.append(f"{node.name} declares no power_watts and reports no draw")
    by_index = {g.index: g for g in node.gpus or ()}
    for index in busy:
        gpu = by_index.get(index)
        if gpu is None:
            continue
        if gpu.watts is None:
            if node.power_draw_watts is None:
                unknown.append(f"{node.name}'s busy {gpu.gpu_class or 'GPU'} (no watts declared)")
            continue
        declared += gpu.watts
    measured = node.power_draw_watts if node.power_draw_watts is not None else 0.0
    return max(declared, measured), unknown


def power_book(nodes: Iterable[NodeView], replicas: Iterable[ReplicaView]) -> PowerBook:
    """Each capped domain's draw now, from every node standing in it."""
    nodes = tuple(nodes)
    busy: dict[str, set[int]] = {}
    for r in replicas:
        if r.state in HELD_STATES:
            for s in r.shards:
                busy.setdefault(s.node, set()).update(s.gpus)
    book = PowerBook({}, {}, {})
    for node in nodes:
        if not node.power_caps:
            continue
        held = busy.get(node.name, set()) | {g.index for g in node.gpus or () if g.allocated}
        draw, unknown = node_draw(node, sorted(held))
        for ref, cap in node.power_caps.items():
            book.caps[ref] = cap
            book.drawn[ref] = book.drawn.get(ref, 0.0) + draw
            if unknown:
                book.unknown.setdefault(ref, []).extend(unknown)
    return book
