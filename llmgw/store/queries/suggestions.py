"""The fleets `llmgw plan --suggest --post` proposed, the newest per repo revision, at most `KEPT_SUGGESTIONS`
revisions (llmgw.controller.api.capacity; the console's plan page). The document is the posted body's JSON, read
back through its pydantic model by the caller. Mixed into `Store`."""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.store.db import Backend

__all__ = ["KEPT_SUGGESTIONS", "StoredSuggestion", "SuggestionQueries"]

KEPT_SUGGESTIONS = 20


@dataclass(frozen=True, slots=True)
class StoredSuggestion:
    revision: str
    posted_at: float
    posted_by: str
    document: str  # JSON


class SuggestionQueries:
    db: Backend

    async def save_suggestion(self, kept: StoredSuggestion) -> None:
        """Keep `kept` as its revision's suggestion (replacing an earlier one), and forget the oldest beyond
        KEPT_SUGGESTIONS revisions."""
        async with self.db.tx() as tx:
            await tx.execute(
                "INSERT INTO fleet_suggestions (revision, posted_at, posted_by, document) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (revision) DO UPDATE SET posted_at = excluded.posted_at, "
                "posted_by = excluded.posted_by, document = excluded.document",
                (kept.revision, kept.posted_at, kept.posted_by, kept.document),
            )
            await tx.execute(
                "DELETE FROM fleet_suggestions WHERE revision NOT IN (SELECT revision FROM fleet_suggestions "
                "ORDER BY posted_at DESC, revision LIMIT ?)",
                (KEPT_SUGGESTIONS,),
            )

    async def list_suggestions(self) -> list[StoredSuggestion]:
        """The kept suggestions, the most recently posted first."""
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                "SELECT revision, posted_at, posted_by, document FROM fleet_suggestions "
                "ORDER BY posted_at DESC, revision"
            )
        return [StoredSuggestion(str(r[0]), float(r[1]), str(r[2]), str(r[3])) for r in rows]
