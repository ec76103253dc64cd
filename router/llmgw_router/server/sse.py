"""Server-sent events: the router's one reader and one writer of the wire format (the WHATWG HTML standard,
"Server-sent events", section 9.2.6).

An event is a run of lines ended by a blank line; a line ends in CRLF, LF or CR. `data:` lines are the event's
data (several are joined by LF), `event:` names it, `id:` identifies it, a line that starts with `:` is a comment
(a keep-alive), and one space after a field's colon is not part of its value. An engine's stream ends with the
event `data: [DONE]`.

`EventReader` cuts a stream into events as its bytes come, in whatever chunks: it hands back each complete event
as the bytes that came (so a proxy passes on what it need not change untouched) and keeps an incomplete one for
the next chunk. `parse` reads one event's fields; `format_event` writes one. Pure: bytes in, bytes out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DONE",
    "DONE_EVENT",
    "DONE_LINE",
    "Event",
    "EventReader",
    "could_start",
    "data_events",
    "format_event",
    "format_json",
    "parse",
    "split",
]

DONE = b"[DONE]"
DONE_EVENT = b"data: [DONE]\n\n"
DONE_LINE = b"data: [DONE]"  # in a block of whole events: the stream's end is among them

# A blank line: two line ends in a row, each CRLF, LF or CR (a CR followed by LF is one line end, not two).
_BLANK_LINE = re.compile(rb"(?:\r\n|\n|\r(?!\n))(?:\r\n|\n|\r(?!\n))")
_LINE_END = re.compile(rb"\r\n|\r|\n")


def _boundaries(buf: bytes) -> list[int]:
    """Where each complete event in `buf` ends (just after its blank line)."""
    if b"\r" not in buf:  # the common case, LF only: no pattern needed
        ends: list[int] = []
        i = buf.find(b"\n\n")
        while i >= 0:
            ends.append(i + 2)
            i = buf.find(b"\n\n", i + 2)
        return ends
    # A CR last in `buf` ends its line whatever follows; an LF that follows it in the next chunk (a CRLF cut in
    # two) then starts the next event as a blank line, which parse skips.
    return [m.end() for m in _BLANK_LINE.finditer(buf)]


class EventReader:
    """A stream cut into complete events across the chunks it comes in. `feed` returns each complete event's
    bytes as they came (its blank line included); `feed_block` returns every complete event in one piece (for
    a proxy that passes them on together: one call, no copy per event, on the path every streamed token takes);
    an incomplete event waits in `pending` for the next chunk."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self.pending + chunk if self.pending else chunk
        out: list[bytes] = []
        start = 0
        for end in _boundaries(buf):
            out.append(buf[start:end])
            start = end
        self.pending = buf[start:]
        return out

    def feed_block(self, chunk: bytes) -> bytes:
        buf = self.pending + chunk if self.pending else chunk
        if b"\r" not in buf:  # LF only (every engine's): the last blank line ends the block
            end = buf.rfind(b"\n\n") + 2
            if end == 1:
                self.pending = buf
                return b""
        else:
            ends = _boundaries(buf)
            end = ends[-1] if ends else 0
        self.pending = buf[end:]
        return buf[:end]

    def take_pending(self) -> bytes:
        """What came after the last complete event (a stream that ended without its blank line), now taken."""
        rest, self.pending = self.pending, b""
        return rest


def split(block: bytes) -> list[bytes]:
    """The events of a block that holds whole events (a stored stream, a chunk the proxy wrote); a trailing
    incomplete one is the last item."""
    if b"\r" not in block and block.find(b"\n\n") == len(block) - 2:
        return [block]  # one event (an engine's usage event, read alone): the common case, made cheap
    out: list[bytes] = []
    start = 0
    for end in _boundaries(block):
        out.append(block[start:end])
        start = end
    if block[start:].strip():
        out.append(block[start:])
    return out


@dataclass(slots=True)
class Event:
    """One event's fields: `data` None when it had no data line (a comment alone, a keep-alive)."""

    data: bytes | None = None
    name: bytes | None = None
    id: bytes | None = None

    @property
    def done(self) -> bool:
        """The `data: [DONE]` that ends an engine's stream."""
        return self.data is not None and self.data.strip() == DONE

    def json(self) -> Any:
        """The data read as JSON; None when there is none, it is `[DONE]`, or it is not JSON."""
        data = self.data
        if data is None or data.strip() == DONE:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None


def parse(raw: bytes) -> Event:
    """The fields of one event (as EventReader returns it). Comments and unknown fields are skipped."""
    if raw[:6] == b"data: " and raw.find(b"\n") == len(raw) - 2 and b"\r" not in raw:
        return Event(raw[6:-2])  # one data line: most events, read without the loop
    lines = _LINE_END.split(raw) if b"\r" in raw else raw.split(b"\n")
    event = Event()
    data: list[bytes] = []
    for line in lines:
        if not line or line[0] == 0x3A:  # blank, or a comment (":")
            continue
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            data.append(value)
        elif name == b"event":
            event.name = value
        elif name == b"id":
            event.id = value
    if data:
        event.data = b"\n".join(data)
    return event


_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")


def could_start(first: bytes) -> bool:
    """The first bytes of a stream start an event's field (or could, if the chunk is that short)."""
    head = first.lstrip()[:6]
    return not head or any(f.startswith(head) or head.startswith(f) for f in _FIELDS)


def data_events(block: bytes) -> int:
    """How many events with data a block of whole events holds, the closing `[DONE]` not counted: its `data:`
    lines that start a line (a value's own "data:" is inside a line, never at its start)."""
    lines = block.count(b"\ndata:") + block.startswith(b"data:")
    if b"\r" in block:
        lines += block.count(b"\rdata:")
    return lines - block.count(DONE_LINE)


def format_event(data: bytes, name: bytes | str | None = None, id: bytes | None = None) -> bytes:
    """One event's bytes: `event:` and `id:` when given, its data (one `data:` line per line), a blank line."""
    head = b""
    if name is not None:
        head = b"event: " + (name.encode() if isinstance(name, str) else name) + b"\n"
    if id is not None:
        head += b"id: " + id + b"\n"
    if b"\n" in data or b"\r" in data:
        data = b"\ndata: ".join(_LINE_END.split(data))
    return head + b"data: " + data + b"\n\n"


def format_json(obj: Any, name: bytes | str | None = None) -> bytes:
    """One event whose data is `obj` as JSON (one line: JSON escapes its line ends)."""
    return format_event(json.dumps(obj).encode(), name)
