"""A request's tags: who and what it was for, from three places, bounded, and kept with its usage.

Sources, later ones winning on the same key: the body's `metadata` object (OpenAI's field: string keys to
string values), then the `user` field (as the tag `user`), then the `x-llmgw-tags: k=v,k2=v2` header (set by
a gateway or an SDK wrapper in front, which knows the application better than the client's body does).

Bounds (OpenAI's for `metadata`, so a client that works there works here): at most 16 tags in all, keys of
1-64 characters from letters, digits and `_ - . :` (so `--by tag:KEY` and a label never need quoting),
values of 1-512 characters. Anything else is a 400 `invalid_tags` naming the place and the bound, never
dropped silently: a tag lost without a word is usage attributed to nobody, found out at the month's end.

Nothing here runs for a request with none of the three (three dictionary lookups).
"""

from __future__ import annotations

from typing import Any

from llmgw_router.server.errors import ApiError

__all__ = ["HEADER", "MAX_KEY", "MAX_TAGS", "MAX_VALUE", "request_tags"]

HEADER = "x-llmgw-tags"
MAX_TAGS = 16
MAX_KEY = 64
MAX_VALUE = 512
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:")


def _refuse(message: str, param: str) -> ApiError:
    return ApiError(400, message, "invalid_tags", param=param)


def _check(key: Any, value: Any, where: str) -> tuple[str, str]:
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY or not _KEY_CHARS.issuperset(key):
        raise _refuse(
            f"{where}: tag key {str(key)[:80]!r} must be 1-{MAX_KEY} letters, digits or `_-.:`", where
        )
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_VALUE:
        shown = f"of {len(value)} characters" if isinstance(value, str) else f"of type {type(value).__name__}"
        raise _refuse(
            f"{where}: the value of tag `{key}` is {shown}; it must be a string of 1-{MAX_VALUE} characters",
            where,
        )
    return key, value


def _from_header(text: str) -> list[tuple[str, str]]:
    pairs = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise _refuse(
                f"{HEADER}: `{part[:80]}` is not `key=value` (e.g. `{HEADER}: app=chat,env=prod`)", HEADER
            )
        pairs.append(_check(key.strip(), value.strip(), HEADER))
    return pairs


def request_tags(body: dict[str, Any], header: str | None) -> dict[str, str] | None:
    """The request's tags, or None when it has none; 400 `invalid_tags` for one out of bounds."""
    metadata = body.get("metadata")
    user = body.get("user")
    if metadata is None and user is None and not header:
        return None
    tags: dict[str, str] = {}
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise _refuse("metadata: must be an object of string keys to string values", "metadata")
        for key, value in metadata.items():
            k, v = _check(key, value, "metadata")
            tags[k] = v
    if user is not None:
        if not isinstance(user, str):
            raise _refuse("user: must be a string", "user")
        if user:  # `user: ""` says nothing: no tag rather than a refusal (some SDKs send it empty)
            tags["user"] = _check("user", user, "user")[1]
    if header:
        tags.update(_from_header(header))
    if len(tags) > MAX_TAGS:
        raise _refuse(
            f"{len(tags)} tags from metadata, user and {HEADER} together; at most {MAX_TAGS}", "metadata"
        )
    return tags or None
