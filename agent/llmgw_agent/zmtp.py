"""A ZMTP 3.0 subscriber for one publisher on this host: how the KV-event relay (kv_relay.py) reads an engine's
KV-cache events.

vLLM's publisher is a ZMQ PUB socket speaking ZMTP 3 with the NULL mechanism (no authentication: why it is bound
to 127.0.0.1 and read only here). The agent's node install carries no pyzmq (its dependencies are aiohttp and
pydantic on purpose), and the part of the protocol a subscriber needs is small: a 64-byte greeting each way, a
READY command each way, one subscription message, then frames. Reading the frames ourselves also checks each
one's size from its header, before a byte of its body is read: a message over the cap ends the connection, as
ZMQ_MAXMSGSIZE would, and is never buffered.

The greeting announces version 3.0, so a libzmq 4.x publisher speaks 3.0 back: subscriptions are messages
whose first byte is 1 (not 3.1's SUBSCRIBE command), and no heartbeat commands are sent (3.1 only).
"""

from __future__ import annotations

import asyncio
import struct

__all__ = ["LocalSubscriber", "PublisherError"]

# signature (0xFF, 8 padding bytes, 0x7F), version 3.0, mechanism NULL (20 bytes), as-server 0, 31 filler bytes
_GREETING = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + bytes(32)
_MORE, _LONG, _COMMAND = 0x01, 0x02, 0x04
_MAX_COMMAND_BYTES = 4096  # a READY with its properties is a few dozen bytes
_READY_SUB = b"\x05READY" + b"\x0bSocket-Type" + struct.pack("!I", 3) + b"SUB"
_PUBLISHER_TYPES = (b"PUB", b"XPUB")


class PublisherError(Exception):
    """The publisher's stream cannot be read on: closed, not ZMTP 3, or a message over the cap."""


class LocalSubscriber:
    """One SUB connection to a publisher, subscribed to every topic: `message()` returns each message's parts."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_message_bytes: int
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._max = max_message_bytes

    @classmethod
    async def connect(
        cls, host: str, port: int, max_message_bytes: int, timeout_s: float = 5.0
    ) -> LocalSubscriber:
        """Connect, exchange greeting and READY, and subscribe; raises OSError or PublisherError."""
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
        sub = cls(reader, writer, max_message_bytes)
        try:
            await asyncio.wait_for(sub._handshake(), timeout_s)
        except TimeoutError as exc:
            sub.close()
            raise PublisherError(
                f"{host}:{port} did not complete a ZMTP handshake in {timeout_s:g}s"
            ) from exc
        except BaseException:
            sub.close()
            raise
        return sub

    async def _handshake(self) -> None:
        self._writer.write(_GREETING)
        peer = await self._read(64)
        if peer[0] != 0xFF or peer[9] != 0x7F or peer[10] < 3:
            raise PublisherError("the peer does not speak ZMTP 3 (is this a ZMQ publisher?)")
        mechanism = peer[12:32].rstrip(b"\0")
        if mechanism != b"NULL":
            raise PublisherError(f"the publisher asks for the {mechanism.decode(errors='replace')} mechanism")
        self._writer.write(bytes([_COMMAND, len(_READY_SUB)]) + _READY_SUB)
        flags, size = await self._frame_head()
        if not flags & _COMMAND or size > _MAX_COMMAND_BYTES:
            raise PublisherError("the publisher sent no READY command")
        ready = await self._read(size)
        if not ready.startswith(b"\x05READY") or _socket_type(ready[6:]) not in _PUBLISHER_TYPES:
            raise PublisherError(f"the peer is not a publisher (READY {ready[:64]!r})")
        # a one-byte message: subscribe (1) to every topic (the empty prefix)
        self._writer.write(bytes([0, 1, 1]))
        await self._writer.drain()

    async def message(self) -> list[bytes]:
        """The next message's parts; PublisherError when the stream ends or the message exceeds the cap."""
        parts: list[bytes] = []
        total = 0
        while True:
            flags, size = await self._frame_head()
            if flags & _COMMAND:  # none is expected after READY on 3.0; skipped, bounded
                if size > _MAX_COMMAND_BYTES:
                    raise PublisherError(f"a command of {size} bytes")
                await self._read(size)
                continue
            total += size
            if total > self._max:
                raise PublisherError(f"a message of more than {self._max} bytes (this frame: {size})")
            parts.append(await self._read(size))
            if not flags & _MORE:
                return parts

    def close(self) -> None:
        self._writer.close()

    async def _frame_head(self) -> tuple[int, int]:
        flags = (await self._read(1))[0]
        if flags & _LONG:
            (size,) = struct.unpack("!Q", await self._read(8))
        else:
            size = (await self._read(1))[0]
        return flags, size

    async def _read(self, n: int) -> bytes:
        try:
            return await self._reader.readexactly(n)
        except asyncio.IncompleteReadError as exc:
            raise PublisherError("the publisher closed the connection") from exc
        except OSError as exc:
            raise PublisherError(f"the publisher's connection failed: {exc}") from exc


def _socket_type(properties: bytes) -> bytes | None:
    """The Socket-Type property of a READY command's metadata (name length byte, name, u32 length, value)."""
    at = 0
    while at < len(properties):
        name_len = properties[at]
        name = properties[at + 1 : at + 1 + name_len]
        at += 1 + name_len
        if at + 4 > len(properties):
            return None
        (value_len,) = struct.unpack("!I", properties[at : at + 4])
        value = properties[at + 4 : at + 4 + value_len]
        at += 4 + value_len
        if name.lower() == b"socket-type":
            return value
    return None
