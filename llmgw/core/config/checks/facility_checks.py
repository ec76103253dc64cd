"""Whole-repo checks of facilities (called by `semantic.check`): what validate can tell before any node reports.

- a profile's `keep_within` on a one-node profile keeps nothing together (a warning: it does no harm);
- a power cap on a domain no Node document stands in caps nothing the repo knows of (a warning: an agent's
  own labels may still put nodes there);
- power caps with no GPU class declaring `watts` and no Node declaring `power_watts` can only count measured
  draw, and a placement only sees a shard's draw once it runs (a warning).
"""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.core.config.errors import IssueAdder
from llmgw.core.config.models import FACILITY_LABEL_PREFIX, Cluster, Model, Node
from llmgw.core.config.validation import did_you_mean

__all__ = ["check_facilities"]


def check_facilities(documents: Sequence[object], add: IssueAdder) -> None:
    for index, doc in enumerate(documents):
        if isinstance(doc, Model):
            for pos, profile in enumerate(doc.spec.profiles):
                if profile.keep_within is not None and profile.nodes == 1:
                    add(
                        index,
                        ("spec", "profiles", pos, "keep_within"),
                        f"keep_within {profile.keep_within} keeps a multi-node replica's nodes in one domain; "
                        "this profile runs on one node",
                        "drop keep_within, or set nodes above 1",
                        warning=True,
                    )
    nodes = [d for d in documents if isinstance(d, Node)]
    for index, doc in enumerate(documents):
        if isinstance(doc, Cluster) and doc.spec.facilities.power_caps:
            _caps(index, doc, nodes, add)


def _caps(index: int, cluster: Cluster, nodes: list[Node], add: IssueAdder) -> None:
    spec = cluster.spec
    where = {
        f"{key.removeprefix(FACILITY_LABEL_PREFIX)}={value}"
        for node in nodes
        for key, value in (node.metadata.labels or {}).items()
        if key.startswith(FACILITY_LABEL_PREFIX)
    }
    if nodes:
        for ref in sorted(spec.facilities.power_caps):
            if ref not in where:
                level, _, value = ref.partition("=")
                add(
                    index,
                    ("spec", "facilities", "power_caps", ref),
                    f"no Node document carries {FACILITY_LABEL_PREFIX}{level}: {value}, so this cap covers "
                    "none of the repo's nodes (an agent's own labels may still put nodes there)",
                    did_you_mean(ref, sorted(where)) or f"label the nodes of {ref}, or drop the cap",
                    warning=True,
                )
    declared = any(c.watts is not None for c in spec.gpu_classes.values()) or any(
        n.spec.power_watts is not None for n in nodes
    )
    if not declared:
        add(
            index,
            ("spec", "facilities", "power_caps"),
            "power caps with no GPU class declaring `watts` and no Node declaring `power_watts` count only the "
            "draw agents measure: a shard's cards are not counted until they draw",
            "declare gpu_classes.<class>.watts (the card's TDP)",
            warning=True,
        )
