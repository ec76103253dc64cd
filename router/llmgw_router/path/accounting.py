"""What a request is charged, and the bookkeeping that records it.

`charge` is the billing rule, pure: tokens and cost from what the engine reported, falling back to what was
reserved when it reported nothing (so hanging up just before the usage event, or a provider that omits
`usage`, is no way around budgets), and nothing spent for a request refused before any engine saw it.
`settle` is the thin shell around it: metrics, the limiter's release, the usage record.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from llmgw.core.config.models import Prices
from llmgw.core.tenancy.projects import TenantChain
from llmgw.core.traffic.recorded import prefix_hash
from llmgw.store.records import UsageRecord
from llmgw_router.decisions.media.forms import FormPart
from llmgw_router.decisions.rules import Sizing
from llmgw_router.decisions.scheduler import Decision
from llmgw_router.fleet.metrics import RouterMetrics
from llmgw_router.fleet.ports import UsageSink
from llmgw_router.fleet.table import RoutingTable
from llmgw_router.path.auth import KeyPrincipal
from llmgw_router.path.lookup import RecentRequests, decision_summary
from llmgw_router.path.ratelimit import Limiter, LimitGrant
from llmgw_router.surfaces.kept_bodies import Keeping
from llmgw_router.surfaces.responses.exchange import ResponsesTurn
from llmgw_router.upstream.proxy import ProxyResult

if TYPE_CHECKING:
    from llmgw_router.path.tracing import RequestTrace

__all__ = ["Answer", "Call", "Charge", "Reservation", "charge", "gone", "settle"]


class Answer(Protocol):
    """What an engine's answer told about its size (a ProxyResult is one)."""

    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def completion_tokens(self) -> int | None: ...
    @property
    def events(self) -> int: ...  # stream events forwarded to the client
    @property
    def images(self) -> int | None: ...  # pictures made (an images model's answer)
    @property
    def audio_seconds(self) -> float | None: ...  # audio transcribed or translated


@dataclass(frozen=True, slots=True)
class Reservation:
    """Tokens a request reserved at admission: the prompt's estimate and the completion's cap (all sequences)."""

    prompt: int
    completion: int

    @property
    def total(self) -> int:
        return self.prompt + self.completion


# Not frozen: built on every request, and a frozen dataclass costs about three times as much to construct.
@dataclass(slots=True)
class Charge:
    prompt: int | None  # prompt tokens counted; None when no engine answered and nothing stands in for it
    completion: int  # completion tokens counted
    used: int  # tokens given back to the limiter as spent (0: the reservation is returned whole)
    cost: float  # charged against budgets, at the serving model's prices


def charge(
    answer: Answer | None, reserved: Reservation, prices: Prices | None, *, status: int, engine_reached: bool
) -> Charge:
    """The billing rule. `answer` is None when no engine answered; `engine_reached` is False for a request
    refused after admission (queue, no endpoint) before any engine saw it."""
    prompt = answer.prompt_tokens if answer is not None else None
    completion = (answer.completion_tokens or 0) if answer is not None else 0
    if prompt is None and answer is not None and answer.events:
        # A stream cut short (the client left, the engine broke) never got to its usage event, yet the engine
        # did the work: the prompt's estimate and a token per event forwarded, rather than nothing.
        prompt, completion = reserved.prompt, answer.events
    elif prompt is None and answer is not None and status == 200:
        # Answered without `usage` (a provider that omits it, a client gone before the body was read): what
        # was reserved for it, not zero, so a missing field is no way around budgets.
        prompt, completion = reserved.prompt, reserved.completion
    used = (prompt if prompt is not None else reserved.total) + completion
    if not engine_reached:
        # The reservation, which may be the whole context, is given back rather than spent.
        used = 0
    cost = 0.0
    if prices is not None and prompt is not None:
        cost = (prompt * prices.input_per_million + completion * prices.output_per_million) / 1e6
    if prices is not None and answer is not None and answer.images:  # pictures are priced each
        cost += answer.images * prices.per_image
    if prices is not None and answer is not None and answer.audio_seconds:  # audio by the minute
        cost += answer.audio_seconds / 60 * prices.per_audio_minute
    return Charge(prompt, completion, used, cost)


