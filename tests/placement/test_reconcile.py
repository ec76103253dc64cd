"""The reconciler's decisions, carried out on a fake fleet with a synthetic clock."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from llmgw.core.fleet.views import ModelState, ModelView, NodeView, ReplicaView, ShardView
from llmgw.core.reconcile import (
    BackoffPolicy,
    MarkStale,
    ReconcileDecision,
    RestartReplica,
    StartReplica,
    StopReplica,
    Wait,
    reconcile,
)

from .builders import cpu_node, cpu_profile, entry, gpu_node, gpu_profile, replica


@dataclass
class FakeFleet:
    """Carries actions out the way the controller would, instantly; the test decides when engines are ready."""

    models: dict[str, ModelView]
    nodes: dict[str, NodeView]
    replicas: dict[str, ReplicaView] = field(default_factory=dict)
    backoff: dict[str, ModelState] = field(default_factory=dict)
    now: float = 1000.0
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    last_used: dict[str, float] = field(default_factory=dict)
    demand: dict[str, int] = field(default_factory=dict)
    started: list[StartReplica] = field(default_factory=list)
    stopped: list[StopReplica] = field(default_factory=list)
    shard_starts: list[tuple[str, int]] = field(default_factory=list)

    def decide(self) -> ReconcileDecision:
        d = reconcile(
            self.models,
            self.nodes.values(),
            self.replicas.values(),
            now=self.now,
            rng=self.rng,
            backoff=self.backoff,
            last_used=self.last_used,
            demand=self.demand,
        )
        self.backoff = dict(d.backoff)
        return d

    def apply(self, d: ReconcileDecision) -> None:
        for a in d.actions:
            if isinstance(a, StartReplica):
                p = a.placement
                self.started.append(a)
                for s in a.shards_in_start_order:
                    self.shard_starts.append((p.replica_id, s.rank))
                self.replicas[p.replica_id] = ReplicaView(
                    id=p.replica_id,
                    model=p.model,
                    profile=p.profile,
                    fingerprint=p.fingerprint,
                    shards=tuple(ShardView(s.node, s.rank, s.gpus, "starting") for s in p.shards),
                    state="starting",
                    created_at=self.now,
                    replaces=a.replaces,
                )
            elif isinstance(a, StopReplica | RestartReplica):
                if isinstance(a, StopReplica):
                    self.stopped.append(a)
                self.replicas.pop(a.replica_id, None)
            elif isinstance(a, MarkStale):
                self.replicas[a.replica_id] = replace(self.replicas[a.replica_id], stale=True)

    def step(self) -> ReconcileDecision:
        d = self.decide()
        self.apply(d)
        return d

    def ready_all(self) -> None:
        for rid, r in list(self.replicas.items()):
            if r.state == "starting":
                shards = tuple(replace(s, state="ready") for s in r.shards)
                self.replicas[rid] = replace(r, shards=shards, state="ready", ready_since=self.now)

    def fail_shard(self, rid: str, rank: int) -> None:
        r = self.replicas[rid]
        shards = tuple(replace(s, state="failed") if s.rank == rank else s for s in r.shards)
        self.replicas[rid] = replace(r, shards=shards)

    def of_model(self, model: str) -> list[ReplicaView]:
        return sorted((r for r in self.replicas.values() if r.model == model), key=lambda r: r.id)


def fleet(models, *nodes: NodeView) -> FakeFleet:
    return FakeFleet(dict(models), {n.name: n for n in nodes})


def test_scales_to_min_on_different_nodes():
    f = fleet({"m": entry(cpu_profile(), min=2, max=2)}, cpu_node("a"), cpu_node("b"), cpu_node("c"))
    d = f.step()
    assert [a.reason for a in d.of(StartReplica)] == ["scale to min 2", "scale to min 2"]
    assert sorted(r.shards[0].node for r in f.of_model("m")) == ["a", "b"]
    f.ready_all()
    assert f.step().actions == ()  # converged: nothing to do


def test_removed_model_is_stopped_with_drain():
    f = fleet({"m": entry(cpu_profile())}, cpu_node("a"))
    f.step()
    f.ready_all()
    f.models = {}
    d = f.step()
    assert d.actions == (StopReplica("m-cpu-1", "model m is no longer in the cluster repo", drain=True),)
    assert f.replicas == {}


def test_failed_shard_replaces_the_whole_replica_with_growing_backoff():
    f = fleet(
        {"m": entry(gpu_profile(gpus=8, nodes=2))}, gpu_node("a", fabric="ib"), gpu_node("b", fabric="ib")
    )
    f.step()
    f.ready_all()
    delays = []
    for _round in range(4):
        rid = f.of_model("m")[0].id
        f.fail_shard(rid, 1)
        d = f.step()
        stop = d.of(StopReplica)
        assert stop == [StopReplica(rid, "shard 1 on b failed; stopping every shard", drain=False)]
        waits = d.of(Wait)
        assert len(waits) == 1 and waits[0].until is not None
        assert waits[0].reason.startswith("backing off after")
        delays.append(waits[0].until - f.now)
        assert d.wake_at == waits[0].until
        assert d.of(StartReplica) == []
        # before the backoff ends, still waiting
        f.now = waits[0].until - 0.5
        assert f.step().of(StartReplica) == []
        f.now = waits[0].until
        started = f.step().of(StartReplica)
        assert len(started) == 1 and started[0].reason == "scale to min 1"
        f.ready_all()
    assert delays == sorted(delays) and delays[0] < delays[-1]
    assert 4.0 <= delays[0] <= 6.0  # base 5 s, jitter 20 %
    assert f.backoff["m"].failures == 4


def test_backoff_is_capped_and_resets_after_a_replica_stays_ready():
    policy = BackoffPolicy()
    rng = random.Random(1)
    assert all(policy.delay(n, rng) <= policy.cap for n in range(1, 30))
    f = fleet({"m": entry(cpu_profile())}, cpu_node("a"))
    f.backoff = {"m": ModelState(failures=5, not_before=0.0)}
    f.step()
    f.ready_all()
    d = f.step()
    assert d.wake_at == f.now + policy.reset_after
    f.now += policy.reset_after
    f.step()
    assert "m" not in f.backoff


def test_jitter_comes_from_the_injected_random():
    def first_delay(seed: int) -> float:
        f = fleet({"m": entry(cpu_profile())}, cpu_node("a"))
        f.rng = random.Random(seed)
        f.step()
        f.fail_shard(f.of_model("m")[0].id, 0)
        wait = f.step().of(Wait)[0]
        assert wait.until is not None
        return wait.until - f.now

    assert first_delay(3) == first_delay(3)
    assert first_delay(3) != first_delay(4)


def test_lost_node_replicas_move_unreachable_ones_stay():
    f = fleet({"m": entry(cpu_profile(), min=2, max=2)}, cpu_node("a"), cpu_node("b"), cpu_node("c"))
    f.step()
    f.ready_all()
    on_a = next(r for r in f.replicas.values() if r.shards[0].node == "a")
    f.nodes["a"] = replace(f.nodes["a"], state="Unreachable")
    d = f.step()
    assert d.of(StopReplica) == [] and d.of(StartReplica) == []
    assert [w.reason for w in d.of(Wait)] == [
        f"{on_a.id} is on Unreachable node a: kept until the node is Lost"
    ]
    f.nodes["a"] = replace(f.nodes["a"], state="Lost")
    d = f.step()
    assert d.of(StopReplica) == [
        StopReplica(on_a.id, "node a is Lost; replaced elsewhere", drain=False, forget=True)
    ]
    (start,) = d.of(StartReplica)
    assert start.placement.nodes == ("c",)
    assert start.reason == f"replaces {on_a.id} (node a is Lost)"
    assert start.replaces == on_a.id
    assert f.backoff == {}  # a lost node is not the model's failure


def _leave(f: FakeFleet, node: str) -> None:
    """The node is removed from the repo: the controller cordons it and marks it leaving."""
    f.nodes[node] = replace(f.nodes[node], cordoned=True, leaving=True)


def test_a_removed_nodes_replica_stops_only_once_its_replacement_is_ready():
    f = fleet({"m": entry(cpu_profile(), min=1, max=1)}, cpu_node("a"), cpu_node("b"))
    f.step()
    f.ready_all()
    (old,) = f.of_model("m")
    _leave(f, old.shards[0].node)
    d = f.step()
    (start,) = d.of(StartReplica)
    assert start.placement.nodes != old.nodes and start.replaces == old.id
    assert start.reason == f"replaces {old.id} (node {old.shards[0].node} removed from the repo)"
    assert d.of(StopReplica) == []  # make before break: the old one keeps serving meanwhile
    assert [w.reason for w in d.of(Wait)] == [
        f"{old.id} on removed node {old.shards[0].node} serves until its replacement is ready"
    ]
    d = f.step()  # the replacement is starting: still nothing stopped, nothing started twice
    assert d.of(StopReplica) == [] and d.of(StartReplica) == []
    f.ready_all()
    d = f.step()
    assert d.of(StopReplica) == [
        StopReplica(
            old.id,
            f"node {old.shards[0].node} removed from the repo; 1 ready replica(s) elsewhere",
            drain=True,
        )
    ]
    assert d.of(StartReplica) == [] and [r.shards[0].node for r in f.of_model("m")] == list(
        start.placement.nodes
    )


def test_a_removed_nodes_replicas_go_as_far_as_what_replaces_them_is_ready():
    f = fleet({"m": entry(cpu_profile(), min=2, max=2)}, cpu_node("a", cores=4), cpu_node("b", cores=4))
    f.step()
    f.ready_all()
    # Room for only one replacement elsewhere: one leaving replica has nothing coming and goes now, the
    # other serves until its replacement on c is ready.
    f.nodes["c"] = cpu_node("c", cores=4)
    _leave(f, "a")
    _leave(f, "b")
    d = f.step()
    assert [s.placement.nodes for s in d.of(StartReplica)] == [("c",)]
    (stop,) = d.of(StopReplica)
    assert stop.reason.endswith(
        "0 ready replica(s) elsewhere; 1 replacement(s) cannot be placed (llmgw explain m)"
    )
    d = f.step()  # c is starting: the one left keeps serving
    assert d.of(StopReplica) == [] and d.of(StartReplica) == []
    assert len([r for r in f.of_model("m") if r.state == "ready"]) == 1
    f.ready_all()
    (stop,) = f.step().of(StopReplica)
    assert "1 ready replica(s) elsewhere" in stop.reason
    assert [r.shards[0].node for r in f.of_model("m")] == ["c"]


def test_a_removed_nodes_replica_waits_through_its_models_backoff():
    f = fleet({"m": entry(cpu_profile(), min=2, max=2)}, cpu_node("a"), cpu_node("b"), cpu_node("c"))
    f.step()
    f.ready_all()
    on_a = next(r for r in f.of_model("m") if r.shards[0].node == "a")
    on_b = next(r for r in f.of_model("m") if r.shards[0].node == "b")
    f.fail_shard(on_b.id, 0)
    f.step()  # b's replica failed: replaced at once (first failure) ...
    f.fail_shard(f.of_model("m")[-1].id, 0)
    f.step()  # ... and that one too: now the model backs off
    _leave(f, "a")
    d = f.step()
    assert d.of(StartReplica) == [] and any("backing off" in w.reason for w in d.of(Wait))
    assert [a.replica_id for a in d.of(StopReplica) if a.replica_id == on_a.id] == []


def test_a_removed_nodes_replica_that_is_not_serving_stops_at_once():
    f = fleet({"m": entry(cpu_profile(), min=1, max=1)}, cpu_node("a"), cpu_node("b"))
    f.step()  # starting, not ready
    (old,) = f.of_model("m")
    _leave(f, old.shards[0].node)
    d = f.step()
    assert [a.replica_id for a in d.of(StopReplica)] == [old.id] and len(d.of(StartReplica)) == 1


def test_adopted_replicas_are_rolled_like_any_other_and_a_current_one_is_kept():
    """Adopted (found running by a restarted controller or a new leader): the one whose fingerprint is the
    revision's is kept as it is; the stale one is rolled make-before-break, as `rollout.on_change` says."""
    view = entry(cpu_profile(), restart_on_profile_change=True)
    current = replica("old-1", "m", "cpu", ("a", ()), fingerprint=view.fingerprints["cpu"], adopted=True)
    stale = replica("old-2", "m", "cpu", ("b", ()), fingerprint="fp-from-before", adopted=True)
    f = fleet({"m": replace_scaling(view, 2)}, cpu_node("a"), cpu_node("b"), cpu_node("c"))
    f.replicas = {r.id: r for r in (current, stale)}
    d = f.step()
    assert d.of(MarkStale) == [MarkStale("old-2", "profile cpu changed since old-2 was placed")]
    (start,) = d.of(StartReplica)
    assert start.replaces == "old-2" and start.placement.fingerprint == view.fingerprints["cpu"]
    assert d.of(RestartReplica) == [] and d.of(StopReplica) == []  # its replacement first
    f.ready_all()
    d = f.step()
    assert d.of(RestartReplica) == [
        RestartReplica("old-2", "profile cpu changed (rollout.on_change: restart)")
    ]
    assert "old-1" in f.replicas  # the current one is never touched


