"""The names other parts import from the decision modules: removing one is a breaking change."""

from __future__ import annotations

import llmgw.core.fleet
import llmgw.core.placement
import llmgw.core.plan
import llmgw.core.reconcile


def test_public_api():
    assert set(llmgw.core.placement.__all__) >= {"place", "explain", "Placer", "Placement", "PlacementResult"}
    assert set(llmgw.core.reconcile.__all__) >= {
        "reconcile",
        "StartReplica",
        "StopReplica",
        "MarkStale",
        "RestartReplica",
        "Wait",
        "Decision",
        "BackoffPolicy",
    }
    assert set(llmgw.core.plan.__all__) >= {
        "make_plan",
        "render",
        "render_text",
        "render_json",
        "render_markdown",
    }
    assert set(llmgw.core.fleet.__all__) >= {
        "LiveState",
        "NodeView",
        "ReplicaView",
        "ModelView",
        "model_views",
    }
    for module in (llmgw.core.fleet, llmgw.core.placement, llmgw.core.plan, llmgw.core.reconcile):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"
