"""Leader lease: which of several controllers on one store places replicas and commands agents.

A row in the store's `leases` table with an expiry, taken and renewed by the store's one-statement
`acquire_lease` (so taking and renewing cannot disagree and two racing controllers cannot both win). The
holder id is random per process, never the hostname: a restarted controller must not match its own stale
lease and believe it led through the gap in which someone else may have taken over.

Only the leader reconciles and accepts agents; a standby refuses agents (they move to their next address)
and serves a read-only admin API. An unreachable store is not evidence that someone else leads, so the
holder keeps its claim until its own expiry minus a margin (counted from when it *sent* its last successful
renewal, on this machine's monotonic clock), then steps down. The decision is a pure function
(`decide`); `LeaderLease` is the thin loop around the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Literal

from aiohttp import web
from aiohttp.typedefs import Middleware

from llmgw.core.security import bearer_token
from llmgw.store.errors import unreachable_words
from llmgw.store.records import Fence, LeaseResult
from llmgw.store.store import Store

__all__ = [
    "LEASE_NAME",
    "STANDBY_REFUSAL",
    "LeaderLease",
    "Leadership",
    "LeaseConfig",
    "decide",
    "leader_address",
    "make_holder",
    "standby_middleware",
]

log = logging.getLogger("llmgw.controller.parts.lease")

LEASE_NAME = "controller-leader"
STANDBY_REFUSAL = "standby: try the next controller address"
Role = Literal["leader", "standby"]


@dataclass(frozen=True)
class LeaseConfig:
    """ttl: how long a claim lasts in the store; renew_s: how often it is renewed (and a standby tries);
    margin_s: the holder steps down this long before its claim could have expired, to absorb clock skew
    between machines and a slow last statement."""

    name: str = LEASE_NAME
    ttl_s: float = 15.0
    renew_s: float = 3.0
    margin_s: float = 3.0

    def __post_init__(self) -> None:
        if not (self.renew_s > 0 and self.margin_s >= 0 and self.renew_s + self.margin_s < self.ttl_s):
            raise ValueError(
                f"lease timings: want renew ({self.renew_s}s) + margin ({self.margin_s}s) < ttl "
                f"({self.ttl_s}s), all positive, so a healthy leader renews before its claim runs out"
            )


@dataclass(frozen=True)
class Leadership:
    """What this controller knows about leadership now. `valid_until` is on the local monotonic clock."""

    role: Role
    holder: str  # this process's id
    leader: str | None = None  # the current holder's id as last read; None when unknown
    valid_until: float = 0.0  # only meaningful while role == "leader"
    since: float = 0.0  # monotonic time the role last changed
    error: str | None = None  # the last store error, while it lasts
    epoch: int = 0  # the lease's epoch as this controller won it (its writes are fenced by it)

    @property
    def leading(self) -> bool:
        return self.role == "leader"


def make_holder(address: str) -> str:
    """A random id that also says where this controller is (`<hex>@<address>`), for status and logs."""
    return f"{uuid.uuid4().hex[:12]}@{address}"


def leader_address(holder: str | None) -> str | None:
    if not holder or "@" not in holder:
        return None
    return holder.split("@", 1)[1] or None


def decide(
    prev: Leadership,
    *,
    now: float,
    cfg: LeaseConfig,
    result: LeaseResult | None = None,
    error: str | None = None,
    sent_at: float | None = None,
) -> Leadership:
    """The next Leadership after one attempt (`result` or `error`, sent at `sent_at`) or a plain tick.

    - held: leader until sent_at + ttl - margin (from when the statement was sent, the conservative end);
    - someone else holds it: standby, naming them;
    - the store failed: a leader keeps leading until its own validity ends; a standby stays standby;
    - a tick past a leader's validity: standby (step down; the store may have given the lease away).
    """
    if result is not None:
        if result.held:
            start = now if sent_at is None else sent_at
            until = start + cfg.ttl_s - cfg.margin_s
            since = prev.since if prev.leading else now
            epoch = result.current.epoch if result.current is not None else prev.epoch
            return replace(
                prev,
                role="leader",
                leader=prev.holder,
                valid_until=until,
                since=since,
                error=None,
                epoch=epoch,
            )
        holder = result.current.holder if result.current is not None else None
        since = now if prev.leading else prev.since
        return replace(prev, role="standby", leader=holder, valid_until=0.0, since=since, error=None)
    if error is not None:
        prev = replace(prev, error=error)
    if prev.leading and now >= prev.valid_until:
        # Our claim may have expired in the store: someone else may lead now. Who is unknown.
        return replace(prev, role="standby", leader=None, valid_until=0.0, since=now)
    return prev


RoleListener = Callable[[Leadership], None]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class LeaderLease:
    """The lease loop. `run()` until cancelled; `leading()` is what actors check before acting.

    `on_lead(state)` is called when this controller takes the lead, `on_step_down(state)` when it stops
    leading (the store said someone else holds it, its claim ran out, or it released it). The lease knows
    nothing of what its owner does then: the owner passes the callbacks in.
    """

    def __init__(
        self,
        store: Store,
        address: str,
        cfg: LeaseConfig | None = None,
        *,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        on_lead: RoleListener | None = None,
        on_step_down: RoleListener | None = None,
    ) -> None:
        self.store = store
        self.cfg = cfg or LeaseConfig()
        self.wall = wall
        self.clock = clock
        self.on_lead = on_lead
        self.on_step_down = on_step_down
        self.state = Leadership(role="standby", holder=make_holder(address), since=clock())
        self.attempts = 0
        self.failures = 0
        # Until the store has answered (or failed) once, who leads is unknown, not "someone else".
        self.answered = False

    @property
    def holder(self) -> str:
        return self.state.holder

    def set_address(self, address: str) -> None:
        """Where this controller is, once its listener is bound (port 0); only before the first attempt."""
        if self.attempts == 0:
            self.state = replace(self.state, holder=make_holder(address))

    def leading(self) -> bool:
        """True only while this process holds an unexpired claim (checked against the clock, not the loop)."""
        return self.state.leading and self.clock() < self.state.valid_until

    def fence(self) -> Fence:
        """What this controller's leader-only writes carry: the store refuses them once the lease changed
        hands (a controller deposed by a partition cannot act when it heals)."""
        return Fence(self.cfg.name, self.holder, self.state.epoch, self.cfg.ttl_s)

    def deposed(self, why: str) -> None:
        """The store refused a write as fenced: someone else holds the lease now; stand by at once."""
        if self.state.leading:
            log.warning("lease %s: %s", self.cfg.name, why)
            self._set(replace(self.state, role="standby", leader=None, valid_until=0.0, since=self.clock()))

    def refusal(self) -> str | None:
        """Why an agent is refused here (None while leading): the protocol's standby message."""
        if self.leading():
            return None
        where = leader_address(self.state.leader)
        return STANDBY_REFUSAL + (f" (the leader is {where})" if where else "")

    async def attempt(self) -> Leadership:
        """One take-or-renew; store errors are folded into the state, never raised."""
        sent_at = self.clock()
        self.attempts += 1
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that arrives as the
            # statement finishes, and the loop would outlive its own cancellation (a stop that never returns).
            async with asyncio.timeout(self.cfg.renew_s):
                result = await self.store.acquire_lease(
                    self.cfg.name, self.holder, self.cfg.ttl_s, self.wall()
                )
        except Exception as exc:  # any store failure: keep the claim while it is valid (see `decide`)
            self.failures += 1
            message = unreachable_words(exc, self.cfg.renew_s)  # a timeout says so, not 'TimeoutError'
            if self.state.error != message:
                log.warning(
                    "lease %s: store unreachable (%s); role stays %s", self.cfg.name, message, self.state.role
                )
            self._set(decide(self.state, now=self.clock(), cfg=self.cfg, error=message))
        else:
            self._set(decide(self.state, now=self.clock(), cfg=self.cfg, result=result, sent_at=sent_at))
        self.answered = True
        return self.state

    def tick(self) -> Leadership:
        self._set(decide(self.state, now=self.clock(), cfg=self.cfg))
        return self.state

    def _set(self, new: Leadership) -> None:
        old, self.state = self.state, new
        if old.role == new.role:
            if not new.leading and old.leader != new.leader and new.leader is not None:
                log.info("lease %s: leader is now %s", self.cfg.name, new.leader)
            return
        if new.leading:
            log.warning("lease %s: this controller (%s) is the leader", self.cfg.name, self.holder)
        else:
            log.warning(
                "lease %s: stepping down to standby (leader: %s%s)",
                self.cfg.name,
                new.leader or "unknown",
                f"; store error: {new.error}" if new.error else "",
            )
        listener = self.on_lead if new.leading else self.on_step_down
        if listener is not None:
            listener(new)

    async def run(self) -> None:
        while True:
            await self.attempt()
            delay = self.cfg.renew_s
            if self.state.leading:
                # Wake at the end of our validity too, so stepping down is not late by a renewal period.
                delay = max(0.01, min(delay, self.state.valid_until - self.clock()))
            await asyncio.sleep(delay)
            self.tick()

    async def release(self) -> None:
        """On a graceful stop: give the lease up so a standby leads at its next try, not after the ttl."""
        was = self.state
        self._set(replace(self.state, role="standby", leader=None, valid_until=0.0, since=self.clock()))
        if not was.leading:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                if await self.store.release_lease(self.cfg.name, self.holder, self.cfg.ttl_s):
                    log.warning(
                        "lease %s: released by %s for the next controller", self.cfg.name, self.holder
                    )

    def status(self) -> dict[str, object]:
        """For the admin API's status: role, who leads, and whether the store answered.

        The role is `starting` before the first take-or-renew has come back: the controller does not lead,
        but it cannot yet say that another does."""
        s = self.state
        leading = self.leading()
        return {
            "role": "leader" if leading else ("standby" if self.answered else "starting"),
            "holder": s.holder,
            "leader": s.holder if leading else s.leader,
            "leader_address": leader_address(s.holder if leading else s.leader),
            "lease": self.cfg.name,
            "ttl_s": self.cfg.ttl_s,
            "epoch": s.epoch if leading else None,
            "valid_for_s": round(max(0.0, s.valid_until - self.clock()), 3) if leading else None,
            "store_error": s.error,
        }