_UNSIZED = Sizing()  # a request refused before its body was sized reserved nothing


@dataclass(slots=True)
class Call:
    """One request's bookkeeping, filled in as it goes down the path and settled at its end."""

    request_id: str
    started: float  # time.monotonic()
    model: str = "unknown"
    served: str | None = None
    principal: KeyPrincipal | None = None
    chain: TenantChain | None = None
    serving: tuple[str, ...] = ()  # the requested model, then the fallbacks this request may use, in order
    sizing: Sizing = _UNSIZED  # what it may cost, from its body and the model (rules.size)
    status: int = 500
    code: str = ""
    result: ProxyResult | None = None
    lease: LimitGrant | None = None
    # Gives the lease's concurrency slots back; called as the answer's last bytes go out (set with the lease).
    ending: Callable[[], None] | None = None
    # The way it went, for `llmgw request ID` (llmgw_router.path.lookup) and the tags (llmgw_router.path.tags).
    endpoint: str = ""
    queue_s: float | None = None
    decision: Decision | None = None
    attempts: list[dict[str, str]] | None = None
    tags: dict[str, str] | None = None
    trace: RequestTrace | None = None  # with tracing configured only (llmgw_router.path.tracing)
    # Its shape for a traffic trace: the session/prefix key (rules.conversation_key, kept only salted and
    # hashed) and whether the client asked for a stream. None: not known (refused before the body was read).
    session: str | None = None
    stream: bool | None = None
    traceparent: str | None = None  # without: the client's, passed to the engine as it came
    guard: dict[str, Any] | None = (
        None  # the guardrails' verdicts by stage (llmgw_router.path.guard); None: none
    )
    # Answered by the response cache: the usage row's decision (llmgw_router.path.cache).
    cache: dict[str, Any] | None = None
    # Sent to a canary replica (the last endpoint picked): its answer is never cached, so a canary rolled back
    # leaves nothing of itself behind.
    canary: bool = False
    adapter: str | None = None  # the LoRA adapter asked for (llmgw_router.path.lora); `model` is its base
    turn: ResponsesTurn | None = None  # a Responses API turn, served as the chat it translates to
    # The x-llmgw-hop it came with: the clusters it passed through (decisions.federation).
    hops: str | None = None
    keeping: Keeping | None = None  # its bodies are kept (surfaces.kept_bodies): set just before forwarding
    form: list[FormPart] | None = None  # a speech request's multipart form (decisions/media/forms.py)

    @property
    def reserved(self) -> Reservation:
        """Tokens the request may take: reserved at admission, corrected at the end. A request that names no
        max_tokens is sent the cap it reserved, so the engine cannot spend more than this."""
        return Reservation(self.sizing.prompt_estimate, self.sizing.completion_reserved)

    @property
    def estimate(self) -> int:
        sizing = self.sizing
        return sizing.prompt_estimate + sizing.completion_reserved

    def streaming(self, result: ProxyResult) -> None:
        """A stream started: keep its result now, so a handler cancelled later still accounts its usage."""
        self.result = result


def gone(call: Call) -> tuple[int, str]:
    """Status for a request whose client went away: 499, unless it had the whole answer already."""
    if call.result is not None and call.result.finished:
        return 200, ""
    return 499, "client_closed_request"


# Without the controller's salt in the snapshot: hashes match within this process only.
_PROCESS_SALT = secrets.token_bytes(32)


def _prefix(table: RoutingTable, principal: KeyPrincipal | None, key: str) -> str:
    salt = table.snapshot.trace_salt
    project = (principal.project or "") if principal else ""
    return prefix_hash(salt.encode() if salt else _PROCESS_SALT, project, key)


