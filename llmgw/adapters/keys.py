"""API keys: made here, shown once, stored only as a hash.

A key is `sk-llmgw-` followed by 32 random bytes, URL-safe base64 (43 characters). The prefix lets secret
scanners recognise a leaked key. The store keeps the SHA-256 of the whole key: the key carries 256 bits of
randomness, so a fast unsalted hash cannot be brute-forced and needs no salt or slow KDF — and a fast hash
is what lets the router look a key up by its hash on every request.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

# Re-exported: the key's shape and hash live in the core, where the router reads them without the store.
from llmgw.core.tenancy.keys import (
    KEY_PREFIX as KEY_PREFIX,
    hash_key as hash_key,
    looks_like_key as looks_like_key,
)
from llmgw.store import ApiKey, KeyLookup, Store, StoreError

KEY_RANDOM_BYTES = 32
DISPLAY_CHARS = 4  # characters after the prefix kept for display ("sk-llmgw-AbCd...")


@dataclass(frozen=True)
class NewKey:
    """A freshly made key. `plaintext` exists only here: print it once, never log or store it."""

    key: ApiKey
    plaintext: str


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(KEY_RANDOM_BYTES)


async def create_key(
    store: Store,
    project: str | None,
    now: float,
    *,
    name: str = "",
    expires_in: float | None = None,
    owner: str | None = None,
) -> NewKey:
    """A project's key (`owner` None), or a person's: `owner` names the Person, `project` is then the key's
    default project (None: every request names one, docs/tenancy.md, Personal keys)."""
    if not project and owner is None:
        raise StoreError("a key needs a project, or an owner (a person's own key)")
    plaintext = generate_key()
    key = ApiKey(
        id="key_" + secrets.token_hex(8),
        prefix=plaintext[: len(KEY_PREFIX) + DISPLAY_CHARS],
        project=project or None,
        name=name,
        created_at=now,
        expires_at=now + expires_in if expires_in is not None else None,
        revoked_at=None,
        owner=owner,
    )
    await store.insert_key(key, hash_key(plaintext))
    return NewKey(key, plaintext)


async def lookup(store: Store, plaintext: str, now: float) -> KeyLookup | None:
    """The router's entry point: the key's project and state (active, revoked, expired), or None if unknown.

    The router caches the answer in memory by hash; `expires_at` is returned so a cached active key can
    still turn expired without asking the store again.
    """
    if not looks_like_key(plaintext):
        return None
    return await store.lookup_key(hash_key(plaintext), now)
