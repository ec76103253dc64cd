"""Quotas with guarantees, as pure decisions on a fake fleet: what a tenant holds beyond its guarantee is
borrowed and taken back for a tenant within its own; what it holds within it is never taken for another;
limits on cores and memory; a Project as owner; the config's shape and its errors."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from llmgw.core.config.models import ClassCapacity, Organization, Project, Team
from llmgw.core.desired.catalog import Catalog
from llmgw.core.fleet.views import LiveState, ModelView
from llmgw.core.placement import explain
from llmgw.core.plan import make_plan, render_text, to_dict
from llmgw.core.reconcile import StartReplica, StopReplica
from llmgw.core.tenancy.limits import QuotaScope, quota_scope

from .builders import cpu_node, cpu_profile, entry, gpu_node, gpu_profile, replica
from .test_reconcile import fleet

ORG = quota_scope("Organization acme", {}, {})


def team(name: str, capacity: dict) -> QuotaScope:
    return quota_scope(f"Team {name}", {}, {k: ClassCapacity.model_validate(v) for k, v in capacity.items()})


def owned(view: ModelView, owner: str, *scopes: QuotaScope) -> ModelView:
    return view._replace(spec=view.spec.model_copy(update={"owner": owner}), quotas=scopes)


def gpu_teams(guarantee_a: int, guarantee_b: int) -> dict[str, ModelView]:
    a = team("a", {"h100-80g": {"guaranteed": {"gpus": guarantee_a}}})
    b = team("b", {"h100-80g": {"guaranteed": {"gpus": guarantee_b}}})
    return {
        "batch": owned(entry(gpu_profile(gpus=2), min=4, max=4), "b", b, ORG),
        "chat": owned(entry(gpu_profile(gpus=2), min=1, max=1), "a", a, ORG),
    }


def b_fills_the_node() -> list:
    return [
        replica(f"batch-{i}", "batch", "gpu", ("g", (2 * i, 2 * i + 1)), created_at=float(i))
        for i in range(4)
    ]


@pytest.mark.parametrize(
    ("guarantee_a", "guarantee_b", "taken"),
    [
        (2, 4, 1),  # b holds 8, 4 guaranteed: 4 borrowed; a within its 2 takes back one replica
        (2, 8, 0),  # b holds exactly its guarantee: nothing of it is borrowed
        (0, 4, 0),  # a's guarantee is 0: one more replica would take it beyond, nothing to take back for
        (4, 6, 1),  # b may lose 2 GPUs and stay at its 6: one replica, however many a is guaranteed
    ],
)
def test_what_is_taken_back_is_what_is_borrowed_beyond_a_guarantee(
    guarantee_a: int, guarantee_b: int, taken: int
) -> None:
    models = gpu_teams(guarantee_a, guarantee_b)
    f = fleet(models, gpu_node("g"))
    f.replicas = {r.id: r for r in b_fills_the_node()}
    d = f.decide()
    stops = d.of(StopReplica)
    assert len(stops) == taken, stops
    for stop in stops:
        assert stop.preempted_by == "chat" and stop.drain
        assert f"(borrowed: Team b holds 8 h100-80g, {guarantee_b} guaranteed)" in stop.reason
        assert "taken back within Team a's guarantee" in stop.reason
    if not taken:
        assert d.unplaced == {"chat": 1}


def test_a_replica_within_its_owners_guarantee_is_not_taken_even_for_a_higher_class() -> None:
    models = gpu_teams(0, 6)
    models["chat"] = models["chat"]._replace(
        rank=0, spec=models["chat"].spec.model_copy(update={"scaling": models["batch"].spec.scaling})
    )
    models["batch"] = models["batch"]._replace(rank=1)
    f = fleet(models, gpu_node("g"))
    f.replicas = {r.id: r for r in b_fills_the_node()}
    d = f.decide()
    # chat (a higher class) wants 4 replicas; b keeps 6 of its 8 GPUs: only one replica yields.
    assert [s.replica_id for s in d.of(StopReplica)] == ["batch-3"]
    assert d.unplaced == {"chat": 3}


def test_a_tenant_within_its_guarantee_gets_the_room_before_a_borrower_replaces_what_it_lost() -> None:
    models = gpu_teams(2, 4)
    f = fleet(models, gpu_node("g"))
    f.replicas = {r.id: r for r in b_fills_the_node()}
    (stop,) = f.decide().of(StopReplica)
    # Draining, then gone: batch is one short too, and is placed first in name order, but chat (within its
    # guarantee) takes the room.
    f.replicas[stop.replica_id] = replace(f.replicas[stop.replica_id], state="draining")
    assert f.decide().of(StopReplica) == []
    del f.replicas[stop.replica_id]
    (start,) = f.decide().of(StartReplica)
    assert start.placement.model == "chat"


def test_limits_on_cores_and_memory_refuse_with_the_words_of_the_limit() -> None:
    scope = team("a", {"cpu": {"limit": {"cpu_cores": 6, "memory_gb": 64}}})
    models = {"m": owned(entry(cpu_profile(cores=4, memory_gb=8), min=2, max=2), "a", scope)}
    running = [replica("m-1", "m", "cpu", ("c1", ()))]
    exp = explain("m", models, [cpu_node("c1"), cpu_node("c2")], running)
    assert exp.chosen is None
    assert exp.profiles[0].summary == "quota: Team a may hold 6 CPU cores, holds 4, a replica needs 4"
    scope = team("a", {"cpu": {"limit": {"memory_gb": 12}}})
    models = {"m": owned(models["m"], "a", scope)}
    exp = explain("m", models, [cpu_node("c1"), cpu_node("c2")], running)
    assert exp.profiles[0].summary == "quota: Team a may hold 12 GB of memory, holds 8, a replica needs 8"


def test_a_gpu_replicas_host_cores_count_under_its_gpu_class() -> None:
    scope = team("a", {"h100-80g": {"limit": {"cpu_cores": 8}}})
    models = {"m": owned(entry(gpu_profile(gpus=1, cpu_cores=8), min=2, max=2), "a", scope)}
    result = explain("m", models, [gpu_node("g")], [replica("m-1", "m", "gpu", ("g", (0,)))])
    assert (
        result.profiles[0].summary
        == "quota: Team a may hold 8 CPU cores on h100-80g, holds 8, a replica needs 8"
    )


def test_capacity_merges_with_gpu_quota_and_refuses_a_guarantee_above_its_limit() -> None:
    scope = quota_scope(
        "Team a",
        {"a100-80g": 4},
        {"h100-80g": ClassCapacity.model_validate({"guaranteed": {"gpus": 2}, "limit": {"gpus": 8}})},
    )
    assert dict(scope.gpus) == {"a100-80g": 4, "h100-80g": 8}
    assert scope.guaranteed["h100-80g"].gpus == 2
    with pytest.raises(
        ValidationError, match=r"guaranteed.gpus 9 is above limit.gpus 8: a guarantee the limit refuses"
    ):
        ClassCapacity.model_validate({"guaranteed": {"gpus": 9}, "limit": {"gpus": 8}})


def test_a_project_owner_counts_against_its_project_team_and_organization() -> None:
    docs = [
        Organization.model_validate(
            _doc("Organization", "acme", {"capacity": {"cpu": {"limit": {"cpu_cores": 64}}}})
        ),
        Team.model_validate(_doc("Team", "ml", {"organization": "acme", "gpu_quota": {"h100-80g": 8}})),
        Project.model_validate(
            _doc("Project", "chat", {"team": "ml", "capacity": {"cpu": {"guaranteed": {"cpu_cores": 4}}}})
        ),
        Project.model_validate(_doc("Project", "solo", {"organization": "acme"})),
    ]
    catalog = Catalog.build(docs)
    assert [s.name for s in catalog.quota_scopes("chat")] == ["Project chat", "Team ml", "Organization acme"]
    assert [s.name for s in catalog.quota_scopes("ml")] == ["Team ml", "Organization acme"]
    assert [s.name for s in catalog.quota_scopes("solo")] == ["Organization acme"]  # it declares none itself
    assert catalog.quota_scopes("chat")[0].guaranteed["cpu"].cpu_cores == 4


def _doc(kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": "llmgw/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def test_plan_shows_guarantees_borrowing_and_what_a_change_takes_back() -> None:
    models = gpu_teams(2, 4)
    live = LiveState.from_views([gpu_node("g")], b_fills_the_node(), revision="abc", taken_at=0.0)
    plan = make_plan(models, live)
    text = render_text(plan)
    assert "  = Team a, h100-80g: guaranteed 2 h100-80g; holds 0 h100-80g, 2 h100-80g once applied\n" in text
    assert (
        "  = Team b, h100-80g: guaranteed 4 h100-80g; holds 8 h100-80g, 6 h100-80g once applied "
        "(2 h100-80g borrowed); taken back: batch-3"
    ) in text
    [stop] = plan.stops
    assert stop.replica_id == "batch-3" and "taken back within Team a's guarantee" in stop.reason
    # chat's replica goes into the room batch-3 leaves: it counts once applied.
    assert [s.model for s in plan.starts] == ["chat"]
    [a] = [c for c in to_dict(plan)["capacity"] if c["scope"] == "Team a"]
    assert a == {
        "scope": "Team a",
        "class": "h100-80g",
        "guaranteed": "2 h100-80g",
        "limit": None,
        "holds": "0 h100-80g",
        "holds_once_applied": "2 h100-80g",
        "borrowed": None,
        "taken_back": [],
    }
