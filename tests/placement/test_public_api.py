"""The names other parts import from the decision modules: removing one is a breaking change."""

from __future__ import annotations

import llmgw.fleet
import llmgw.placement
import llmgw.plan
import llmgw.reconcile


def test_public_api():
    assert set(llmgw.placement.__all__) >= {"place", "explain", "Placer", "Placement", "PlacementResult"}
    assert set(llmgw.reconcile.__all__) >= {
        "reconcile",
        "StartReplica",
        "StopReplica",
        "MarkStale",
        "RestartReplica",
        "Wait",
        "Decision",
        "BackoffPolicy",
    }
    assert set(llmgw.plan.__all__) >= {"make_plan", "render", "render_text", "render_json", "render_markdown"}
    assert set(llmgw.fleet.__all__) >= {"LiveState", "NodeView", "ReplicaView", "ModelView", "model_views"}
    for module in (llmgw.fleet, llmgw.placement, llmgw.plan, llmgw.reconcile):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"
