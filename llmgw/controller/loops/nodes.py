"""The controller's node loop: bootstrap declared remote Nodes over SSH, tear down the ones removed.

The steps themselves live in `llmgw.adapters.ssh` (each looks before it acts); this module decides *when* to run them
and keeps what an operator needs to see per node (`NodeOps`, shown by the admin API, events and a metric):

- a remote Node (not `local: true`) in the applied revision with no live agent link is bootstrapped, several
  at once, each on its own; a failing node is retried after a jittered exponential backoff (never a hot loop);
- a node whose agent is connected is not touched; one that was up before this controller started gets the
  settle window to reconnect first;
- a Node removed from the repo is cordoned and marked leaving (views): the reconciler replaces its replicas
  elsewhere before it drains them (make-before-break); then its agent is stopped and removed over SSH
  (weights kept), its certificate revoked and its live link closed;
- only the leader acts (`Controller.leading()`); a standby shows what it knows and does nothing.

The decisions (`to_bootstrap`, `removal_step`) are pure; `NodesLoop` is the I/O shell around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from llmgw.adapters.secrets import SecretError
from llmgw.adapters.ssh import wheels
from llmgw.adapters.ssh.bootstrap import (
    BootstrapOptions,
    NodeResult,
    Step,
    TeardownOptions,
    bootstrap_node,
    teardown_node,
)
from llmgw.adapters.ssh.ca import CAError, ClusterCA
from llmgw.adapters.ssh.remote import SshTarget, StepFailed, target_for
from llmgw.adapters.ssh.render import Layout
from llmgw.controller.parts.background import Background
from llmgw.controller.parts.credentials import loopback_address
from llmgw.controller.parts.fleet import FleetActor
from llmgw.controller.parts.hub import AgentHub
from llmgw.controller.parts.settings import ControllerOptions
from llmgw.controller.parts.state import NodeOps
from llmgw.core.errors import Outage, TransientError, retry_after
from llmgw.core.reconcile import BackoffPolicy

if TYPE_CHECKING:
    from llmgw.controller.parts.desired import Desired
    from llmgw.core.desired.catalog import NodeEntry

log = logging.getLogger("llmgw.controller.nodes")

TICK_S = 1.0  # backoff ends and drains are noticed at least this often
RETRY_CAP_S = 300.0
DRAIN_GRACE_S = 30.0  # beyond drain_s + command_timeout_s: a drain that cannot finish does not block removal
# A removed node's replicas serve until their replacements elsewhere are ready (the reconciler's
# make-before-break); past this they are drained and stopped anyway (a replacement that never gets ready).
REPLACE_WAIT_S = 600.0

DrainNode = Callable[[str, str], Awaitable[int]]


@dataclass(frozen=True)
class LinkSeen:
    connected: bool
    state: str  # Ready, Unreachable, Lost


# ---------------------------------------------------------------------------------------------- decisions


def needs_bootstrap(link: LinkSeen | None) -> bool:
    """No agent ever connected here, or it went silent (Unreachable/Lost). A link that just dropped but is
    still Ready gets its heartbeat window to come back on its own (the supervisor restarts a crashed agent)."""
    return link is None or (not link.connected and link.state != "Ready")


def to_bootstrap(
    declared: Iterable[str],
    links: Mapping[str, LinkSeen],
    ops: Mapping[str, NodeOps],
    *,
    now: float,
    busy: Iterable[str],
    settling: Iterable[str] = (),
) -> list[str]:
    """The remote nodes to start a bootstrap attempt for now, sorted."""
    busy_set, settling_set = set(busy), set(settling)
    out: list[str] = []
    for name in sorted(declared):
        op = ops.get(name)
        if name in busy_set or name in settling_set or not needs_bootstrap(links.get(name)):
            continue
        if op is not None and op.retry_at is not None and now < op.retry_at:
            continue
        out.append(name)
    return out


def removal_step(
    op: NodeOps, replicas_left: int, *, now: float, drain_timeout: float, replace_wait: float = 0.0
) -> str:
    """`drain` (cordon it: the reconciler replaces its replicas elsewhere, then stops them), `force` (stop
    the ones left now: their replacements took longer than `replace_wait`), `teardown` (stop and remove the
    agent, once none is left or the stops had `drain_timeout`), or `wait`."""
    if op.removal is None:
        return "drain"
    if op.removal == "draining":
        started = op.drain_started if op.drain_started is not None else now
        if replicas_left == 0 or now - started >= replace_wait + drain_timeout:
            return "teardown"
        if now - started >= replace_wait and not op.forced:
            return "force"
    return "wait"


def retry_delay(failures: int, base: float, rng: random.Random) -> float:
    """Seconds before the next attempt of a node that failed `failures` times in a row (jittered, capped)."""
    return BackoffPolicy(base=base, cap=RETRY_CAP_S).delay(failures, rng)


def _summary(result: NodeResult) -> str:
    changed = [s.name for s in result.steps if s.status == "changed"]
    return "changed " + ", ".join(changed) if changed else "nothing to change"


def remote_link_problem(node: str, address: str, has_ca: bool, settings: ControllerOptions) -> str | None:
    """Why node `node` must not be bootstrapped to dial `address` as things are set, or None.

    Token only (no cluster CA) over a network, the node's token crosses it in clear and anyone on the path can
    play the controller and send `start_shard`: refused unless the operator asked for it by name."""
    if has_ca or loopback_address(address) or settings.insecure_token_only_remote_nodes:
        return None
    return (
        f"node {node}: the controller has no cluster CA, and its agent would dial {address} with a bearer token "
        "in clear (anyone on the path could read it and pose as the controller); give the controller a CA "
        "(ca_dir, created in STATE_DIR/ca by default when the repo declares remote Nodes) or, knowingly, set "
        "insecure_token_only_remote_nodes"
    )


def pin_identity(target: SshTarget) -> SshTarget:
    """The target with its key's text held in memory: a removed Node's key file may go with it, and teardown
    still has to log in."""
    if target.identity_file is None:
        return target
    try:
        text = target.identity_file.read_text(encoding="utf-8")
    except OSError:
        return target  # teardown then says the file is missing, in the usual words
    return dataclasses.replace(target, identity_file=None, identity_text=text)


# ---------------------------------------------------------------------------------------------- the loop


class NodeParts(FleetActor, Protocol):
    """What the nodes loop reads besides a FleetActor: the hub's own links (not a test's fake agents), the
    change listeners (a revision applied wakes it) and the node tokens it writes to and revokes from nodes."""

    @property
    def hub(self) -> AgentHub: ...

    @property
    def change_listeners(self) -> list[Callable[[], None]]: ...

    def node_token(self, node: str) -> str: ...

    def revoke_node_token(self, node: str) -> int: ...


class NodesLoop:
    """Runs until cancelled (`run`); `close()` ends the attempts in flight."""

    def __init__(
        self,
        controller: NodeParts,
        drain_node: DrainNode,
        *,
        rng: random.Random | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.c = controller
        self.drain_node = drain_node
        self.rng = rng or random.Random()
        self.env = environ if environ is not None else os.environ
        self.background = Background("node")  # one bootstrap or teardown per node at a time
        self.tasks = self.background.named  # node -> its attempt in flight
        self.wake = asyncio.Event()
        # Remote nodes declared in a revision this controller applied, to reach them once they are removed.
        self.known: dict[str, SshTarget] = {}
        self._remembered: str | None = None  # the revision whose nodes `known` holds
        self._house: wheels.Wheelhouse | None = None
        self._house_lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(controller.settings.bootstrap_concurrency)
        controller.change_listeners.append(self.wake.set)

    async def run(self) -> None:
        failing = Outage(log, "a node bootstrap pass")
        while True:
            wait = TICK_S
            try:
                await self.pass_once()
                failing.recovered()
            except TransientError as exc:  # the store did not answer: retried when the raiser says
                wait = retry_after(exc, default=TICK_S, most=RETRY_CAP_S)
                failing.failed(exc, wait)
            except Exception as exc:  # a bug in one pass must not end bootstrapping; the next starts afresh
                failing.failed(exc, wait)
            await self._wait_for_wake(wait)

    async def _wait_for_wake(self, seconds: float) -> None:
        """Until a change (a heartbeat, a revision) wakes the loop, at most `seconds`."""
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that arrives as the event is
        # set (it is set on every heartbeat), and the app's shutdown would wait for this task forever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.wake.wait()
        self.wake.clear()

    async def close(self) -> None:
        await self.background.close()
        with contextlib.suppress(ValueError):
            self.c.change_listeners.remove(self.wake.set)

    async def pass_once(self) -> None:
        c = self.c
        d = c.desired
        if d is None or not c.settings.bootstrap_nodes:
            return
        if not c.leading():
            self._stand_down()
            return
        now = c.clock()
        remote = {n: e for n, e in d.catalog.nodes.items() if not e.spec.local}
        self._remember(d, remote)
        links = {n: LinkSeen(link.connected, link.state) for n, link in c.hub.nodes.items()}
        for name in remote:
            op = c.fleet.nodes.ops_for(name)
            if op.removal is not None:  # declared again: it is wanted after all
                op.removal, op.removal_message, op.drain_started = None, "", None
            link = links.get(name)
            if link is not None and link.connected and name not in self.tasks and op.state != "done":
                op.state, op.failures, op.retry_at = "done", 0, None
                op.message = op.message if op.attempts else "agent connected"
        ws = c.fleet.worker_state
        settling = ws.expected_nodes if now < ws.settle_until else set()
        # A node being upgraded restarts its agent on purpose: a bootstrap then would pip into the venv the
        # upgrade just switched to and race its rollback.
        busy = set(self.tasks) | {n for n, op in c.fleet.nodes.all_ops().items() if op.upgrading}
        for name in to_bootstrap(
            remote, links, c.fleet.nodes.all_ops(), now=now, busy=busy, settling=settling
        ):
            self._spawn(name, functools.partial(self._bootstrap, name))
        for name in sorted(set(self.known) - set(remote)):
            await self._advance_removal(name, now)

    def _stand_down(self) -> None:
        """No longer the leader: the new leader does the SSH work; two controllers must not act on one node."""
        for name, task in list(self.tasks.items()):
            task.cancel()
            op = self.c.fleet.nodes.ops(name)
            if op is not None and op.removal is None:
                op.state, op.message = "pending", "left to the leader"

    def _remember(self, d: Desired, remote: Mapping[str, NodeEntry]) -> None:
        if d.revision == self._remembered:
            return
        self._remembered = d.revision
        for name, entry in remote.items():
            # A problem here (identity variable unset) is reported by the node's bootstrap attempt.
            with contextlib.suppress(StepFailed):
                self.known[name] = pin_identity(
                    target_for(entry.document(), d.root, self.env, secrets=self.c.settings.secret_policy())
                )

    def _spawn(self, name: str, work: Callable[[], Awaitable[None]]) -> None:
        # The coroutine is made inside the task, so a task cancelled before it ran leaves none unawaited.
        async def wrapped() -> None:
            try:
                await work()
            finally:
                self.tasks.pop(name, None)
                self.wake.set()

        self.background.spawn(wrapped(), key=name)

    # ------------------------------------------------------------------------------------------ bootstrap

    def _on_step(self, node: str, step: Step) -> None:
        op = self.c.fleet.nodes.ops(node)
        if op is None:
            return
        op.step = step.name
        op.message = (
            step.detail
            if step.status == "failed"
            else f"{step.name}: {step.status}" + (f" ({step.detail})" if step.detail else "")
        )

    async def _bootstrap(self, name: str) -> None:
        c = self.c
        op = c.fleet.nodes.ops_for(name)
        op.state, op.step, op.message = "pending", "", "waiting for a free bootstrap slot"
        async with self._slots:
            d = c.desired
            entry = d.catalog.nodes.get(name) if d is not None else None
            if d is None or entry is None or entry.spec.local:
                return
            op.state, op.attempts, op.retry_at = "running", op.attempts + 1, None
            op.message = "connecting"
            result: NodeResult | None = None
            try:
                target = target_for(
                    entry.document(), d.root, self.env, secrets=self.c.settings.secret_policy()
                )
                op.message = f"connecting to {target.where}"
                opts = await self._options(d, name, entry)
                await c.event("node_bootstrap", name, f"attempt {op.attempts} over ssh {target.where}")
                result = await bootstrap_node(target, opts)
                failure, step = (
                    result.failure,
                    next((s.name for s in result.steps if s.status == "failed"), ""),
                )
            except (StepFailed, wheels.WheelhouseError, SecretError, CAError) as exc:
                failure, step = str(exc), "prepare"
            except Exception as exc:  # a bug must fail this node's attempt, not the loop or other nodes
                log.exception("bootstrap of node %s failed unexpectedly", name)
                failure, step = f"{type(exc).__name__}: {exc}", op.step or "prepare"
        if failure is None and result is not None:
            op.state, op.failures, op.retry_at = "done", 0, None
            op.step, op.message = "register", f"joined: {_summary(result)}"
            log.info("node %s bootstrapped: %s", name, _summary(result))
            await c.event("node_joined", name, op.message)
            return
        op.failures += 1
        delay = retry_delay(op.failures, c.settings.bootstrap_backoff_s, self.rng)
        op.state, op.step, op.message = "failed", step, failure or "failed"
        op.retry_at = c.clock() + delay
        log.warning(
            "bootstrap of node %s failed at %s: %s; next attempt in %.0fs", name, step, failure, delay
        )
        await c.event("node_bootstrap_failed", name, f"{step}: {failure}; next attempt in {delay:.0f}s")

    async def _options(self, d: Desired, name: str, entry: NodeEntry) -> BootstrapOptions:
        c = self.c
        s = c.settings
        ca = ClusterCA.open(s.ca_dir, create=False) if s.ca_dir is not None else None
        problem = remote_link_problem(name, d.cluster.controller.address, ca is not None, s)
        if problem is not None:
            raise StepFailed(problem)
        # The node's own token (never the Cluster's shared one): it opens the hub for this node name only.
        token = c.node_token(name)
        hub = c.hub

        async def registered(node: str, since: float) -> bool:
            link = hub.nodes.get(node)
            return link is not None and link.connected and link.connected_at >= since

        return BootstrapOptions(
            controllers=(d.cluster.controller.address,),
            wheelhouse=await self._wheelhouse(),
            registered=registered,
            ca=ca,
            token=token,
            layout=Layout(prefix=s.node_prefix),
            service=s.node_service,
            register_timeout=s.node_register_timeout_s,
            labels={name: dict(entry.labels)},
            metrics_listen={name: m} if (m := entry.spec.agent.metrics_listen) else {},
            engines={e: {"path": v.path, "version": v.version} for e, v in d.cluster.engines.items()},
            on_step=self._on_step,
        )

    async def _wheelhouse(self) -> wheels.Wheelhouse:
        """Built once per controller (in a thread: pip takes seconds), or the prebuilt one the settings name."""
        async with self._house_lock:
            if self._house is None:
                s = self.c.settings
                if s.wheelhouse is not None:
                    self._house = await asyncio.to_thread(wheels.load, s.wheelhouse)
                else:
                    self._house = await asyncio.to_thread(wheels.build, s.state_dir / "wheelhouse")
            return self._house

    # ------------------------------------------------------------------------------------------ removal

    async def _advance_removal(self, name: str, now: float) -> None:
        c = self.c
        op = c.fleet.nodes.ops_for(name)
        left = sum(1 for r in c.fleet.replicas.values() if name in r.nodes)
        timeout = c.settings.drain_s + c.settings.command_timeout_s + DRAIN_GRACE_S
        step = removal_step(op, left, now=now, drain_timeout=timeout, replace_wait=REPLACE_WAIT_S)
        if step == "drain":
            task = self.tasks.get(name)
            if task is not None:  # a bootstrap of a node no longer wanted
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            op.removal, op.drain_started, op.forced = "draining", now, False
            # The views cordon it and mark it leaving from now on: the reconciler places replacements
            # elsewhere and stops each replica here once they are ready (make-before-break).
            c.notify("node removed")
            op.removal_message = (
                f"{left} replica(s) replaced elsewhere first, then drained and stopped"
                if left
                else "no replicas to drain"
            )
            await c.event("node_removing", name, f"removed from the repo; {op.removal_message}")
        elif step == "force":
            op.forced = True
            drained = await self.drain_node(name, "node removed from the repo; replacement not ready in time")
            op.removal_message = f"draining {drained} replica(s) whose replacements were not ready in time"
            log.warning("removing node %s: %s", name, op.removal_message)
        elif step == "teardown":
            op.removal, op.removal_message = "removing", "stopping and removing the agent over ssh"
            self._spawn(name, functools.partial(self._teardown, name, left))

    async def _teardown(self, name: str, left: int) -> None:
        c = self.c
        op = c.fleet.nodes.ops_for(name)
        target = self.known[name]
        s = c.settings
        try:
            ca = ClusterCA.open(s.ca_dir, create=False) if s.ca_dir is not None else None
        except CAError as exc:
            ca = None
            log.warning("cannot open the cluster CA to revoke %s's certificate: %s", name, exc)
        result = await teardown_node(target, TeardownOptions(layout=Layout(prefix=s.node_prefix), ca=ca))
        # Whether or not the machine could be reached: the token it holds must not open the hub again.
        generation = c.revoke_node_token(name)
        log.info("node %s: token of generation %d revoked", name, generation - 1)
        await self._close_link(name)
        self.known.pop(name, None)
        revoked = any(st.name == "revoke" and st.status == "changed" for st in result.steps)
        tail = "; node token revoked" + ("; certificate revoked" if revoked else "")
        if left:
            tail += f"; {left} replica(s) had not drained in time"
        if result.ok:
            op.removal = "done"
            op.removal_message = f"agent stopped and removed, weights kept{tail}"
            await c.event("node_removed", name, op.removal_message)
        else:
            op.removal = "failed"
            op.removal_message = f"{result.failure}{tail}; remove the agent by hand or run teardown again"
            log.warning("removing node %s: %s", name, op.removal_message)
            await c.event("node_remove_failed", name, op.removal_message)
        c.notify("node removed")

    async def _close_link(self, name: str) -> None:
        """A revoked certificate is checked only when an agent connects: close a link still open."""
        hub = self.c.hub
        link = hub.nodes.get(name)
        if link is None:
            return
        if link.ws is not None and not link.ws.closed:
            with contextlib.suppress(Exception):
                await link.ws.close()
        if hub.nodes.get(name) is link:
            del hub.nodes[name]
