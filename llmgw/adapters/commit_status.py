"""Commit statuses on the cluster repo's forge: GitHub's and Gitea/Forgejo's `POST
{repo_api}/statuses/{sha}` with `{state, context, description, target_url}` share one shape (and both take
`Authorization: token T`).

A post is retried with a doubling backoff on what may pass later (an unreachable forge, 5xx, 429); a 4xx is
final (a wrong token or an unknown commit will not mend itself). The caller is never held: it learns the
outcome and decides what to say.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import aiohttp

from llmgw.core.errors import LlmgwError

__all__ = ["CommitStatus", "CommitStatusError", "StatusPoster", "is_commit_sha", "read_token"]

State = Literal["pending", "success", "failure", "error"]
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # sha1 and sha256 object names
_DESCRIPTION_MAX = 140  # GitHub refuses longer descriptions


class CommitStatusError(LlmgwError):
    """The token file cannot be read; the message says where."""


def is_commit_sha(revision: str) -> bool:
    """A git object name a forge knows (a plain directory's content hash or an apply label is not)."""
    return _SHA.fullmatch(revision) is not None


def read_token(path: Path) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise CommitStatusError(f"commit_status_token_file {path}: {exc.strerror}") from None
    if not token:
        raise CommitStatusError(f"commit_status_token_file {path} is empty (it must hold the forge token)")
    return token


@dataclass(frozen=True, slots=True)
class CommitStatus:
    sha: str
    state: State
    context: str
    description: str
    target_url: str | None = None

    def body(self) -> dict[str, str]:
        out = {
            "state": self.state,
            "context": self.context,
            "description": self.description[:_DESCRIPTION_MAX],
        }
        if self.target_url:
            out["target_url"] = self.target_url
        return out


class StatusPoster:
    """Posts statuses to one repo's API base, in the order asked (a lock: a late `pending` must never land
    after the verdict it precedes)."""

    def __init__(
        self,
        repo_api: str,
        token: str,
        *,
        attempts: int = 5,
        backoff_s: float = 1.0,
        timeout_s: float = 10.0,
    ) -> None:
        self.repo_api = repo_api.rstrip("/")
        self.token = token
        self.attempts, self.backoff_s, self.timeout_s = attempts, backoff_s, timeout_s
        self._lock = asyncio.Lock()

    async def post(self, status: CommitStatus) -> str | None:
        """None once the forge took it, else why not (after the retries)."""
        async with self._lock:
            delay = self.backoff_s
            problem = "not tried"
            for attempt in range(self.attempts):
                if attempt:
                    await asyncio.sleep(delay)
                    delay *= 2
                problem, final = await self._once(status)
                if not problem or final:
                    break
            return problem or None

    async def _once(self, status: CommitStatus) -> tuple[str, bool]:
        """('', _) posted; (why, final) not: final when asking again cannot help."""
        url = f"{self.repo_api}/statuses/{status.sha}"
        headers = {"Authorization": f"token {self.token}", "Accept": "application/json"}
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    url,
                    json=status.body(),
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                ) as resp,
            ):
                if resp.status < 300:
                    return "", True
                text = (await resp.text())[:200]
                retry = resp.status >= 500 or resp.status == 429
                return f"{url} answered {resp.status}: {text}", not retry
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"{url} could not be reached: {type(exc).__name__} {exc}".rstrip(), False
