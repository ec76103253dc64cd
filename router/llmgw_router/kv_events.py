"""Subscribe to the engines' KV-cache events (vLLM's `--kv-events-config` publisher, the sim's
`--kv-events-port`) and feed them to the precise prefix index.

One ZMQ SUB socket per endpoint whose snapshot entry names `kv_events`, started and stopped as snapshots come
and go. The address is resolved and checked against the forbidden-address rules, as every connection the
router opens is (egress.py), then connected to as the literal checked. A frame set is vLLM's
`[topic, seq (8 bytes big-endian), msgpack KVEventBatch]`; a sequence gap is logged (blocks in the gap are
missing until stored again: a match only under-counts), a batch that does not parse is counted and skipped.
The router subscribes rather than the agent because the router is who scores: the agent would only relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from urllib.parse import urlsplit

import msgpack
import zmq
import zmq.asyncio

from llmgw_router.egress import ForbiddenAddress, checked_addresses
from llmgw_router.prefix import EventIndex, parse_event_batch
from llmgw_router.state import RoutingTable

__all__ = ["kv_events_loop", "subscribe"]

log = logging.getLogger(__name__)
_RECONCILE_S = 1.0


async def _connect_address(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None:
        raise ValueError(f"kv_events {url!r} is not tcp://host:port")
    infos = await checked_addresses(asyncio.get_running_loop(), parts.hostname, parts.port)
    host = str(infos[0][4][0])
    return f"tcp://[{host}]:{parts.port}" if ":" in host else f"tcp://{host}:{parts.port}"


async def subscribe(
    ctx: zmq.asyncio.Context, endpoint: str, url: str, index: EventIndex, clock: Callable[[], float]
) -> None:
    """Read one endpoint's events into `index` until cancelled."""
    try:
        address = await _connect_address(url)
    except (ValueError, OSError, ForbiddenAddress) as exc:
        log.warning("endpoint %s: KV events at %s not subscribed: %s", endpoint, url, exc)
        return
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(address)
    last_seq: int | None = None
    try:
        while True:
            frames = await sock.recv_multipart()
            if len(frames) < 2:
                index.bad_batch(endpoint)
                continue
            seq = int.from_bytes(frames[-2], "big") if len(frames) >= 3 else None
            if seq is not None and last_seq is not None and seq != last_seq + 1:
                log.info("endpoint %s: KV events %d..%d missed", endpoint, last_seq + 1, seq - 1)
            last_seq = seq if seq is not None else last_seq
            try:
                _, events = parse_event_batch(msgpack.unpackb(frames[-1], raw=False))
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                index.bad_batch(endpoint)
                log.debug("endpoint %s: a KV event batch did not parse: %s", endpoint, exc)
                continue
            index.apply(endpoint, events, clock())
    finally:
        sock.close()


async def kv_events_loop(
    table: Callable[[], RoutingTable | None],
    index: EventIndex,
    clock: Callable[[], float],
    subscribed: dict[str, str] | None = None,
) -> None:
    """Keep one subscription per endpoint publishing KV events, as the snapshots say; `subscribed` is kept
    as the endpoints' current addresses (for the admin view and tests)."""
    subscribed = {} if subscribed is None else subscribed
    ctx = zmq.asyncio.Context()
    running: dict[tuple[str, str], asyncio.Task[None]] = {}
    try:
        while True:
            current = table()
            wanted = {
                (ep.id, ep.spec.kv_events)
                for ep in (current.all_endpoints() if current is not None else ())
                if ep.spec.kv_events
            }
            for key in [k for k in running if k not in wanted]:
                task = running.pop(key)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task  # its socket closed before a new one opens: no batch from the old address
                subscribed.pop(key[0], None)
            for key in wanted - running.keys():
                running[key] = asyncio.create_task(subscribe(ctx, key[0], key[1], index, clock))
                subscribed[key[0]] = key[1]
            await asyncio.sleep(_RECONCILE_S)
    finally:
        for task in running.values():
            task.cancel()
        for task in running.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        ctx.term()
