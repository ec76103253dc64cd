"""Tokens and the cluster secret: read once from where the repo or the flags say, never logged."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from llmgw.config.models import SecretRef


class SecretError(Exception):
    """A secret could not be read; the message names where it was looked for, never its value."""


def read_secret(ref: SecretRef, root: Path, environ: dict[str, str] | None = None) -> str:
    """A SecretRef's value: `file` is relative to the cluster repo root, `env` names a variable."""
    if ref.env is not None:
        env = os.environ if environ is None else environ
        value = env.get(ref.env)
        if not value:
            raise SecretError(f"environment variable {ref.env} is not set (named by the cluster repo)")
        return value.strip()
    assert ref.file is not None
    path = Path(ref.file).expanduser()
    path = path if path.is_absolute() else root / path
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SecretError(f"cannot read secret file {path}: {exc.strerror}") from exc


def load_or_create(path: Path, nbytes: int = 32) -> str:
    """A random secret kept in a 0600 file: made on first use, the same one ever after."""
    if path.exists():
        value = path.read_text(encoding="utf-8").strip()
        if value:
            return value
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(nbytes)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(value + "\n")
    return value
