"""The controller's state and the revision pipeline: one object the app factory builds and passes down.

`Controller.desired` is the immutable desired state; a new revision replaces the reference in one assignment,
so a reader that took it finishes on the one it took. Everything the admin API shows is derived from this
object plus what the hub reports.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from llmgw.adapters.secrets import SecretError, load_or_create, read_secret
from llmgw.adapters.sources import Checkout
from llmgw.controller.parts.admin_tokens import AdminTokens
from llmgw.controller.parts.audit import AuditLog
from llmgw.controller.parts.background import Background
from llmgw.controller.parts.canary_record import CanaryBook
from llmgw.controller.parts.check_book import CheckBook
from llmgw.controller.parts.credentials import (
    GENERATIONS_FILE,
    Grant,
    NodeGenerations,
    NodeTokenIndex,
    hub_grant,
    node_token_refusal,
    router_token_ok,
)
from llmgw.controller.parts.desired import Desired, build_desired
from llmgw.controller.parts.fleet import LiveFleet
from llmgw.controller.parts.hub import AgentClient, AgentHub, HubTimings
from llmgw.controller.parts.lease import LeaderLease, Leadership, LeaseConfig
from llmgw.controller.parts.metrics import ControllerMetrics
from llmgw.controller.parts.revision_history import RevisionHistory
from llmgw.controller.parts.settings import ControllerOptions
from llmgw.controller.parts.state import (
    EventLog,
    NodeBook,
    RefusedRevision,
    ReplicaRec,
    SeenRevision,
    WorkerState,
)
from llmgw.core.config.secret_bindings import reserved_names
from llmgw.core.errors import ConfigInvalidError
from llmgw.core.fleet.autoscale import Capacity
from llmgw.core.security import node_token, router_token
from llmgw.core.words import short
from llmgw.store.errors import LeaseFenced, StoreError
from llmgw.store.records import Fence, Revision
from llmgw.store.store import Store

if TYPE_CHECKING:
    from llmgw.controller.parts.tracing import CommitTracer

log = logging.getLogger("llmgw.controller")

# An expected node that never connects: holds placement until the new leader has read the earlier state.
LOADING_NODE = "\0loading earlier state"

DEFAULT_TIMINGS = HubTimings(heartbeat_interval_s=5.0, unreachable_after_s=20.0, lost_after_s=300.0)


class Controller:
    def __init__(
        self,
        settings: ControllerOptions,
        store: Store,
        metrics: ControllerMetrics,
        *,
        admin_token: str,
        admin_tokens: AdminTokens | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        peer_check: Callable[[bytes | None], str] | None = None,
        agents: AgentClient | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.admin_token = admin_token  # the `admin` token; agents and routers may present it too
        self.admin_tokens = admin_tokens or AdminTokens.single(admin_token)
        self.clock = clock
        self.wall = wall
        self.desired: Desired | None = None
        self.applied_at: float | None = None
        self.seen: SeenRevision | None = None
        self.polled: SeenRevision | None = None  # the source's last poll that was read and offered to the end
        self.source_revision: str | None = None  # what the source showed at its last poll
        self.refused: RefusedRevision | None = None
        self.source_error: str | None = None
        self.fleet = LiveFleet(model_checks=CheckBook(auto=settings.model_checks_auto))
        self.changed = asyncio.Event()
        self.change_listeners: list[Callable[[], None]] = []
        self.router_sockets: set[web.WebSocketResponse] = set()
        self.router_peers: dict[web.WebSocketResponse, str] = {}  # the address each router connected from
        self.metrics_address: tuple[str, int] | None = None  # the metrics listener, once bound
        self.node_generations = NodeGenerations(Path(settings.state_dir) / GENERATIONS_FILE)
        self.node_token_index = NodeTokenIndex()
        # Short tasks (closing sockets, taking over): awaited at stop.
        self.background = Background("controller")
        self.lease: LeaderLease | None = self._make_lease() if settings.ha else None
        self.hub = self._make_hub(peer_check)
        # What the reconcile loop and the views read the fleet through: the hub, or a test's fake.
        self.agents: AgentClient = agents if agents is not None else self.hub
        self._generated_secret: str | None = None
        # With the cluster CA: the router a client certificate names, or an exception saying why it is none.
        self.router_peer_check: Callable[[bytes | None], str] | None = None
        self.history = RevisionHistory(store)  # what the store has not taken yet, retried until written
        # Admin actions, written off the request path (llmgw.controller.parts.audit).
        self.audit = AuditLog(store)
        # With an OTLP endpoint: the commit path's spans (llmgw.controller.parts.tracing); None: not traced.
        self.commit_tracer: CommitTracer | None = None
        self.trace_shutdown: Callable[[], None] | None = None
        # Called with each event the leader records (kind, object, message, time): the notifier's way in.
        self.event_hooks: list[Callable[[str, str, str, float], Coroutine[Any, Any, None]]] = []

    # The live fleet's records, read through the Controller by what has not yet been given the part itself.
    @property
    def replicas(self) -> dict[str, ReplicaRec]:
        return self.fleet.replicas

    @property
    def capacities(self) -> dict[tuple[str, str], Capacity]:
        return self.fleet.capacities

    @property
    def events(self) -> EventLog:
        return self.fleet.events

    @property
    def canaries(self) -> CanaryBook:
        return self.fleet.canaries

    @property
    def model_checks(self) -> CheckBook:
        return self.fleet.model_checks

    @property
    def worker_state(self) -> WorkerState:
        return self.fleet.worker_state

    @property
    def nodes(self) -> NodeBook:
        return self.fleet.nodes

    def leading(self) -> bool:
        """Whether this controller may place, stop and command agents now (see llmgw.controller.parts.lease)."""
        return self.lease is None or self.lease.leading()

    def fence(self) -> Fence | None:
        """What a leader-only store write carries (None without ha: nobody else can lead)."""
        return self.lease.fence() if self.lease is not None else None

    def fenced_out(self, exc: LeaseFenced) -> None:
        """The store refused a leader-only write: this controller was deposed; it stops leading now."""
        if self.lease is not None:
            self.lease.deposed(str(exc))

    def leadership(self) -> dict[str, object]:
        """For status: the role and who leads (one controller without ha always leads)."""
        if self.lease is None:
            return {"role": "leader", "ha": False}
        return {"ha": True, **self.lease.status()}

    # ---------------------------------------------------------------------------------- leadership

    def _make_lease(self) -> LeaderLease:
        """With settings.ha, a lease says whether this controller leads (standby until its first attempt wins);
        without one, it always leads."""
        s = self.settings
        cfg = LeaseConfig(ttl_s=s.lease_ttl_s, renew_s=s.lease_renew_s, margin_s=min(3.0, s.lease_ttl_s / 5))
        self.metrics.is_leader.set(0)
        return LeaderLease(
            self.store,
            s.advertise or s.listen,
            cfg,
            wall=self.wall,  # the controller's clocks, both: a test that injects them controls the lease too
            clock=self.clock,
            on_lead=self._took_lead,
            on_step_down=self._stepped_down,
        )

    def _make_hub(self, peer_check: Callable[[bytes | None], str] | None) -> AgentHub:
        """The agents' WebSocket hub, asking this controller who may connect (and, with ha, whether it leads)."""
        return AgentHub(
            grant=self._hub_grant,
            node_check=self._node_check,
            timings=self.timings,
            clock=self.clock,
            on_change=self.notify,
            peer_check=peer_check,
            declared=self._declared_nodes,
            gate=self.lease.refusal if self.lease is not None else None,
            wall=self.wall,
        )

    def _took_lead(self, new: Leadership) -> None:
        self.metrics.is_leader.set(1)
        # Nothing is placed until the nodes that were up have reconnected here (or settle_s passed), so the
        # engines they run are adopted, not started a second time.
        ws = self.worker_state
        ws.expected_nodes = {LOADING_NODE}
        ws.settle_until = self.clock() + self.settings.settle_s
        ws.earlier_state_read = False  # read again: what the last leader left is newer than our start
        self.background.spawn(self._take_over(), key="take-over")
        self.notify("leadership changed")

    def _stepped_down(self, new: Leadership) -> None:
        """No longer the leader: let agents and routers go (they find the leader), forget the live view."""
        self.metrics.is_leader.set(0)
        for link in self.hub.nodes.values():
            if link.ws is not None and not link.ws.closed:
                self.background.spawn(link.ws.close())
        for ws in list(self.router_sockets):
            self.background.spawn(ws.close())
        self.hub.nodes.clear()
        self.replicas.clear()
        self.worker_state.stored_states.clear()
        # The next leader goes on from the store; this one reads it again if it leads again.
        self.worker_state.earlier_state_read = False
        self.canaries.cancel()
        self.canaries.runs.clear()
        self.notify("leadership changed")

    async def _take_over(self) -> None:
        """A new leader reads what the last one left in the store and resumes it (`load_earlier_state`)."""
        ws = self.worker_state
        if not await self.load_earlier_state():
            ws.expected_nodes = set()  # the store elected us, so this is a blip: settle_s bounds the wait
        ws.settle_until = self.clock() + self.settings.settle_s
        await self.event("leader", self.lease.holder if self.lease else "", "this controller leads")
        await self._record_serving()
        self.notify("took over")

    async def load_earlier_state(self) -> bool:
        """What the last controller (this one before a restart, or the last leader) left in the store: the
        replicas (adopted as themselves), the nodes it knew (waited for before placing), drains, holds, model-check
        verdicts and canary runs. False when the store could not be read (said in the log)."""
        ws = self.worker_state
        try:
            for record in await self.store.list_replicas():
                ws.known_records[record.id] = record
            nodes = await self.store.list_nodes()
            self.nodes.set_stored({n.name: n.state for n in nodes})
            ws.expected_nodes = {n.name for n in nodes if n.state != "Lost"}
            ws.drained = await self.store.list_node_drains()  # a drain outlives the controller that was told
            ws.holds = await self.store.list_facility_holds()  # so does a facility hold
            self.model_checks.load(await self.store.list_model_checks())
            self.canaries.load(await self.store.list_canary_runs())
            return True
        except StoreError as exc:
            log.warning("could not read earlier state from the store: %s", exc)
            return False
        finally:
            ws.earlier_state_read = True

    async def _record_serving(self) -> None:
        """A standby applies revisions without recording them (`_record`); once it leads, the one it serves
        goes into the history unless the last leader already recorded it as the newest accepted."""
        d = self.desired
        if d is None:
            return
        try:
            last = await self.store.last_accepted_revision()
        except StoreError as exc:  # the next revision applied is recorded; this one said in the log
            log.warning("new leader could not read the revision history (%s); serving %s", exc, d.revision)
            return
        if last is None or last.sha != d.revision:
            await self.record_applied(d, f"from {d.source}, on taking over as leader")

    # ---------------------------------------------------------------------------------- wiring

    def notify(self, why: str = "") -> None:
        """Something changed: wake the reconcile worker and the router publisher."""
        self.changed.set()
        for listener in self.change_listeners:
            listener()

    def timings(self) -> HubTimings:
        d = self.desired
        if d is None:
            return DEFAULT_TIMINGS
        return HubTimings(d.heartbeat_interval_s, d.unreachable_after_s, d.lost_after_s)

    def shared_token(self) -> str | None:
        """The Cluster's `spec.controller.token` when it declares one: it opens the agent hub for any node
        name (agents installed by hand); bootstrap gives nodes their own token instead."""
        d = self.desired
        if d is None or d.cluster.controller.token is None:
            return None
        try:
            return read_secret(d.cluster.controller.token, self.settings.secret_policy())
        except SecretError as exc:
            log.warning("cluster token unavailable: %s", exc)
            return None

    def reserved_secret_names(self) -> frozenset[str]:
        """What the Cluster's and Nodes' own references name: never resolved for another kind's reference."""
        d = self.desired
        if d is None:
            return frozenset()
        return reserved_names(d.cluster, [n.spec for n in d.catalog.nodes.values()])

    def _secret_or_none(self) -> bytes | None:
        try:
            return self.cluster_secret().encode()
        except SecretError as exc:
            log.warning("node and router tokens cannot be checked: %s", exc)
            return None

    def _hub_grant(self, presented: str) -> Grant | None:
        return hub_grant(presented, admin=self.admin_token, shared=self.shared_token())

    def _node_check(self, presented: str, node: str) -> str | None:
        secret = self._secret_or_none()
        if secret is None:
            return "the controller has no cluster secret to check node tokens with"
        return node_token_refusal(presented, node, secret, self.node_generations.get(node))

    def mirror_reader(self, presented: str | None) -> bool:
        """Who may GET from the mirror this controller serves: whoever the hub would let in as an agent (the
        admin or cluster token, or a declared node's own token): weights may be private."""
        if presented is None:
            return False
        grant = self._hub_grant(presented)
        if grant is None:
            return False
        if grant.any_node:
            return True
        secret = self._secret_or_none()
        if secret is None:
            return False
        # The token names no node: look it up (one digest), then check it as the hub would (one HMAC), never
        # one HMAC per declared node for each anonymous guess (L16).
        generations = tuple(sorted((n, self.node_generations.get(n)) for n in self._declared_nodes()))
        node = self.node_token_index.node_of(presented, secret, generations)
        return node is not None and self._node_check(presented, node) is None

    def _declared_nodes(self) -> frozenset[str]:
        d = self.desired
        return frozenset(d.catalog.nodes) if d is not None else frozenset()

    def node_token(self, node: str) -> str:
        """Node `node`'s token of its current generation (what bootstrap writes to it)."""
        return node_token(self.cluster_secret().encode(), node, self.node_generations.get(node))

    def revoke_node_token(self, node: str) -> int:
        """The node is torn down: the token it holds stops opening the hub. Returns the new generation."""
        return self.node_generations.bump(node)

    def router_token(self) -> str:
        return router_token(self.cluster_secret().encode())

    def router_token_ok(self, presented: str) -> bool:
        """The router stream and the routers' signals: the router token, or the admin token."""
        return router_token_ok(presented, admin=self.admin_token, secret=self._secret_or_none())

    def cluster_secret(self) -> str:
        d = self.desired
        if d is not None and d.cluster.secret is not None:
            return read_secret(d.cluster.secret, self.settings.secret_policy())
        if self.settings.ha:
            # A generated secret lives on one machine: a new leader would derive other engine keys and
            # routers would be told keys the running engines refuse.
            raise SecretError(
                "with ha, the Cluster document must declare `secret` ({file: PATH} or {env: NAME}, the same "
                "on every controller): engine keys are derived from it"
            )
        if self._generated_secret is None:
            self._generated_secret = load_or_create(self.settings.state_dir / "cluster-secret")
        return self._generated_secret

    async def event(self, kind: str, obj: str, message: str) -> None:
        """Kept in memory here, and in the store only by the leader: a standby follows the repo too, and its
        "revision_applied" beside the leader's would tell operators reading `llmgw events` of an act no one
        did on the fleet. A standby logs it instead."""
        now = self.wall()
        self.events.items.append({"time": now, "kind": kind, "object": obj, "message": message})
        if not self.leading():
            log.info("standby, not recorded in the store: %s %s: %s", kind, obj, message)
            return
        for hook in self.event_hooks:  # in the background: a slow outbox write must not hold the caller
            self.background.spawn(hook(kind, obj, message, now))
        try:
            await self.store.add_event(kind, obj, message, now)
        except StoreError as exc:  # the store being down must not stop the controller acting
            log.warning("could not record event in the store: %s", exc)

    # ---------------------------------------------------------------------------------- revisions

    async def offer(
        self,
        checkout: Checkout,
        *,
        force: bool = False,
        from_source: bool = True,
        actor: str = "controller",
        actor_detail: str = "",
    ) -> str:
        """Take a revision: 'unchanged', 'applied' or 'refused'.

        `actor` is who the history records: `controller` for its own source, an admin token's name for
        POST /api/v1/apply; `actor_detail` what that client said about itself (a CI run), not trusted.

        `seen` is the newest revision offered by either way in (the source, or POST /api/v1/apply). From the
        source, only a revision it did not show before is considered, so a revision applied through the admin
        API is not undone by the next poll of an unchanged source.
        """
        now = self.wall()
        if from_source:
            self.source_error = None
            previous, self.source_revision = self.source_revision, checkout.revision
            if not force and previous == checkout.revision:
                if self.seen is not None and self.seen.revision == checkout.revision:
                    self.seen = SeenRevision(checkout.revision, checkout.where, now)  # polled again just now
                return "unchanged"
        self.seen = SeenRevision(checkout.revision, checkout.where, now)
        current = self.desired.revision if self.desired else None
        if not force and checkout.revision == current:
            return "unchanged"
        if not force and self.refused is not None and self.refused.revision == checkout.revision:
            return "refused"  # already said once; not again every poll
        began = time.time_ns()
        try:
            desired = await asyncio.to_thread(build_desired, checkout.root, checkout.revision, checkout.where)
        except ConfigInvalidError as exc:
            if self.commit_tracer is not None:
                self.commit_tracer.revision(
                    checkout.revision, checkout.where, began, time.time_ns(), exc.errors
                )
            await self._refuse(checkout, exc.errors, actor, actor_detail)
            return "refused"
        if self.commit_tracer is not None:
            self.commit_tracer.revision(checkout.revision, checkout.where, began, time.time_ns(), None)
        await self._apply(desired, actor, actor_detail)
        return "applied"

    async def _refuse(self, checkout: Checkout, errors: list[str], actor: str, actor_detail: str) -> None:
        self.refused = RefusedRevision(checkout.revision, checkout.where, self.wall(), tuple(errors))
        self.metrics.revision_refused.set(1)
        log.warning(
            "revision %s from %s refused (%d error(s)); still serving %s: %s",
            short(checkout.revision),
            checkout.where,
            len(errors),
            short(self.desired.revision if self.desired else None),
            errors[0] if errors else "",
        )
        await self._record(
            Revision(
                checkout.revision, checkout.where, self.wall(), actor, "refused", tuple(errors), actor_detail
            )
        )
        await self.event(
            "revision_refused",
            short(checkout.revision),
            f"{len(errors)} error(s): {errors[0] if errors else ''}",
        )
        self.notify("revision refused")

    async def _apply(self, desired: Desired, actor: str, actor_detail: str) -> None:
        previous = self.desired
        self.canaries.note_revision(
            previous, desired
        )  # the stable model a canary of this change rolls back to
        self.desired = desired  # the one atomic swap; readers keep what they took
        self.applied_at = self.wall()
        if self.refused is not None:
            self.refused = None
            self.metrics.revision_refused.set(0)
        log.info(
            "revision %s from %s applied (was %s)",
            short(desired.revision),
            desired.source,
            short(previous.revision if previous else None),
        )
        by = "" if actor == "controller" else f" by {actor}" + (f" ({actor_detail})" if actor_detail else "")
        await self.record_applied(desired, f"from {desired.source}{by}", actor, actor_detail)
        self.notify("revision applied")

    async def _record(self, revision: Revision) -> None:
        """Revision history is the leader's: a standby's "accepted" would move `applied_at` of a revision the
        fleet may not run (the leader may still be on another). A new leader records what it serves when it
        takes over (`llmgw.controller.parts.lease`)."""
        if self.leading():
            await self.history.record(revision)

    async def record_applied(
        self, desired: Desired, message: str, actor: str = "controller", actor_detail: str = ""
    ) -> None:
        """The revision this controller serves, in the store's history and events (only when leading)."""
        await self._record(
            Revision(desired.revision, desired.source, self.wall(), actor, "accepted", (), actor_detail)
        )
        await self.event("revision_applied", short(desired.revision), message)

    async def stop_background(self) -> None:
        """Stop the retry task and the short background tasks (a controller shutting down; what is still
        queued is logged)."""
        await self.background.close()
        await self.audit.close()
        await self.history.close()

    def source_showed(self, revision: str) -> None:
        """The source was read outside a poll (an admin apply's label check fetched the branch) and showed
        `revision`: a poll that shows it again is no news, so it does not undo an admin apply made since."""
        self.source_revision = revision

    def set_source_error(self, message: str) -> None:
        if message != self.source_error:
            log.warning(
                "cluster repo unavailable, keeping revision %s: %s",
                short(self.desired.revision if self.desired else None),
                message,
            )
        self.source_error = message

    def sync_status(self) -> str:
        if self.desired is None or self.seen is None:
            return "Unknown"
        return "Synced" if self.seen.revision == self.desired.revision else "OutOfSync"


# The app's key for the controller: the admin API and the router endpoints both read it.
CONTROLLER: web.AppKey[Controller] = web.AppKey("controller", Controller)


def admin_token_from(settings: ControllerOptions) -> str:
    """The admin token from --admin-token-file, or one generated once into the state dir."""
    if settings.admin_token_file is not None:
        try:
            token = settings.admin_token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise SecretError(
                f"cannot read --admin-token-file {settings.admin_token_file}: {exc.strerror}"
            ) from exc
        if not token:
            raise SecretError(f"--admin-token-file {settings.admin_token_file} is empty")
        return token
    return load_or_create(Path(settings.state_dir) / "admin-token")