def replace_scaling(view: ModelView, n: int) -> ModelView:
    scaling = view.spec.scaling.model_copy(update={"min": n, "max": n})
    return view._replace(spec=view.spec.model_copy(update={"scaling": scaling}))


def test_stale_profile_is_marked_and_restarted_only_on_request():
    f = fleet({"m": entry(cpu_profile(cores=2), min=2, max=2)}, cpu_node("a"), cpu_node("b"), cpu_node("c"))
    f.step()
    f.ready_all()
    changed = entry(cpu_profile(cores=4), min=2, max=2)
    f.models = {"m": changed}
    d = f.step()
    assert [a.replica_id for a in d.of(MarkStale)] == ["m-cpu-1", "m-cpu-2"]
    assert d.of(RestartReplica) == [] and d.of(StartReplica) == []
    assert f.step().actions == ()  # marked once, then left alone

    f.models = {
        "m": changed._replace(spec=changed.spec.model_copy(update={"restart_on_profile_change": True}))
    }
    d = f.step()
    # make-before-break (rollout's default max_surge 1, max_unavailable 0): a replacement first, beside them
    assert d.of(RestartReplica) == []
    (start,) = d.of(StartReplica)
    assert start.reason == "replaces m-cpu-1 (profile cpu changed (rollout.on_change: restart))"
    assert start.replaces == "m-cpu-1"
    assert start.placement.fingerprint == changed.fingerprints["cpu"]
    assert start.placement.nodes == ("c",)
    # while the replacement starts, both old ones keep serving and nothing more starts
    d = f.step()
    assert d.of(RestartReplica) == [] and d.of(StartReplica) == []
    f.ready_all()
    d = f.step()
    assert [a.replica_id for a in d.of(RestartReplica)] == ["m-cpu-1"]
    assert [a.replaces for a in d.of(StartReplica)] == ["m-cpu-2"]
    f.ready_all()
    assert [a.replica_id for a in f.step().of(RestartReplica)] == ["m-cpu-2"]
    assert all(r.fingerprint == changed.fingerprints["cpu"] for r in f.replicas.values())
    assert len(f.replicas) == 2
    f.ready_all()
    assert f.step().actions == ()


