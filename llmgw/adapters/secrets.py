"""Tokens and the cluster secret: read once from where the repo or the flags say, never logged."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from llmgw.core.config.models import SecretRef
from llmgw.core.config.secret_bindings import BINDINGS_FILE, SecretUse
from llmgw.core.config.secretrefs import SecretPolicy, SecretRefError, resolve, resolve_bound
from llmgw.core.errors import LlmgwError


class SecretError(LlmgwError):
    """A secret could not be read; the message names where it was looked for, never its value."""


def read_secret(ref: SecretRef, policy: SecretPolicy, environ: Mapping[str, str] | None = None) -> str:
    """A SecretRef's value, confined to the controller's secrets directory and env prefix (never the repo
    root: a git clone is cleaned on every poll, and `..` from it reaches the controller's own state)."""
    try:
        return resolve(ref, policy, environ)
    except SecretRefError as exc:
        raise SecretError(str(exc)) from None


def read_bound_secret(
    use: SecretUse,
    policy: SecretPolicy,
    reserved: frozenset[str],
    environ: Mapping[str, str] | None = None,
) -> str:
    """A Model's, Adapter's or Notification's secret, only where the operator's binding map lets it go
    (llmgw.core.config.secret_bindings); the message of a refusal names the line to add."""
    try:
        return resolve_bound(use, policy, reserved, environ)
    except SecretRefError as exc:
        raise SecretError(str(exc)) from None


STARTER_BINDINGS = """\
# Which secret a Model or Adapter may have sent where (docs/security.md, "Secrets bound to destinations").
# One line per secret the repo names in `source.token` or `provider.key`: the file name (or $ENV_NAME), the
# purposes it may serve and the hosts that may receive it. Nothing listed: no such reference resolves.
#
# hf-token: {purposes: [source-token], hosts: [huggingface.co]}
# openai-key: {purposes: [provider-key], hosts: [api.openai.com]}
"""


def write_starter_bindings(secrets_dir: Path) -> Path | None:
    """A commented, empty binding map in `secrets_dir` unless one is there (never overwritten: it is the
    operator's); the path written, or None."""
    path = secrets_dir / BINDINGS_FILE
    if path.exists():
        return None
    secrets_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(STARTER_BINDINGS)
    return path


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
