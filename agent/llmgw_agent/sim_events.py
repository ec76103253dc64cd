"""The sim engine's KV-cache event publisher, in vLLM's wire format (`--kv-events-config` with the zmq
publisher): a ZMQ PUB socket sending `[topic, seq (8 bytes big-endian), msgpack KVEventBatch]` per change.

KVEventBatch is `[ts, [event, ...]]` (msgspec array-like structs with their defaults omitted), the events
tagged by class name: `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size]`,
`["BlockRemoved", block_hashes]`, `["AllBlocksCleared"]`; hashes are the 8-byte integers vLLM sends with
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (its default). The socket binds to 127.0.0.1 unless told otherwise, as
the agent runs vLLM's: the events carry every prompt's token ids, and routers read them through the
pass-through's key check (kv_relay.py). pyzmq and msgpack are imported only when the publisher is asked for
(the agent's `kv-events` extra).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from llmgw_agent.sim_model import CacheChange

__all__ = ["KvEventPublisher", "batch_events"]


def batch_events(change: CacheChange | None, block_size: int, cleared: bool = False) -> list[list[Any]]:
    """The events of one change, in the order they happened."""
    events: list[list[Any]] = [["AllBlocksCleared"]] if cleared else []
    if change is not None:
        # one BlockStored per run of blocks chained to each other, as vLLM sends a request's new blocks
        run: list[tuple[int, int | None, list[int]]] = []
        for block in change.stored:
            if run and block[1] != run[-1][0]:
                events.append(_stored(run, block_size))
                run = []
            run.append(block)
        if run:
            events.append(_stored(run, block_size))
        if change.removed:
            events.append(["BlockRemoved", list(change.removed)])
    return events


def _stored(run: list[tuple[int, int | None, list[int]]], block_size: int) -> list[Any]:
    tokens = [t for _, _, block in run for t in block]
    return ["BlockStored", [h for h, _, _ in run], run[0][1], tokens, block_size]


class KvEventPublisher:
    def __init__(self, host: str, port: int, topic: str = "") -> None:
        import msgpack
        import zmq

        self._pack = msgpack.packb
        self._zmq = zmq
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        address = f"[{host}]" if ":" in host else host
        self._sock.bind(f"tcp://{address}:{port}")
        self._topic = topic.encode()
        self._seq = 0

    def publish(self, events: list[list[Any]]) -> None:
        if not events:
            return
        payload = self._pack([time.time(), events])
        frames = [self._topic, self._seq.to_bytes(8, "big"), payload]
        self._seq += 1
        # a PUB socket drops at its high-water mark rather than block; never stall serving for it
        with contextlib.suppress(self._zmq.Again):
            self._sock.send_multipart(frames, flags=self._zmq.NOBLOCK)

    def close(self) -> None:
        self._sock.close()
        self._ctx.term()