def test_on_demand_starts_when_asked_and_stops_when_idle():
    view = entry(cpu_profile(), scaling={"min": 0, "max": 2, "idle_timeout": "10m"})
    f = fleet({"m": view}, cpu_node("a"), cpu_node("b"))
    assert f.step().actions == ()  # nobody asked
    f.demand = {"m": 1}
    (start,) = f.step().of(StartReplica)
    assert start.reason == "asked for (1 wanted)"
    f.ready_all()
    f.demand = {}
    f.now += 60
    f.last_used = {"m": f.now}
    d = f.step()
    assert d.actions == ()
    assert d.wake_at == f.now + 600
    f.now += 599
    assert f.step().actions == ()
    f.now += 1
    d = f.step()
    assert d.of(StopReplica) == [StopReplica("m-cpu-1", "scale down to 0 (unused for 10m)", drain=True)]
    assert f.replicas == {}


def test_demand_is_capped_at_max():
    view = entry(cpu_profile(), scaling={"min": 0, "max": 2})
    f = fleet({"m": view}, cpu_node("a"), cpu_node("b"), cpu_node("c"))
    f.demand = {"m": 5}
    assert len(f.step().of(StartReplica)) == 2


def test_scale_down_drains_the_newest_first():
    f = fleet({"m": entry(cpu_profile(), min=3, max=3)}, cpu_node("a"), cpu_node("b"), cpu_node("c"))
    f.step()
    f.ready_all()
    newest = "m-cpu-3"
    f.replicas[newest] = replace(f.replicas[newest], created_at=f.now + 1)
    f.models = {"m": entry(cpu_profile(), min=1, max=1)}
    d = f.step()
    stops = d.of(StopReplica)
    assert all(s.drain for s in stops) and len(stops) == 2
    assert stops[0].replica_id == newest
    assert stops[0].reason == "scale down to 1"


