"""Whole-repo checks of service objectives and prices: a model's per-project objectives name a Project, and,
once the Cluster prices anything, every GPU class and CPU node kind a profile runs on has a price (or a default)
so `plan` can say what the fleet costs instead of leaving a replica out of the sum."""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.core.config.errors import IssueAdder
from llmgw.core.config.models import Cluster, Model, Project
from llmgw.core.config.specs.serving.cost_spec import CPU_KIND_LABEL, DEFAULT_CPU_KIND, Costs
from llmgw.core.config.validation import did_you_mean

__all__ = ["check_serving"]


def check_serving(documents: Sequence[object], add: IssueAdder) -> None:
    projects = {doc.metadata.name for doc in documents if isinstance(doc, Project)}
    costs = next((doc.spec.costs for doc in documents if isinstance(doc, Cluster)), None)
    for index, doc in enumerate(documents):
        if not isinstance(doc, Model):
            continue
        if doc.spec.slo is not None:
            for name in doc.spec.slo.projects:
                if name not in projects:
                    hint = did_you_mean(name, projects) or "name a Project of this repo"
                    add(index, ("spec", "slo", "projects", name), f"no Project `{name}`", hint)
        if costs is not None and costs.declared:
            _priced(index, doc, costs, add)


def _priced(index: int, doc: Model, costs: Costs, add: IssueAdder) -> None:
    for pos, profile in enumerate(doc.spec.profiles):
        if profile.gpu_class is not None:
            what, field, named = "GPU class", "gpu_class", profile.gpu_class
            price, keys = costs.gpu_price(named), ("gpu_per_hour", "default_gpu_per_hour")
        else:
            what, field, named = (
                "CPU node kind",
                "node_selector",
                profile.node_selector.get(CPU_KIND_LABEL, DEFAULT_CPU_KIND),
            )
            price, keys = costs.cpu_price(named), ("cpu_node_per_hour", "default_cpu_node_per_hour")
        if price is None:
            add(
                index,
                ("spec", "profiles", pos, field),
                f"{what} `{named}` has no price: the plan cannot say what this profile costs",
                f"set the Cluster's costs.{keys[0]}.{named} or costs.{keys[1]}",
                warning=True,
            )
