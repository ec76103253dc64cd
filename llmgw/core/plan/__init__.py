"""`llmgw plan`: the difference between the cluster repo and the live fleet, as a value, and its renderings.

    values.py   the plan as frozen values (Plan, ReplicaStart, DocumentChange, ..., its Impact)
    diff.py     make_plan / plan_for_catalog (pure: the reconciler in plan mode) and the document diffs
    render.py   text (Terraform's symbols), json (to_dict, stable keys), markdown (a pull-request comment)
    file.py     a saved plan's body and digest, and the rule that refuses a stale one
    impact.py   plan_impact: what each change does to a recent window's traffic (the Impact section)
    source_check.py  which weights sources a plan checks, and what the servers' answers mean (the checking
                is adapters/source_probe.py's; it imports this module by name)
    weight_updates.py  new weights upstream: which files of the pinned sources to ask the origin about, and
                whether they changed there (`llmgw model updates|update`; imported by name)

Import from here; the modules are the package's inside.
"""

from llmgw.core.plan.diff import (
    catalog_documents,
    document_changes,
    exit_code,
    make_plan,
    plan_for_catalog,
)
from llmgw.core.plan.file import (
    PLAN_FORMAT,
    StalePlan,
    check_plan_current,
    parse_saved_plan,
    plan_digest,
    saved_plan,
)
from llmgw.core.plan.impact import plan_impact, unknown_impact
from llmgw.core.plan.render import Format, render, render_json, render_markdown, render_text, to_dict
from llmgw.core.plan.values import (
    DocumentChange,
    Drift,
    FieldChange,
    Impact,
    ImpactItem,
    ModelChange,
    NodeChange,
    Plan,
    ReplicaRestart,
    ReplicaStart,
    ReplicaStop,
    StaleReplica,
    Unplaceable,
)

__all__ = [
    "PLAN_FORMAT",
    "DocumentChange",
    "Drift",
    "FieldChange",
    "Format",
    "Impact",
    "ImpactItem",
    "ModelChange",
    "NodeChange",
    "Plan",
    "ReplicaRestart",
    "ReplicaStart",
    "ReplicaStop",
    "StalePlan",
    "StaleReplica",
    "Unplaceable",
    "catalog_documents",
    "check_plan_current",
    "document_changes",
    "exit_code",
    "make_plan",
    "parse_saved_plan",
    "plan_digest",
    "plan_for_catalog",
    "plan_impact",
    "render",
    "render_json",
    "render_markdown",
    "render_text",
    "saved_plan",
    "to_dict",
    "unknown_impact",
]
