"""`llmgw plan` says who yields to whom: a critical model committed to a fleet full of batch replicas plans a
stop of one batch replica, naming the model it yields to, and nothing else of batch."""

from __future__ import annotations

from llmgw.core.fleet.views import LiveNode, LiveReplica, LiveState
from llmgw.core.plan import make_plan, render_text

from .builders import gpu_node
from .test_preemption import full_of_batch


def test_the_plan_names_the_replica_that_yields_and_to_whom() -> None:
    models, replicas = full_of_batch()
    live = LiveState(
        nodes=[LiveNode.from_view(n) for n in (gpu_node("g1"), gpu_node("g2"))],
        replicas=[LiveReplica.from_view(r) for r in replicas],
        models={"batch": models["batch"].spec},
    )
    plan = make_plan(models, live)
    [stop] = plan.stops
    assert stop.replica_id == "batch-0" and stop.drain
    assert stop.reason.startswith("preempted: batch-0 of batch (batch) yields g1 to chat (critical)")
    # The whole way: chat starts in the room batch-0 leaves (the controller places it once it is gone).
    [start] = plan.starts
    assert (start.model, start.nodes) == ("chat", ("g1",))
    assert start.reason == "scale to min 1 once batch-0 stopped"
    text = render_text(plan)
    assert "stop batch-0 (batch/gpu) on g1: preempted: batch-0 of batch (batch) yields g1 to chat" in text
    assert "why there: preemption: in the room batch-0 leaves on g1" in text
