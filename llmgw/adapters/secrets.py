"""Tokens and the cluster secret: read once from where the repo or the flags say, never logged."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from llmgw.core.config.models import SecretRef
from llmgw.core.errors import LlmgwError
from llmgw.core.secretrefs import SecretPolicy, SecretRefError, resolve


class SecretError(LlmgwError):
    """A secret could not be read; the message names where it was looked for, never its value."""


def read_secret(ref: SecretRef, policy: SecretPolicy, environ: Mapping[str, str] | None = None) -> str:
    """A SecretRef's value, confined to the controller's secrets directory and env prefix (never the repo
    root: a git clone is cleaned on every poll, and `..` from it reaches the controller's own state)."""
    try:
        return resolve(ref, policy, environ)
    except SecretRefError as exc:
        raise SecretError(str(exc)) from None


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
