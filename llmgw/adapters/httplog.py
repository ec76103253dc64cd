"""Quiet aiohttp's log of malformed requests: one warning line instead of an ERROR with a traceback.

aiohttp logs every request it cannot parse (a header value with CR, a bad chunk size, garbage on the port)
as "Error handling request" with a full traceback at ERROR. That is the client's mistake, not ours, and
anyone who can reach the port could fill the log with tracebacks and page whoever watches ERRORs. Our own
handlers' errors are untouched: only records whose exception is aiohttp's HTTP parsing error are changed.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["BadRequestFilter", "quiet_bad_requests"]


class BadRequestFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            detail = str(exc.message).strip().splitlines()[0] if exc.message else type(exc).__name__
            original = record.getMessage()
            record.msg = "%s (refused with %s: %s)"
            record.args = (original, exc.code, detail[:200])
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_bad_requests(logger_name: str = "aiohttp.server") -> None:
    """Install the filter once on aiohttp's server logger (idempotent)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, BadRequestFilter) for f in logger.filters):
        logger.addFilter(BadRequestFilter())
