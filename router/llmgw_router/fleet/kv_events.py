"""Read the engines' KV-cache events (vLLM's `--kv-events-config` publisher, the sim's `--kv-events-port`)
through each replica's relay and feed them to the precise prefix index.

Publishers bind 127.0.0.1 only: they have no authentication and the events carry every prompt's token ids
(docs/security.md, H8). The agent's pass-through relays them at the URL a snapshot entry names in `kv_events`
(`http://host:port/llmgw/kv-events`), behind the same engine key as every request (`api_key`). One streaming GET
per endpoint, started and stopped as snapshots come and go, through the router's checked connector (egress.py)
and never following a redirect; a stream that ends, fails or goes quiet past three relay heartbeats is opened
again after a pause that grows to _BACKOFF_MAX_S.

The stream is records (agent's kv_relay.py): a 4-byte big-endian length, then the message's parts, each a 4-byte
length and its bytes; length 0 is a heartbeat. A record over MAX_RECORD_BYTES is refused from its length alone,
before a byte of it is read, and the connection dropped. A message is vLLM's `[topic, seq (8 bytes
big-endian), msgpack KVEventBatch]`; a sequence gap is logged (blocks in the gap are missing until stored again:
a match only under-counts), a batch that does not parse is counted and skipped. The router reads the events itself
because the router is who scores: the agent only relays them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp
import msgpack

from llmgw.core.errors import LlmgwError
from llmgw_router.decisions.prefix import EventIndex, parse_event_batch
from llmgw_router.fleet.table import RoutingTable
from llmgw_router.upstream.egress import client_connector

__all__ = [
    "MAX_RECORD_BYTES",
    "BadRecord",
    "EventStreamError",
    "kv_events_loop",
    "read_record",
    "split_parts",
    "subscribe",
]

log = logging.getLogger(__name__)
_RECONCILE_S = 1.0
# The relay's own cap (8 MiB per message) plus the parts' length prefixes.
MAX_RECORD_BYTES = 8 * 1024 * 1024 + 64
_IDLE_S = 35.0  # the relay sends a heartbeat after 10 s without events: three missed is a dead connection
_BACKOFF_MIN_S = 1.0
_BACKOFF_MAX_S = 15.0


class EventStreamError(LlmgwError):
    """A replica's KV-event stream cannot be read on (refused, cut, quiet): it is opened again later."""


class BadRecord(EventStreamError):
    """A record over the cap or whose parts do not add up: counted as a bad batch, and the stream dropped."""


class _Backoff:
    """The pause before a stream is opened again: doubling from _BACKOFF_MIN_S, back to it once one opens."""

    def __init__(self) -> None:
        self.delay = _BACKOFF_MIN_S

    def opened(self) -> None:
        self.delay = _BACKOFF_MIN_S

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, _BACKOFF_MAX_S)
        return delay


def split_parts(body: bytes) -> list[bytes]:
    """A record's body as its message parts (each a 4-byte big-endian length and its bytes)."""
    parts: list[bytes] = []
    at = 0
    while at < len(body):
        if at + 4 > len(body):
            raise BadRecord(f"a record's part length is cut at byte {at} of {len(body)}")
        size = int.from_bytes(body[at : at + 4], "big")
        at += 4
        if at + size > len(body):
            raise BadRecord(f"a record's part of {size} bytes runs past its end ({len(body)} bytes)")
        parts.append(body[at : at + size])
        at += size
    return parts


async def read_record(content: aiohttp.StreamReader, limit: int = MAX_RECORD_BYTES) -> list[bytes] | None:
    """The next record's parts, None for a heartbeat; EventStreamError for a record over `limit`, refused before
    its body is read, or a stream that ends."""
    try:
        size = int.from_bytes(await content.readexactly(4), "big")
        if size > limit:
            raise BadRecord(f"a record of {size} bytes, over the cap of {limit}")
        return split_parts(await content.readexactly(size)) if size else None
    except asyncio.IncompleteReadError as exc:
        raise EventStreamError("the stream ended") from exc


