"""The agent's log ring: every engine's output and the agent's own log lines, bounded, redacted, in memory.

Engines write to a file in their work directory (a pipe would kill them with SIGPIPE once the agent is gone, see
supervisor.py), so each running shard has an `OutputTail` that reads what was appended since it last looked,
redacts each line with the shard's redactor and puts it in the ring stamped with the time the agent read it. The
agent's own records reach the ring through `RingHandler`.

Bounded twice: at most `max_lines` lines and `max_bytes` of text (each line counted with a fixed overhead, so a
flood of empty lines is bounded too); the oldest go first. A line longer than `MAX_LINE_BYTES` is cut and says so.
Every line has a sequence number, counted from 1 since the agent started, and the agent's `boot` id, so a reader
that comes back with a cursor from an earlier agent process starts from the new process's first line instead of
skipping it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

DEFAULT_MAX_LINES = 20_000
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
MAX_LINE_BYTES = 4096
LINE_OVERHEAD = 64  # bytes charged per line besides its text: the record, its time and source
MAX_PAGE = 1000  # lines one query returns at most (a reply is one WebSocket message)
AGENT_SOURCE = "agent"


@dataclass(frozen=True)
class LogLine:
    seq: int
    time: float
    source: str  # the engine's replica id, or "agent"
    shard: int | None  # the engine's shard rank; None for the agent's own lines
    text: str

    def json(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "time": self.time,
            "source": self.source,
            "shard": self.shard,
            "text": self.text,
        }


@dataclass(frozen=True)
class LogPage:
    lines: list[LogLine]
    next_after: int  # the cursor to pass as `after` for what comes next
    more: bool  # lines past `next_after` already match (fetch again at once)
    missed: int  # lines the reader's cursor pointed at that the ring had already dropped


class LogRing:
    def __init__(
        self,
        max_lines: int = DEFAULT_MAX_LINES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_lines < 1 or max_bytes < LINE_OVERHEAD + MAX_LINE_BYTES:
            raise ValueError(
                f"a log ring needs max_lines >= 1 and max_bytes >= {LINE_OVERHEAD + MAX_LINE_BYTES}"
            )
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.boot = secrets.token_hex(6)
        self._clock = clock
        self._lines: deque[LogLine] = deque()
        self._bytes = 0
        self._seq = 0
        self._mutex = threading.Lock()  # the agent logs from worker threads too (inventory, weights)
        self._grew = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None  # set by the first follower: where to wake it

    @property
    def last_seq(self) -> int:
        return self._seq

    @property
    def first_seq(self) -> int:
        return self._lines[0].seq if self._lines else self._seq + 1

    def append(self, source: str, text: str, shard: int | None = None) -> LogLine:
        raw = text.encode("utf-8", "replace")
        if len(raw) > MAX_LINE_BYTES:
            text = raw[: MAX_LINE_BYTES - 40].decode("utf-8", "ignore") + f" [cut: {len(raw)} bytes]"
        with self._mutex:
            self._seq += 1
            line = LogLine(self._seq, self._clock(), source, shard, text)
            self._lines.append(line)
            self._bytes += _cost(line)
            while len(self._lines) > self.max_lines or self._bytes > self.max_bytes:
                self._bytes -= _cost(self._lines.popleft())
        self._wake()
        return line

    def _wake(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._grew.set()
        else:  # asyncio.Event is not thread-safe: hand the wake-up to the follower's loop
            loop.call_soon_threadsafe(self._grew.set)

    def query(
        self,
        *,
        after: int | None = None,
        since: float | None = None,
        grep: re.Pattern[str] | None = None,
        source: str | None = None,
        shard: int | None = None,
        limit: int = 200,
    ) -> LogPage:
        """After a cursor (oldest first), else from a time on (oldest first), else the newest `limit` lines."""
        limit = max(1, min(limit, MAX_PAGE))

        def wanted(line: LogLine) -> bool:
            return (
                (source is None or line.source == source)
                and (shard is None or line.shard == shard)
                and (since is None or line.time >= since)
                and (grep is None or grep.search(line.text) is not None)
            )

        with self._mutex:
            lines, last = list(self._lines), self._seq
        if after is None and since is None:
            tail = list(islice((line for line in reversed(lines) if wanted(line)), limit))
            return LogPage(tail[::-1], last, False, 0)
        start = 0 if after is None else after
        first = lines[0].seq if lines else last + 1
        missed = max(0, first - 1 - start) if after is not None else 0
        found: list[LogLine] = []
        for line in lines:
            if line.seq <= start or not wanted(line):
                continue
            if len(found) == limit:
                return LogPage(found, found[-1].seq, True, missed)
            found.append(line)
        return LogPage(found, last, False, missed)

    def tail(self, source: str, shard: int | None, count: int) -> list[str]:
        return [line.text for line in self.query(source=source, shard=shard, limit=count).lines]

    async def wait_past(self, seq: int, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for a line after `seq`; whether one came."""
        self._loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout_s
        while self._seq <= seq:
            self._grew.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._grew.wait(), left)
            except TimeoutError:
                return self._seq > seq
        return True


def _cost(line: LogLine) -> int:
    return len(line.text) + len(line.source) + LINE_OVERHEAD


class OutputTail:
    """Follows one engine's output file into the ring: what was appended since the last `drain`."""

    def __init__(
        self,
        ring: LogRing,
        path: Path,
        source: str,
        shard: int,
        redact: Callable[[str], str],
        *,
        from_end: bool = False,
    ) -> None:
        self.ring, self.path, self.source, self.shard, self.redact = ring, path, source, shard, redact
        self._offset = _size(path) if from_end else 0
        self._partial = b""

    def drain(self, *, final: bool = False) -> int:
        """Read what is new; `final` also takes a last line that has no newline yet. Returns lines added."""
        size = _size(self.path)
        if size < self._offset:  # the file was replaced (a restart of the same shard): read it from the start
            self._offset, self._partial = 0, b""
        if size == self._offset and not (final and self._partial):
            return 0
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read(size - self._offset)
        except OSError:
            return 0
        self._offset += len(data)
        chunks = (self._partial + data).split(b"\n")
        self._partial = chunks.pop()
        if (final and self._partial) or len(self._partial) > MAX_LINE_BYTES:
            chunks.append(self._partial)
            self._partial = b""
        for chunk in chunks:
            text = chunk.decode("utf-8", "replace").rstrip("\r")
            self.ring.append(self.source, self.redact(text), self.shard)
        return len(chunks)


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


class RingHandler(logging.Handler):
    """The agent's own log records into the ring, redacted (bearer tokens, secret-looking values)."""

    def __init__(self, ring: LogRing, redact: Callable[[str], str]) -> None:
        super().__init__()
        self.ring = ring
        self.redact = redact
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # a bad format string must not break the caller's log call
            self.handleError(record)
            return
        for part in text.splitlines() or [""]:
            self.ring.append(AGENT_SOURCE, self.redact(part))
