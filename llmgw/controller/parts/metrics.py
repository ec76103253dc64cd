"""The controller's Prometheus metrics, in their own registry (never the process-global one).

Gauges describing state (nodes, replicas, health, GPUs) are recomputed from the controller at scrape time,
so they can never drift from what the admin API says; counters are incremented where things happen.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

PREFIX = "llmgw_controller_"


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._declare_revisions(r)
        self._declare_replicas(r)
        self._declare_scaling(r)
        self.gpus = Gauge(
            PREFIX + "gpus",
            "GPUs per node and class, allocated or not",
            ["node", "class", "allocated"],
            registry=r,
        )
        self.agent_connections = Gauge(PREFIX + "agent_connections", "Agents connected now", registry=r)
        self.node_clock_offset = _clock_offset_gauge(r)
        self.router_connections = Gauge(PREFIX + "router_connections", "Routers subscribed now", registry=r)
        self.node_bootstrap = Gauge(
            PREFIX + "node_bootstrap",
            "1 for each declared remote node's bootstrap state (pending, running, done, failed)",
            ["node", "state"],
            registry=r,
        )
        self.is_leader = Gauge(
            PREFIX + "is_leader",
            "1 while this controller leads (always, without ha); 0 on a standby",
            registry=r,
        )
        self.is_leader.set(1)
        self._declare_notifications(r)

    def _declare_revisions(self, r: CollectorRegistry) -> None:
        """The revision pipeline's: what is applied, refused, in sync, and whether the source answers."""
        self.revision_applied_info = Gauge(
            PREFIX + "revision_applied_info",
            "The applied cluster repo revision (value 1)",
            ["revision"],
            registry=r,
        )
        self.revision_refused = Gauge(
            PREFIX + "revision_refused", "1 while the newest revision seen was refused as invalid", registry=r
        )
        self.sync_status = Gauge(
            PREFIX + "sync_status",
            "1 for the current sync status (Synced, OutOfSync, Unknown)",
            ["status"],
            registry=r,
        )
        self.source_up = Gauge(
            PREFIX + "source_up", "1 when the cluster repo could be read at the last poll", registry=r
        )
        self.source_polls = Counter(
            PREFIX + "source_polls",
            "Polls of the cluster repo (timed, or asked for by a webhook)",
            registry=r,
        )

    def _declare_replicas(self, r: CollectorRegistry) -> None:
        """The fleet's and the reconcile loop's: nodes and replicas by state, health, passes and failures."""
        self.nodes = Gauge(
            PREFIX + "nodes", "Nodes by state (Ready, Unreachable, Lost)", ["state"], registry=r
        )
        self.replicas = Gauge(
            PREFIX + "replicas", "Replicas by model and state", ["model", "state"], registry=r
        )
        self.model_health = Gauge(
            PREFIX + "model_health", "1 for each model's current health", ["model", "health"], registry=r
        )
        self.reconcile_passes = Counter(PREFIX + "reconcile_passes", "Reconcile passes run", registry=r)
        self.reconcile_errors = Counter(
            PREFIX + "reconcile_errors",
            "Reconcile actions that failed (each is retried after a backoff)",
            registry=r,
        )
        self.replica_restarts = Counter(
            PREFIX + "replica_restarts",
            "Replicas of a model started again after their engine exited or failed",
            ["model"],
            registry=r,
        )

    def _declare_notifications(self, r: CollectorRegistry) -> None:
        """The webhook sender's: attempts by outcome and what waits in the outbox."""
        self.notification_deliveries = Counter(
            PREFIX + "notification_deliveries",
            "Webhook delivery attempts by outcome (delivered, retried, dead: dead-lettered)",
            ["outcome"],
            registry=r,
        )
        self.notifications_outbox = Gauge(
            PREFIX + "notifications_outbox",
            "Notifications in the store's outbox: waiting (to be delivered or retried) and dead (dead letters)",
            ["state"],
            registry=r,
        )

    def _declare_scaling(self, r: CollectorRegistry) -> None:
        """The autoscaler's: its count per model, the load it decides on, and how often it moved."""
        self.autoscale_desired = Gauge(
            PREFIX + "autoscale_desired_replicas",
            "The replica count the autoscaler aims at, per model that may scale (max above min)",
            ["model"],
            registry=r,
        )
        self.model_load = Gauge(
            PREFIX + "model_load",
            "A model's load as the routers last reported it, summed: queued, inflight, refused",
            ["model", "kind"],
            registry=r,
        )
        self.scale_events = Counter(
            PREFIX + "scale_events",
            "Times the autoscaler moved a model's replica count, by direction (up, down)",
            ["model", "direction"],
            registry=r,
        )
        self.canary_verdicts = Counter(
            PREFIX + "canary_verdicts",
            "Canaries decided, by verdict (promoted, failed)",
            ["model", "verdict"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _clock_offset_gauge(r: CollectorRegistry) -> Gauge:
    return Gauge(
        PREFIX + "node_clock_offset_seconds",
        "A connected node's clock minus the controller's, estimated from its heartbeats",
        ["node"],
        registry=r,
    )
