"""The router's Prometheus metrics, in a registry of its own (never the global one), served on its own listener.

Per-endpoint gauges are produced at collection time from the live records, so an endpoint that leaves the
snapshot leaves the metrics with it instead of lingering at its last value.

What every request adds to (its count, duration, time to first token, tokens, the scheduler's decision) is
counted in plain dicts and added to the prometheus_client series when the registry is collected (a scrape):
prometheus_client takes a lock per increment and walks a histogram's buckets in Python, several
microseconds per request for numbers read once every few seconds. The page is the same.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw_router.fleet.load import LoadTracker
from llmgw_router.fleet.table import RoutingTable
from llmgw_router.fleet.tag_metrics import TagMetrics

__all__ = ["PREFIX", "RouterMetrics"]

PREFIX = "llmgw_router_"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_BOUNDS = (*(float(b) for b in _LATENCY_BUCKETS), float("inf"))  # prometheus_client adds +Inf


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


class _Publish(Collector):
    """Registered first, so that collecting the registry adds what was counted locally before the series
    that hold it are read."""

    def __init__(self, publish: Callable[[], None]) -> None:
        self._publish = publish

    def collect(self) -> Iterator[Metric]:
        self._publish()
        return iter(())


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
        # Counted on the event loop's thread, published when the registry is collected (on the same thread:
        # the metrics listener runs in the router's loop).
        self._counted: dict[tuple[Counter, tuple[str, ...]], float] = {}
        self._observed: dict[tuple[Histogram, tuple[str, ...]], list[float]] = {}
        r.register(_Publish(self.publish))
        self._declare_request_metrics(r)
        self._declare_routing_metrics(r, queue_depth)
        self._declare_disaggregated_metrics(r)
        r.register(_EndpointCollector(table, clock))
        r.register(_BudgetCollector(budgets))
        self.tags = TagMetrics(r, PREFIX, self.count)  # only the keys the repo declares (router.tag_labels)

        # labels() costs a lock and a dict build per call; the request path asks for the same few children
        # over and over, so they are kept (bounded by models x statuses x codes, a small set).
        self._children: dict[tuple[str, ...], Any] = {}
        # What the controller link reports as load (not Prometheus: the autoscaler's input, llmgw_router.fleet.load).
        self.load = LoadTracker(clock=clock)

    def _declare_disaggregated_metrics(self, r: CollectorRegistry) -> None:
        """Disaggregated serving (docs/routing.md): each step of a two-step request, by role."""
        self.pd_steps = Counter(
            PREFIX + "disaggregated_steps",
            "Steps of two-step (prefill, decode) requests, by model, role and outcome (ok|failed)",
            ["model", "role", "outcome"],
            registry=r,
        )
        self.pd_step_seconds = Histogram(
            PREFIX + "disaggregated_step_seconds",
            "Time a prefill step took, or a decode step to its first byte, by model and role",
            ["model", "role"],
            registry=r,
        )
        self.pd_fallbacks = Counter(
            PREFIX + "disaggregated_fallbacks",
            "Two-step requests with a failed step, by model and what followed (plain|retry|fail)",
            ["model", "policy"],
            registry=r,
        )

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

    def count(self, metric: Counter, labels: tuple[str, ...], amount: float = 1.0) -> None:
        """`metric.labels(*labels).inc(amount)`, published at the next collection."""
        key = (metric, labels)
        counted = self._counted
        counted[key] = counted.get(key, 0.0) + amount

    def observe(self, metric: Histogram, labels: tuple[str, ...], value: float) -> None:
        """`metric.labels(*labels).observe(value)`, published at the next collection: the bucket's count
        and the sum, in a list (one slot per bucket, then the sum)."""
        key = (metric, labels)
        tally = self._observed.get(key)
        if tally is None:
            tally = self._observed[key] = [0.0] * (len(_BOUNDS) + 1)
        tally[bisect_left(_BOUNDS, value)] += 1  # the first bucket whose upper bound holds the value
        tally[-1] += value

    def publish(self) -> None:
        """Add what was counted since the last collection to the prometheus_client series."""
        counted, self._counted = self._counted, {}
        for (counter, labels), amount in counted.items():
            self.child(counter, *labels).inc(amount)
        observed, self._observed = self._observed, {}
        for (histogram, labels), tally in observed.items():
            child = self.child(histogram, *labels)
            # Histogram.observe's own parts: one count in the value's bucket (its buckets are not
            # cumulative inside; the exposition adds them up) and the sum.
            for i, n in enumerate(tally[:-1]):
                if n:
                    child._buckets[i].inc(n)
            child._sum.inc(tally[-1])

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
            self.count(self.tokens, (model, "prompt"), prompt)
        if completion:
            self.count(self.tokens, (model, "completion"), completion)