# ---------------------------------------------------------------------------------------------- standby

_READ_ONLY_OK = frozenset({"GET", "HEAD", "OPTIONS"})


def standby_middleware(
    lease: LeaderLease, router_path: str, router_token_ok: Callable[[str], bool]
) -> Middleware:
    """On a standby: the admin API reads, never writes; routers are sent away (they keep their snapshot).

    `router_token_ok(token)` says whether a presented token is the admin's or a router's: only such a caller
    is told where the leader is."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if lease.leading():
            return await handler(request)
        path = request.path
        writes = (
            path.startswith("/api/") and request.method not in _READ_ONLY_OK and path != "/api/v1/webhook"
        )
        if writes or path == router_path:
            # The leader's address is for those who may talk to it: an anonymous caller learns only that
            # this one stands by (it must not map the cluster from a standby it can reach).
            presented = bearer_token(request.headers.get("Authorization"))
            credentialed = presented is not None and router_token_ok(presented)
            where = leader_address(lease.state.leader) if credentialed else None
            known = "; no leader is known right now" if lease.state.leader is None else ""
            message = "this controller is a standby (read-only)" + (
                f"; the leader is {where}" if where else known
            )
            return web.json_response({"error": {"message": message, "leader": where}}, status=503)
        return await handler(request)

    return middleware
