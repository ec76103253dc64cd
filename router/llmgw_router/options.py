"""What one router process is told at start (its flags), apart from the snapshot it is fed."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw.core.config.secretrefs import SecretPolicy
from llmgw_router.decisions import breaker as brk
from llmgw_router.upstream.provider_keys import DEFAULT_SECRETS_DIR

__all__ = ["RouterOptions"]


@dataclass(frozen=True)
class RouterOptions:
    router_id: str = "router"
    # How long a request for a model with no replica yet waits for one. None: from the snapshot (1.5 x the
    # measured load time + 5 s, else router.admission.load_timeout).
    on_demand_wait: float | None = None
    loading_retry_after: int = 10
    debug_token: str | None = None  # requests sending it in x-llmgw-debug get the decision's rationale
    # Operators' tools present it (Bearer) for the per-request rows on the metrics listener and the details of
    # /ready; None: neither is served (L12).
    operator_token: str | None = None
    breaker: brk.BreakerPolicy = field(default_factory=brk.BreakerPolicy)
    connect_timeout: float = 5.0
    read_timeout: float = 600.0  # idle: the longest silence of an engine while an answer is expected
    request_deadline: float = 3600.0  # an engine's whole answer, stream or not, however steadily it comes
    write_timeout: float = 30.0  # a stream's client that accepts no byte for this long is cut off
    # How long a key's answer from the store is trusted: a revoked key keeps working at most this long.
    key_cache_ttl: float = 10.0
    # Where the repo's provider keys may be read from: the router's settings, never the repo's.
    secrets: SecretPolicy = field(default_factory=lambda: SecretPolicy(DEFAULT_SECRETS_DIR).absolute())
    # OpenTelemetry: spans of the request path go to this OTLP/HTTP collector (None: no tracing at all).
    otlp_endpoint: str | None = None
    # The share of requests traced, decided at each root span; a client's sampled flag decides nothing.
    trace_sample: float = 1.0
