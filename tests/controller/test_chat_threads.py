"""A person's chat threads (issue 44): kept per person on both stores, deletable by their owner only, and pruned
by the leader's retention loop once their last message is older than the Cluster's `console.threads.retention`
(real controller and store, fake agents). The console's handling of them: tests/console/test_oidc_password.py."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.controller.console.threads import MAX_TITLE, answer_text, title_of
from llmgw.controller.core import Controller
from llmgw.controller.loops.retention import Retention
from llmgw.controller.parts.metrics import ControllerMetrics
from llmgw.store.queries.threads import ChatThread
from llmgw.store.store import Store

from .fake_agents import FakeAgents
from .helpers import Repo, cluster_yaml, settings_for
from .test_reconcile_loop import Loop

DAY = 86400.0


def _thread(tid: str, person: str, at: float) -> ChatThread:
    return ChatThread(tid, person, f"about {tid}", "sim-a", at, at)


async def test_threads_are_their_persons_own_on_both_stores(store_dsn: str) -> None:
    store = await Store.open(store_dsn)
    try:
        await store.start_thread(_thread("t1", "ada", 10.0))
        await store.start_thread(_thread("t2", "ada", 20.0))
        await store.start_thread(_thread("t3", "bob", 30.0))
        assert await store.add_messages("ada", "t1", [("user", "hi"), ("assistant", "hello")], 40.0)
        assert await store.add_messages("ada", "t1", [("user", "again"), ("assistant", "yes")], 41.0)
        assert not await store.add_messages("bob", "t1", [("user", "not mine")], 42.0), "ada's thread"
        assert [t.id for t in await store.threads_of("ada")] == ["t1", "t2"], "last used first"
        found = await store.thread("ada", "t1")
        assert found is not None
        thread, messages = found
        assert thread.updated_at == 41.0
        assert [(m.seq, m.role, m.content) for m in messages] == [
            (1, "user", "hi"),
            (2, "assistant", "hello"),
            (3, "user", "again"),
            (4, "assistant", "yes"),
        ]
        assert await store.thread("bob", "t1") is None
        assert not await store.delete_thread("bob", "t1")
        assert await store.delete_thread("ada", "t1")
        assert await store.thread("ada", "t1") is None
        async with store.db.tx() as tx:
            left = await tx.fetch("SELECT COUNT(*) FROM chat_messages WHERE thread_id = 't1'")
        assert left[0][0] == 0, "a thread's messages go with it"
        assert await store.prune_threads(older_than=25.0) == 1  # t2 (20.0); bob's t3 (30.0) stays
        assert [t.id for t in await store.threads_of("bob")] == ["t3"]
    finally:
        await store.close()


def test_the_answer_kept_is_the_streamed_text_and_the_title_its_first_line() -> None:
    events = [
        {"choices": [{"delta": {"role": "assistant"}}]},
        {"choices": [{"delta": {"content": "Hel"}}]},
        {"choices": [{"delta": {"content": "lo"}}]},
        {"choices": [], "usage": {"prompt_tokens": 3}},
    ]
    stream = (
        "".join(f"data: {json.dumps(e)}\n\n" for e in events)
        + ": keep-alive\n\ndata: not json\n\ndata: [DONE]\n\n"
    )
    assert answer_text(stream.encode()) == "Hello"
    assert title_of("  first line\nsecond") == "first line"
    assert title_of("x" * 200) == "x" * (MAX_TITLE - 1) + "…"


@pytest.fixture
async def loop(tmp_path: Path) -> AsyncIterator[Loop]:
    repo = Repo(tmp_path / "repo", use_git=False)
    settings = settings_for(tmp_path, repo.path, retention_check_s=0.05)
    store = await Store.open(settings.store)
    agents = FakeAgents(clock=time.monotonic)
    controller = Controller(settings, store, ControllerMetrics(), admin_token="admin", agents=agents)
    yield Loop(tmp_path, controller, agents, repo)
    await controller.stop_background()
    await store.close()


async def test_the_retention_loop_prunes_threads_past_the_declared_retention(loop: Loop) -> None:
    c: Controller = loop.c
    now = c.wall()
    await c.store.start_thread(_thread("fresh", "ada", now - 1 * DAY))
    await c.store.start_thread(_thread("stale", "ada", now - 3 * DAY))
    await c.store.start_thread(_thread("ancient", "bob", now - 40 * DAY))
    assert (await Retention(c).prune_once()).threads_pruned == 0, "no revision: the retention is not known"

    loop.apply({"cluster.yaml": cluster_yaml()})  # the default retention, 30d
    assert (await Retention(c).prune_once()).threads_pruned == 1
    assert await c.store.thread("bob", "ancient") is None

    loop.apply({"cluster.yaml": cluster_yaml() + "  console: {threads: {retention: 2d}}\n"})
    assert (await Retention(c).prune_once()).threads_pruned == 1
    assert [t.id for t in await c.store.threads_of("ada")] == ["fresh"]
