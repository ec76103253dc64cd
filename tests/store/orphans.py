"""Make usage whose key is gone from api_keys, which the schema's foreign key otherwise prevents."""

from __future__ import annotations

import sqlite3
from contextlib import closing

from llmgw.store import Store


async def delete_key_behind_the_foreign_key(store: Store, key_id: str) -> None:
    """Delete a key that usage rows still name, as a hand-edited or older database might have done."""
    if store.dsn.dialect == "sqlite":
        # A fresh connection has foreign keys off (the store turns them on for its own connections).
        with closing(sqlite3.connect(store.dsn.target)) as conn, conn:
            conn.execute("DELETE FROM api_keys WHERE id = ?", (key_id,))
        return
    async with store.db.tx() as tx:
        await tx.execute("ALTER TABLE usage DROP CONSTRAINT usage_key_id_fkey")  # each test has its own db
        await tx.execute("DELETE FROM api_keys WHERE id = ?", (key_id,))
