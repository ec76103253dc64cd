"""The fleets `plan --suggest --post` sent, kept in the store (issue 50), on SQLite and PostgreSQL: the newest
per revision, the most recently posted first, at most KEPT_SUGGESTIONS revisions, and there for a store opened
again (a restarted controller, another controller of the same store)."""

from __future__ import annotations

from llmgw.store.queries.suggestions import KEPT_SUGGESTIONS, StoredSuggestion
from llmgw.store.store import Store


async def test_the_newest_per_revision_is_kept_and_the_oldest_revisions_go(store: Store) -> None:
    for i in range(KEPT_SUGGESTIONS + 3):
        await store.save_suggestion(StoredSuggestion(f"rev-{i}", 1000.0 + i, "ci", f'{{"n": {i}}}'))
    await store.save_suggestion(StoredSuggestion("rev-5", 2000.0, "alice", '{"n": "again"}'))
    kept = await store.list_suggestions()
    assert len(kept) == KEPT_SUGGESTIONS
    assert kept[0] == StoredSuggestion("rev-5", 2000.0, "alice", '{"n": "again"}')  # replaced, now the newest
    assert [k.revision for k in kept[1:4]] == [f"rev-{i}" for i in (22, 21, 20)]
    assert {"rev-0", "rev-1", "rev-2"}.isdisjoint(k.revision for k in kept)  # the three oldest went


async def test_a_store_opened_again_shows_the_same(store: Store) -> None:
    await store.save_suggestion(StoredSuggestion("abc123", 1.5, "ci", "{}"))
    again = await Store.open(store.dsn)
    try:
        assert await again.list_suggestions() == [StoredSuggestion("abc123", 1.5, "ci", "{}")]
    finally:
        await again.close()
