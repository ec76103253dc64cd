"""`llmgw store backup` and `llmgw store restore`: the store, with the secrets it cannot serve without.

A backup is one tar file: `manifest.json` (the store's dialect, schema version and rows per table; the paths of
the sealed files), the store's rows (`store.sqlite` from SQLite's backup API, or `store.pgdump` from pg_dump),
and `secrets.sealed`: the controller's secrets directory, its cluster CA, the keys it made in its state
directory (admin token, cluster secret, node token generations) and its TLS files, sealed with the operator's
passphrase (llmgw.adapters.sealed_files). A store restored without them cannot serve: every engine key and node
token derives from the cluster secret, agents and routers trust only the CA.

Restore puts both back, then checks that the result serves: migrations current, the rows the manifest counted,
a key given with --check-key-file authenticates, and the controller starts on it (/healthz, then its admin API
with the restored admin token).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Annotated, Any

import typer

from llmgw.adapters import keys as keymod, sealed_files
from llmgw.cli import output
from llmgw.cli.data import restore_check
from llmgw.cli.data.store_find import CONFIG_ENV, StoreWhere, find_store
from llmgw.store import KeyLookup, Store, StoreError, parse_dsn
from llmgw.store.backup import dump_store, load_store, store_has_tables

FORMAT = "llmgw-backup/1"
MANIFEST, SEALED = "manifest.json", "secrets.sealed"
STORE_MEMBER = {"sqlite": "store.sqlite", "postgres": "store.pgdump"}
# Files the controller makes in its state directory that a restored controller needs as they were.
STATE_SECRETS = ("admin-token", "cluster-secret", "node-generations.json")

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--controller-config",
        envvar=CONFIG_ENV,
        help="The controller's settings file: its store, state_dir, secrets_dir, ca_dir and TLS files",
    ),
]
StoreOpt = Annotated[
    str | None,
    typer.Option("--store", envvar="LLMGW_STORE", help="The store's DSN, when not the controller's `store:`"),
]
PassphraseOpt = Annotated[
    Path | None,
    typer.Option(
        "--passphrase-file",
        help=f"File whose first line seals the secrets (else ${sealed_files.PASSPHRASE_ENV})",
    ),
]


@dataclass(frozen=True)
class Manifest:
    dialect: str
    schema_version: int
    rows: dict[str, int]
    sealed: list[str]
    created_at: float

    def dump(self) -> bytes:
        body = {"format": FORMAT, **self.__dict__}
        return json.dumps(body, indent=2, sort_keys=True).encode()


def _controller_values(config: Path | None) -> dict[str, Any]:
    if config is None:
        return {}
    from llmgw.controller.parts.settings import SettingsError, load_settings_file

    try:
        return load_settings_file(config)
    except (SettingsError, OSError) as exc:
        output.fail(f"--controller-config {config}: {exc}")


def secret_paths(values: dict[str, Any], include: list[Path]) -> list[Path]:
    """What the controller configured in `values` keeps that a restore needs, where it exists now."""
    state = Path(values.get("state_dir") or ".llmgw/controller")
    found = [Path(values.get("secrets_dir") or state / "secrets"), Path(values.get("ca_dir") or state / "ca")]
    found += [state / name for name in STATE_SECRETS]
    for setting in ("admin_token_file", "admin_tokens_file", "tls_cert", "tls_key", "tls_client_ca"):
        if values.get(setting):
            found.append(Path(values[setting]))
    if values.get("webhook_secret_file"):
        found.append(Path(values["webhook_secret_file"]))
    present = [p.expanduser().resolve() for p in found if p.expanduser().exists()]
    return list(dict.fromkeys(present + [p.expanduser().resolve() for p in include]))


def backup(
    out: Annotated[Path, typer.Argument(help="The backup file to write (mode 0600)")],
    controller_config: ConfigOpt = None,
    store: StoreOpt = None,
    passphrase_file: PassphraseOpt = None,
    include: Annotated[
        list[Path] | None,
        typer.Option("--include", help="Another file or directory to seal (e.g. a router's content key)"),
    ] = None,
    store_only: Annotated[
        bool, typer.Option("--store-only", help="No secrets: the store alone (it cannot serve by itself)")
    ] = False,
) -> None:
    """Back up the store (SQLite's backup API, or pg_dump) with the controller's secrets directory, CA and
    keys sealed by a passphrase; the controller and routers keep running."""
    if controller_config is None and not store_only:
        output.fail(
            "--controller-config (or $LLMGW_CONTROLLER_CONFIG) says where the secrets and the CA are; "
            "--store-only backs up the store alone"
        )
    values = _controller_values(controller_config)
    paths = [] if store_only else secret_paths(values, include or [])
    sealed = b""
    if paths:
        sealed = sealed_files.seal(paths, sealed_files.read_passphrase(passphrase_file, os.environ))
    found = find_store(StoreWhere(store, controller_config))
    dsn = parse_dsn(found.dsn)
    err = output.console(stderr=True)
    err.print(f"store {found.shown()}", highlight=False, markup=False)
    work = out.with_name(f".{out.name}.part")
    dump = out.with_name(f".{out.name}.store")
    try:
        dumped = dump_store(dsn, dump)
        version, rows = dumped.schema_version, dumped.rows
        manifest = Manifest(dsn.dialect, version, rows, [str(p) for p in paths], time.time())
        fd = os.open(work, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh, tarfile.open(fileobj=fh, mode="w") as tar:
            _add(tar, MANIFEST, manifest.dump())
            tar.add(str(dump), arcname=STORE_MEMBER[dsn.dialect])
            if sealed:
                _add(tar, SEALED, sealed)
        work.replace(out)
    finally:
        dump.unlink(missing_ok=True)
        work.unlink(missing_ok=True)
    for p in paths:
        err.print(f"sealed {p}", highlight=False, markup=False)
    print(
        f"backed up {sum(rows.values())} rows at schema version {version} and {len(paths)} secret paths to {out}"
    )


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
    tar.addfile(info, io.BytesIO(data))


def _read_backup(path: Path) -> tuple[Manifest, bytes]:
    """The manifest and the sealed secrets (empty when the backup has none); the store stays in the file."""
    try:
        with tarfile.open(path, mode="r") as tar:
            raw = json.loads(_member(tar, MANIFEST, path).read())
            if raw.pop("format", None) != FORMAT:
                output.fail(f"{path}: not an llmgw backup of format {FORMAT}")
            manifest = Manifest(**raw)
            sealed = _member(tar, SEALED, path).read() if SEALED in tar.getnames() else b""
    except (OSError, tarfile.TarError, json.JSONDecodeError, TypeError, KeyError) as exc:
        output.fail(f"{path}: cannot read the backup ({exc})")
    return manifest, sealed


def _extract_store(path: Path, manifest: Manifest, out: Path) -> None:
    """The store's dump out of the backup into `out` (0600), streamed: a dump may be larger than memory."""
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with tarfile.open(path, mode="r") as tar, os.fdopen(fd, "wb") as fh:
        shutil.copyfileobj(_member(tar, STORE_MEMBER[manifest.dialect], path), fh)


def _member(tar: tarfile.TarFile, name: str, path: Path) -> IO[bytes]:
    try:
        extracted = tar.extractfile(name)
    except KeyError:
        output.fail(f"{path}: the backup has no {name}")
    if extracted is None:
        output.fail(f"{path}: {name} in the backup is not a file")
    return extracted


def restore(
    backup_file: Annotated[Path, typer.Argument(help="A file `llmgw store backup` wrote")],
    controller_config: ConfigOpt = None,
    store: StoreOpt = None,
    passphrase_file: PassphraseOpt = None,
    replace: Annotated[
        bool,
        typer.Option("--replace", help="Overwrite a store that has tables, and secret files that differ"),
    ] = False,
    check_key_file: Annotated[
        Path | None, typer.Option("--check-key-file", help="An API key (first line) that must authenticate")
    ] = None,
    start_check: Annotated[
        bool, typer.Option("--start-check/--no-start-check", help="Start the controller on the result")
    ] = True,
) -> None:
    """Restore a backup into the configured store (empty, unless --replace) and put the sealed secrets back
    where they were; then check that it serves. Stop the controllers and routers first."""
    manifest, sealed = _read_backup(backup_file)
    entries: list[sealed_files.SealedEntry] = []
    if sealed:  # opened before the store is touched: a wrong passphrase changes nothing
        entries = sealed_files.unseal(sealed, sealed_files.read_passphrase(passphrase_file, os.environ))
    target = _target_dsn(store, controller_config)
    dsn = parse_dsn(target)
    if dsn.dialect != manifest.dialect:
        output.fail(
            f"the backup is of a {manifest.dialect} store and the target {dsn.redacted()} is {dsn.dialect}: "
            "restore into the same kind, then `llmgw store move` it"
        )
    if asyncio.run(store_has_tables(dsn)) and not replace:
        output.fail(f"the store {dsn.redacted()} already has tables: give --replace to overwrite it")
    sealed_files.check_clashes(entries, replace=replace)
    work = backup_file.with_name(f".{backup_file.name}.restoring")
    try:
        _extract_store(backup_file, manifest, work)
        load_store(dsn, work, replace=replace)
    finally:
        work.unlink(missing_ok=True)
    err = output.console(stderr=True)
    for written in sealed_files.write_entries(entries, replace=replace):
        err.print(f"restored {written}", highlight=False, markup=False)
    print(
        f"restored {sum(manifest.rows.values())} rows into {dsn.redacted()} and {len(entries)} secret files"
    )
    _check(target, manifest, check_key_file, controller_config if start_check else None)


def _target_dsn(store: str | None, controller_config: Path | None) -> str:
    if store:
        return store
    value = _controller_values(controller_config).get("store")
    if not isinstance(value, str) or not value.strip():
        output.fail("no store to restore into: give --store DSN or --controller-config with a `store:`")
    return value


def _check(dsn: str, manifest: Manifest, key_file: Path | None, config: Path | None) -> None:
    """That the restored store serves; each check said as it passes, the first failure exits."""

    try:
        plain = key_file.read_text(encoding="utf-8").strip() if key_file is not None else None
    except OSError as exc:
        output.fail(f"check: cannot read --check-key-file {key_file}: {exc.strerror}")

    async def go() -> tuple[list[int], dict[str, int], KeyLookup | None]:
        opened = await Store.open(dsn, migrate_schema=False)
        try:
            applied = await opened.migrate()
            key = None if plain is None else await keymod.lookup(opened, plain, time.time())
            return applied, await opened.row_counts(), key
        finally:
            await opened.close()

    try:
        applied, rows, key = asyncio.run(go())
    except (StoreError, OSError) as exc:
        output.fail(f"check: the restored store does not open: {exc}")
    print(f"check: migrations current (applied now: {applied or 'none'})")
    differ = {t: (n, rows.get(t)) for t, n in manifest.rows.items() if rows.get(t) != n}
    if differ:
        output.fail(f"check: rows differ from the backup's count (table: backup, restored): {differ}")
    print(f"check: {len(rows)} tables hold the rows the backup counted")
    if key_file is not None:
        if key is None or key.state != "active":
            output.fail(
                f"check: the key in {key_file} does not authenticate ({key.state if key else 'unknown'})"
            )
        print(f"check: the key in {key_file} authenticates (project {key.project})")
    if config is not None:
        print(f"check: {restore_check.start_controller(config)}")
