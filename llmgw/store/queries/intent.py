"""What a commit set in motion, kept for whichever controller leads next: each canary model's run and the
commit statuses not yet posted. Mixed into `Store`; the controller owns the meaning of the JSON it keeps."""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.store.db import Backend

__all__ = ["CanaryRunRow", "IntentQueries", "OwedStatus"]


@dataclass(frozen=True)
class CanaryRunRow:
    """One model's canary run as the controller wrote it: `run` and `stable` are its JSON ('' stable: the
    profiles before the change were not known to the controller that began the run)."""

    model: str
    run: str
    stable: str
    updated_at: float


@dataclass(frozen=True)
class OwedStatus:
    """A commit status written before its first attempt, deleted once the forge took it."""

    id: str
    seq: float
    sha: str
    state: str
    context: str
    description: str
    target_url: str = ""


class IntentQueries:
    db: Backend

    async def save_canary_run(self, model: str, run: str, stable: str | None, now: float) -> None:
        """Replace the model's run; `stable` None keeps what the row holds (the profiles before the change
        are written once, when the run begins)."""
        async with self.db.tx() as tx:
            if stable is None:
                rows = await tx.fetch("SELECT stable FROM canary_runs WHERE model = ?", (model,))
                stable = str(rows[0][0]) if rows else ""
            await tx.execute(
                "INSERT INTO canary_runs (model, run, stable, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (model) DO UPDATE SET run = excluded.run, stable = excluded.stable, "
                "updated_at = excluded.updated_at",
                (model, run, stable, now),
            )

    async def list_canary_runs(self) -> list[CanaryRunRow]:
        async with self.db.tx() as tx:
            rows = await tx.fetch("SELECT model, run, stable, updated_at FROM canary_runs ORDER BY model")
        return [CanaryRunRow(str(r[0]), str(r[1]), str(r[2]), float(r[3])) for r in rows]

    async def delete_canary_run(self, model: str) -> bool:
        async with self.db.tx() as tx:
            return await tx.execute("DELETE FROM canary_runs WHERE model = ?", (model,)) > 0

    async def owe_commit_status(self, status: OwedStatus) -> None:
        """Written before the first attempt; the same id written twice (a retry) is kept once."""
        async with self.db.tx() as tx:
            await tx.execute(
                "INSERT INTO commit_status_outbox (id, seq, sha, state, context, description, target_url) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                (
                    status.id,
                    status.seq,
                    status.sha,
                    status.state,
                    status.context,
                    status.description,
                    status.target_url,
                ),
            )

    async def owed_commit_statuses(self) -> list[OwedStatus]:
        """Oldest first: the order they were meant to land in."""
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                "SELECT id, seq, sha, state, context, description, target_url FROM commit_status_outbox "
                "ORDER BY seq, id"
            )
        return [
            OwedStatus(str(r[0]), float(r[1]), str(r[2]), str(r[3]), str(r[4]), str(r[5]), str(r[6]))
            for r in rows
        ]

    async def commit_status_posted(self, status_id: str) -> bool:
        async with self.db.tx() as tx:
            return await tx.execute("DELETE FROM commit_status_outbox WHERE id = ?", (status_id,)) > 0
