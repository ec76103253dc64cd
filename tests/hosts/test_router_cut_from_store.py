"""Fault: one of two routers cut from the store's host (it still reaches its engine and its clients), then healed.

Must hold: the cut router keeps serving on the share it holds, then on one grace share of its own authority,
then refuses (429); the other router, still on the store, serves the rest of the pool. Together they admit at
most the limit plus one router's grace share in the window (docs/tenancy.md, When the store is unreachable).
Must not be lost: usage. Every answered request's record, spooled on the cut router's disk meanwhile, reaches
the store once healed, exactly once (as many rows as answers, one per request id, nothing left pending).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request

import openai
import pytest
from support import wait_until
from tenancy.helpers import create_key, in_one_window, window_start_offset

from hosts.lab import HostLab
from llmgw.store import Store
from llmgw.store.limits.limiter import SharePolicy

pytestmark = [pytest.mark.hosts, pytest.mark.postgres]

RPM = 20
ENGINE_KEY = "hosts-engine-key"


def outcome(client: openai.OpenAI) -> str:
    try:
        client.completions.create(model="sim-chat", prompt="count me", max_tokens=2)
    except openai.RateLimitError:
        return "refused"
    return "ok"


def pending(lab: HostLab, router: str) -> float | None:
    url = lab.router_url(router).replace(":8000", ":9000") + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            lines = r.read().decode().splitlines()
    except OSError:
        return None
    return next((float(x.split()[1]) for x in lines if x.startswith("llmgw_router_usage_pending ")), None)


async def usage_rows(dsn: str) -> tuple[int, int, int]:
    """(rows, distinct request ids, rows of answered requests) of project p1's usage in the store."""
    store = await Store.open(dsn)
    try:
        rows = [u for u in await store.list_usage(limit=10_000) if u.project == "p1"]
    finally:
        await store.close()
    return len(rows), len({u.request_id for u in rows}), sum(u.status == 200 for u in rows)


def test_router_cut_from_the_store_overruns_by_one_grace_share_and_loses_no_usage(lab: HostLab) -> None:
    for name in ("db", "n1", "r1", "r2"):
        lab.add_host(name)
    dsn = lab.start_postgres("db")
    engine = lab.start_sim("n1", "sim-chat", ENGINE_KEY)
    model = {"context_length": 4096, "capabilities": ["chat", "completions"], "simulated": True}
    snapshot = {
        "revision": "hosts-1",
        "models": {"sim-chat": model},
        "tenants": {
            "organizations": {"o": {}},
            "teams": {"t": {"organization": "o"}},
            "projects": {"p1": {"team": "t", "limits": {"rpm": RPM}}},
        },
        "endpoints": [
            {
                "replica_id": "n1-sim",
                "model": "sim-chat",
                "engine": "sim",
                "base_url": engine,
                "api_key": ENGINE_KEY,
                "slots": 8,
                "simulated": True,
            },
        ],
    }
    path = lab.tmp / "snapshot.json"
    path.write_text(json.dumps(snapshot))
    key = create_key(dsn, "p1")
    offset = window_start_offset()  # one for both: they count in the store's same minute windows
    args = ["--snapshot", str(path), "--store", dsn, "--limits-clock-offset", repr(offset)]
    for router in ("r1", "r2"):
        lab.start_router_with(router, args)
    c1, c2 = (
        openai.OpenAI(base_url=lab.router_url(r) + "/v1", api_key=key, max_retries=0, timeout=30)
        for r in ("r1", "r2")
    )

    def window() -> list[str]:
        out = [outcome(c1)]  # r1 takes its first share from the store (and learns the key)
        lab.net.cut("r1", "db")
        try:
            while out[-1] == "ok":  # on its share, then its grace share, then refused
                out.append(outcome(c1))
            on_r1 = out.count("ok")
            out.append(outcome(c2))
            while out[-1] == "ok":  # r2 serves what is left of the pool
                out.append(outcome(c2))
        finally:
            lab.net.heal("r1", "db")
        assert on_r1 >= 2, "the cut router served on after the cut"
        return out

    outcomes = in_one_window(offset, window)
    answered = outcomes.count("ok")
    assert RPM <= answered <= RPM + SharePolicy().size("rpm", RPM), (
        f"{answered} admitted in one window of an rpm {RPM} pool"
    )

    wait_until(lambda: pending(lab, "r1") == 0 and pending(lab, "r2") == 0, 60, "every usage record written")
    rows, ids, ok = asyncio.run(usage_rows(dsn))
    # One row per request made (a refusal is recorded too), each once; the answered ones as answered.
    assert rows == ids == len(outcomes), f"{len(outcomes)} requests; {rows} usage rows, {ids} request ids"
    assert ok == answered
