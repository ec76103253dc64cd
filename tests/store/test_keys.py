"""Key lifecycle on both backends: create, lookup, revoke, expire."""

from __future__ import annotations

import functools

import pytest

from llmgw.adapters import keys
from llmgw.core.words import parse_duration
from llmgw.store import Store


async def test_key_lifecycle(store: Store) -> None:
    new = await keys.create_key(store, "playground", now=1000.0, name="ci", expires_in=parse_duration("30d"))
    assert new.plaintext.startswith("sk-llmgw-") and len(new.plaintext) >= len("sk-llmgw-") + 43
    assert new.key.prefix == new.plaintext[:13]
    # Only the hash is stored: the plaintext appears in no column of the row.
    async with store.db.tx() as tx:
        rows = await tx.fetch("SELECT * FROM api_keys")
    assert all(new.plaintext not in str(v) for v in rows[0])

    found = await keys.lookup(store, new.plaintext, now=2000.0)
    assert found is not None and (found.key_id, found.project, found.state) == (
        new.key.id,
        "playground",
        "active",
    )
    expired = await keys.lookup(store, new.plaintext, now=1000.0 + 30 * 86400)
    assert expired is not None and expired.state == "expired"
    assert await keys.lookup(store, "sk-llmgw-" + "x" * 43, now=2000.0) is None
    assert await keys.lookup(store, "not-ours", now=2000.0) is None

    assert await store.revoke_key(new.key.id, now=3000.0)
    revoked = await keys.lookup(store, new.plaintext, now=3001.0)
    assert revoked is not None and revoked.state == "revoked"


async def test_keys_are_unique_and_never_expire_by_default(store: Store) -> None:
    a = await keys.create_key(store, "p", now=0.0)
    b = await keys.create_key(store, "p", now=0.0)
    assert a.plaintext != b.plaintext and a.key.id != b.key.id
    found = await keys.lookup(store, a.plaintext, now=1e12)
    assert found is not None and found.state == "active" and found.expires_at is None


def test_key_lifetimes_read_as_before() -> None:
    """`keys create --expires` and `usage --since` take a positive duration with its unit written."""
    lifetime = functools.partial(parse_duration, bare_seconds=False, positive=True)
    assert lifetime("30d") == 30 * 86400
    assert lifetime("12h") == 43200
    assert lifetime("2w") == 14 * 86400
    assert lifetime("90m") == 5400 and lifetime("45s") == 45
    for bad in ("30", "d", "0d", "-1d", "1y"):
        with pytest.raises(ValueError, match="not a duration"):
            lifetime(bad)
