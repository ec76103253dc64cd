"""One request, end to end: what the router keeps of the way each request went.

Every finished request's usage record carries, besides its tokens and cost, the endpoint that served it, the
time it waited for one, the time to its first streamed bytes, the endpoints that failed first and a compact
scheduling decision (`decision_summary`). The record goes to the store (tenants' requests, as before) and to
`RecentRequests`, a bounded buffer of the last requests this router finished, every request included: one
refused before its key was known, or made without tenants, has no usage row, and a row reaches the store only
at the next flush (a second).

Why the row holds the decision rather than the controller asking routers for it later: a router's buffer
lives as long as the process and as far back as its size, and a request may have gone through any of several
routers behind a load balancer; the row is in the one store every router writes, as long as usage is kept.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from llmgw.store.records import UsageRecord, time_ordered_id
from llmgw_router.decisions.scheduler import Decision

__all__ = [
    "RECENT_DEFAULT",
    "RecentRequests",
    "decision_summary",
    "new_request_id",
    "request_id_for",
]

RECENT_DEFAULT = 4096
CANDIDATES_KEPT = 8  # candidates a row keeps of one decision (the best by total, the winner always)


def decision_summary(decision: Decision) -> dict[str, Any]:
    """The decision, compact: the winner, the picker, the scorer that decided, each candidate's total and
    per-scorer scores (the best CANDIDATES_KEPT, the winner among them), the session target, and how many
    endpoints each filter dropped. A value, not JSON text: it is encoded with the rest of the usage record
    (the spool's one line, the store's writer), never on its own on the request path."""
    scores = decision.scores
    if len(scores) > CANDIDATES_KEPT:  # the best ones and the winner; a row stays small on a large fleet
        best = sorted(scores, key=lambda s: s.total, reverse=True)[:CANDIDATES_KEPT]
        if decision.endpoint not in {s.id for s in best}:
            best[-1] = next((s for s in scores if s.id == decision.endpoint), best[-1])
        scores = tuple(best)
    out: dict[str, Any] = {
        "endpoint": decision.endpoint,
        "picker": decision.picker,
        "by": decision.winning_scorer,
        # The scorers' dicts as the Decision holds them (never changed after it is made): no copy per request.
        "candidates": [{"id": s.id, "total": s.total, "scores": s.scores} for s in scores],
    }
    if len(decision.scores) > len(scores):
        out["candidates_not_kept"] = len(decision.scores) - len(scores)
    dropped = {k: v for k, v in decision.dropped.items() if v}
    if dropped:
        out["dropped"] = dropped
    if decision.session_target is not None:
        out["session_target"] = decision.session_target
    return out


class RecentRequests:
    """The last `capacity` requests this router finished, by request id (a client may reuse its own id:
    every record under it is kept, newest last, within the bound)."""

    def __init__(self, capacity: int = RECENT_DEFAULT) -> None:
        self.capacity = capacity
        self._by_id: OrderedDict[str, list[UsageRecord]] = OrderedDict()
        self._count = 0

    def add(self, rec: UsageRecord) -> None:
        same = self._by_id.get(rec.request_id)
        if same is None:
            self._by_id[rec.request_id] = [rec]
        else:
            same.append(rec)
            self._by_id.move_to_end(rec.request_id)
        self._count += 1
        while self._count > self.capacity:
            _, oldest = self._by_id.popitem(last=False)
            self._count -= len(oldest)

    def get(self, request_id: str) -> list[UsageRecord]:
        return list(self._by_id.get(request_id, ()))

    def __len__(self) -> int:
        return self._count


def new_request_id() -> str:
    """A UUIDv7 in hex (time_ordered_id, as usage ids are): a request id must be unique, not unpredictable,
    and usage rows are indexed by it (`llmgw request ID`). Random UUID4s landed all over that index, so each
    batch of rows dirtied a page of it per row (WAL frames written, then copied back at checkpoints); ids that
    grow with time append at its end."""
    return time_ordered_id()


_REQUEST_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


def request_id_for(sent: str | None) -> str:
    """The client's x-request-id when it is a plain token (it goes to the engine, into logs and usage rows),
    else a new one."""
    if sent and len(sent) <= 128 and _REQUEST_ID_CHARS.issuperset(sent):
        return sent
    return new_request_id()
