"""A person's notes and their full-text search, the same on both stores (issue 44).

The index is each store's own (migration 0020): SQLite's FTS5 table kept in step by triggers, PostgreSQL's
generated tsvector column under the 'simple' configuration. What a search finds must not depend on the store,
so the words of a query are taken here, once, by one rule (runs of letters and digits, lower-cased; a trailing
`*` makes a word a prefix), and each dialect is given only those: every word must occur (AND), and matches come
newest first. No query text reaches either dialect's query syntax. Mixed into `Store`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmgw.store.db import Backend, Dialect, Row
from llmgw.store.errors import StoreError

__all__ = ["MAX_TERMS", "Note", "NotesQueries", "SearchTerm", "match_expression", "search_terms"]

MAX_TERMS = (
    16  # a query of more words than this is refused, not cut: the person would not know what was dropped
)
_WORD = re.compile(r"([^\W_]+)(\*?)")


class NoteSearchError(StoreError):
    """A search that cannot be run (no word in it, or too many); the message says what would be right."""


@dataclass(frozen=True)
class SearchTerm:
    word: str  # letters and digits only, lower-cased
    prefix: bool  # `word*`: any word starting with it


@dataclass(frozen=True)
class Note:
    id: str
    person: str
    title: str
    body: str
    created_at: float
    updated_at: float


def search_terms(text: str) -> list[SearchTerm]:
    """The words of a search: runs of letters and digits (what both indexes split the notes into)."""
    terms = [SearchTerm(word.lower(), star == "*") for word, star in _WORD.findall(text)]
    if not terms:
        raise NoteSearchError(
            f"search {text!r} has no word in it: search for letters or digits (e.g. gpu, draft*)"
        )
    if len(terms) > MAX_TERMS:
        raise NoteSearchError(f"search has {len(terms)} words; at most {MAX_TERMS}")
    return terms


def match_expression(terms: list[SearchTerm], dialect: Dialect) -> str:
    """The terms in the store's own query syntax: FTS5's `"word" "pre"*`, or to_tsquery's `word & pre:*`.
    Safe to bind as a parameter: a word holds letters and digits only."""
    if dialect == "sqlite":
        return " ".join(f'"{t.word}"' + ("*" if t.prefix else "") for t in terms)
    return " & ".join(t.word + (":*" if t.prefix else "") for t in terms)


_SEARCH_SQL: dict[Dialect, str] = {
    "sqlite": (
        "SELECT n.id, n.person, n.title, n.body, n.created_at, n.updated_at FROM notes_fts f "
        "JOIN notes n ON n.rowid = f.rowid WHERE notes_fts MATCH ? AND n.person = ? "
        "ORDER BY n.updated_at DESC, n.id LIMIT ?"
    ),
    "postgres": (
        "SELECT id, person, title, body, created_at, updated_at FROM notes "
        "WHERE search @@ to_tsquery('simple', ?) AND person = ? ORDER BY updated_at DESC, id LIMIT ?"
    ),
}
_COLUMNS = "id, person, title, body, created_at, updated_at"


def _note(row: Row) -> Note:
    return Note(str(row[0]), str(row[1]), str(row[2]), str(row[3]), float(row[4]), float(row[5]))


class NotesQueries:
    db: Backend

    async def save_note(self, note: Note) -> None:
        """Insert the note, or replace its title and body (its owner and creation time stay)."""
        async with self.db.tx() as tx:
            await tx.execute(
                f"INSERT INTO notes ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                "title = excluded.title, body = excluded.body, updated_at = excluded.updated_at "
                "WHERE notes.person = excluded.person",
                (note.id, note.person, note.title, note.body, note.created_at, note.updated_at),
            )

    async def note(self, person: str, note_id: str) -> Note | None:
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {_COLUMNS} FROM notes WHERE id = ? AND person = ?", (note_id, person)
            )
        return _note(rows[0]) if rows else None

    async def notes_of(self, person: str, limit: int = 100) -> list[Note]:
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {_COLUMNS} FROM notes WHERE person = ? ORDER BY updated_at DESC, id LIMIT ?",
                (person, limit),
            )
        return [_note(r) for r in rows]

    async def delete_note(self, person: str, note_id: str) -> bool:
        async with self.db.tx() as tx:
            return await tx.execute("DELETE FROM notes WHERE id = ? AND person = ?", (note_id, person)) > 0

    async def search_notes(self, person: str, text: str, limit: int = 50) -> list[Note]:
        """The person's notes holding every word of `text` (see `search_terms`), newest first."""
        expression = match_expression(search_terms(text), self.db.dialect)
        async with self.db.tx() as tx:
            rows = await tx.fetch(_SEARCH_SQL[self.db.dialect], (expression, person, limit))
        return [_note(r) for r in rows]
