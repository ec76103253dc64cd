"""Webhook notifications: the thin I/O shell around llmgw.core.api.notify.

An event the repo's Notifications select is written to the store's outbox when it happens (`emit`), and the
sender loop (`run`) delivers what is due: signed, retried with jittered backoff, dead-lettered after the
Notification's attempts. Only the leader emits and sends: a standby's view of the fleet is not the cluster's,
and two senders would deliver everything twice. The budget loop reads each tenant's spend from the store's
usage against its budget and emits budget_80 / budget_100 once per budget period (the mark is in the store,
so a poll or a restart does not say it again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

import aiohttp

from llmgw.adapters.egress import AnswerTooLarge, ForbiddenAddress, checked_connector, read_at_most
from llmgw.adapters.secrets import SecretError, read_bound_secret
from llmgw.controller.parts.fleet import FleetActor
from llmgw.controller.parts.state import RefusedRevision
from llmgw.core.api import notify
from llmgw.core.config.models import NotificationSpec
from llmgw.core.config.secret_bindings import SecretUse
from llmgw.core.errors import Outage, TransientError, retry_after
from llmgw.core.security import forbidden_address_reason
from llmgw.core.tenancy.limits import window_bounds
from llmgw.core.words import parse_duration
from llmgw.store.errors import StoreError
from llmgw.store.records import Delivery, time_ordered_id

log = logging.getLogger("llmgw.controller.loops.notifier")

IDLE_WAIT_S = 30.0  # with nothing due, look at the outbox again this often (another leader may have written)
STORE_RETRY_S = 2.0
PENDING_MAX = 10_000  # outbox writes the store refused, kept in memory until it takes them
MARKS_KEPT_S = 40 * 86400.0  # marks older than the longest usual budget period are pruned
WEBHOOK_ANSWER_BYTES = 64 * 1024  # of a receiver's answer, read and dropped (only its status counts)
_LEVELS = (("Organization", "org"), ("Team", "team"), ("Project", "project"))


class NotifierParts(FleetActor, Protocol):
    """What the notifier reads besides a FleetActor: the refused revision (its event's fields), the change
    listeners (a revision applied wakes it) and the names the Cluster's own secrets hold (never a webhook's)."""

    @property
    def refused(self) -> RefusedRevision | None: ...

    @property
    def change_listeners(self) -> list[Callable[[], None]]: ...

    def reserved_secret_names(self) -> frozenset[str]: ...


class Notifier:
    def __init__(self, c: NotifierParts, *, rng: random.Random | None = None) -> None:
        self.c = c
        self.rng = rng or random.Random()
        self.wake = asyncio.Event()
        # Outbox rows the store did not take (it was down), oldest first: written before anything newer.
        self.pending: deque[Delivery] = deque(maxlen=PENDING_MAX)
        self._pending_lock = asyncio.Lock()
        self.waiting = 0
        self.dead = 0
        self.budget_checks = 0  # completed checks (status and tests read it)
        c.change_listeners.append(self.wake.set)  # a revision applied may bring the first Notifications

    # ---------------------------------------------------------------------------------- events

    async def emit(self, event: notify.NotifyEvent) -> int:
        """Queue `event` for every Notification that selects it; returns how many deliveries were queued."""
        c = self.c
        d = c.desired
        if d is None or not c.leading():
            return 0
        names = notify.targets(d.catalog.notifications, event.kind)
        if not names:
            return 0
        mark = notify.dedupe_mark(event)
        if mark is not None:
            try:
                if not await c.store.mark_once(mark, c.wall()):
                    return 0  # already said (this window, this hour)
            except StoreError as exc:  # better twice than never: send it, say why it may repeat
                log.warning("could not check whether %s was already announced (%s); sending it", mark, exc)
        now = c.wall()
        for name in names:
            spec = d.catalog.notifications[name]
            delivery_id = "ntf_" + time_ordered_id()
            body = notify.render(spec.format, event, delivery_id)
            self.pending.append(Delivery(name, event.kind, event.object, body, now, now, id=delivery_id))
        await self._write_pending()
        self.wake.set()
        return len(names)

    async def _write_pending(self) -> bool:
        async with self._pending_lock:  # one writer: two would both write the head, then drop the next
            while self.pending:
                try:
                    await self.c.store.enqueue_delivery(self.pending[0])
                except StoreError as exc:
                    log.warning(
                        "notification outbox write failed (%d waiting in memory): %s", len(self.pending), exc
                    )
                    return False
                self.pending.popleft()
            return True

    async def controller_event(self, kind: str, obj: str, message: str, now: float) -> None:
        """The controller's events that are also notification events (called by `Controller.event`)."""
        c = self.c
        d = c.desired
        fields: dict[str, object] = {}
        if kind in ("replica_failed", "replica_start_failed"):
            rec = c.fleet.replicas.get(obj)
            fields = {
                "replica": obj,
                "model": rec.model if rec else "",
                "nodes": list(rec.nodes) if rec else [],
            }
            kind = "replica_failed"
        elif kind == "node_lost":
            fields = {"node": obj}
        elif kind == "weights_update":
            fields = {"model": obj, "mark": notify.weights_update_mark(obj, message, now)}
        elif kind in ("canary_promoted", "canary_failed"):
            verdict = "promoted" if kind == "canary_promoted" else "failed"
            fields = {"model": obj, "verdict": verdict, "revision": d.revision if d is not None else ""}
            kind = "canary_verdict"
        elif kind == "revision_refused":
            fields = {"revision": c.refused.revision if c.refused else obj}
            if c.refused is not None:
                fields["errors"] = list(c.refused.errors[:20])
        else:
            return
        cluster = d.cluster_name if d is not None else ""
        await self.emit(notify.NotifyEvent(kind, obj, message, now, cluster, fields))

    # ---------------------------------------------------------------------------------- budgets

    async def check_budgets(self) -> int:
        """Emit the budget thresholds reached; returns how many deliveries were queued."""
        c = self.c
        d = c.desired
        if d is None or not c.leading():
            return 0
        if not notify.targets(d.catalog.notifications, "budget_80") and not notify.targets(
            d.catalog.notifications, "budget_100"
        ):
            return 0
        now = c.wall()
        queued = 0
        catalog = d.catalog
        for kind, level in _LEVELS:
            tenants = {
                "Organization": catalog.organizations,
                "Team": catalog.teams,
                "Project": catalog.projects,
            }
            for name, tenant in sorted(tenants[kind].items()):
                budget = tenant.limits.budget
                if budget is None:
                    continue
                start, end = window_bounds(now, parse_duration(budget.period))
                spent = await c.store.spend(level, name, start, end)
                reading = notify.BudgetReading(level, name, budget.amount, spent, start, end)
                for event in notify.budget_events(reading, now, d.cluster_name):
                    queued += await self.emit(event)
        return queued

    async def budget_loop(self) -> None:
        failing = Outage(log, "the budget check for notifications")
        while True:
            every = self.c.settings.budget_check_s
            wait = every
            try:
                await self.check_budgets()
                await self.c.store.prune_marks(self.c.wall() - MARKS_KEPT_S)
                self.budget_checks += 1
                failing.recovered()
            except TransientError as exc:  # the store down: the next check reads the same usage
                wait = retry_after(exc, default=every, most=every)
                failing.failed(exc, wait)
            except Exception as exc:  # a bug must not end the checks
                failing.failed(exc, wait)
            await self._pause(wait)

    async def _pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    # ---------------------------------------------------------------------------------- sending

    async def run(self) -> None:
        """Deliver what is due, for ever (only while leading)."""
        failing = Outage(log, "the notification sender")
        async with aiohttp.ClientSession(connector=checked_connector("a webhook", limit=8)) as session:
            while True:
                wait = IDLE_WAIT_S
                try:
                    if self.c.leading():
                        wait = await self.deliver_due(session)
                    failing.recovered()
                except TransientError as exc:  # the store down: nothing is lost, the rows wait there
                    wait = retry_after(exc, default=STORE_RETRY_S, most=IDLE_WAIT_S)
                    failing.failed(exc, wait)
                except Exception as exc:  # a bug must not end the sending
                    wait = STORE_RETRY_S
                    failing.failed(exc, wait)
                await self._wait_for_wake(wait)

    async def _wait_for_wake(self, seconds: float) -> None:
        """Until `emit` (or a revision) wakes the sender, at most `seconds` (the next row due)."""
        self.wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, seconds)):
                await self.wake.wait()

    async def deliver_due(self, session: aiohttp.ClientSession) -> float:
        """One pass over the due rows; returns how long until the next is due."""
        store = self.c.store
        if self.c.desired is None:
            # Nothing applied yet (a controller just started): which Notifications exist is not known, and a
            # row owed to one must not be dead-lettered as "no longer in the repo". The first revision wakes us.
            return IDLE_WAIT_S
        if self.pending and not await self._write_pending():
            return STORE_RETRY_S
        for delivery in await store.due_deliveries(self.c.wall()):
            await self._attempt(session, delivery)
        self.waiting, self.dead = await store.delivery_counts()
        self.c.metrics.notifications_outbox.labels("waiting").set(self.waiting)
        self.c.metrics.notifications_outbox.labels("dead").set(self.dead)
        next_at = await store.next_delivery_at()
        return IDLE_WAIT_S if next_at is None else min(IDLE_WAIT_S, next_at - self.c.wall())

    async def _attempt(self, session: aiohttp.ClientSession, delivery: Delivery) -> None:
        c = self.c
        d = c.desired
        spec = d.catalog.notifications.get(delivery.notification) if d is not None else None
        attempts = delivery.attempts + 1
        if spec is None:
            why = f"Notification {delivery.notification!r} is not in the applied revision any more"
            await self._dead(delivery, attempts, why)
            return
        attempt = await self._post(session, spec, delivery)
        verdict = notify.after_attempt(spec, attempts, attempt, c.wall(), self.rng.random())
        if isinstance(verdict, notify.Delivered):
            await c.store.delivery_done(delivery.id)
            c.metrics.notification_deliveries.labels("delivered").inc()
            if delivery.attempts:
                log.info(
                    "notification %s to %s delivered after %d attempt(s)",
                    delivery.event,
                    delivery.notification,
                    attempts,
                )
        elif isinstance(verdict, notify.RetryAt):
            await c.store.delivery_retry(delivery.id, attempts, verdict.at, verdict.error)
            c.metrics.notification_deliveries.labels("retried").inc()
            if (
                attempts == 1
            ):  # said once per delivery; the row keeps the last error for `llmgw notifications`
                log.warning(
                    "notification %s to %s failed (%s); retrying with backoff",
                    delivery.event,
                    delivery.notification,
                    verdict.error,
                )
        else:
            await self._dead(delivery, attempts, verdict.error)

    async def _dead(self, delivery: Delivery, attempts: int, why: str) -> None:
        await self.c.store.delivery_dead(delivery.id, attempts, why, self.c.wall())
        self.c.metrics.notification_deliveries.labels("dead").inc()
        log.error(
            "notification %s to %s dead-lettered: %s (see `llmgw notifications --dead`)",
            delivery.event,
            delivery.notification,
            why,
        )

    async def _post(
        self, session: aiohttp.ClientSession, spec: NotificationSpec, delivery: Delivery
    ) -> notify.Attempt:
        body = delivery.body.encode()
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "llmgw-controller",
            notify.EVENT_HEADER: delivery.event,
            notify.DELIVERY_HEADER: delivery.id,
            notify.TIMESTAMP_HEADER: str(timestamp),
        }
        if spec.secret is not None:
            try:
                use = SecretUse(spec.secret, "notification-secret", spec.url)
                policy = self.c.settings.secret_policy()
                secret = read_bound_secret(use, policy, self.c.reserved_secret_names())
            except SecretError as exc:  # perhaps fixed before the attempts run out: retried like a 5xx
                return notify.Attempt(None, f"signing secret unavailable: {exc}")
            headers[notify.SIGNATURE_HEADER] = notify.signature(secret.encode(), timestamp, body)
        if why := forbidden_address_reason(spec.url):
            return notify.Attempt(403, f"{spec.url} is refused: {why}")
        timeout = aiohttp.ClientTimeout(total=parse_duration(spec.retry.timeout))
        try:
            async with session.post(
                spec.url, data=body, headers=headers, timeout=timeout, allow_redirects=False
            ) as response:
                with contextlib.suppress(AnswerTooLarge):  # the status is the answer; the body is not kept
                    await read_at_most(response, WEBHOOK_ANSWER_BYTES, spec.url)
                return notify.Attempt(response.status)
        except ForbiddenAddress as exc:
            return notify.Attempt(403, str(exc))
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return notify.Attempt(None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
