"""What each console page shows, taken from the admin API's own view functions (llmgw.controller.status.fleet,
logs_admin, the store's queries): the console presents those facts, it never derives its own.

Lists are filtered and cut into pages here, on the server, so a page at 1,000 nodes or 500 models carries one
page of rows, not the fleet.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from llmgw.controller.parts.fleet import FleetReader, StatusReader
from llmgw.controller.status import fleet as views
from llmgw.core.fleet.states import NODE_WORDS
from llmgw.core.plan.diff import plan_for_catalog
from llmgw.core.plan.render import render_text

T = TypeVar("T")
PAGE_SIZE = 50


@dataclass(frozen=True)
class Page:
    items: list[Any]
    number: int  # 1-based
    pages: int
    total: int


def paginate(items: Sequence[T], number: int, size: int = PAGE_SIZE) -> Page:
    pages = max(1, math.ceil(len(items) / size))
    number = min(max(1, number), pages)
    return Page(list(items[(number - 1) * size : number * size]), number, pages, len(items))


def page_number(raw: str | None) -> int:
    try:
        return max(1, int(raw or "1"))
    except ValueError:
        return 1


# ------------------------------------------------------------------------------------------------ overview


def overview(c: StatusReader) -> dict[str, Any]:
    status = views.status_json(c)
    health: dict[str, int] = {}
    for m in status["models"]:
        health[m["health"]] = health.get(m["health"], 0) + 1
    attention = [m for m in status["models"] if m["health"] in ("Degraded", "Missing")]
    return {"status": status, "health": health, "attention": attention[:PAGE_SIZE]}


# ------------------------------------------------------------------------------------------------ nodes


@dataclass(frozen=True)
class NodeFilter:
    state: str = ""
    gpu_class: str = ""
    label: str = ""  # key=value, or a key alone
    fabric: str = ""

    def keeps(self, node: dict[str, Any], fabric: str | None) -> bool:
        if self.state and node["state"] != self.state:
            return False
        if self.gpu_class and self.gpu_class not in gpu_classes(node):
            return False
        if self.fabric and fabric != self.fabric:
            return False
        if self.label:
            key, _, value = self.label.partition("=")
            labels = node["labels"]
            if key.strip() not in labels or (value and labels[key.strip()] != value.strip()):
                return False
        return True


def gpu_classes(node: dict[str, Any]) -> set[str]:
    inv = node.get("inventory") or {}
    return {g.get("class") or "" for g in inv.get("gpus") or []} - {""}


def fabric_of(c: FleetReader, name: str) -> str | None:
    d = c.desired
    entry = d.catalog.nodes.get(name) if d is not None else None
    return entry.spec.fabric if entry is not None else None


def gpu_allocation(c: FleetReader) -> dict[tuple[str, int], str]:
    """(node, GPU index) -> the replica holding it."""
    held: dict[tuple[str, int], str] = {}
    for rec in c.fleet.replicas.values():
        for shard in rec.shards:
            for gpu in shard.gpus:
                held[(shard.node, gpu)] = rec.id
    return held


def nodes_page(c: FleetReader, flt: NodeFilter, number: int) -> dict[str, Any]:
    every = views.nodes_json(c)
    kept = [n for n in every if flt.keeps(n, fabric_of(c, n["name"]))]
    page = paginate(kept, number)
    held = gpu_allocation(c)
    rows = [node_row(c, n, held) for n in page.items]
    classes = sorted({cls for n in every for cls in gpu_classes(n)})
    fabrics = sorted({f for n in every if (f := fabric_of(c, n["name"]))})
    return {
        "page": page,
        "rows": rows,
        "filter": flt,
        "states": NODE_WORDS,
        "classes": classes,
        "fabrics": fabrics,
        "fleet": len(every),
    }


def node_row(c: FleetReader, node: dict[str, Any], held: dict[tuple[str, int], str]) -> dict[str, Any]:
    inv = node.get("inventory") or {}
    gpus = [
        g | {"held_by": held.get((node["name"], g["index"]))} for g in inv.get("gpus") or []
    ]  # None: the agent reported none (or no inventory yet): shown as unknown, never as zero
    return node | {
        "fabric": fabric_of(c, node["name"]),
        "gpus": gpus if inv.get("gpus") is not None else None,
        "engines": inv.get("engines"),
        "disks": inv.get("disks"),
        "conditions": inv.get("conditions") or [],
    }


def node_detail(c: FleetReader, name: str) -> dict[str, Any] | None:
    found = next((n for n in views.nodes_json(c) if n["name"] == name), None)
    if found is None:
        return None
    replicas = [
        views.replica_json(c, c.fleet.replicas[r]) for r in found["replicas"] if r in c.fleet.replicas
    ]
    return {"node": node_row(c, found, gpu_allocation(c)), "replicas": replicas}


# ------------------------------------------------------------------------------------------------ models


def models_page(c: FleetReader, query: str, number: int) -> dict[str, Any]:
    d = c.desired
    names = sorted(d.models) if d is not None else []
    query = query.strip().lower()
    kept = [n for n in names if query in n.lower()] if query else names
    page = paginate(kept, number)
    rows = [model_row(c, n) for n in page.items]
    return {"page": page, "rows": rows, "q": query, "fleet": len(names)}


def model_row(c: FleetReader, name: str) -> dict[str, Any]:
    d = c.desired
    assert d is not None
    m = d.models[name]
    replicas = [
        views.replica_json(c, r)
        for r in sorted(c.fleet.replicas.values(), key=lambda r: r.id)
        if r.model == name
    ]
    policy = m.spec.routing_policy or "(the cluster's)"
    return {
        "name": name,
        "health": views.model_health(c, name),
        "replicas": replicas,
        "routing_policy": policy,
        "fallbacks": list(m.spec.fallbacks),
        "aliases": list(m.aliases),
        "provider": m.spec.provider.url if m.spec.provider else None,
    }


def replica_detail(c: FleetReader, replica_id: str) -> dict[str, Any] | None:
    rec = c.fleet.replicas.get(replica_id)
    if rec is None:
        return None
    return {"replica": views.replica_json(c, rec), "seen_by": replica_seen_by(c, replica_id)}


def replica_seen_by(c: FleetReader, replica_id: str) -> list[dict[str, Any]]:
    """The replica as each router's last load report saw it (its requests and its engine's scraped metrics),
    newest report first: the controller scrapes no engine itself, the routers do."""
    now = c.wall()
    rows: list[dict[str, Any]] = []
    for router, load in c.fleet.worker_state.loads.items():
        seen = load.replicas.get(replica_id)
        if seen is not None:
            rows.append({"router": router, "age_s": max(0.0, now - load.at), "load": seen})
    rows.sort(key=lambda r: r["age_s"])
    return rows


# ------------------------------------------------------------------------------------------------ plan


@dataclass
class PlanCache:
    """The last plan made, by revision: making one reads every node and replica (seconds at 1,000 nodes), so a
    page polled by several operators makes it at most once per PLAN_FRESH_S."""

    revision: str | None = None
    made_at: float = float("-inf")
    text: str = ""
    making: asyncio.Lock = field(default_factory=asyncio.Lock)


PLAN_FRESH_S = 15.0


async def plan_text(c: FleetReader, cache: PlanCache) -> tuple[str | None, str, float]:
    """What `llmgw plan` prints for the applied revision against the live state (drift since it was applied),
    and when it was made (monotonic). The live state is taken on the loop; the plan is made in a thread."""
    d = c.desired
    if d is None:
        return None, "nothing applied yet: there is no revision to plan against", c.clock()
    async with cache.making:
        if cache.revision != d.revision or c.clock() - cache.made_at > PLAN_FRESH_S:
            live = views.live_state(c)
            plan = await asyncio.to_thread(plan_for_catalog, d.catalog, live)
            cache.revision, cache.made_at, cache.text = d.revision, c.clock(), render_text(plan)
    return cache.revision, cache.text, cache.made_at
