"""How the controller and the router write their log lines: human text (the default) or JSON lines.

`--log-format json` (the settings' `log_format`) makes every record one JSON object on one line:
`time` (RFC 3339, UTC, milliseconds), `level`, `logger`, `message`, then `request_id`, `replica_id` and `node`
where the code that logged knew them, and `exception` (the traceback) when there was one. Those three come from
the record's `extra=` or from `bind(...)`: a context variable, so what one request's task binds stays with
that request (asyncio copies the context into each task it creates).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Literal

__all__ = ["CONTEXT_FIELDS", "LOG_FORMATS", "JsonFormatter", "LogFormat", "bind", "bound", "configure"]

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONTEXT_FIELDS = ("request_id", "replica_id", "node")

_context: ContextVar[dict[str, str] | None] = ContextVar("llmgw_log_context", default=None)


def bind(**fields: str | None) -> None:
    """Add fields to every record logged from this context on (this task, and the tasks it starts)."""
    current = dict(_context.get() or {})
    current.update({k: v for k, v in fields.items() if v})
    _context.set(current)


@contextmanager
def bound(**fields: str | None) -> Iterator[None]:
    """`bind` for the length of a block."""
    token = _context.set({**(_context.get() or {}), **{k: v for k, v in fields.items() if v}})
    try:
        yield
    finally:
        _context.reset(token)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = _context.get() or {}
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None) or context.get(name)
            if value:
                out[name] = str(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def log_format(value: str) -> LogFormat:
    """The format named `value`; ValueError naming the choices."""
    for choice in LOG_FORMATS:
        if value == choice:
            return choice
    raise ValueError(f"log format {value!r}: expected one of {', '.join(LOG_FORMATS)}")


def configure(level: str, fmt: str = "text") -> None:
    """The process's root handler on stderr, in `fmt` (replaces a handler an earlier call installed)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format(fmt) == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_llmgw", False):
            root.removeHandler(old)
    handler._llmgw = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper())
