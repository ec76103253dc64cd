"""Kept content, the one retention mechanism every stored content uses (Responses `store`, a shared cache):
sealed with AES-GCM under the controller's content key, kept by kind + project + id, deleted on expiry.

Whether a project may keep content at all, and for how long, is the repo's (`Project.spec.retention`,
`llmgw.core.config`); the caller asks that first and passes the TTL here. The vault only seals, keeps and
forgets. The associated data binds each sealed value to its kind, project and id, so a row copied to another
project's or id's place does not open. `key_id` names the key a row was sealed with: a rotated key is
reported as such instead of as corrupt content.
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from llmgw.core.errors import LlmgwError
from llmgw.store.db import Backend

__all__ = ["KEY_BYTES", "ContentError", "ContentQueries", "ContentVault", "Kept", "parse_content_key"]

KEY_BYTES = 32  # AES-256
_NONCE_BYTES = 12


class ContentError(LlmgwError):
    """Content cannot be sealed or opened; the message says which and why."""


def parse_content_key(text: str, where: str) -> bytes:
    """A content key as a settings file holds it: 32 bytes, base64 (`openssl rand -base64 32`)."""
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except ValueError:
        raise ContentError(
            f"{where}: the content key is not base64 (make one: openssl rand -base64 32)"
        ) from None
    if len(key) != KEY_BYTES:
        raise ContentError(
            f"{where}: the content key is {len(key)} bytes; it must be {KEY_BYTES} (base64 of them)"
        )
    return key


def key_id(key: bytes) -> str:
    """Which key sealed a row, without revealing it: 16 hex digits of a hash of it."""
    return hashlib.sha256(b"llmgw-content-key\0" + key).hexdigest()[:16]


@dataclass(frozen=True)
class Kept:
    kind: str
    project: str
    id: str
    created_at: float
    expires_at: float
    data: bytes


class ContentQueries:
    """The `content` table's rows as they are stored (sealed); mixed into `Store`."""

    db: Backend

    async def put_content_row(
        self, kind: str, project: str, id_: str, created_at: float, expires_at: float, key: str, sealed: str
    ) -> None:
        async with self.db.tx() as tx:
            await tx.execute(
                "INSERT INTO content (kind, project, id, created_at, expires_at, key_id, sealed) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (kind, project, id) DO UPDATE SET "
                "created_at = excluded.created_at, expires_at = excluded.expires_at, key_id = excluded.key_id, "
                "sealed = excluded.sealed",
                (kind, project, id_, created_at, expires_at, key, sealed),
            )

    async def content_row(
        self, kind: str, project: str, id_: str, now: float
    ) -> tuple[float, float, str, str] | None:
        """(created_at, expires_at, key_id, sealed) of a row not expired at `now`; None: none."""
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                "SELECT created_at, expires_at, key_id, sealed FROM content "
                "WHERE kind = ? AND project = ? AND id = ? AND expires_at > ?",
                (kind, project, id_, now),
            )
        return (float(rows[0][0]), float(rows[0][1]), rows[0][2], rows[0][3]) if rows else None

    async def delete_content(self, kind: str, project: str, id_: str) -> bool:
        async with self.db.tx() as tx:
            n = await tx.execute(
                "DELETE FROM content WHERE kind = ? AND project = ? AND id = ?", (kind, project, id_)
            )
        return n > 0

    async def prune_content(self, now: float, batch: int = 5000) -> int:
        """Delete up to `batch` rows expired at `now`, oldest expiry first; returns how many."""
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                "SELECT kind, project, id FROM content WHERE expires_at <= ? ORDER BY expires_at LIMIT ?",
                (now, batch),
            )
            for kind, project, id_ in rows:
                await tx.execute(
                    "DELETE FROM content WHERE kind = ? AND project = ? AND id = ?", (kind, project, id_)
                )
        return len(rows)

    async def content_projects(self) -> list[str]:
        async with self.db.tx() as tx:
            rows = await tx.fetch("SELECT DISTINCT project FROM content ORDER BY project")
        return [r[0] for r in rows]

    async def delete_project_content(self, project: str) -> int:
        """Forget everything a project kept (it withdrew its opt-in, or is gone from the repo)."""
        async with self.db.tx() as tx:
            return await tx.execute("DELETE FROM content WHERE project = ?", (project,))


def _aad(kind: str, project: str, id_: str) -> bytes:
    return b"\0".join(part.encode() for part in ("llmgw-content", kind, project, id_))


class ContentVault:
    """put / get / delete by kind + project + id, sealed at rest. `key` is the controller's content key."""

    def __init__(self, store: ContentQueries, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ContentError(f"a content key is {KEY_BYTES} bytes (got {len(key)})")
        self.store = store
        self._aead = AESGCM(key)
        self.key_id = key_id(key)

    async def put(self, kind: str, project: str, id_: str, data: bytes, ttl_s: float, now: float) -> float:
        """Keep `data` for `ttl_s` seconds from `now` (replacing what was kept under the same name); returns
        when it expires."""
        if not ttl_s > 0:
            raise ContentError(f"{kind} {id_}: a TTL must be positive (got {ttl_s!r})")
        for what, value in (("kind", kind), ("project", project), ("id", id_)):
            if not value:
                raise ContentError(f"content needs a non-empty {what}")
        nonce = os.urandom(_NONCE_BYTES)  # random per value: 2^-32 collision odds only past 2^32 puts a key
        sealed = nonce + self._aead.encrypt(nonce, data, _aad(kind, project, id_))
        expires = now + ttl_s
        await self.store.put_content_row(
            kind, project, id_, now, expires, self.key_id, base64.b64encode(sealed).decode()
        )
        return expires

    async def get(self, kind: str, project: str, id_: str, now: float) -> Kept | None:
        """What was kept, opened; None when nothing is (never kept, deleted, or expired at `now`)."""
        row = await self.store.content_row(kind, project, id_, now)
        if row is None:
            return None
        created, expires, sealed_by, text = row
        if sealed_by != self.key_id:
            raise ContentError(
                f"{kind} {id_} of project {project} was sealed with another content key ({sealed_by}; this "
                f"controller's is {self.key_id}): it cannot be opened"
            )
        raw = base64.b64decode(text)
        try:
            data = self._aead.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _aad(kind, project, id_))
        except InvalidTag:
            raise ContentError(
                f"{kind} {id_} of project {project} does not open: altered in the store"
            ) from None
        return Kept(kind, project, id_, created, expires, data)

    async def delete(self, kind: str, project: str, id_: str) -> bool:
        return await self.store.delete_content(kind, project, id_)
