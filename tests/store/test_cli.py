"""The store's commands through typer's CliRunner, and `store move` SQLite -> PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmgw.adapters import keys
from llmgw.cli.data import usage_cmds as cli
from llmgw.cli.main import app
from llmgw.store import ApiKey, Store, UsageRecord
from llmgw.store.move import COLUMNS

from .orphans import delete_key_behind_the_foreign_key

runner = CliRunner(env={"COLUMNS": "200"})


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout


@pytest.fixture
def sqlite_dsn(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'state' / 'llmgw.db'}"


def test_keys_create_list_revoke(sqlite_dsn: str) -> None:
    code, out = invoke(
        "keys", "create", "--project", "playground", "--name", "ci", "--expires", "30d", "--store", sqlite_dsn
    )
    assert code == 0
    plaintext = out.strip().splitlines()[0]
    assert plaintext.startswith("sk-llmgw-")
    code, out = invoke("keys", "list", "--json", "--store", sqlite_dsn)
    [listed] = json.loads(out)
    assert (listed["project"], listed["name"], listed["state"]) == ("playground", "ci", "active")
    assert plaintext not in out and listed["expires_at"]
    assert listed["last_used_at"] is None  # no request yet: not a time
    code, out = invoke("keys", "list", "--store", sqlite_dsn)
    assert code == 0 and listed["id"] in out and "never" in out
    assert invoke("keys", "revoke", listed["id"], "--store", sqlite_dsn)[0] == 0
    [after] = json.loads(invoke("keys", "list", "--json", "--store", sqlite_dsn)[1])
    assert after["state"] == "revoked"
    code, _ = invoke("keys", "revoke", "key_nope", "--store", sqlite_dsn)
    assert code == 1


def test_store_from_environment(sqlite_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_STORE", sqlite_dsn)
    assert invoke("keys", "create", "--project", "p")[0] == 0
    assert len(json.loads(invoke("keys", "list", "--json", "--store", sqlite_dsn)[1])) == 1


def test_bad_expiry_and_bad_group_are_errors(sqlite_dsn: str) -> None:
    assert invoke("keys", "create", "--project", "p", "--expires", "soon", "--store", sqlite_dsn)[0] == 1
    assert invoke("usage", "--by", "user", "--store", sqlite_dsn)[0] == 1


def test_usage_by_project_csv_and_json(sqlite_dsn: str) -> None:
    async def seed() -> None:
        store = await Store.open(sqlite_dsn)
        import time as _t

        now = _t.time()
        await store.insert_usage(
            [
                UsageRecord(
                    time=now - i,
                    request_id=f"r{i}",
                    project="a" if i % 2 else "b",
                    model="m",
                    status=200,
                    tokens_in=10,
                    tokens_out=5,
                    cost=0.25,
                )
                for i in range(6)
            ]
        )
        await store.insert_usage(
            [UsageRecord(time=now - 30 * 86400, request_id="old", project="a", model="m", status=200)]
        )
        await store.close()

    asyncio.run(seed())
    code, out = invoke("usage", "--by", "project", "--since", "7d", "--csv", "--store", sqlite_dsn)
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].startswith("project,requests") and lines[1].startswith("a,3,0,30,15,0.75")
    code, out = invoke("usage", "--by", "model", "--json", "--store", sqlite_dsn)
    assert json.loads(out) == [
        {
            "model": "m",
            "requests": 7,
            "errors": 0,
            "tokens_in": 60,
            "tokens_out": 30,
            "cost": 1.5,
            "avg_latency_ms": 0.0,
        }
    ]
    assert invoke("usage", "--store", sqlite_dsn)[0] == 0


def test_usage_by_key_shows_each_keys_name_and_project(store_dsn: str) -> None:
    async def seed() -> None:
        store = await Store.open(store_dsn)
        await store.insert_key(ApiKey("key_a", "sk-llmgw-a", "search", "[ci]", 0.0, None, None), "ha")
        await store.insert_key(ApiKey("key_b", "sk-llmgw-b", "chat", "web", 0.0, None, None), "hb")
        await store.insert_usage(
            [
                UsageRecord(
                    time=time.time() - 60,
                    request_id=f"r{i}",
                    project="p",
                    model="m",
                    status=200,
                    key_id=key,
                    tokens_in=10,
                )
                for i, key in enumerate(["key_a", "key_a", "key_b", None])
            ]
        )
        await delete_key_behind_the_foreign_key(store, "key_b")
        await store.close()

    asyncio.run(seed())
    code, out = invoke("usage", "--by", "key", "--json", "--store", store_dsn)
    assert code == 0, out
    assert [(r["key"], r["name"], r["project"], r["requests"]) for r in json.loads(out)] == [
        (None, None, None, 1),  # no key: null, not ""
        ("key_a", "[ci]", "search", 2),
        ("key_b", None, None, 1),  # gone from api_keys: unknown, not empty
    ]
    code, out = invoke("usage", "--by", "key", "--csv", "--store", store_dsn)
    assert code == 0
    assert out.splitlines() == [
        "key,name,project,requests,errors,tokens_in,tokens_out,cost,avg_latency_ms",
        f"{cli.NO_KEY},,,1,0,10,0,0.0,0.0",
        "key_a,[ci],search,2,0,20,0,0.0,0.0",
        f"key_b,{cli.KEY_NOT_IN_STORE},{cli.UNKNOWN},1,0,10,0,0.0,0.0",
    ]
    code, out = invoke("usage", "--by", "key", "--since", "1d", "--store", store_dsn)
    assert code == 0
    table = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 3}
    assert "[ci]" in table["key_a"] and "search" in table["key_a"]
    assert cli.KEY_NOT_IN_STORE in table["key_b"] and cli.UNKNOWN in table["key_b"]
    assert cli.NO_KEY in table


def test_usage_table_off_a_terminal_is_whole_and_reads_as_money(sqlite_dsn: str) -> None:
    """In a pipe or a CI log (no terminal, no COLUMNS) no cell is cut with "…" and costs are not `1e-06`."""
    project = "team-search-ranking-experiments-" + "x" * 60  # far wider than 80 columns with the rest

    async def seed() -> None:
        store = await Store.open(sqlite_dsn)
        await store.insert_usage(
            [
                UsageRecord(
                    time=time.time() - 5,
                    request_id="r1",
                    project=project,
                    model="m",
                    status=200,
                    tokens_in=12_345,
                    tokens_out=7,
                    cost=0.000001,
                    latency_ms=1250.0,
                )
            ]
        )
        await store.close()

    asyncio.run(seed())
    result = CliRunner(env={"COLUMNS": None}).invoke(app, ["usage", "--store", sqlite_dsn])
    assert result.exit_code == 0, result.stdout
    assert "…" not in result.stdout and project in result.stdout
    [row] = [line for line in result.stdout.splitlines() if project in line]
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[1:] == ["1", "0", "12k", "7", "$0.000001", "1.2s"]
    # Machine formats keep the exact numbers.
    code, out = invoke("usage", "--csv", "--store", sqlite_dsn)
    assert code == 0 and out.splitlines()[1].endswith(",1,0,12345,7,0.000001,1250.0")


def test_store_migrate(sqlite_dsn: str) -> None:
    code, out = invoke("store", "migrate", "--store", sqlite_dsn)
    from llmgw.store.migrate import load_migrations

    newest = max(m.version for m in load_migrations())
    assert code == 0 and f"schema version {newest}" in out


def test_move_columns_match_the_schema(sqlite_dsn: str) -> None:
    async def columns() -> dict[str, tuple[str, ...]]:
        store = await Store.open(sqlite_dsn)
        found = {}
        async with store.db.tx() as tx:
            for table in COLUMNS:
                found[table] = tuple(r[1] for r in await tx.fetch(f"PRAGMA table_info({table})"))
        await store.close()
        return found

    assert asyncio.run(columns()) == COLUMNS


@pytest.mark.postgres
def test_store_move_sqlite_to_postgres_keeps_keys_usable(sqlite_dsn: str, pg_dsn: str) -> None:
    code, out = invoke("keys", "create", "--project", "playground", "--store", sqlite_dsn)
    plaintext = out.strip().splitlines()[0]

    async def seed() -> None:
        store = await Store.open(sqlite_dsn)
        key = await keys.lookup(store, plaintext, now=1.0)
        assert key is not None
        await store.insert_usage(
            [
                UsageRecord(
                    time=1.0,
                    request_id="r",
                    project="playground",
                    model="m",
                    status=200,
                    key_id=key.key_id,
                    tokens_in=7,
                )
            ]
        )
        await store.acquire_lease("leader", "a", 10.0, now=1.0)
        await store.close()

    asyncio.run(seed())
    code, out = invoke("store", "move", "--to", pg_dsn, "--store", sqlite_dsn)
    assert code == 0, out

    async def check() -> None:
        store = await Store.open(pg_dsn)
        found = await keys.lookup(store, plaintext, now=2.0)
        assert found is not None and (found.project, found.state) == ("playground", "active")
        [total] = await store.usage_totals("key")
        assert (total.group, total.tokens_in) == (found.key_id, 7)
        assert (await store.row_counts())["leases"] == 1
        await store.close()

    asyncio.run(check())
    code, _ = invoke("store", "move", "--to", pg_dsn, "--store", sqlite_dsn)
    assert code == 1  # the destination is no longer empty
    result = runner.invoke(app, ["store", "move", "--to", pg_dsn, "--store", sqlite_dsn])
    assert "not empty" in result.output
    assert "--replace" in result.output  # the refusal names the way through

    # Told to, it empties the destination and copies again: every table's count checked against the source.
    asyncio.run(_add_usage(sqlite_dsn, "r2"))
    code, out = invoke("store", "move", "--to", pg_dsn, "--store", sqlite_dsn, "--replace")
    assert code == 0, out
    assert "count checked" in out

    async def counts() -> tuple[dict[str, int], dict[str, int]]:
        src, dst = await Store.open(sqlite_dsn), await Store.open(pg_dsn)
        try:
            return await src.row_counts(), await dst.row_counts()
        finally:
            await src.close()
            await dst.close()

    before, after = asyncio.run(counts())
    assert before == after and after["usage"] == 2


async def _add_usage(dsn: str, request_id: str) -> None:
    store = await Store.open(dsn)
    try:
        record = UsageRecord(time=2.0, request_id=request_id, project="playground", model="m", status=200)
        await store.insert_usage([record])
    finally:
        await store.close()
