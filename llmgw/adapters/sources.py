"""Where revisions come from: a git branch (gitpython) or a plain directory.

A source only fetches and says which revision is current and where its tree is; validating and applying is
the controller's job. gitpython blocks, so every git call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from llmgw.adapters.repo_files import content_hash
from llmgw.core.errors import TransientError


class SourceUnavailable(TransientError):
    """The source could not be read right now (remote unreachable, directory missing); `delay`: the source's
    poll interval, when it is retried."""


@dataclass(frozen=True)
class Checkout:
    revision: str
    root: Path  # the tree to validate (sub-path applied)
    where: str  # where it came from, for the store and status ("git URL@branch", "dir PATH")


class RevisionSource(Protocol):
    description: str
    interval_s: float

    async def poll(self) -> Checkout: ...


def _redact_url(url: str) -> str:
    """https://user:token@host/x -> https://host/x: credentials never reach logs or the status page."""
    return re.sub(r"//[^/@]+@", "//", url)


class GitSource:
    """A clone of one branch under `state_dir`, fetched every poll; a revision is the commit SHA."""

    def __init__(self, url: str, branch: str, subpath: str, state_dir: Path, interval_s: float) -> None:
        self.url = url
        self.branch = branch
        self.subpath = subpath
        self.interval_s = interval_s
        key = hashlib.sha256(f"{url}\0{branch}".encode()).hexdigest()[:12]
        self.clone_dir = state_dir / "repo" / key
        self._lock = threading.Lock()
        self.description = f"git {_redact_url(url)}@{branch}" + (
            "" if subpath in ("", ".") else f":{subpath}"
        )

    async def poll(self) -> Checkout:
        return await asyncio.to_thread(self._poll_sync)

    async def content_hash_at(self, sha: str) -> str | None:
        """The content hash of the YAML tree at commit `sha` (sub-path applied), when the followed branch
        as fetched now contains that commit; None when it does not (or the source cannot be read).

        What lets an admin apply carry a git SHA as its label only when the files it sent are that commit's
        (llmgw.controller.api.admin)."""
        return await asyncio.to_thread(self._content_hash_at_sync, sha)

    async def branch_tip(self) -> str | None:
        """The followed branch's commit as last fetched (by a poll or `content_hash_at`), without fetching."""
        return await asyncio.to_thread(self._branch_tip_sync)

    def _branch_tip_sync(self) -> str | None:
        import git

        with self._lock:
            try:
                with git.Repo(self.clone_dir) as repo:
                    return str(repo.commit(f"origin/{self.branch}").hexsha)
            except (git.InvalidGitRepositoryError, git.NoSuchPathError, git.exc.BadName, ValueError):
                return None

    def _content_hash_at_sync(self, sha: str) -> str | None:
        import io
        import tarfile
        import tempfile

        import git

        with self._lock:
            try:
                if not (self.clone_dir / ".git").exists():
                    return None
                with git.Repo(self.clone_dir) as repo:
                    repo.remotes.origin.fetch(self.branch, prune=True)
                    commit = repo.commit(sha)
                    tip = repo.commit(f"origin/{self.branch}")
                    if commit.hexsha != sha or not repo.is_ancestor(commit, tip):
                        return None
                    archive = io.BytesIO()
                    repo.archive(archive, treeish=commit.hexsha, format="tar")
            except (
                git.GitCommandError,
                git.InvalidGitRepositoryError,
                git.NoSuchPathError,
                git.exc.BadName,
                git.exc.BadObject,
                ValueError,
            ):
                return None
        archive.seek(0)
        with tempfile.TemporaryDirectory(prefix="llmgw-verify-") as tmp, tarfile.open(fileobj=archive) as tar:
            tar.extractall(tmp, filter="data")
            root = Path(tmp) / self.subpath
            return content_hash(root) if root.is_dir() else None

    def _poll_sync(self) -> Checkout:
        with self._lock:  # one git operation at a time on the clone (the poll, or a verification)
            return self._poll_locked()

    def _poll_locked(self) -> Checkout:
        import git

        try:
            if not (self.clone_dir / ".git").exists():
                self.clone_dir.parent.mkdir(parents=True, exist_ok=True)
                repo = git.Repo.clone_from(self.url, self.clone_dir, branch=self.branch, no_checkout=True)
            else:
                repo = git.Repo(self.clone_dir)
            # Closed at once: an open Repo keeps `git cat-file` processes running until it is collected.
            with repo:
                repo.remotes.origin.fetch(self.branch, prune=True)
                head = repo.commit(f"origin/{self.branch}")
                repo.git.checkout("--force", "--detach", head.hexsha)
                repo.git.clean("-fdx")
        except (git.GitCommandError, git.InvalidGitRepositoryError, git.NoSuchPathError, ValueError) as exc:
            raise SourceUnavailable(
                f"{self.description}: {_redact_url(_first_line(exc))}", delay=self.interval_s
            ) from exc
        root = (self.clone_dir / self.subpath).resolve()
        if not root.is_dir():
            raise SourceUnavailable(
                f"{self.description}: sub-path {self.subpath!r} does not exist at {head.hexsha[:12]}",
                delay=self.interval_s,
            )
        return Checkout(head.hexsha, root, self.description)


def _first_line(exc: Exception) -> str:
    text = str(getattr(exc, "stderr", "") or exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


class DirectorySource:
    """A plain directory (development, `llmgw up`): the revision is a hash of the YAML content.

    Polled every second: file sizes and mtimes are cheap, and only a change there costs a content hash.
    """

    def __init__(self, path: Path, interval_s: float = 1.0) -> None:
        self.path = path.resolve()
        self.interval_s = interval_s
        self.description = f"dir {self.path}"
        self._stamp: tuple[tuple[str, int, int], ...] | None = None
        self._revision: str | None = None

    async def poll(self) -> Checkout:
        return await asyncio.to_thread(self._poll_sync)

    def _poll_sync(self) -> Checkout:
        if not self.path.is_dir():
            raise SourceUnavailable(f"{self.description}: not a directory", delay=self.interval_s)
        try:
            stamp = tuple(
                sorted(
                    (str(p.relative_to(self.path)), p.stat().st_mtime_ns, p.stat().st_size)
                    for p in self.path.rglob("*")
                    if p.suffix in (".yaml", ".yml") and p.is_file()
                )
            )
            if stamp != self._stamp or self._revision is None:
                self._revision = content_hash(self.path)
                self._stamp = stamp
        except OSError as exc:
            raise SourceUnavailable(f"{self.description}: {exc}", delay=self.interval_s) from exc
        return Checkout(self._revision, self.path, self.description)
