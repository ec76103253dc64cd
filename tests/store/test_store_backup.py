"""`llmgw store backup` / `restore` on both stores: back up a store with its controller's secrets directory,
cluster CA and keys; wipe all of it; restore; the restored store serves (a key made before the backup
authenticates, the controller starts on it over TLS from the restored CA and takes the restored admin token)."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import tarfile
import threading
from pathlib import Path

import psycopg
import pytest
import yaml
from typer.testing import CliRunner

from llmgw.adapters.ssh.ca import ClusterCA
from llmgw.cli.main import app
from llmgw.store import Store, UsageRecord, parse_dsn

pytestmark = pytest.mark.integration

runner = CliRunner(env={"COLUMNS": "200"})
PASSPHRASE = "correct horse battery staple"


class Deployment:
    """A controller's configuration and the files it keeps, as `llmgw server init` would leave them."""

    def __init__(self, tmp: Path, dsn: str) -> None:
        self.dsn = dsn
        self.state = tmp / "state-controller"
        self.secrets = self.state / "secrets"
        self.ca_dir = self.state / "ca"
        self.repo = tmp / "repo"
        self.repo.mkdir()
        (self.repo / "cluster.yaml").write_text(
            "apiVersion: llmgw/v1\nkind: Cluster\nmetadata: {name: restored}\nspec: {}\n"
        )
        self.secrets.mkdir(parents=True)
        (self.secrets / "openai-key").write_text("sk-upstream-secret\n")
        (self.state / "admin-token").write_text("restored-admin-token\n")
        (self.state / "cluster-secret").write_text("cluster-secret-value\n")
        os.chmod(self.state / "admin-token", 0o600)
        ClusterCA.open(self.ca_dir)
        self.config = tmp / "controller.yaml"
        settings = {
            "repo": str(self.repo),
            "source": "directory",
            "store": dsn,
            "state_dir": str(self.state),
            "ca_dir": str(self.ca_dir),
        }
        self.config.write_text(yaml.safe_dump(settings))
        self.passphrase = tmp / "passphrase"
        self.passphrase.write_text(PASSPHRASE + "\n")

    def flags(self, passphrase: Path | None = None) -> list[str]:
        return [
            "--controller-config",
            str(self.config),
            "--passphrase-file",
            str(passphrase or self.passphrase),
        ]

    def kept_files(self) -> dict[Path, tuple[bytes, int]]:
        return {
            p: (p.read_bytes(), stat.S_IMODE(p.stat().st_mode)) for p in self.state.rglob("*") if p.is_file()
        }


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def _wipe_store(dsn: str, pg_admin: str | None) -> None:
    parsed = parse_dsn(dsn)
    if parsed.dialect == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{parsed.target}{suffix}").unlink(missing_ok=True)
        return
    assert pg_admin is not None
    name = psycopg.conninfo.conninfo_to_dict(parsed.target)["dbname"]
    with psycopg.connect(pg_admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    extracted = tar.extractfile(member)
    assert extracted is not None
    return extracted.read()


async def _seed(dsn: str) -> None:
    store = await Store.open(dsn)
    try:
        records = [
            UsageRecord(time=1.0 + i, request_id=f"r{i}", project="playground", model="m", status=200)
            for i in range(25)
        ]
        await store.insert_usage(records)
    finally:
        await store.close()


class Writer:
    """Usage rows written one by one from a thread of its own until the `with` block ends."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.written = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._write()), daemon=True)

    async def _write(self) -> None:
        store = await Store.open(self.dsn)
        try:
            while not self.stop.is_set() or self.written == 0:
                record = UsageRecord(
                    time=100.0, request_id=f"w{self.written}", project="p", model="m", status=200
                )
                await store.insert_usage([record])
                self.written += 1
        finally:
            await store.close()

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def test_backup_wipe_restore_serves(store_dsn: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    pg_admin = request.getfixturevalue("pg_server").admin_dsn if store_dsn.startswith("postgres") else None
    d = Deployment(tmp_path, store_dsn)
    made = runner.invoke(app, ["keys", "create", "--project", "playground", "--store", store_dsn])
    assert made.exit_code == 0, made.output
    key_file = tmp_path / "key"
    key_file.write_text(made.stdout.strip() + "\n")
    asyncio.run(_seed(store_dsn))
    kept = d.kept_files()
    assert {d.secrets / "openai-key", d.ca_dir / "ca.key", d.state / "cluster-secret"} <= set(kept)

    backup = tmp_path / "backups" / "llmgw.backup"
    backup.parent.mkdir()
    with Writer(store_dsn) as writer:  # a router keeps writing usage while the backup is taken
        code, out = invoke("store", "backup", str(backup), *d.flags())
    assert code == 0, out
    assert writer.written > 0
    rows = int(out.split("backed up ")[1].split()[0])
    assert (
        27 <= rows <= 27 + writer.written
    )  # 25 usage rows, the key, its audit entry: and some written meanwhile
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    with tarfile.open(backup) as tar:  # the secrets travel sealed: none of them is readable in the file
        raw = b"".join(_read(tar, m) for m in tar.getmembers() if m.isfile())
    for content, _mode in kept.values():
        assert content not in raw

    # Everything the cluster needs is gone: the store, the secrets directory, the CA, the controller's keys.
    _wipe_store(store_dsn, pg_admin)
    shutil.rmtree(d.state)

    wrong = tmp_path / "wrong"
    wrong.write_text("not the passphrase at all\n")
    code, out = invoke("store", "restore", str(backup), *d.flags(wrong))
    assert code == 1 and "do not open with this passphrase" in out
    assert not d.state.exists(), "a wrong passphrase changed nothing"

    code, out = invoke("store", "restore", str(backup), *d.flags(), "--check-key-file", str(key_file))
    assert code == 0, out
    assert "check: migrations current" in out
    assert "authenticates (project playground)" in out
    assert "the controller started on the restored store and took the restored admin token (https://" in out
    after = d.kept_files()  # and the controller's certificate, which the started controller issued itself
    assert {p: after.get(p) for p in kept} == kept, "every secret back, with its mode"

    # A second restore onto the served store is refused unless told.
    code, out = invoke("store", "restore", str(backup), *d.flags(), "--no-start-check")
    assert code == 1 and "--replace" in out
    code, out = invoke("store", "restore", str(backup), *d.flags(), "--no-start-check", "--replace")
    assert code == 0, out
