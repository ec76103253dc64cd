"""Refusals as values with OpenAI's error shape; the one place they become HTTP responses.

Every refusal is an `ApiError` raised by the request path and rendered by `error_response`; nothing else
reaches a client, so a traceback never does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from llmgw.core.errors import LlmgwError
from llmgw_router.server.exchange import HttpReply

__all__ = ["ApiError", "error_body", "error_response"]


class ApiError(LlmgwError):
    """A refusal the client is told about: status, OpenAI type and code, a precise message."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None,
        type_: str = "invalid_request_error",
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.type = type_
        self.param = param
        self.headers = dict(headers or {})


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    err = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return json.dumps(err).encode()


def error_response(err: ApiError) -> HttpReply:
    body = error_body(err.message, err.type, err.code, err.param)
    return HttpReply(err.status, body, {"Content-Type": "application/json", **err.headers})
