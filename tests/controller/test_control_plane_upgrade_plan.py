"""The decisions of `llmgw upgrade --control-plane` (llmgw.cli.deploy.control_plane), and the store's way back
(`migrate_down`) on both stores. The rolling upgrade itself: test_control_plane_upgrade.py."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmgw.cli.deploy.control_plane import Member, MigrationInfo, order, store_step
from llmgw.cli.main import app
from llmgw.store import Store, StoreError
from llmgw.store.migrate import Migration, load_migrations, migrate, migrate_down

OLD = [MigrationInfo(1, "initial", False), MigrationInfo(2, "lease", False)]
PROBE = MigrationInfo(3, "probe", True)
ONE_WAY = MigrationInfo(3, "rewrite", False)


def test_crossing_an_undoable_migration_goes_ahead_and_says_which() -> None:
    step = store_step(2, OLD, [*OLD, PROBE], allow_irreversible=False)
    assert (step.down_to, step.crossing, step.refusal) == (None, [PROBE], None)


def test_a_migration_that_cannot_be_undone_is_refused_unless_told() -> None:
    refused = store_step(2, OLD, [*OLD, ONE_WAY], allow_irreversible=False)
    assert refused.refusal is not None and "0003 rewrite" in refused.refusal
    assert "--allow-irreversible" in refused.refusal and "llmgw store backup" in refused.refusal
    told = store_step(2, OLD, [*OLD, ONE_WAY], allow_irreversible=True)
    assert (told.refusal, told.crossing) == (None, [ONE_WAY])


def test_going_back_undoes_what_the_target_does_not_know_or_refuses() -> None:
    back = store_step(3, [*OLD, PROBE], OLD, allow_irreversible=False)
    assert (back.down_to, back.refusal) == (2, None)
    stuck = store_step(3, [*OLD, ONE_WAY], OLD, allow_irreversible=True)  # told or not: it cannot be undone
    assert stuck.down_to is None and stuck.refusal is not None and "0003 rewrite" in stuck.refusal
    unknown = store_step(3, OLD, OLD[:1], allow_irreversible=False)  # the running release lacks 0003 itself
    assert unknown.refusal is not None and "0002 lease" in unknown.refusal and "0003" in unknown.refusal


def test_same_schema_crosses_nothing() -> None:
    assert store_step(2, OLD, OLD, allow_irreversible=False) == store_step(
        2, OLD, OLD, allow_irreversible=True
    )
    assert store_step(2, OLD, OLD, allow_irreversible=False).crossing == []


def _member(name: str) -> Member:
    return Member(name=name, url=f"http://{name}:1", restart=["true"])


def test_standbys_then_the_leader_then_the_routers() -> None:
    a, b, c, r1, r2 = (_member(n) for n in ("a", "b", "c", "r1", "r2"))
    rolled = order([a, b, c], {"a": True, "b": False, "c": False}, [r1, r2])
    assert [(role, m.name) for role, m in rolled] == [
        ("standby", "b"),
        ("standby", "c"),
        ("leader", "a"),
        ("router", "r1"),
        ("router", "r2"),
    ]
    # None answering as leader (between two leases): every controller is rolled as a standby.
    assert [role for role, _ in order([a, b], {}, [])] == ["standby", "standby"]


def test_migrate_down_undoes_with_its_down_file_or_refuses(store_dsn: str) -> None:
    shipped = load_migrations()
    top = shipped[-1].version
    extra = Migration(top + 1, "probe", ("CREATE TABLE upgrade_probe (id BIGINT PRIMARY KEY)",))
    down = Migration(top + 1, "probe", ("DROP TABLE upgrade_probe",))

    async def go() -> None:
        store = await Store.open(store_dsn, migrate_schema=False)
        try:
            # A migration written per store (a .sqlite/.postgres pair) is one version, applied once.
            versions = sorted({m.version for m in [*shipped, extra]})
            assert await migrate(store.db, [*shipped, extra]) == versions
            with pytest.raises(StoreError, match=f"migrations \\[{top + 1}\\] have no .down.sql"):
                await migrate_down(store.db, top, downs={})
            assert await store.schema_version() == top + 1  # refused before anything changed
            assert await migrate_down(store.db, top, downs={top + 1: down}) == [top + 1]
            assert await store.schema_version() == top
            async with store.db.tx() as tx:  # the table is gone: making it again works
                await tx.execute("CREATE TABLE upgrade_probe (id BIGINT PRIMARY KEY)")
        finally:
            await store.close()

    asyncio.run(go())


FAKE_LLMGW = """\
import sys
from pathlib import Path
release, asked = Path(sys.argv[1]), sys.argv[2:]
assert asked == ["store", "migrations", "--json"], asked
print((release / "migrations.json").read_text())
"""


def _release(path: Path, migrations: list[MigrationInfo]) -> Path:
    path.mkdir()
    listed = [{"version": m.version, "name": m.name, "reversible": m.reversible} for m in migrations]
    (path / "migrations.json").write_text(json.dumps(listed))
    return path


def test_the_command_refuses_before_restarting_anything(tmp_path: Path) -> None:
    """The CLI's wiring: each release asked through the plan's `llmgw`, the refusal said before any restart
    command runs; told to go on, it restarts, and a process that does not come back stops the roll unrecorded."""
    shipped = [MigrationInfo(m.version, m.name, False) for m in load_migrations()]
    top = shipped[-1].version
    old = _release(tmp_path / "a", shipped)
    new = _release(tmp_path / "b", [*shipped, MigrationInfo(top + 1, "rewrite", False)])
    store = f"sqlite:///{tmp_path / 'llmgw.db'}"
    asyncio.run(_migrated(store))
    fake = tmp_path / "fake_llmgw.py"
    fake.write_text(FAKE_LLMGW)
    restarted = tmp_path / "restarted"
    plan = {
        "store": store,
        "llmgw": [sys.executable, str(fake), "{release}"],
        "release": str(old),
        "controllers": [
            {
                "name": "c1",
                "url": "http://127.0.0.1:9",  # nothing answers there
                "restart": [sys.executable, "-c", f"open({str(restarted)!r}, 'w').write('{{release}}')"],
            }
        ],
        "ready_timeout_s": 0.5,
    }
    plan_file = tmp_path / "plane.yaml"
    plan_file.write_text(yaml.safe_dump(plan))
    runner = CliRunner()

    def upgrade(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, ["upgrade", "--control-plane", "--plan", str(plan_file), *args])
        return result.exit_code, result.output

    code, said = upgrade("--to", str(new))
    assert code == 1 and f"{top + 1:04d} rewrite, which cannot be undone" in said, said
    assert not restarted.exists(), "refused before any restart"
    code, said = upgrade("--to", str(new), "--allow-irreversible")
    assert code == 1 and "did not answer 200" in said and "the roll stops here" in said, said
    assert restarted.read_text() == str(new)
    assert not plan_file.with_suffix(".state.json").exists(), "a roll that stopped is not recorded as done"
    code, said = upgrade("--rollback")
    assert code == 1 and "no release to go back to" in said
    code, said = upgrade("--to", str(old))
    assert code == 1 and "already runs" in said


async def _migrated(dsn: str) -> None:
    store = await Store.open(dsn)
    await store.close()