def test_multi_node_workers_start_before_rank_zero():
    f = fleet(
        {"m": entry(gpu_profile(gpus=8, nodes=3))},
        gpu_node("a", fabric="ib"),
        gpu_node("b", fabric="ib"),
        gpu_node("c", fabric="ib"),
    )
    f.step()
    (rid,) = f.replicas
    assert f.shard_starts == [(rid, 1), (rid, 2), (rid, 0)]


def test_unplaceable_model_waits_and_says_so():
    f = fleet({"m": entry(gpu_profile(gpus=4))}, cpu_node("a"))
    d = f.step()
    assert d.actions == (
        Wait("m", None, "1 replica cannot be placed: no node fits any profile (llmgw explain m)"),
    )


def test_two_models_never_get_the_same_gpus_in_one_pass():
    f = fleet({"x": entry(gpu_profile(gpus=4)), "y": entry(gpu_profile(gpus=4))}, gpu_node("a"))
    f.step()
    gpus = [set(r.shards[0].gpus) for r in f.replicas.values()]
    assert len(gpus) == 2 and not gpus[0] & gpus[1]


def test_idle_default_stops_on_demand_replicas_without_idle_timeout():
    view = entry(cpu_profile(), scaling={"min": 0, "max": 1})
    f = fleet({"m": view}, cpu_node("a"))
    f.demand = {"m": 1}
    f.step()
    f.ready_all()
    f.demand = {}
    kept = reconcile(f.models, f.nodes.values(), f.replicas.values(), now=f.now + 10_000, rng=f.rng)
    assert kept.actions == () and kept.targets == {"m": 1}
    d = reconcile(
        f.models, f.nodes.values(), f.replicas.values(), now=f.now + 300, rng=f.rng, idle_default=300.0
    )
    assert d.of(StopReplica) == [StopReplica("m-cpu-1", "scale down to 0 (unused for 300s)", drain=True)]
    assert d.targets == {"m": 0}


def test_replicas_on_lost_nodes_are_forgotten_even_when_draining_or_removed():
    nodes = [cpu_node("a", state="Lost"), cpu_node("b")]
    draining = replica("m-cpu-1", "m", "cpu", ("a", ()), state="draining")
    orphan = replica("gone-cpu-1", "gone", "cpu", ("a", ()))
    d = reconcile(
        {"m": entry(cpu_profile(), min=0, max=1)}, nodes, [draining, orphan], now=0.0, rng=random.Random(0)
    )
    assert d.of(StopReplica) == [
        StopReplica(
            "gone-cpu-1",
            "model gone is no longer in the cluster repo; node a is Lost",
            drain=False,
            forget=True,
        ),
        StopReplica("m-cpu-1", "node a is Lost; replaced elsewhere", drain=False, forget=True),
    ]
    assert d.of(StartReplica) == []  # the draining one was on its way out: not replaced
