"""Full-text search of a person's notes (issue 44): SQLite's FTS5 table kept in step by triggers, PostgreSQL's
generated tsvector column; the same queries over the same notes find the same notes on both stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.store import Store
from llmgw.store.move import move_store
from llmgw.store.queries.notes import Note, NoteSearchError, SearchTerm, match_expression, search_terms

NOTES = (
    Note("n1", "ada", "GPU budget", "Ask finance about the H100 order; draft due Friday.", 1.0, 1.0),
    Note(
        "n2",
        "ada",
        "Router notes",
        "The router retries twice. See https://example.org/retry-policy",
        2.0,
        2.0,
    ),
    Note(
        "n3", "ada", "e-mail", "Write to ops-team@example.org about the drain; the café opens at 9.", 3.0, 3.0
    ),
    Note("n4", "ada", "Drafts", "drafting the rollout plan (v2.1) with snake_case_names", 4.0, 4.0),
    Note("n5", "bob", "GPU budget", "bob's own budget note: not ada's to find", 5.0, 5.0),
)
# Each query and what it finds for ada, newest first: the same on both stores.
EXPECTED: dict[str, list[str]] = {
    "budget": ["n1"],
    "GPU budget": ["n1"],
    "gpu finance": ["n1"],
    "draft": ["n1"],  # a whole word: not `drafting`, not `Drafts`
    "draft*": ["n4", "n1"],  # a prefix: drafting, Drafts, draft
    "example": ["n3", "n2"],  # inside an e-mail address and a URL alike
    "ops team": ["n3"],
    "retry policy": ["n2"],
    "café": ["n3"],
    "cafe": [],  # diacritics are kept on both
    "v2": ["n4"],
    "1": ["n4"],  # `v2.1` is the words v2 and 1
    "snake case": ["n4"],  # `_` separates words too
    "h100": ["n1"],
    "own": [],  # bob's note is not ada's to find
    "nothing-here": [],
}


async def _seed(store: Store) -> None:
    for note in NOTES:
        await store.save_note(note)


@pytest.mark.postgres
async def test_the_same_queries_find_the_same_notes_on_both_stores(pg_dsn: str, tmp_path: Path) -> None:
    """The notes written on SQLite and moved to PostgreSQL (`store move` copies the rows; each store derives
    its own index from them), then every query asked of both."""
    sqlite = await Store.open(f"sqlite:///{tmp_path / 'both.db'}")
    postgres = await Store.open(pg_dsn)
    try:
        await _seed(sqlite)
        assert (await move_store(sqlite, postgres)).copied["notes"] == len(NOTES)
        for query, expected in EXPECTED.items():
            on_sqlite = [n.id for n in await sqlite.search_notes("ada", query)]
            on_postgres = [n.id for n in await postgres.search_notes("ada", query)]
            assert (query, on_sqlite) == (query, expected)
            assert (query, on_postgres) == (query, expected)
    finally:
        await sqlite.close()
        await postgres.close()


async def test_the_index_follows_edits_and_deletes(store: Store) -> None:
    """The triggers (SQLite) and the generated column (PostgreSQL) keep the index in step with the rows."""
    await _seed(store)
    await store.save_note(Note("n1", "ada", "GPU budget", "settled: the order went out", 1.0, 9.0))
    assert [n.id for n in await store.search_notes("ada", "finance")] == []
    assert [n.id for n in await store.search_notes("ada", "settled")] == ["n1"]
    assert [n.id for n in await store.search_notes("ada", "gpu")] == ["n1"]
    assert await store.delete_note("ada", "n1")
    assert [n.id for n in await store.search_notes("ada", "settled")] == []
    assert not await store.delete_note("ada", "n1")  # gone already


async def test_a_note_is_its_owners_only(store: Store) -> None:
    await _seed(store)
    assert not await store.delete_note("ada", "n5")  # bob's
    await store.save_note(Note("n5", "ada", "taken", "ada writing over bob's note", 6.0, 6.0))
    kept = await store.note("bob", "n5")
    assert kept is not None and kept.title == "GPU budget" and kept.person == "bob"
    assert await store.note("ada", "n5") is None
    assert [n.id for n in await store.notes_of("ada")] == ["n4", "n3", "n2", "n1"]


def test_a_search_is_its_words_in_each_dialect() -> None:
    terms = search_terms('Draft* "budget" OR NOT x:y')
    assert terms == [
        SearchTerm("draft", True),
        SearchTerm("budget", False),
        SearchTerm("or", False),
        SearchTerm("not", False),
        SearchTerm("x", False),
        SearchTerm("y", False),
    ]
    assert match_expression(terms, "sqlite") == '"draft"* "budget" "or" "not" "x" "y"'
    assert match_expression(terms, "postgres") == "draft:* & budget & or & not & x & y"


@pytest.mark.parametrize(
    ("text", "said"), [("", "has no word"), ("-- * !", "has no word"), ("a " * 17, "at most 16")]
)
def test_a_search_without_words_says_so(text: str, said: str) -> None:
    """Refused before either store is asked (`search_notes` takes its words first)."""
    with pytest.raises(NoteSearchError, match=said):
        search_terms(text)
