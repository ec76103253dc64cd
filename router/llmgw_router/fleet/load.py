"""What this router tells the controller about load: per model and per replica, for the autoscaler and drains.

`LoadTracker` counts as requests go: a claim and a release per replica (kept apart from the routing table, so
a replica the controller dropped from the snapshot while it drains still shows its requests in flight until
they finish), time to first token per model over a sliding window, and refusals for want of capacity. Its
`report` is the `{"type": "load", ...}` message the controller link sends every `load_interval`:

    {"type": "load",
     "models": {NAME: {"queued": int, "inflight": int, "ttft_p99_ms": float | null, "refused": int}},
     "replicas": {ID: {"inflight": int, "last_request_at": float | null, "routed": bool,
                       "requests": int, "errors": int, "ttft_p99_ms": float | null,
                       "engine": {"running": float | null, "waiting": float | null,
                                  "kv_usage": float | null, "scrape_error": str | null}}}}

`refused` counts since the last report; `ttft_p99_ms` is over the last `window` seconds (null: no first token
in it, which is unknown, not fast), a request not streamed counting its whole answer (its client's first token
came with its last); `last_request_at` is wall time (null: none since this router started);
`routed` says the replica is in this router's table (false: dropped, only its requests in flight remain).
A replica's `requests` and `errors` count every attempt sent to it since this router started (an error: a
5xx or an engine that could not be reached, retried elsewhere or not), and its `ttft_p99_ms` is over the
same window as the model's: what a canary's gates compare (llmgw.core.evals.canary). `engine` is the router's
last scrape of a routed replica's metrics (null values: not scraped yet, or the engine does not publish it),
so the console can show a replica's live metrics without the controller scraping engines itself; a replica
no longer routed has no `engine`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmgw_router.fleet.table import LiveEndpoint, RoutingTable

__all__ = ["CAPACITY_CODES", "LoadTracker"]

# Refusals that say the model had no room (not a tenant's limit, not a bad request).
CAPACITY_CODES = frozenset({"queue_full", "queue_timeout", "model_loading"})
_REPLICA_KEY = "\0replica:"  # a replica's TTFT samples beside the models' (no model name holds a NUL)


@dataclass(slots=True)
class _Replica:
    inflight: int = 0
    last_request_at: float | None = None
    requests: int = 0
    errors: int = 0


class LoadTracker:
    def __init__(self, window: float = 10.0, clock: Callable[[], float] = time.time) -> None:
        self.window = window
        self.clock = clock
        self._ttft: dict[str, deque[tuple[float, float]]] = {}
        self._refused: dict[str, int] = {}
        self._replicas: dict[str, _Replica] = {}

    def claimed(self, replica_id: str) -> None:
        rec = self._replicas.setdefault(replica_id, _Replica())
        rec.inflight += 1
        rec.last_request_at = self.clock()

    def released(self, replica_id: str) -> None:
        rec = self._replicas.get(replica_id)
        if rec is not None and rec.inflight > 0:
            rec.inflight -= 1

    def first_token(self, model: str, seconds: float, replica_id: str | None = None) -> None:
        keys = (model,) if replica_id is None else (model, _REPLICA_KEY + replica_id)
        for key in keys:
            samples = self._ttft.setdefault(key, deque())
            samples.append((self.clock(), seconds))
            if len(samples) > 10_000:  # a flood inside one window: the oldest go first
                samples.popleft()

    def answered(self, replica_id: str, *, ok: bool) -> None:
        """One attempt on the replica ended: answered (ok), or a 5xx / unreachable engine."""
        rec = self._replicas.setdefault(replica_id, _Replica())
        rec.requests += 1
        rec.errors += not ok

    def finished(self, model: str, status: int, code: str | None) -> None:
        """Every answered request passes here (accounting.settle); counts the capacity refusals."""
        if status in (429, 503) and code in CAPACITY_CODES:
            self._refused[model] = self._refused.get(model, 0) + 1

    def _p99(self, model: str, now: float) -> float | None:
        samples = self._ttft.get(model)
        if not samples:
            return None
        while samples and samples[0][0] < now - self.window:
            samples.popleft()
        if not samples:
            return None
        ordered = sorted(s for _, s in samples)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000.0

    def report(self, table: RoutingTable | None, queued: Callable[[str], int]) -> dict[str, Any]:
        """The load message now; refusals counted since the last report start again at zero."""
        now = self.clock()
        models: dict[str, Any] = {}
        routed: dict[str, LiveEndpoint] = {}
        for name, endpoints in (table.endpoints if table is not None else {}).items():
            if table is not None and table.models[name].provider is not None:
                continue
            ids = [ep.id for ep in endpoints]
            routed.update((ep.id, ep) for ep in endpoints)
            models[name] = {
                "queued": queued(name),
                "inflight": sum(self._replicas[i].inflight for i in ids if i in self._replicas),
                "ttft_p99_ms": self._p99(name, now),
                "refused": self._refused.pop(name, 0),
            }
        replicas: dict[str, Any] = {}
        for rid in list(self._replicas):
            rec = self._replicas[rid]
            if rid not in routed and rec.inflight == 0:
                del self._replicas[rid]  # dropped and finished: nothing left to say about it
                self._ttft.pop(_REPLICA_KEY + rid, None)
                continue
            replicas[rid] = {
                "inflight": rec.inflight,
                "last_request_at": rec.last_request_at,
                "routed": rid in routed,
                "requests": rec.requests,
                "errors": rec.errors,
                "ttft_p99_ms": self._p99(_REPLICA_KEY + rid, now),
            }
        for rid in routed.keys() - replicas.keys():
            replicas[rid] = {
                "inflight": 0,
                "last_request_at": None,
                "routed": True,
                "requests": 0,
                "errors": 0,
                "ttft_p99_ms": None,
            }
        for rid, ep in routed.items():
            s, names = ep.sample, ep.names
            running = waiting = None
            if s is not None and names is not None:  # a name the page lacked was read as 0: unknown here
                running = None if names.running in s.missing else s.running
                waiting = None if names.waiting in s.missing else s.waiting
            replicas[rid]["engine"] = {
                "running": running,
                "waiting": waiting,
                "kv_usage": None if s is None else s.kv_usage,
                "scrape_error": ep.scrape_error,
            }
        return {"type": "load", "models": models, "replicas": replicas}
