"""`llmgw keys ...` and `llmgw store ...`: the store's commands (`llmgw usage` is usage_cmds).

`llmgw keys` talks to the controller's admin API (`--controller`/LLMGW_CONTROLLER, default the local
controller on 127.0.0.1:7070, with an `admin`-scope token): the controller writes the key into the store its
routers read. Only with `--store DSN` (or LLMGW_STORE) does it open a store directly, for an operator who
means that store; without either it never makes a local SQLite file that no router reads.

For the other commands the store is the deployment's, found as llmgw.cli.data.store_find says (`--store`,
LLMGW_STORE, the controller's configuration, its admin API, the local store `llmgw up` made); each says on
standard error which one chose it, and a store that is not there is an error, never an empty store made on
the spot. Errors say which of those chose the address, because "cannot open" is only useful next to where the
address came from.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import getpass
import json
import os
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Column, Table

from llmgw.adapters import keys as keymod
from llmgw.cli import admin_client, output
from llmgw.cli.admin_client import AnswerT
from llmgw.cli.data.store_find import CONFIG_ENV, StoreWhere, find_store
from llmgw.core.api.admin_api import KeyCreated, KeyRevoked, KeysAnswer, KeyView
from llmgw.core.words import parse_duration
from llmgw.store import (
    DEFAULT_DSN,
    ApiKey,
    AuditEntry,
    Store,
    StoreError,
)
from llmgw.store.migrate import load_down_migrations, load_migrations, migrate_down
from llmgw.store.move import move_store
from llmgw.store.records import AuditOutcome

T = TypeVar("T")

keys_app = typer.Typer(help="API keys: create (shown once), list, revoke.", no_args_is_help=True)
store_app = typer.Typer(
    help="The store: migrate it, move it to another database, back it up and restore it.",
    no_args_is_help=True,
)

StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="Store DSN (sqlite:///path, postgresql://..., @file); env LLMGW_STORE; else the controller's "
        f"(--controller-config, ${admin_client.CONTROLLER_ENV}), else {DEFAULT_DSN} when it exists",
    ),
]
ControllerConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--controller-config",
        envvar=CONFIG_ENV,
        help="The controller's settings file: its `store:` is the store opened",
    ),
]
JsonOpt = output.JsonOpt
KeysStoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="LLMGW_STORE",
        help="Open this store directly (sqlite:///path or postgresql://...) instead of asking the controller",
    ),
]
ControllerOpt = Annotated[
    str | None,
    typer.Option(
        "--controller",
        envvar=admin_client.CONTROLLER_ENV,
        help=f"The controller's admin URL (default {admin_client.DEFAULT_CONTROLLER}); needs an admin token",
    ),
]
TokenFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        help=f"Admin token file (default: ${admin_client.TOKEN_ENV}, else the token a local controller made)",
    ),
]


def controller_client(controller: str | None, token_file: Path | None) -> admin_client.AdminClient:
    env = admin_client.environ()
    try:
        token = admin_client.resolve_token(
            token_file, env, admin_client.default_token_files(None, Path.cwd())
        )
        client = admin_client.AdminClient(controller or admin_client.DEFAULT_CONTROLLER, token)
    except admin_client.AdminError as exc:
        output.fail(f"{exc} (keys are made through the controller; --store DSN opens a store directly)")
    warning = admin_client.plaintext_warning(client.url)
    if warning is not None:
        output.console(stderr=True).print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    return client


def admin_call(
    client: admin_client.AdminClient, method: str, path: str, payload: Any, model: type[AnswerT]
) -> AnswerT:
    """The answer as `model` (the route table's, llmgw.core.api.admin_api); a message and exit 1 on any failure."""
    try:
        if method == "GET":
            return client.get_as(path, model)
        body = client.post(path, payload, ok=(200, 201))[1]
        return admin_client.read_answer(body, model, client.url + path)
    except admin_client.AdminError as exc:
        hint = ""
        if exc.status is None:
            hint = " (keys are made through the controller's admin API; --store DSN opens a store directly)"
        output.fail(f"{exc}{hint}")


def _api_key(view: KeyView) -> ApiKey:
    return ApiKey(
        view.id,
        view.prefix,
        view.project,
        view.name,
        view.created_at,
        view.expires_at,
        view.revoked_at,
        view.last_used_at,
        view.owner,
    )


def run_on_store(where: StoreWhere, action: Callable[[Store], Awaitable[T]], *, announce: bool = True) -> T:
    """Open the store `where` finds, run `action`; `announce`: say on standard error which store and what
    chose it (the key commands, given their store explicitly, print only the key)."""
    found = find_store(where)
    if announce:
        output.console(stderr=True).print(f"store {found.shown()}", highlight=False, markup=False)

    async def go() -> T:
        opened = await Store.open(found.dsn)
        try:
            return await action(opened)
        finally:
            await opened.close()

    try:
        return asyncio.run(go())
    except StoreError as exc:
        output.fail(f"{exc} (store chosen by {found.source})")


async def _audit_direct(store: Store, action: str, obj: str, outcome: AuditOutcome, reason: str = "") -> None:
    """A key command that opened the store itself is audited there, with the local user as its actor (no
    admin token named anyone). A failed write is said, and does not undo the action it records."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container): the uid still says who
        user = f"uid {os.getuid()}"
    entry = AuditEntry(time.time(), f"local:{user}", action, obj, outcome, reason, via="cli-store")
    try:
        await store.record_audit(entry)
    except StoreError as exc:
        output.console(stderr=True).print(
            f"[yellow]warning:[/yellow] {action} done, not audited: {exc}", highlight=False
        )


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _key_json(key: ApiKey, now: float) -> dict[str, Any]:
    return {
        "id": key.id,
        "prefix": key.prefix,
        "project": key.project,
        "owner": key.owner,
        "name": key.name,
        "state": key.state(now),
        "created_at": _when(key.created_at),
        "expires_at": _when(key.expires_at) or None,
        "revoked_at": _when(key.revoked_at) or None,
        "last_used_at": _when(key.last_used_at) or None,
    }


@keys_app.command("create")
def keys_create(
    project: Annotated[
        str | None,
        typer.Option("--project", help="Project the key spends against (with --owner: the key's default)."),
    ] = None,
    owner: Annotated[
        str | None,
        typer.Option("--owner", help="A Person: a personal key, charged to them (docs/tenancy.md)."),
    ] = None,
    name: Annotated[str, typer.Option("--name", help="A label for the key.")] = "",
    expires: Annotated[str | None, typer.Option("--expires", help="Lifetime such as 30d, 12h, 2w.")] = None,
    store: KeysStoreOpt = None,
    controller: ControllerOpt = None,
    token_file: TokenFileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a key and print it once: only its hash is kept."""
    if project is None and owner is None:
        output.fail(
            "give --project (a project's key) or --owner (a person's own key; --project is then its default)"
        )
    try:
        expires_in = parse_duration(expires, bare_seconds=False, positive=True) if expires else None
    except ValueError as exc:
        output.fail(f"--expires: {exc}")
    if store is None:
        body = {"project": project, "owner": owner, "name": name, "expires_in_s": expires_in}
        made = admin_call(controller_client(controller, token_file), "POST", "/api/v1/keys", body, KeyCreated)
        new = keymod.NewKey(_api_key(made), made.key)
    else:

        async def create(s: Store) -> keymod.NewKey:
            made = await keymod.create_key(
                s, project, time.time(), name=name, expires_in=expires_in, owner=owner
            )
            whose = (
                f"project {project}"
                if owner is None
                else f"person {owner}, project {project or '(names one)'}"
            )
            await _audit_direct(s, "key.create", f"{made.key.id} ({whose})", "accepted")
            return made

        new = run_on_store(StoreWhere(store, may_create=True), create, announce=False)
    if as_json:
        print(json.dumps({**_key_json(new.key, time.time()), "key": new.plaintext}))
        return
    print(new.plaintext)
    output.console(stderr=True).print(
        f"key {new.key.id} {_key_for(project, owner)}"
        + (f", expires {_when(new.key.expires_at)}" if new.key.expires_at else "")
        + ". This is the only time the key is shown: store it now.",
        highlight=False,
    )


def _key_for(project: str | None, owner: str | None) -> str:
    """Whose a new key is, as the messages say it."""
    if owner is None:
        return f"for project {project!r}"
    return f"of person {owner!r}" + (f", default project {project!r}" if project else ", no default project")


@keys_app.command("list")
def keys_list(
    project: Annotated[str | None, typer.Option("--project", help="Only this project's keys.")] = None,
    owner: Annotated[str | None, typer.Option("--owner", help="Only this person's keys.")] = None,
    store: KeysStoreOpt = None,
    controller: ControllerOpt = None,
    token_file: TokenFileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List keys (prefix only; the keys themselves are not kept)."""
    if store is None:
        params = {k: v for k, v in (("project", project), ("owner", owner)) if v}
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        listed = admin_call(
            controller_client(controller, token_file), "GET", f"/api/v1/keys{query}", None, KeysAnswer
        )
        found = [_api_key(k) for k in listed.keys]
    else:
        where = StoreWhere(store, may_create=True)
        found = run_on_store(where, lambda s: s.list_keys(project, owner), announce=False)
    now = time.time()
    if as_json:
        output.print_json([_key_json(k, now) for k in found])
        return
    table = Table(
        Column("ID", no_wrap=True),
        Column("Prefix", no_wrap=True),
        "Project",
        "Owner",
        "Name",
        "State",
        "Created",
        "Expires",
        "Last used",
    )
    for k in found:
        table.add_row(
            k.id,
            k.prefix + "…",
            k.project or "(names one)",
            k.owner or "",
            k.name,
            k.state(now),
            _when(k.created_at),
            _when(k.expires_at),
            _when(k.last_used_at) or "never",
        )
    output.console().print(table)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (see keys list).")],
    store: KeysStoreOpt = None,
    controller: ControllerOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """Revoke a key: the router answers 401 "revoked" from then on (after its cache expires)."""
    if store is None:
        path = f"/api/v1/keys/{urllib.parse.quote(key_id)}/revoke"
        admin_call(controller_client(controller, token_file), "POST", path, None, KeyRevoked)
    else:

        async def revoke(s: Store) -> bool:
            done = await s.revoke_key(key_id, time.time())
            reason = "" if done else "no such key"
            await _audit_direct(s, "key.revoke", key_id, "accepted" if done else "refused", reason)
            return done

        if not run_on_store(StoreWhere(store, may_create=True), revoke, announce=False):
            output.fail(f"no key with id {key_id!r} (see `llmgw keys list`)")
    print(f"revoked {key_id}")


@store_app.command("migrate")
def store_migrate(
    store: StoreOpt = None,
    controller_config: ControllerConfigOpt = None,
    down_to: Annotated[
        int | None,
        typer.Option(
            "--down-to",
            help="Undo the migrations above this version instead (each must ship a .down.sql): a rollback",
        ),
    ] = None,
) -> None:
    """Bring the store's schema up to date (also done by every process at start-up); with --store (or
    LLMGW_STORE) naming a SQLite file that does not exist, make it. --down-to goes back instead."""

    async def go(s: Store) -> tuple[list[int], int]:
        if down_to is not None:
            return await migrate_down(s.db, down_to), await s.schema_version()
        return await s.migrate(), await s.schema_version()

    if down_to is not None:
        found = find_store(StoreWhere(store, controller_config))
        undone, version = asyncio.run(_unmigrated(found.dsn, go))
        print(f"undid migrations {undone or 'none'}; store at schema version {version}")
        return
    # Store.open already migrates; report the resulting version.
    _, version = run_on_store(StoreWhere(store, controller_config, may_create=True), go)
    print(f"store at schema version {version}")


async def _unmigrated(dsn: str, action: Callable[[Store], Awaitable[T]]) -> T:
    """`action` on the store opened without migrating it first (what --down-to must not have done)."""
    opened = await Store.open(dsn, migrate_schema=False)
    try:
        return await action(opened)
    finally:
        await opened.close()


@store_app.command("migrations")
def store_migrations(as_json: JsonOpt = False) -> None:
    """The schema migrations this llmgw ships, and whether each can be undone (a .down.sql): what
    `llmgw upgrade --control-plane` asks each release before crossing them."""
    downs = load_down_migrations()
    listed = [
        {"version": m.version, "name": m.name, "reversible": m.version in downs} for m in load_migrations()
    ]
    if as_json:
        output.print_json(listed)
        return
    for m in listed:
        print(f"{m['version']:04d} {m['name']}{'' if m['reversible'] else ' (cannot be undone)'}")


@store_app.command("move")
def store_move(
    to: Annotated[str, typer.Option("--to", help="Destination DSN; must be empty (see --replace).")],
    replace: Annotated[
        bool, typer.Option("--replace", help="Delete the destination's rows first instead of refusing")
    ] = False,
    store: StoreOpt = None,
    controller_config: ControllerConfigOpt = None,
) -> None:
    """Copy every table to another store (for example SQLite to PostgreSQL), then check each table's row count
    in both. Stop the writers first."""
    console = output.console(stderr=True)

    async def go(src: Store) -> dict[str, int]:
        dst = await Store.open(to)
        try:
            report = await move_store(
                src,
                dst,
                lambda t, n: console.print(f"copied {t}: {n} rows", highlight=False),
                replace=replace,
            )
        finally:
            await dst.close()
        return report.copied

    copied = run_on_store(StoreWhere(store, controller_config), go)
    print(
        f"moved {sum(copied.values())} rows, each table's count checked in both stores; "
        "point --store / LLMGW_STORE at the new store"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
    from llmgw.cli.data import backup_cmds

    store_app.command("backup")(backup_cmds.backup)
    store_app.command("restore")(backup_cmds.restore)
    app.add_typer(store_app, name="store")
