"""What a commit set in motion, as both stores keep it (issue 39): a replica's part in a roll, a canary run with
the stable model it rolls back to, and the commit statuses still owed; on SQLite and on PostgreSQL alike."""

from __future__ import annotations

from llmgw.controller.parts.canary_record import (
    CanaryRun,
    run_from_record,
    run_record,
    stable_from_json,
    stable_json,
)
from llmgw.core.config.models import ModelSpec
from llmgw.core.desired.catalog import ModelEntry, ProfileEntry
from llmgw.store import Store
from llmgw.store.queries.intent import OwedStatus
from llmgw.store.records import ReplicaRecord


def _entry() -> ModelEntry:
    spec = ModelSpec.model_validate(
        {
            "context_length": 4096,
            "scaling": {"min": 2, "max": 2},
            "rollout": {"strategy": "canary", "canary": {"weight": 50, "duration": "2s"}},
            "profiles": [
                {"name": "sim", "engine": "sim", "cpu_cores": 1, "args": {"decode_ms_per_token": 2}}
            ],
        }
    )
    return ModelEntry("m", spec, {"team": "a"}, tuple(ProfileEntry(p, "fp-stable") for p in spec.profiles))


async def test_replicas_keep_their_part_in_a_roll(store_dsn: str) -> None:
    store = await Store.open(store_dsn)
    try:
        await store.upsert_replica(
            ReplicaRecord("new", "m", "sim", ("n1",), "ready", "fp2", 1.0, 2.0, "old", True)
        )
        await store.upsert_replica(ReplicaRecord("old", "m", "sim", ("n2",), "ready", "fp1", 1.0, 2.0))
        by_id = {r.id: r for r in await store.list_replicas()}
        assert (by_id["new"].replaces, by_id["new"].restart_asked) == ("old", True)
        assert (by_id["old"].replaces, by_id["old"].restart_asked) == (None, False)
    finally:
        await store.close()


async def test_a_canary_run_and_its_stable_model_come_back_as_they_were(store_dsn: str) -> None:
    stable = _entry()
    run = CanaryRun("m", {"sim": "fp-new"}, 100.0, {"s1": (7, 1)}, phase="failed", replicas={"c1"})
    run.verdict, run.decided_at, run.evals = "error rate 100.0%", 130.0, {"capitals": False}
    store = await Store.open(store_dsn)
    try:
        await store.save_canary_run("m", run_record(run), stable_json(stable), 101.0)
        await store.save_canary_run("m", run_record(run), None, 131.0)  # a later write keeps the stable model
        [row] = await store.list_canary_runs()
        back = run_from_record(row.model, row.run, stable_from_json(row.stable))
        assert run_record(back) == run_record(run)
        assert back.stable is not None and back.stable.spec == stable.spec
        assert [(p.name, p.fingerprint) for p in back.stable.profiles] == [("sim", "fp-stable")]
        assert await store.delete_canary_run("m") and await store.list_canary_runs() == []
    finally:
        await store.close()


async def test_owed_commit_statuses_come_back_in_order_until_posted(store_dsn: str) -> None:
    store = await Store.open(store_dsn)
    try:
        sha = "0123456789abcdef0123456789abcdef01234567"
        second = OwedStatus("b", 2.0, sha, "success", "llmgw/canary/m", "canary promoted")
        first = OwedStatus("a", 1.0, sha, "pending", "llmgw/canary/m", "canary started", "https://x.example")
        for owed in (second, first, first):  # written twice (a retry): kept once
            await store.owe_commit_status(owed)
        assert await store.owed_commit_statuses() == [first, second]
        assert await store.commit_status_posted("a")
        assert await store.owed_commit_statuses() == [second]
    finally:
        await store.close()
