"""People's console passwords, kept as their KDF makes them (llmgw.controller.console.passwords); the repo says who
a person is, this only lets them in where no identity provider is configured (issue 44). Mixed into `Store`."""

from __future__ import annotations

from llmgw.store.db import Backend

__all__ = ["PasswordQueries"]


class PasswordQueries:
    db: Backend

    async def set_password(self, person: str, encoded: str, now: float) -> None:
        async with self.db.tx() as tx:
            await tx.execute(
                "INSERT INTO console_passwords (person, hash, set_at) VALUES (?, ?, ?) ON CONFLICT (person) "
                "DO UPDATE SET hash = excluded.hash, set_at = excluded.set_at",
                (person, encoded, now),
            )

    async def password_of(self, person: str) -> str | None:
        """The person's encoded password; None: they have set none."""
        async with self.db.tx() as tx:
            rows = await tx.fetch("SELECT hash FROM console_passwords WHERE person = ?", (person,))
        return str(rows[0][0]) if rows else None

    async def forget_password(self, person: str) -> bool:
        async with self.db.tx() as tx:
            return await tx.execute("DELETE FROM console_passwords WHERE person = ?", (person,)) > 0