def _url_problem(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "not an http(s) URL of a replica's relay (a publisher's tcp:// address is never subscribed to)"
    return None


async def subscribe(
    session: aiohttp.ClientSession,
    endpoint: str,
    url: str,
    api_key: str | None,
    index: EventIndex,
    clock: Callable[[], float],
) -> None:
    """Read one endpoint's events into `index` until cancelled, opening the stream again when it ends."""
    if (problem := _url_problem(url)) is not None:
        log.warning("endpoint %s: KV events at %s not read: %s", endpoint, url, problem)
        return
    backoff = _Backoff()
    while True:
        try:
            await _read_stream(session, (endpoint, url, api_key), backoff, index, clock)
        except BadRecord as exc:
            index.bad_batch(endpoint)
            log.warning("endpoint %s: KV events at %s: %s: stream dropped", endpoint, url, exc)
        except EventStreamError as exc:
            log.warning("endpoint %s: KV events at %s: %s", endpoint, url, exc)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.info("endpoint %s: KV events at %s unreachable: %r", endpoint, url, exc)
        await asyncio.sleep(backoff.next())


async def _read_stream(
    session: aiohttp.ClientSession,
    source: tuple[str, str, str | None],
    backoff: _Backoff,
    index: EventIndex,
    clock: Callable[[], float],
) -> None:
    endpoint, url, api_key = source
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=_IDLE_S)
    async with session.get(url, headers=headers, timeout=timeout, allow_redirects=False) as resp:
        if resp.status != 200:
            refused = " (the engine key was refused)" if resp.status == 401 else ""
            raise EventStreamError(f"the relay answered {resp.status}{refused}")
        backoff.opened()
        last_seq: int | None = None
        while True:
            parts = await read_record(resp.content)
            if parts is not None:
                last_seq = _apply(endpoint, parts, last_seq, index, clock)


def _apply(
    endpoint: str, frames: list[bytes], last_seq: int | None, index: EventIndex, clock: Callable[[], float]
) -> int | None:
    """Apply one message to the index; the sequence number it carried (or the last one, if none)."""
    if len(frames) < 2:
        index.bad_batch(endpoint)
        return last_seq
    seq = int.from_bytes(frames[-2], "big") if len(frames) >= 3 else None
    if seq is not None and last_seq is not None and seq != last_seq + 1:
        log.info("endpoint %s: KV events %d..%d missed", endpoint, last_seq + 1, seq - 1)
    try:
        _, events = parse_event_batch(msgpack.unpackb(frames[-1], raw=False))
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        index.bad_batch(endpoint)
        log.debug("endpoint %s: a KV event batch did not parse: %s", endpoint, exc)
    else:
        index.apply(endpoint, events, clock())
    return seq if seq is not None else last_seq


def _relayed(table: RoutingTable | None) -> set[tuple[str, str, str | None]]:
    """(endpoint, relay URL, engine key) of every endpoint whose snapshot entry names a relay."""
    endpoints = table.all_endpoints() if table is not None else ()
    return {(ep.id, ep.spec.kv_events, ep.spec.api_key) for ep in endpoints if ep.spec.kv_events is not None}


async def kv_events_loop(
    table: Callable[[], RoutingTable | None],
    index: EventIndex,
    clock: Callable[[], float],
    subscribed: dict[str, str] | None = None,
) -> None:
    """Keep one stream per endpoint relaying KV events, as the snapshots say; `subscribed` is kept as the
    endpoints' current relay URLs (for the admin view and tests)."""
    subscribed = {} if subscribed is None else subscribed
    running: dict[tuple[str, str, str | None], asyncio.Task[None]] = {}
    async with aiohttp.ClientSession(connector=client_connector(), auto_decompress=False) as session:
        try:
            while True:
                current = table()
                wanted = _relayed(current)
                for key in [k for k in running if k not in wanted]:
                    task = running.pop(key)
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task  # its stream closed before a new one opens: no batch from the old address
                    subscribed.pop(key[0], None)
                for key in wanted - running.keys():
                    endpoint, url, api_key = key
                    running[key] = asyncio.create_task(
                        subscribe(session, endpoint, url, api_key, index, clock)
                    )
                    subscribed[endpoint] = url
                await asyncio.sleep(_RECONCILE_S)
        finally:
            for task in running.values():
                task.cancel()
            for task in running.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await task
