"""Key lifecycle on both backends: create, lookup, revoke, expire."""

from __future__ import annotations

import functools

import pytest

from llmgw.adapters import keys
from llmgw.core.words import parse_duration
from llmgw.store import Store, UsageRecord
from llmgw.store.migrate import load_migrations, migrate


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


async def test_a_key_shows_its_last_request_and_a_late_batch_does_not_lower_it(store: Store) -> None:
    used = await keys.create_key(store, "p", now=10.0)
    idle = await keys.create_key(store, "p", now=10.0)
    await store.insert_usage(
        [
            UsageRecord(time=t, request_id=f"r{t}", project="p", model="m", status=200, key_id=used.key.id)
            for t in (100.0, 300.0, 200.0)
        ]
        + [UsageRecord(time=400.0, request_id="nokey", project="p", model="m", status=200)]
    )
    # A batch spooled before a restart and written afterwards carries older times.
    await store.insert_usage(
        [UsageRecord(time=50.0, request_id="late", project="p", model="m", status=429, key_id=used.key.id)]
    )
    by_id = {k.id: k for k in await store.list_keys("p")}
    assert by_id[used.key.id].last_used_at == 300.0
    assert by_id[idle.key.id].last_used_at is None  # never used: absent, not the epoch
    fetched = await store.get_key(used.key.id)
    assert fetched is not None and fetched.last_used_at == 300.0


async def test_the_migration_takes_last_use_from_the_usage_already_kept(store_dsn: str) -> None:
    """A store upgraded from before migration 0015 knows its keys' last use from the rows it still holds."""
    before = [m for m in load_migrations() if m.version < 15]
    opened = await Store.open(store_dsn, migrate_schema=False)
    try:
        await migrate(opened.db, before)
        async with opened.db.tx() as tx:
            await tx.execute(
                "INSERT INTO api_keys (id, prefix, project, name, created_at, hash) "
                "VALUES ('k1', 'sk-llmgw-abcd', 'p', '', 1.0, 'h1'), ('k2', 'sk-llmgw-efgh', 'p', '', 1.0, 'h2')"
            )
            for rid, t in (("a", 70.0), ("b", 90.0)):
                await tx.execute(
                    "INSERT INTO usage (id, time, request_id, project, team, org, key_id, model, tokens_in, "
                    "tokens_out, cost, latency_ms, status, fallback_used, router_id) "
                    "VALUES (?, ?, ?, 'p', '', '', 'k1', 'm', 0, 0, 0, 0, 200, 0, '')",
                    (rid, t, rid),
                )
        assert 15 in await migrate(opened.db)
        by_id = {k.id: k.last_used_at for k in await opened.list_keys()}
        assert by_id == {"k1": 90.0, "k2": None}
    finally:
        await opened.close()
