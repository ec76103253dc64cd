"""A router's usage records on local disk until the store has them: append-only segments of JSON lines.

Why: the writer batches records in memory, so a router killed with SIGKILL (or by the OOM killer) lost up to
one flush interval of usage, and up to `max_pending` records during a store outage. Now every record is
written to the current segment before the event loop goes back to waiting for I/O: the writer's `record()`
buffers the line and the records of one step of the loop go out in one write(2) at its end (`append`
writes at once, for callers outside a loop):

* the process dying loses nothing recorded before the loop's current step (the kernel has the bytes);
* the machine dying loses at most what was written since the last fsync: the writer fsyncs the segment
  before each batch goes to the store, i.e. at least once per flush interval while records arrive.

Segments rotate at each flush; a closed segment is deleted once every record in it is in the store. At start
the segments left behind are read back and written first. Inserts are idempotent (a record's id is the
primary key), so a record already in the store when the router died is not counted twice. One router owns a
spool directory at a time (an exclusive lock), so two routers never drain each other's live segment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
from math import isfinite
from pathlib import Path
from typing import IO

import orjson

from llmgw.core.errors import LlmgwError
from llmgw.store.records import UsageRecord

log = logging.getLogger(__name__)

_SEGMENT = re.compile(r"^usage-(\d{12})\.jsonl$")
_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(UsageRecord))
_FIELDS = set(_FIELD_NAMES)


class SpoolError(LlmgwError):
    """The spool directory cannot be used; the message says which and what to do."""


def _name(seq: int) -> str:
    return f"usage-{seq:012d}.jsonl"


def encode(rec: UsageRecord) -> bytes:
    """One line: the record as a JSON object (tags, attempts and the decision are small JSON values). orjson
    encodes the dataclass itself, about four times cheaper
    than json (every request is spooled: it was 5% of the router's CPU per request). It would write a
    non-finite float as null and refuses integers beyond 64 bits, so those records go through json, which
    writes what `decode` reads back as the same value."""
    if isfinite(rec.time) and isfinite(rec.cost) and isfinite(rec.latency_ms):
        try:
            return orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE)
        except orjson.JSONEncodeError:
            pass
    obj = {name: getattr(rec, name) for name in _FIELD_NAMES}
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def decode(line: bytes) -> UsageRecord | None:
    """A record from one line; None for a line cut short (a power loss mid-write) or not a record."""
    try:
        obj = json.loads(line)
        if not isinstance(obj, dict) or not set(obj) <= _FIELDS:
            return None
        return UsageRecord(**obj)
    except (ValueError, TypeError):
        return None


class UsageSpool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.current = 0  # sequence number of the segment being appended to
        self._fd: int | None = None
        self._lock: IO[str] | None = None
        self._closed: list[int] = []  # segments no longer appended to, oldest first
        self._buffered: list[bytes] = []  # lines `buffer` took, for `write_buffered`
        self._write_failed = False  # warned once; said again when a write works

    def open(self) -> list[tuple[UsageRecord, int]]:
        """Lock the directory, read back what earlier runs left (with each record's segment), start a new
        segment. The records come oldest segment first."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock = (self.directory / "lock").open("a")
        except OSError as exc:
            raise SpoolError(f"usage spool {self.directory}: {exc.strerror}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise SpoolError(
                f"usage spool {self.directory} is held by another router; give each router its own state dir"
            ) from None
        found = sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := _SEGMENT.match(p.name)))
        left: list[tuple[UsageRecord, int]] = []
        bad = 0
        for seq in found:
            for line in (self.directory / _name(seq)).read_bytes().splitlines():
                rec = decode(line)
                if rec is None:
                    bad += 1
                else:
                    left.append((rec, seq))
        if left or bad:
            log.warning(
                "usage spool %s: %d records left by an earlier run are written again%s",
                self.directory,
                len(left),
                f"; {bad} unreadable lines skipped" if bad else "",
            )
        self._closed = found
        self.current = (found[-1] + 1) if found else 1
        self._open_current()
        return left

    def _open_current(self) -> None:
        path = self.directory / _name(self.current)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def append(self, rec: UsageRecord) -> int:
        """Write one record (one write(2)); the segment it went to."""
        assert self._fd is not None, "spool not open"
        os.write(self._fd, encode(rec))
        return self.current

    def buffer(self, rec: UsageRecord) -> int:
        """Take one record for the next `write_buffered` (the caller makes sure it comes soon); the segment
        it goes to."""
        assert self._fd is not None, "spool not open"
        self._buffered.append(encode(rec))
        return self.current

    def write_buffered(self) -> None:
        """Write what `buffer` took, in one write(2). A failed write (a full disk) is logged, once until one
        works again, and its lines dropped: the records are still in the writer's memory, on their way to
        the store; only their copy on disk is missing."""
        lines, self._buffered = self._buffered, []
        if not lines or self._fd is None:
            return
        data = b"".join(lines)
        try:
            while data:  # a regular file takes it whole; a short write is finished, not dropped
                data = data[os.write(self._fd, data) :]
        except OSError as exc:
            if not self._write_failed:
                log.error(
                    "usage spool %s: write failed, records are kept in memory only: %s", self.directory, exc
                )
            self._write_failed = True
            return
        if self._write_failed:
            log.warning("usage spool %s: writing again", self.directory)
            self._write_failed = False

    def rotate(self) -> Path | None:
        """Start a new segment if the current one has records; the old one (returned, for `fsync_file` off
        the event loop) waits for `release`."""
        self.write_buffered()
        if self._fd is None or os.fstat(self._fd).st_size == 0:
            return None
        os.close(self._fd)
        self._closed.append(self.current)
        self.current += 1
        self._open_current()
        return self.directory / _name(self.current - 1)

    def release(self, oldest_pending: int | None) -> None:
        """Delete closed segments older than the oldest one still holding an unwritten record (all of them
        when nothing is pending)."""
        keep = self.current if oldest_pending is None else oldest_pending
        while self._closed and self._closed[0] < keep:
            seq = self._closed.pop(0)
            with contextlib.suppress(FileNotFoundError):
                (self.directory / _name(seq)).unlink()

    def close(self, everything_written: bool) -> None:
        """Close the segment; when the store has every record, leave no segment behind."""
        self.write_buffered()
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
            if everything_written:
                self._closed.append(self.current)
                self.release(self.current + 1)
            elif os.stat(self.directory / _name(self.current)).st_size == 0:
                (self.directory / _name(self.current)).unlink()
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def fsync_file(path: Path) -> None:
    """fsync a closed segment (its pages are the file's, whichever descriptor wrote them). Blocking."""
    with contextlib.suppress(FileNotFoundError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
