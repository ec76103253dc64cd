"""The router's Prometheus metrics, in a registry of its own (never the global one), served on its own listener.

Per-endpoint gauges are produced at collection time from the live records, so an endpoint that leaves the
snapshot leaves the metrics with it instead of lingering at its last value.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw_router.load import LoadTracker
from llmgw_router.state import RoutingTable
from llmgw_router.tag_metrics import TagMetrics

__all__ = ["PREFIX", "RouterMetrics"]

PREFIX = "llmgw_router_"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _EndpointCollector(Collector):
    def __init__(self, table: Callable[[], RoutingTable | None], clock: Callable[[], float]) -> None:
        self._table = table
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        table = self._table()
        labels = ["endpoint", "model"]
        state = GaugeMetricFamily(
            PREFIX + "endpoint_state", "1 for the state each endpoint is in", labels=[*labels, "state"]
        )
        running = GaugeMetricFamily(
            PREFIX + "endpoint_running", "Requests the engine reports running", labels=labels
        )
        waiting = GaugeMetricFamily(
            PREFIX + "endpoint_waiting", "Requests the engine reports queued", labels=labels
        )
        kv = GaugeMetricFamily(
            PREFIX + "endpoint_kv_usage", "KV-cache use the engine reports, 0..1", labels=labels
        )
        inflight = GaugeMetricFamily(
            PREFIX + "endpoint_inflight", "Requests this router has in flight", labels=labels
        )
        violations = GaugeMetricFamily(
            PREFIX + "metrics_contract_violations",
            "Mapped metric names the engine's page lacks (0 when it serves them all)",
            labels=labels,
        )
        breaker = GaugeMetricFamily(
            PREFIX + "breaker_open", "1 while the endpoint's breaker refuses requests", labels=labels
        )
        families = [state, running, waiting, kv, inflight, violations, breaker]
        if table is None:
            yield from families
            return
        now = self._clock()
        for ep in table.all_endpoints():
            lv = [ep.id, ep.spec.model]
            if ep.breaker.is_open(now):
                current = "breaker_open"
            elif ep.spec.state != "ready":
                current = ep.spec.state
            elif ep.stale(now, table.stale_after):
                current = "stale"
            else:
                current = "ready"
            state.add_metric([*lv, current], 1.0)
            inflight.add_metric(lv, float(ep.inflight))
            breaker.add_metric(lv, 1.0 if ep.breaker.mode != "closed" else 0.0)
            if ep.is_provider:
                continue
            violations.add_metric(lv, float(len(ep.violation)))
            if ep.sample is not None:
                running.add_metric(lv, ep.sample.running)
                waiting.add_metric(lv, ep.sample.waiting)
                if ep.sample.kv_usage is not None:
                    kv.add_metric(lv, ep.sample.kv_usage)
        yield from families


class _BudgetCollector(Collector):
    """Budget use read from the limiter at collection time, so it is current after every admission and
    finish, and a level whose budget a new snapshot removes loses its series at once."""

    def __init__(self, use: Callable[[], Iterable[tuple[str, str, float]]]) -> None:
        self._use = use

    def collect(self) -> Iterator[Metric]:
        ratio = GaugeMetricFamily(
            PREFIX + "budget_used_ratio",
            "Share of the budget of the current period spent, by level and tenant (0..1, above when overrun)",
            labels=["level", "tenant"],
        )
        for level, tenant, used in self._use():
            ratio.add_metric([level, tenant], used)
        yield ratio


class RouterMetrics:
    def __init__(
        self,
        table: Callable[[], RoutingTable | None],
        queue_depth: Callable[[], float],
        clock: Callable[[], float] = time.time,
        budgets: Callable[[], Iterable[tuple[str, str, float]]] = tuple,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._declare_request_metrics(r)
        self._declare_routing_metrics(r, queue_depth)
        r.register(_EndpointCollector(table, clock))
        r.register(_BudgetCollector(budgets))
        self.tags = TagMetrics(r, PREFIX)  # only the keys the repo declares (router.tag_labels)

        # labels() costs a lock and a dict build per call; the request path asks for the same few children
        # over and over, so they are kept (bounded by models x statuses x codes, a small set).
        self._children: dict[tuple[str, ...], Any] = {}
        # What the controller link reports as load (not Prometheus: the autoscaler's input, llmgw_router.load).
        self.load = LoadTracker(clock=clock)

    def _declare_request_metrics(self, r: CollectorRegistry) -> None:
        """What every answered request adds to: counts, durations, tokens."""
        self.requests = Counter(
            PREFIX + "requests",
            "Requests answered, by model, HTTP status and error code",
            ["model", "status", "code"],
            registry=r,
        )
        self.duration = Histogram(
            PREFIX + "request_duration_seconds",
            "Time from request to last byte",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds",
            "Time from request to the first streamed chunk",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            PREFIX + "tokens",
            "Tokens, by model and direction (prompt|completion)",
            ["model", "direction"],
            registry=r,
        )

    def _declare_routing_metrics(self, r: CollectorRegistry, queue_depth: Callable[[], float]) -> None:
        """How requests were routed: admission, decisions, fallbacks, retries, the snapshot and its source."""
        self.provider_unavailable = Gauge(
            PREFIX + "provider_unavailable",
            "1 while a provider model's endpoint is dropped (its key unreadable or refused, or its URL refused)",
            ["model"],
            registry=r,
        )
        self.queue_depth = Gauge(
            PREFIX + "admission_queue_depth", "Requests waiting in the admission queue", registry=r
        )
        self.queue_depth.set_function(queue_depth)
        self.usage_pending = Gauge(
            PREFIX + "usage_pending",
            "Usage records waiting to be written to the store (grows while the store is unreachable)",
            registry=r,
        )
        self.rejections = Counter(
            PREFIX + "admission_rejections",
            "Requests refused at admission, by reason",
            ["reason"],
            registry=r,
        )
        self.decisions = Counter(
            PREFIX + "scheduler_decisions",
            "Scheduling decisions, by model and the scorer that decided",
            ["model", "scorer"],
            registry=r,
        )
        self.scrape_errors = Counter(
            PREFIX + "scrape_errors", "Failed metric scrapes, by endpoint", ["endpoint"], registry=r
        )
        self.fallbacks = Counter(
            PREFIX + "fallbacks", "Requests served by a fallback model", ["model", "fallback"], registry=r
        )
        self.retries = Counter(
            PREFIX + "retries",
            "Requests retried on another endpoint after a connect failure",
            ["model"],
            registry=r,
        )
        self.snapshot_revision = Gauge(
            PREFIX + "snapshot_info",
            "1, labelled with the revision of the snapshot in use",
            ["revision"],
            registry=r,
        )
        self.controller_connected = Gauge(
            PREFIX + "controller_connected", "1 while the controller stream is connected", registry=r
        )

    def child(self, metric: Counter | Histogram, *labels: str) -> Any:
        key = (metric._name, *labels)
        found = self._children.get(key)
        if found is None:
            if len(self._children) > 50_000:
                self._children.clear()
            found = self._children[key] = metric.labels(*labels)
        return found

    def set_revision(self, revision: str) -> None:
        self.snapshot_revision.clear()
        self.snapshot_revision.labels(revision).set(1)

    def observe_tokens(self, model: str, prompt: int, completion: int) -> None:
        if prompt:
            self.child(self.tokens, model, "prompt").inc(prompt)
        if completion:
            self.child(self.tokens, model, "completion").inc(completion)
