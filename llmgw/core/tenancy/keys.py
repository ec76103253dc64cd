"""The shape and the hash of an API key: pure, so the router checks a presented key without the store's
drivers (llmgw.adapters.keys makes and keeps keys; the router only recognises and hashes them)."""

from __future__ import annotations

import hashlib

__all__ = ["KEY_PREFIX", "hash_key", "looks_like_key"]

KEY_PREFIX = "sk-llmgw-"


def hash_key(plaintext: str) -> str:
    """The hash the store keeps and the router looks up (hex SHA-256 of the whole key)."""
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def looks_like_key(text: str) -> bool:
    """Cheap shape check before any lookup: a bearer token that is not ours is 'unknown' without a query."""
    return text.startswith(KEY_PREFIX) and len(text) >= len(KEY_PREFIX) + 40
