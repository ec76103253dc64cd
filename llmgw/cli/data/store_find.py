"""Which store the CLI's store commands open (`llmgw usage`, `llmgw traffic export|import`, `llmgw store ...`).

The deployment's store, found in this order, the first that answers choosing it:
1. `--store DSN`;
2. the LLMGW_STORE environment variable;
3. the controller's own configuration: `--controller-config FILE` (or LLMGW_CONTROLLER_CONFIG), its `store:`;
4. the controller's admin API, when one is named (`--controller URL` where the command has it, or
   LLMGW_CONTROLLER): `GET /api/v1/store` (an admin token), which answers without a password;
5. the store `llmgw up` made in this directory (`.llmgw/state/llmgw.db`), when it exists.

The command says which one chose it. A SQLite file that does not exist is an error naming where it was looked
for and how to point at the right store: a store command never makes an empty store by accident (on a
PostgreSQL deployment that empty file read as "no usage" and as a trace of no requests). Only the commands
that write (`llmgw store migrate`, `llmgw traffic import`, `llmgw keys --store`) create one, and only where an
explicit `--store`/LLMGW_STORE names it: that is what they were asked for.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llmgw.cli import admin_client
from llmgw.core.api.admin_api import StoreLocation
from llmgw.core.errors import LlmgwError
from llmgw.store import DEFAULT_DSN, StoreError, parse_dsn

__all__ = ["CONFIG_ENV", "FoundStore", "StoreNotFoundError", "StoreWhere", "find_store"]

CONFIG_ENV = "LLMGW_CONTROLLER_CONFIG"
_HOW = (
    "point --store at the deployment's store (the controller's `store` setting, e.g. --store "
    "@/etc/llmgw/store.dsn), or --controller-config at the controller's settings file"
)


class StoreNotFoundError(LlmgwError):
    """No store where the command looked; the message says where it looked and how to name the right one."""


@dataclass(frozen=True)
class StoreWhere:
    """What the command was told about the store."""

    store: str | None = None
    controller_config: Path | None = None
    controller: str | None = None
    token_file: Path | None = None
    may_create: bool = (
        False  # a writing command: with --store/LLMGW_STORE, making the store is what was asked
    )


@dataclass(frozen=True)
class FoundStore:
    dsn: str
    source: str  # what chose it, in words

    def shown(self) -> str:
        """The store without a password, and what chose it."""
        try:
            where = parse_dsn(self.dsn).redacted() if not self.dsn.startswith("@") else self.dsn
        except StoreError:
            where = "(unreadable DSN)"
        return f"{where} (chosen by {self.source})"


def find_store(where: StoreWhere, cwd: Path | None = None) -> FoundStore:
    env = os.environ
    cwd = cwd or Path.cwd()
    explicit = True
    if where.store:
        found = FoundStore(where.store, "--store")
    elif env.get("LLMGW_STORE"):
        found = FoundStore(env["LLMGW_STORE"], "LLMGW_STORE")
    else:
        explicit = False
        found = _from_controller(where, env) or _local(cwd)
    _check_exists(found, may_create=where.may_create and explicit)
    return found


def _from_controller(where: StoreWhere, env: os._Environ[str]) -> FoundStore | None:
    config = where.controller_config or (Path(env[CONFIG_ENV]) if env.get(CONFIG_ENV) else None)
    if config is not None:
        return _from_config(config, "--controller-config" if where.controller_config else CONFIG_ENV)
    url = where.controller or env.get(admin_client.CONTROLLER_ENV)
    if url:
        return _from_admin_api(url, where.token_file)
    return None


def _from_config(path: Path, named_by: str) -> FoundStore:
    from llmgw.controller.parts.settings import SettingsError, load_settings_file

    try:
        values = load_settings_file(path)
    except (SettingsError, OSError) as exc:
        raise StoreNotFoundError(f"the controller's configuration {path} (from {named_by}): {exc}") from None
    store = values.get("store")
    if not isinstance(store, str) or not store.strip():
        raise StoreNotFoundError(
            f"the controller's configuration {path} (from {named_by}) has no `store:`; its controller uses "
            "the single-machine default .llmgw/state/llmgw.db of the directory it runs in: " + _HOW
        )
    return FoundStore(store, f"the controller's configuration {path}")


def _from_admin_api(url: str, token_file: Path | None) -> FoundStore:
    env = admin_client.environ()
    try:
        token = admin_client.resolve_token(
            token_file, env, admin_client.default_token_files(None, Path.cwd())
        )
        where = admin_client.AdminClient(url, token).get_as("/api/v1/store", StoreLocation)
    except admin_client.AdminError as exc:
        raise StoreNotFoundError(
            f"asking the controller at {url} where its store is: {exc}; or {_HOW}"
        ) from None
    return FoundStore(where.store, f"the controller at {url} (its admin API)")


def _local(cwd: Path) -> FoundStore:
    path = cwd / parse_dsn(DEFAULT_DSN).target
    if path.exists():
        return FoundStore(f"sqlite:///{path}", f"the local store `llmgw up` made in {cwd}")
    raise StoreNotFoundError(
        "no store found: no --store, no LLMGW_STORE, no controller configuration (--controller-config or "
        f"{CONFIG_ENV}), no controller named ({admin_client.CONTROLLER_ENV}), and no local store at {path} "
        "(what `llmgw up` makes); " + _HOW
    )


def _check_exists(found: FoundStore, *, may_create: bool) -> None:
    try:
        dsn = parse_dsn(found.dsn)
    except StoreError as exc:
        raise StoreNotFoundError(f"{exc} (store chosen by {found.source})") from None
    if dsn.dialect != "sqlite" or may_create:
        return
    path = Path(dsn.target).expanduser()
    if not path.exists():
        raise StoreNotFoundError(
            f"no store at {path} (chosen by {found.source}): nothing is created by this command; " + _HOW
        )
