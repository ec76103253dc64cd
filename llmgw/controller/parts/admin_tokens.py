"""Named, scoped admin tokens: who may read, who may apply, who may do everything.

Three scopes, each containing the one before it:

* `plan`  — read-only: status, nodes, replicas, models, explain, the live state, events. What a pull-request
  job needs for `llmgw plan`; a branch anyone can push may hold it without being able to change anything.
* `apply` — `plan` and `POST /api/v1/apply`: the push-to-main job.
* `admin` — everything, including API keys: operators.

The controller's own admin token (`--admin-token-file`, or the one it generates) is always the token named
`admin` with scope `admin`, so a single-token setup works as before. More tokens come from the
`admin_tokens_file` setting, a YAML mapping of name to scope and value, the value never in the clear:

    ci-plan:  {scope: plan,  sha256: 3f9a...}            # hex SHA-256 of the token
    ci-apply: {scope: apply, file: tokens/ci-apply}      # a file holding the token (relative to this file)

The token's name is what the audit trail records (revision history, events), never the token.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from llmgw.core.errors import LlmgwError

Scope = Literal["plan", "apply", "admin"]
SCOPES: tuple[Scope, ...] = ("plan", "apply", "admin")
_RANK: dict[Scope, int] = {scope: i for i, scope in enumerate(SCOPES)}
ADMIN_NAME = "admin"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class AdminTokenError(LlmgwError, ValueError):
    """The tokens file is wrong; the message names the file, the token's name and what would be right."""


def allows(have: Scope, need: Scope) -> bool:
    """Whether a token of scope `have` may call an endpoint that needs `need`."""
    return _RANK[have] >= _RANK[need]


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class AdminPrincipal:
    """Who called: a token's name and scope (never its value)."""

    name: str
    scope: Scope


@dataclass(frozen=True)
class _Entry:
    principal: AdminPrincipal
    digest: str  # hex SHA-256 of the token

    def __repr__(self) -> str:  # the digest is not the token, but still nothing for a log
        return f"_Entry({self.principal!r})"


class _TokenSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    scope: Scope
    sha256: str | None = Field(None, description="hex SHA-256 of the token")
    file: Path | None = Field(None, description="a file holding the token, relative to the tokens file")

    @model_validator(mode="after")
    def _one_value(self) -> _TokenSpec:
        if (self.sha256 is None) == (self.file is None):
            raise ValueError("give exactly one of sha256 (hex SHA-256 of the token) or file (a token file)")
        if self.sha256 is not None and not _HEX64.match(self.sha256):
            raise ValueError("sha256 must be 64 lowercase hex digits (`printf %s TOKEN | sha256sum`)")
        return self


class AdminTokens:
    """The tokens one controller accepts on its admin API."""

    def __init__(self, entries: list[_Entry]) -> None:
        self._entries = tuple(entries)

    @classmethod
    def single(cls, admin_token: str) -> AdminTokens:
        return cls([_Entry(AdminPrincipal(ADMIN_NAME, "admin"), token_digest(admin_token))])

    @classmethod
    def load(cls, admin_token: str, tokens_file: Path | None) -> AdminTokens:
        """The controller's own token as `admin`, plus every token the tokens file names."""
        own = _Entry(AdminPrincipal(ADMIN_NAME, "admin"), token_digest(admin_token))
        more = _read_tokens_file(tokens_file) if tokens_file is not None else []
        for entry in more:
            if entry.digest == own.digest:
                raise AdminTokenError(
                    f"{tokens_file}: token {entry.principal.name!r} is the controller's own admin token; "
                    "give it a token of its own"
                )
        return cls([own, *more])

    def principal(self, presented: str) -> AdminPrincipal | None:
        """The token's owner, or None. Every entry is compared (constant time each), so the time taken
        does not say which entry came close."""
        digest = token_digest(presented).encode()
        found: AdminPrincipal | None = None
        for entry in self._entries:
            if hmac.compare_digest(digest, entry.digest.encode()):
                found = found or entry.principal
        return found

    def names(self) -> list[tuple[str, Scope]]:
        return [(e.principal.name, e.principal.scope) for e in self._entries]


def check_tokens_file(path: Path) -> None:
    """Raises AdminTokenError when the tokens file is unreadable or wrong (for the command line)."""
    _read_tokens_file(path)


def _read_tokens_file(path: Path) -> list[_Entry]:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        data = YAML(typ="safe").load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AdminTokenError(f"cannot read admin_tokens_file {path}: {exc.strerror}") from exc
    except YAMLError as exc:
        raise AdminTokenError(f"admin_tokens_file {path} is not YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return []
    if not isinstance(data, dict):
        raise AdminTokenError(
            f"{path}: expected a mapping of token name to {{scope: plan|apply|admin, sha256: HEX}} "
            "or {scope: ..., file: PATH}"
        )
    entries: list[_Entry] = []
    seen_digests: dict[str, str] = {}
    for raw_name, raw_spec in data.items():
        name = str(raw_name)
        if not _NAME.match(name):
            raise AdminTokenError(
                f"{path}: token name {name!r} must be lowercase letters, digits, '.', '_' or '-' "
                "(it is what the audit trail records)"
            )
        if name == ADMIN_NAME:
            raise AdminTokenError(
                f"{path}: the name {ADMIN_NAME!r} is the controller's own admin token "
                "(--admin-token-file); give this token another name"
            )
        try:
            spec = _TokenSpec.model_validate(raw_spec)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "value"
            raise AdminTokenError(f"{path}: {name}.{where}: {first['msg']}") from None
        digest = spec.sha256 if spec.sha256 is not None else _digest_of_file(path, name, spec.file)
        if digest in seen_digests:
            raise AdminTokenError(
                f"{path}: tokens {seen_digests[digest]!r} and {name!r} are the same token; each name needs "
                "its own, or the audit trail cannot tell them apart"
            )
        seen_digests[digest] = name
        entries.append(_Entry(AdminPrincipal(name, spec.scope), digest))
    return entries


def _digest_of_file(tokens_file: Path, name: str, ref: Path | None) -> str:
    assert ref is not None
    target = ref.expanduser()
    target = target if target.is_absolute() else tokens_file.parent / target
    try:
        value = target.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise AdminTokenError(f"{tokens_file}: {name}.file: cannot read {target}: {exc.strerror}") from exc
    if not value:
        raise AdminTokenError(f"{tokens_file}: {name}.file: {target} is empty (it should hold the token)")
    return token_digest(value)
