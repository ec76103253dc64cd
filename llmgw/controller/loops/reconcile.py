"""The reconcile worker: one loop, one pass at a time, on every change and on a timer.

A pass builds views, asks the pure decision (`llmgw.core.reconcile.reconcile`) what to do, and starts each action as a task
whose outcome comes back as a change (so a slow agent never blocks the next pass). A failed action is never
logged and forgotten: it marks the replica or model and sets a backoff after which the pass tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from typing import TYPE_CHECKING, Protocol

from llmgw_agent.protocol import (
    Register,
    ShardSpec,
)

from llmgw.adapters import logformat
from llmgw.adapters.secrets import SecretError
from llmgw.controller.loops import adoption, yielding
from llmgw.controller.loops.autoscaler import autoscale, load_capacities
from llmgw.controller.loops.canary import held_views
from llmgw.controller.loops.shard_specs import StartInputs
from llmgw.controller.parts.background import Background
from llmgw.controller.parts.fleet import EngineCaller
from llmgw.controller.parts.hub import AgentError, AgentHub, NodeLink
from llmgw.controller.parts.state import ReplicaRec
from llmgw.controller.status import fleet as views, node_builds
from llmgw.controller.status.capacity import unplaced_reasons
from llmgw.controller.wire.engine_orders import EngineOrders
from llmgw.core.errors import Outage, TransientError, retry_after
from llmgw.core.fleet.autoscale import ScalePolicy
from llmgw.core.fleet.views import NodeView, ReplicaView
from llmgw.core.placement import ShardPlacement
from llmgw.core.reconcile import (
    BackoffPolicy,
    MarkStale,
    ReconcileDecision,
    RestartReplica,
    RollPace,
    StartReplica,
    StopReplica,
    Wait,
    reconcile,
    replica_stale,
)
from llmgw.core.security import engine_key
from llmgw.store.errors import LeaseFenced, StoreError
from llmgw.store.records import Fence, ReplicaRecord

if TYPE_CHECKING:
    from llmgw.controller.parts.tracing import CommitTracer

log = logging.getLogger("llmgw.controller.reconcile")

STOP_RETRY_S = 5.0
PASS_RETRY_S = 1.0  # after a failed pass, the next one this soon (unless the error says when)
PASS_RETRY_MAX_S = 30.0  # and never later than this, whatever it says
DEMAND_FRESH_S = 60.0  # a router's demand for an on-demand model, before a replica exists, counts this long
DRAIN_POLL_S = 0.1  # how often a drain looks at the routers' load reports for the replica's last request


def new_replica_id(model: str, profile: str) -> str:
    return f"{model}-{profile}-{uuid.uuid4().hex[:6]}"


class ReconcileParts(EngineCaller, Protocol):
    """What the reconcile worker reads besides an EngineCaller: its wake-up, the commit path's spans, the hub's
    links, the lease's fence on its store writes and the names the Cluster's own secrets hold."""

    @property
    def changed(self) -> asyncio.Event: ...

    @property
    def commit_tracer(self) -> CommitTracer | None: ...

    @property
    def hub(self) -> AgentHub: ...

    def fence(self) -> Fence | None: ...

    def fenced_out(self, exc: LeaseFenced) -> None: ...

    def reserved_secret_names(self) -> frozenset[str]: ...


class Reconciler:
    """Commands go to the agents through `controller.agents` (an `AgentClient`); `adopt` is the hub's
    `on_register` (app.py wires it)."""

    def __init__(self, controller: ReconcileParts, rng: random.Random | None = None) -> None:
        self.c = controller
        self.agents = controller.agents
        self.rng = rng or random.Random()
        self.background = Background("reconcile")  # drains, stops and engine orders in flight
        # Starts apart: a controller stopping lets them reach their agents (finish_in_flight), since a start
        # cut off there leaves a replica in the store that never ran, and the next leader starts another.
        self.starts = Background("reconcile-starts")
        self.halted = False
        self.in_pass = asyncio.Lock()  # held by the loop through a pass: a stop lets the pass end first
        self.engine_orders = EngineOrders()
        self.capacities_loaded = False  # what `llmgw bench --save` stored, read once a revision is applied
        self.capacities_warned = False

    # ---------------------------------------------------------------------------------- loop

    async def run(self) -> None:
        c = self.c
        failing = Outage(log, "a reconcile pass")
        while not self.halted:  # halted: the controller is stopping (finish_in_flight)
            try:
                async with self.in_pass:
                    if self.halted:  # halted while this waited for the lock
                        return
                    wake = await self.pass_once()
                failing.recovered()
            except TransientError as exc:  # the store did not answer: retried when the raiser says
                wake = retry_after(exc, default=PASS_RETRY_S, most=PASS_RETRY_MAX_S)
                failing.failed(exc, wake)
                c.metrics.reconcile_errors.inc()
            except Exception as exc:  # a bug in one pass must not end reconciling; the next starts afresh
                wake = PASS_RETRY_S
                failing.failed(exc, wake)
                c.metrics.reconcile_errors.inc()
            await self._wait_for_change(wake)

    async def _wait_for_change(self, seconds: float) -> None:
        """Until a change is notified, at most `seconds` (the next timed pass)."""
        c = self.c
        with contextlib.suppress(TimeoutError):
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that races the event
            async with asyncio.timeout(seconds):
                await c.changed.wait()
        c.changed.clear()

    async def pass_once(self) -> float:
        """One pass; returns seconds until the next timed pass."""
        c = self.c
        d = c.desired
        if d is None:
            return 5.0
        if not c.leading():
            return 1.0  # a standby decides nothing; woken when it becomes the leader
        self.engine_orders.send_due(
            self.agents,
            d.cluster.engines,
            self.background,
            lambda n, inv: node_builds.build_choices(c, n, inv),
        )
        await self._load_capacities()
        ws = c.fleet.worker_state
        now = c.wall()
        nodes = views.node_views(c)
        replicas = views.replica_views(c)
        self._note_ready(replicas, now)
        scaled = autoscale(c.desired, c.fleet, now, self.scale_policy())
        # A held model (its canary failed) is reconciled as it was before the change: a stable replica that
        # fails comes back with the stable profile, not the rejected one.
        models = {**d.fleet_models, **{n: view for n, (_, view) in held_views(c).items()}}
        decision = reconcile(
            models,
            nodes,
            replicas,
            now=now,
            rng=self.rng,
            backoff=ws.backoff(),
            last_used=ws.last_used(),
            demand=self._demand(now),
            policy=BackoffPolicy(base=c.settings.backoff_base_s),
            new_id=new_replica_id,
            scale_to=scaled.scale_to,
            idleness=ws.replica_idleness(),
            paces={m: RollPace(*r.pace) for m, r in ws.models.items() if r.pace is not None},
            canaries=c.fleet.canaries.phases(),
        )
        for model, words, up in scaled.events:
            c.metrics.scale_events.labels(model, "up" if up else "down").inc()
            await c.event("model_scaled", model, words)
        acting = self._note_pass(decision, nodes, replicas, now)
        settling = self._settling()
        traced = c.commit_tracer.reconcile_begin(ws.last_actions) if c.commit_tracer and acting else None
        try:
            await self._act(acting, settling)
        finally:
            if traced is not None and c.commit_tracer is not None:
                c.commit_tracer.reconcile_end(traced)
        await self._persist_states()
        wake = [d.resync_interval_s] + ([0.5] if settling else [])
        if any(r.state == "pending" for r in replicas):
            wake.append(1.0)
        if decision.wake_at is not None:
            wake.append(max(0.05, decision.wake_at - now))
        if scaled.wake_at is not None:
            wake.append(max(0.05, scaled.wake_at - now))
        return min(wake)

    def _note_ready(self, replicas: list[ReplicaView], now: float) -> None:
        """Replicas ready for the first time: when, how long the load took, and the commit's trace."""
        c, ws = self.c, self.c.fleet.worker_state
        for r in replicas:
            rec = c.fleet.replicas.get(r.id)
            if rec is not None and rec.ready_since is None and r.effective_state() == "ready":
                rec.ready_since = now
                if not rec.adopted:  # an adopted replica was started before this controller looked
                    ws.model(rec.model).loaded(c.clock() - rec.start_sent_at)
                if c.commit_tracer is not None:
                    c.commit_tracer.ready(rec.id)

    def _note_pass(
        self, decision: ReconcileDecision, nodes: list[NodeView], replicas: list[ReplicaView], now: float
    ) -> list[StartReplica | StopReplica | RestartReplica | MarkStale]:
        """What the pass decided, kept per model for status (backoff, target, wait, why unplaced) and for the
        pass count; returns the actions to take (every one but a wait)."""
        ws = self.c.fleet.worker_state
        for record in ws.models.values():
            record.clear_pass()
        self._note_rolls(decision.of(RestartReplica), replicas)
        for model, state in decision.backoff.items():
            ws.model(model).backoff = state
        for model, target in decision.targets.items():
            ws.model(model).target = target
        for action in decision.actions:
            if isinstance(action, Wait):
                ws.model(action.model).wait = action.reason
        d = self.c.desired
        assert d is not None  # a pass decides only with a revision applied
        for model, reasons in unplaced_reasons(decision.unplaced, d.fleet_models, nodes, replicas).items():
            ws.model(model).unplaceable = reasons
        ws.passes += 1
        ws.last_pass_at = now
        acting = [a for a in decision.actions if not isinstance(a, Wait)]
        if acting:
            ws.last_actions = [_describe(a) for a in acting]
        self.c.metrics.reconcile_passes.inc()
        return acting

    async def _act(
        self, acting: list[StartReplica | StopReplica | RestartReplica | MarkStale], settling: bool
    ) -> None:
        for action in acting:
            if isinstance(action, StartReplica):
                if not settling:  # placed once the nodes that were up have had their chance to report
                    await self._start(action)
            elif isinstance(action, StopReplica):
                await self._stop(
                    action.replica_id,
                    action.reason,
                    drain=action.drain,
                    forget=action.forget,
                    preempted_by=action.preempted_by,
                )
            elif isinstance(action, RestartReplica):
                await self._stop(action.replica_id, action.reason, drain=True, forget=False)
            elif isinstance(action, MarkStale):
                await self._mark_stale(action)

    async def _load_capacities(self) -> None:
        """What `llmgw bench --save` stored, read once (a revision is applied by now, so profiles are known)."""
        if self.capacities_loaded:
            return
        try:
            await load_capacities(self.c.store, self.c.desired, self.c.fleet)
            self.capacities_loaded = True
        except StoreError as exc:  # the store is down: slots are assumed meanwhile, tried again next pass
            if not self.capacities_warned:
                self.capacities_warned = True
                log.warning("measured capacities not read from the store yet (slots assumed): %s", exc)

    def scale_policy(self) -> ScalePolicy:
        s = self.c.settings
        return ScalePolicy(
            up_cooldown=s.scale_up_cooldown_s,
            down_cooldown=s.scale_down_cooldown_s,
            down_utilization=s.scale_down_utilization,
            stale_after=s.load_stale_s,
        )

    def _note_rolls(self, restarts: list[RestartReplica], replicas: list[ReplicaView]) -> None:
        """Which models are rolling (status, `apply --wait`); a pace given by `llmgw restart` is forgotten
        once its roll is over."""
        ws = self.c.fleet.worker_state
        d = self.c.desired
        rolling = {
            self.c.fleet.replicas[a.replica_id].model
            for a in restarts
            if a.replica_id in self.c.fleet.replicas
        }
        for r in replicas:
            if r.state in ("draining", "stopping", "stopped"):
                continue
            entry = d.fleet_models.get(r.model) if d else None
            auto = entry is not None and entry.spec.restarts_on_change and replica_stale(r, entry)
            if r.restart or auto:
                rolling.add(r.model)
        for model, record in ws.models.items():
            record.rolling = model in rolling
            if model not in rolling:
                record.pace = None
        for model in rolling:
            ws.model(model).rolling = True

    def _demand(self, now: float) -> dict[str, int]:
        """A model asked for recently, with nothing running yet, wants one replica (the router's signal)."""
        c = self.c
        running = {r.model for r in c.fleet.replicas.values() if not r.stopping}
        return {
            m: 1
            for m, at in c.fleet.worker_state.demand().items()
            if now - at < DEMAND_FRESH_S and m not in running
        }

    def _settling(self) -> bool:
        ws = self.c.fleet.worker_state
        if not ws.expected_nodes or self.c.clock() >= ws.settle_until:
            return False
        back = {n for n, link in self.agents.nodes.items() if link.connected}
        if ws.expected_nodes <= back:
            ws.expected_nodes = set()
            return False
        return True

    @property
    def in_flight(self) -> int:
        """Commands sent and not yet answered (starts, drains, stops, engine orders)."""
        return len(self.starts) + len(self.background)

    async def finish_in_flight(self, within: float) -> None:
        """Decide nothing more and give the pass under way and the starts it sent up to `within` seconds to
        end (a controller stopping, before its agents' links close). A pass cut off between writing a replica
        to the store and sending its start would leave the same replica that never ran."""
        self.halted = True
        ends = asyncio.get_running_loop().time() + within
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within), self.in_pass:
                pass
        await self.starts.settle(max(0.0, ends - asyncio.get_running_loop().time()))

    async def close(self) -> None:
        await self.starts.close()
        await self.background.close()

    # ---------------------------------------------------------------------------------- actions

    async def _start(self, action: StartReplica) -> None:
        placement = action.placement
        c = self.c
        d = c.desired
        assert d is not None
        try:
            key = engine_key(c.cluster_secret().encode(), placement.replica_id)
            inputs = self._start_inputs()
            sources = {s.node: inputs.weights(placement.model, s.node) for s in placement.shards}
        except (SecretError, ValueError) as exc:
            # Nothing was started, so the next pass (at the latest the resync) decides to start it again. The
            # message names the model and the secret reference or the missing mirror, never a token.
            c.metrics.reconcile_errors.inc()
            c.fleet.worker_state.model(placement.model).wait = f"cannot start: {exc}"
            log.warning("cannot start a replica of %s: %s", placement.model, exc)
            return
        rec = ReplicaRec(
            id=placement.replica_id,
            model=placement.model,
            profile=placement.profile,
            fingerprint=placement.fingerprint,
            created_at=c.wall(),
            shards=placement.shards,
            start_sent_at=c.clock(),
            replaces=action.replaces,
        )
        c.fleet.replicas[rec.id] = rec
        await self._upsert(rec, "pending")
        inputs = self._start_inputs()  # again: the canary may have been judged while the store was written
        held = (
            " (the stable profile: the model is held after its canary failed)"
            if inputs.model(rec.model)[1]
            else ""
        )
        await c.event(
            "replica_start",
            rec.id,
            f"{rec.model}/{rec.profile} on {', '.join(rec.nodes)}: {placement.why}{held}",
        )
        specs = [(s, inputs.spec(placement, s, key, sources[s.node])) for s in placement.start_order()]
        if c.commit_tracer is not None:
            c.commit_tracer.starting(rec.id, rec.model, list(rec.nodes))
        self.starts.spawn(self._send_start(rec, specs))

    def _start_inputs(self) -> StartInputs:
        c = self.c
        assert c.desired is not None
        return StartInputs(
            c.desired, held_views(c), c.hub.nodes, c.settings.secret_policy(), c.reserved_secret_names()
        )

    async def _send_start(self, rec: ReplicaRec, specs: list[tuple[ShardPlacement, ShardSpec]]) -> None:
        c = self.c
        logformat.bind(replica_id=rec.id)  # its own background task: the binding ends with it
        try:
            for shard, spec in specs:  # workers before rank 0
                await self.agents.start_shard(shard.node, spec, c.settings.command_timeout_s)
        except AgentError as exc:
            rec.error = str(exc)
            c.metrics.reconcile_errors.inc()
            log.warning("starting replica %s failed, retried after backoff: %s", rec.id, exc)
            await c.event("replica_start_failed", rec.id, str(exc))
        if c.commit_tracer is not None:
            c.commit_tracer.started(rec.id, rec.error)
        c.notify("start sent")

    async def _stop(
        self, replica_id: str, reason: str, *, drain: bool, forget: bool, preempted_by: str | None = None
    ) -> None:
        c = self.c
        rec = c.fleet.replicas.get(replica_id)
        if rec is None or rec.stopping:
            return
        if forget:
            await c.event("replica_lost", rec.id, reason)
            await self._drop(rec)
            return
        if views.replica_view(c, rec).effective_state() == "failed":
            status = views.shard_status(c, rec)
            detail = rec.error or (status.message if status else "") or "engine exited"
            # No output tail: events are read with a plan token and sent to the repo's webhooks, and engine
            # output can carry prompts (`llmgw logs`, admin scope, has it).
            await c.event("replica_failed", rec.id, f"{reason}: {detail} (its output: llmgw logs {rec.id})")
            await c.event("drift", rec.model, self._drift_words(rec, detail))
            c.metrics.replica_restarts.labels(rec.model).inc()  # its replacement follows (after backoff)
        rec.stopping = True
        rec.draining = drain
        rec.preempted_by = preempted_by
        if preempted_by is not None:
            await c.event("replica_preempted", rec.id, reason)
        await c.event("replica_stop", rec.id, reason + (" (draining first)" if drain else ""))
        c.notify("replica stopping")  # routers drop it from their endpoints now
        self.background.spawn(self._send_stop(rec))

    def _drift_words(self, rec: ReplicaRec, detail: str) -> str:
        """What differs from the applied revision when a replica stopped without being asked (an engine killed
        or stopped by hand, a crash): said as the `drift` event, as `llmgw plan` shows it."""
        d = self.c.desired
        entry = d.models.get(rec.model) if d is not None else None
        declared = f"{entry.spec.scaling.min} replica(s)" if entry is not None else "no replica"
        return (
            f"{rec.id} ({rec.model}/{rec.profile}) on {', '.join(rec.nodes)} is not running ({detail}); the "
            f"revision declares {declared} of {rec.model}: replaced"
        )

    async def drain_node(self, node: str, reason: str) -> int:
        """Drain and stop every replica with a shard on `node` (a Node removed from the repo); the views cordon
        the node, so the next pass places their replacements elsewhere. Returns how many were asked to stop."""
        recs = [r for r in self.c.fleet.replicas.values() if node in r.nodes and not r.stopping]
        for rec in recs:
            await self._stop(rec.id, reason, drain=True, forget=False)
        return len(recs)

    async def _mark_stale(self, action: MarkStale) -> None:
        rec = self.c.fleet.replicas.get(action.replica_id)
        if rec is not None and not rec.stale:
            rec.stale = True
            await self.c.event("replica_stale", rec.id, action.reason or "stale profile")

    async def _send_stop(self, rec: ReplicaRec) -> None:
        c = self.c
        logformat.bind(replica_id=rec.id)
        if rec.draining and rec.preempted_by is not None:
            await yielding.grace(c, rec)
            rec.draining = False
        elif rec.draining:
            await self._drain(rec)
            rec.draining = False
        pending = sorted(rec.shards, key=lambda s: s.rank)
        while pending and rec.id in c.fleet.replicas:
            shard = pending[0]
            link = self.agents.nodes.get(shard.node)
            if link is None or link.state == "Lost":
                pending.pop(0)  # nothing to tell; the node's agent forgets it or we adopt and stop it later
                continue
            try:
                await self.agents.stop_shard(shard.node, rec.id, shard.rank, c.settings.command_timeout_s)
            except AgentError as exc:
                c.metrics.reconcile_errors.inc()
                log.info("stopping replica %s failed, retrying in %.0fs: %s", rec.id, STOP_RETRY_S, exc)
                await asyncio.sleep(STOP_RETRY_S)
                continue
            pending.pop(0)
        await self._drop(rec)
        c.notify("replica stopped")

    async def _drain(self, rec: ReplicaRec) -> None:
        """Routers were told to stop sending it requests. Wait until every router reporting load says it no
        longer routes to it and has nothing in flight there (so no request is cut), at most `drain`; with no
        router reporting load that is unknown, and the whole `drain` is waited."""
        c = self.c
        loop = asyncio.get_running_loop()
        since = c.wall()
        deadline = loop.time() + c.settings.drain_s
        while (left := deadline - loop.time()) > 0:
            if c.fleet.worker_state.replica_drained(rec.id, since):
                return
            await asyncio.sleep(min(DRAIN_POLL_S, left))

    async def _drop(self, rec: ReplicaRec) -> None:
        c = self.c
        if c.fleet.replicas.get(rec.id) is not rec:
            return
        del c.fleet.replicas[rec.id]
        c.fleet.worker_state.stored_states.pop(rec.id, None)
        for shard in rec.shards:
            link = self.agents.nodes.get(shard.node)
            if link is not None:
                link.shards.pop(f"{rec.id}-{shard.rank}", None)
        try:
            await c.store.delete_replica(rec.id, fence=c.fence())
        except LeaseFenced as exc:
            c.fenced_out(exc)
        except StoreError as exc:
            log.warning("could not delete replica %s from the store: %s", rec.id, exc)

    # ---------------------------------------------------------------------------------- adoption

    def adopt(self, link: NodeLink, register: Register) -> None:
        """What an agent reports at Register that this controller does not know (loops/adoption.py)."""
        adoption.adopt(self.c, self.background, link, register)

    # ---------------------------------------------------------------------------------- store

    async def _persist_states(self) -> None:
        c = self.c
        for name, link in list(self.agents.nodes.items()):
            record = c.fleet.nodes.node(name)
            if record.stored_state != link.state:
                try:
                    inventory = link.inventory.model_dump(mode="json", by_alias=True)
                    await c.store.upsert_node(name, link.state, inventory, c.wall())
                    record.stored_state = link.state
                except StoreError as exc:
                    log.warning("could not record node %s in the store: %s", name, exc)
        stored = self.c.fleet.worker_state.stored_states
        for rec in list(self.c.fleet.replicas.values()):
            state = views.replica_state(self.c, rec)
            if stored.get(rec.id) != (state, rec.restart):
                await self._upsert(rec, state)

    async def _upsert(self, rec: ReplicaRec, state: str) -> None:
        c = self.c
        try:
            await c.store.upsert_replica(
                ReplicaRecord(
                    rec.id,
                    rec.model,
                    rec.profile,
                    rec.nodes,
                    state + (" (adopted)" if rec.adopted else ""),
                    rec.fingerprint,
                    rec.created_at,
                    c.wall(),
                    replaces=rec.replaces,
                    restart_asked=rec.restart,
                ),
                fence=c.fence(),
            )
            c.fleet.worker_state.stored_states[rec.id] = (state, rec.restart)
        except LeaseFenced as exc:
            c.fenced_out(exc)
        except StoreError as exc:
            log.warning("could not record replica %s in the store: %s", rec.id, exc)


def _describe(action: StartReplica | StopReplica | RestartReplica | MarkStale | Wait) -> str:
    if isinstance(action, StartReplica):
        p = action.placement
        return f"start {p.replica_id} ({p.model}/{p.profile}) on {', '.join(p.nodes)}: {action.reason}"
    if isinstance(action, StopReplica):
        return f"{'forget' if action.forget else 'stop'} {action.replica_id}: {action.reason}"
    if isinstance(action, RestartReplica):
        return f"restart {action.replica_id}: {action.reason}"
    if isinstance(action, MarkStale):
        return f"mark {action.replica_id} stale: {action.reason}"
    return f"wait {action.model}: {action.reason}"