def settle(
    call: Call,
    table: RoutingTable | None,
    metrics: RouterMetrics,
    limiter: Limiter,
    usage: UsageSink,
    clock: Callable[[], float],
    router_id: str,
    recent: RecentRequests | None = None,
) -> None:
    """Record a finished request: metrics, the limiter's release, and a usage record for a tenant's key
    (every request's record also goes to `recent`, the router's buffer of the last ones)."""
    elapsed = time.monotonic() - call.started
    served = call.served or call.model
    prices = table.models[served].prices if table is not None and served in table.models else None
    bill = charge(
        call.result, call.reserved, prices, status=call.status, engine_reached=call.served is not None
    )
    _observe(call, table, metrics, served, elapsed, bill)
    if call.lease is not None:
        limiter.release(call.lease, bill.used, bill.cost)
    principal = call.principal
    if table is None or (recent is None and (principal is None or principal.project is None)):
        return
    rec = _usage_record(call, table, served, elapsed, bill, clock(), router_id)
    if recent is not None:
        recent.add(rec)
    if principal is not None and principal.project is not None:
        usage.record(rec)


def _observe(
    call: Call, table: RoutingTable | None, m: RouterMetrics, served: str, elapsed: float, bill: Charge
) -> None:
    """The request in the router's metrics: counts, durations, first tokens, tokens, tags."""
    result = call.result
    m.count(m.requests, (call.model, str(call.status), call.code))
    m.observe(m.duration, (call.model,), elapsed)
    if result is not None and result.first_byte_at is not None:
        m.observe(m.ttft, (call.model,), result.first_byte_at - call.started)
        m.load.first_token(served, result.first_byte_at - call.started, call.endpoint)
    elif result is not None and call.status == 200:
        # Not streamed: the client has its first token with the last.
        m.load.first_token(served, elapsed, call.endpoint)
    m.load.finished(call.model, call.status, call.code)
    if bill.prompt is not None:
        m.observe_tokens(served, bill.prompt, bill.completion)
    if call.tags and table is not None and table.snapshot.router.tag_labels:
        m.tags.observe(call.tags, table.snapshot.router, served, bill.prompt, bill.completion, bill.cost)


def _usage_record(
    call: Call, table: RoutingTable, served: str, elapsed: float, bill: Charge, now: float, router_id: str
) -> UsageRecord:
    """The request's usage row (the project's, and `llmgw request ID`'s)."""
    principal, chain = call.principal, call.chain
    ttft = call.result.first_byte_at if call.result is not None else None
    decision = decision_summary(call.decision) if call.decision is not None else call.cache
    if call.adapter is not None:  # billed to its base model's prices; which adapter it was is kept here
        decision = {**(decision or {}), "adapter": call.adapter}
    if call.result is not None and call.result.images is not None:  # what a picture answer was billed by
        decision = {**(decision or {}), "images": call.result.images}
    if call.result is not None and call.result.audio_seconds is not None:
        decision = {**(decision or {}), "audio_seconds": call.result.audio_seconds}
    return UsageRecord(
        time=now,
        request_id=call.request_id,
        project=(principal.project or "") if principal else "",
        model=served,
        status=call.status,
        team=(chain.team or "") if chain else "",
        org=(chain.organization or "") if chain else "",
        key_id=principal.key_id if principal else None,
        person=principal.person if principal else None,
        tokens_in=bill.prompt or 0,
        tokens_out=bill.completion,
        cost=bill.cost,
        latency_ms=elapsed * 1000,
        fallback_used=served != call.model,
        router_id=router_id,
        endpoint=call.endpoint,
        queue_ms=call.queue_s * 1000 if call.queue_s is not None else None,
        ttft_ms=(ttft - call.started) * 1000 if ttft is not None else None,
        attempts=call.attempts,
        decision=decision,
        code=call.code,
        tags=call.tags,
        stream=call.stream,
        prefix=_prefix(table, principal, call.session) if call.session is not None else None,
        guard=call.guard,
    )
