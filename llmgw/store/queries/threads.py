"""A person's chat threads on the console's chat page (issue 44): kept until the Cluster's declared retention
has passed since their last message (the controller's prune loop deletes them then), or until their owner
deletes them. Every read and write names the person: nobody reaches another's thread by its id. Mixed into
`Store`."""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.store.db import Backend, Row

__all__ = ["ChatMessage", "ChatThread", "ThreadQueries"]


@dataclass(frozen=True)
class ChatThread:
    id: str
    person: str
    title: str
    model: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class ChatMessage:
    seq: int
    role: str  # user, assistant or system
    content: str
    created_at: float


_THREAD = "id, person, title, model, created_at, updated_at"


def _thread(row: Row) -> ChatThread:
    return ChatThread(
        str(row[0]),
        str(row[1]),
        str(row[2]),
        str(row[3]),
        float(row[4]),
        float(row[5]),
    )


class ThreadQueries:
    db: Backend

    async def start_thread(self, thread: ChatThread) -> None:
        async with self.db.tx() as tx:
            await tx.execute(
                f"INSERT INTO chat_threads ({_THREAD}) VALUES (?, ?, ?, ?, ?, ?)",
                (thread.id, thread.person, thread.title, thread.model, thread.created_at, thread.updated_at),
            )

    async def add_messages(
        self, person: str, thread_id: str, messages: list[tuple[str, str]], now: float
    ) -> bool:
        """Append (role, content) pairs to the person's thread and mark it used at `now`; False when the person
        has no such thread (never theirs, deleted, or pruned)."""
        async with self.db.tx() as tx:
            touched = await tx.execute(
                "UPDATE chat_threads SET updated_at = ? WHERE id = ? AND person = ?", (now, thread_id, person)
            )
            if not touched:
                return False
            rows = await tx.fetch(
                "SELECT COALESCE(MAX(seq), 0) FROM chat_messages WHERE thread_id = ?", (thread_id,)
            )
            first = int(rows[0][0]) + 1
            await tx.executemany(
                "INSERT INTO chat_messages (thread_id, seq, role, content, created_at) VALUES (?, ?, ?, ?, ?)",
                [(thread_id, first + i, role, content, now) for i, (role, content) in enumerate(messages)],
            )
        return True

    async def threads_of(self, person: str, limit: int = 100) -> list[ChatThread]:
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {_THREAD} FROM chat_threads WHERE person = ? ORDER BY updated_at DESC, id LIMIT ?",
                (person, limit),
            )
        return [_thread(r) for r in rows]

    async def thread(self, person: str, thread_id: str) -> tuple[ChatThread, list[ChatMessage]] | None:
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {_THREAD} FROM chat_threads WHERE id = ? AND person = ?", (thread_id, person)
            )
            if not rows:
                return None
            messages = await tx.fetch(
                "SELECT seq, role, content, created_at FROM chat_messages WHERE thread_id = ? ORDER BY seq",
                (thread_id,),
            )
        return _thread(rows[0]), [ChatMessage(int(m[0]), str(m[1]), str(m[2]), float(m[3])) for m in messages]

    async def delete_thread(self, person: str, thread_id: str) -> bool:
        async with self.db.tx() as tx:
            return (
                await tx.execute("DELETE FROM chat_threads WHERE id = ? AND person = ?", (thread_id, person))
                > 0
            )

    async def prune_threads(self, older_than: float) -> int:
        """Delete every thread whose last message is older than `older_than` (the retention's cut-off); their
        messages go with them. Returns how many threads went."""
        async with self.db.tx() as tx:
            return await tx.execute("DELETE FROM chat_threads WHERE updated_at < ?", (older_than,))
