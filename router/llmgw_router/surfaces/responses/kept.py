"""Stored responses (`store`, `previous_response_id`), pure: what a request asks to keep or continue from, and
what a kept response holds. The vault and the HTTP handlers around it are surfaces/responses/keeper.py's.

A response is kept only for a project that opted in to content retention (`Project.spec.retention`, issue 21's
one retention mechanism) on a router that holds the content key. OpenAI's default for `store` is true; here an
absent `store` means "keep it if the project keeps content", so a client that never sets it is served as
before by every other project (its Response says `store: false`). Asking for it explicitly where nothing can
be kept is a 400 that says why: `store: true` is `store_unsupported` (silently not keeping what a client asked
to keep would break its next turn), and `previous_response_id` is OpenAI's own answer for a response it does
not hold (400 `previous_response_not_found`, which clients recognise and recover from by sending the whole
conversation), its message saying why nothing is held.
"""

from __future__ import annotations

import functools
import json
from typing import Any, NamedTuple

from llmgw.core.config.models import ContentRetention
from llmgw.core.traffic.recorded import content_ttl
from llmgw_router.server.errors import ApiError

__all__ = [
    "KIND",
    "Storage",
    "continued_input",
    "input_items",
    "kept_record",
    "not_found",
    "plan_storage",
    "read_record",
]

KIND = "response"  # the vault's kind for a kept Response


class Storage(NamedTuple):
    """What one Responses request does with the vault: keep its answer for `ttl_s` (None: not kept), and
    continue from `previous` (None: a fresh conversation). A tuple: one is made per request of an opted-in
    project, and a frozen dataclass costs several times as much to make."""

    ttl_s: float | None = None
    previous: str | None = None

    @property
    def used(self) -> bool:
        return self.ttl_s is not None or self.previous is not None


NO_STORAGE = Storage()


def _unsupported(field: str, project: str | None, keyless: bool, previous: str = "") -> ApiError:
    if keyless:
        why = "this router holds no content key (--content-key-file), so it keeps no content"
    elif project is None:
        why = "the request has no project (content-retention is opted into per project)"
    else:
        why = (
            f"project `{project}` does not keep content (content-retention opt-in: "
            "`spec.retention: {content: true, ttl: 7d}` in its Project document)"
        )
    because = f"stored responses need the per-project content-retention opt-in, and {why}"
    if field == "previous_response_id":  # OpenAI's answer for a response it does not hold, and why
        return ApiError(
            400,
            f"Previous response with id '{previous[:200]}' not found: {because}. Send the whole conversation "
            "in `input` instead.",
            "previous_response_not_found",
            param=field,
        )
    return ApiError(
        400,
        f"`{field}`: {because}; send the whole conversation in `input` instead, and `store` false or absent.",
        "store_unsupported",
        param=field.split(":")[0],
    )


def _ttl_s(project: str | None, retention: ContentRetention | None) -> float | None:
    """The project's content TTL in seconds; None: it keeps no content."""
    if project is None or retention is None or not retention.content:
        return None
    return _parsed_ttl(retention.ttl)


@functools.lru_cache(maxsize=1024)
def _parsed_ttl(ttl: str) -> float | None:
    # Once per distinct value, not per request: parsing a duration costs tens of microseconds.
    return content_ttl(ContentRetention(content=True, ttl=ttl))


def plan_storage(
    body: dict[str, Any], project: str | None, retention: ContentRetention | None, has_key: bool
) -> Storage:
    """What the request's `store` and `previous_response_id` mean for this project, or a 400."""
    store, previous = body.get("store"), body.get("previous_response_id")
    if store is None and previous is None and body.get("conversation") is None:  # the common request
        ttl = _ttl_s(project, retention) if has_key else None
        return NO_STORAGE if ttl is None else Storage(ttl)
    if body.get("conversation") is not None:
        raise ApiError(
            400,
            "`conversation`: the Conversations API is not served here; continue a stored response with "
            "`previous_response_id`, or send the whole conversation in `input`.",
            "store_unsupported",
            param="conversation",
        )
    if store is not None and not isinstance(store, bool):
        raise ApiError(400, "`store` must be true or false.", "invalid_type", param="store")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise ApiError(
            400, "`previous_response_id` must be a response id.", "invalid_type", param="previous_response_id"
        )
    opted_in = _ttl_s(project, retention) is not None
    ttl = _ttl_s(project, retention) if has_key else None
    if ttl is None:
        if previous is not None:
            raise _unsupported("previous_response_id", project, keyless=opted_in, previous=previous)
        if store is True:
            raise _unsupported("store: true", project, keyless=opted_in)
        return NO_STORAGE
    return Storage(None if store is False else ttl, previous)


def not_found(response_id: str, param: str) -> ApiError:
    """OpenAI's answer for a response this project cannot see: never kept, deleted, expired, or another
    project's (the same answer for each: existence is not leaked across projects). Retrieving or deleting
    one is a 404; continuing one is a 400, as OpenAI answers a `previous_response_id` it does not hold."""
    if param == "previous_response_id":
        message = f"Previous response with id '{response_id[:200]}' not found."
        return ApiError(400, message, "previous_response_not_found", param=param)
    message = f"Response with id '{response_id[:200]}' not found."
    return ApiError(404, message, "response_not_found", param=param)


def input_items(value: Any) -> list[dict[str, Any]]:
    """The request's `input` as Responses input items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    return [dict(item) for item in value] if isinstance(value, list) else []


def continued_input(record: dict[str, Any], new_input: Any) -> list[dict[str, Any]]:
    """The conversation so far (the kept response's history, input and output), then the new input."""
    response = record.get("response") or {}
    return [
        *record.get("history", []),
        *record.get("input", []),
        *(response.get("output") or []),
        *input_items(new_input),
    ]


def kept_record(history: list[dict[str, Any]], new_input: Any, response: dict[str, Any]) -> bytes:
    """What is sealed for a response: the Response object, its own input items and the items before them
    (what continuing from it prepends)."""
    record = {"v": 1, "history": history, "input": input_items(new_input), "response": response}
    return json.dumps(record, separators=(",", ":")).encode()


def read_record(data: bytes) -> dict[str, Any]:
    record = json.loads(data)
    if not isinstance(record, dict) or record.get("v") != 1 or not isinstance(record.get("response"), dict):
        raise ValueError("not a kept response record (v1)")
    return record
