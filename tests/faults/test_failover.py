"""Two controllers on one PostgreSQL store, as real processes: one leads, the other stands by (refuses agents,
read-only admin API). The leader is killed with -9: the standby leads within seconds, the agents move to it,
and no replica is restarted (same replica ids, same engine PIDs)."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psycopg
import pytest
from controller.helpers import Agents, Repo, cluster_yaml, model_yaml
from support import pid_alive, wait_until

from faults.procs import (
    ControllerProc,
    RouterProc,
    http_status,
    start_controller_proc,
    start_router_following,
)
from llmgw.controller.parts.lease import LEASE_NAME

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

TOKEN = "failover-token"
KEY = "sk-llmgw-" + "h" * 43
TTL_S = 3.0


def get(c: ControllerProc, path: str) -> Any:
    req = urllib.request.Request(c.url + path, headers=c.admin_headers)
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def post(c: ControllerProc, path: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(
        c.url + path,
        data=json.dumps(body).encode(),
        headers={**c.admin_headers, "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status), json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read())


def role(c: ControllerProc) -> str | None:
    try:
        return str(get(c, "/api/v1/status")["leadership"]["role"])
    except (urllib.error.URLError, OSError, KeyError):
        return None


def ready_replicas(c: ControllerProc, model: str, count: int) -> dict[str, int] | None:
    try:
        items = get(c, "/api/v1/replicas")["replicas"]
    except (urllib.error.URLError, OSError):
        return None
    mine = [r for r in items if r["model"] == model]
    ok = len(mine) == count and all(r["state"] == "ready" and r["pid"] for r in mine)
    return {r["id"]: r["pid"] for r in mine} if ok else None


def _leader_named(c: ControllerProc) -> str | None:
    try:
        return get(c, "/api/v1/status")["leadership"]["leader_address"]  # type: ignore[no-any-return]
    except (urllib.error.URLError, OSError, KeyError):
        return None


def lease_holder(dsn: str) -> str | None:
    """Who holds the leader lease, read from the store's row (None when no row: released)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT holder FROM leases WHERE name = %s", (LEASE_NAME,)).fetchone()
    return str(row[0]) if row else None


def _answers(client: openai.OpenAI) -> bool:
    try:
        r = client.completions.create(model="sim-a", prompt="failover", max_tokens=2)
    except openai.APIError:
        return False
    return bool(r.choices and r.choices[0].text)


def _metric(url: str, name: str) -> float | None:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


class Pair:
    def __init__(self, tmp: Path, dsn: str) -> None:
        self.tmp = tmp
        self.dsn = dsn
        (tmp / "token").write_text(TOKEN + "\n")
        self.repo = Repo(tmp / "origin", use_git=True)
        self.procs: list[ControllerProc] = []
        self.agents = Agents(tmp, tmp / "token")
        self.routers: list[RouterProc] = []

    def cluster(self, **timings: str) -> str:
        """The Cluster document, with the secret every controller derives engine keys from (ha needs one)."""
        (self.tmp / "cluster-secret").write_text("failover-cluster-secret\n")
        return cluster_yaml(**timings) + "  secret: {file: cluster-secret}\n"

    def start(self, name: str) -> ControllerProc:
        settings = {
            "repo": str(self.repo.path),
            "poll_s": 0.3,
            "store": self.dsn,
            "admin_token_file": str(self.tmp / "token"),
            "state_dir": str(self.tmp / f"state-{name}"),
            "secrets_dir": str(self.tmp),  # every controller reads the same cluster-secret
            "command_timeout_s": 10.0,
            "drain_s": 0.3,
            "backoff_base_s": 0.5,
            "settle_s": 20.0,
            "ha": True,
            "lease_ttl_s": TTL_S,
            "lease_renew_s": 0.5,
        }
        c = start_controller_proc(self.tmp / f"controller-{name}.log", settings, TOKEN)
        self.procs.append(c)
        return c

    def close(self) -> None:
        for r in self.routers:
            r.stop()
        for c in self.procs:
            c.kill()
        self.agents.cleanup()


@pytest.fixture
def pair(tmp_path: Path, pg_dsn: str) -> Iterator[Pair]:
    p = Pair(tmp_path, pg_dsn)
    try:
        yield p
    finally:
        p.close()


def test_leader_killed_standby_leads_and_adopts_without_restarting(pair: Pair) -> None:
    pair.repo.write({"cluster.yaml": pair.cluster(unreachable="2s", lost="60s")}, "cluster")
    a = pair.start("a")
    wait_until(lambda: role(a) == "leader", 30, "controller a to lead")
    b = pair.start("b")
    wait_until(lambda: role(b) == "standby", 30, "controller b to stand by")

    # The standby names the leader, serves reads, refuses writes, and turns agents away.
    leading = {c.url: http_status(c.url + "/healthz/leader") for c in (a, b)}
    assert leading == {a.url: 200, b.url: 503}  # no token needed, and the role is all it tells
    status = get(b, "/api/v1/status")["leadership"]
    assert status["leader_address"] == a.url and status["ha"] is True
    code, body = post(b, "/api/v1/apply", {"path": str(pair.repo.path)})
    assert code == 503 and a.url in body["error"]["message"] and "standby" in body["error"]["message"]

    for node in ("n1", "n2"):
        pair.agents.start(node, [b.url, a.url])  # the standby first: it must send them on
    pair.repo.write({"models/a.yaml": model_yaml("sim-a", min_=2)}, "add sim-a")
    before = wait_until(lambda: ready_replicas(a, "sim-a", 2), 90, "two replicas ready on the leader")
    assert get(b, "/api/v1/nodes")["nodes"] == [], "a standby holds no agent"
    logs = "".join(p.read_text() for p in pair.tmp.glob("agents/*/agent-*.log"))
    assert "standby: try the next controller address" in logs

    # A router told both addresses: it follows whichever leads, and serves throughout.
    router = start_router_following(pair.tmp, [b.url, a.url], KEY)
    pair.routers.append(router)
    client = openai.OpenAI(base_url=router.api + "/v1", api_key=KEY, max_retries=0, timeout=30)
    wait_until(lambda: _answers(client), 30, "sim-a through the router")

    killed_wall = time.time()
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(10)
    answered = 0

    def answered_until_b_leads() -> bool:  # every request during the failover is answered, from the snapshot
        nonlocal answered
        assert _answers(client), "a request failed during the failover"
        answered += 1
        return role(b) == "leader"

    wait_until(answered_until_b_leads, 30, "controller b to lead after a was killed", interval=0.0)
    assert answered > 0
    # Taken over by expiry, as the store records it: b holds the lease row, and a never released it.
    assert lease_holder(pair.dsn) == get(b, "/api/v1/status")["leadership"]["holder"]
    assert "released by" not in a.text()
    after = wait_until(lambda: ready_replicas(b, "sim-a", 2), 60, "the replicas adopted by b")
    assert after == before, "same replicas, same engine processes: nothing restarted"
    assert all(pid_alive(pid) for pid in before.values())
    events = [e for e in get(b, "/api/v1/events?limit=1000")["events"] if e["time"] >= killed_wall]
    assert not any(e["kind"] == "replica_start" for e in events), [
        e for e in events if e["kind"] == "replica_start"
    ]
    assert sum(e["kind"] == "replica_adopted" for e in events) == 2
    # The new leader keeps it that way over further passes.
    passes = get(b, "/api/v1/status")["reconcile"]["passes"]
    wait_until(lambda: get(b, "/api/v1/status")["reconcile"]["passes"] >= passes + 3, 30, "more passes")
    assert ready_replicas(b, "sim-a", 2) == before

    wait_until(
        lambda: _metric(b.metrics_url, "llmgw_controller_router_connections") == 1.0, 30, "router on b"
    )
    for _ in range(10):
        assert _answers(client)

    # The killed controller comes back as a standby: it does not take the lease back.
    a2 = pair.start("a")
    # A controller is a standby that knows no leader until its first attempt: wait for it to name b.
    wait_until(lambda: _leader_named(a2) == b.url, 30, "the restarted controller to stand by, naming b")
    assert role(a2) == "standby"
    assert role(b) == "leader"


def test_graceful_stop_hands_over_at_once(pair: Pair) -> None:
    pair.repo.write({"cluster.yaml": pair.cluster()}, "cluster")
    a = pair.start("a")
    wait_until(lambda: role(a) == "leader", 30, "controller a to lead")
    b = pair.start("b")
    wait_until(lambda: role(b) == "standby", 30, "controller b to stand by")
    a_holder = get(a, "/api/v1/status")["leadership"]["holder"]
    b_holder = get(b, "/api/v1/status")["leadership"]["holder"]
    a.stop()  # SIGTERM: the lease is released on the way out
    assert "Traceback" not in a.text()
    # Released, not left to expire: a says so, and the store's row is gone or already b's.
    assert f"released by {a_holder}" in a.text()
    assert lease_holder(pair.dsn) in (None, b_holder)
    wait_until(lambda: role(b) == "leader", 30, "b to lead after a stopped")
    assert lease_holder(pair.dsn) == b_holder


def test_is_leader_metric_matches_the_role(pair: Pair) -> None:
    """Without killing anything: is_leader on /metrics matches the role in status, on both."""
    pair.repo.write({"cluster.yaml": pair.cluster()}, "cluster")
    a = pair.start("a")
    wait_until(lambda: role(a) == "leader", 30, "a leads")
    b = pair.start("b")
    wait_until(lambda: role(b) == "standby", 30, "b stands by")
    for c, expect in ((a, "1.0"), (b, "0.0")):
        with urllib.request.urlopen(c.metrics_url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        assert f"llmgw_controller_is_leader {expect}" in text


def test_store_lost_the_leader_steps_down_and_leadership_returns_without_restarts(
    pair: Pair, pg_server
) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL stopped for longer than the lease: the leader keeps its claim until its validity ends, then
    steps down (nobody places while the store is gone); when it is back one controller leads again and adopts
    the same engines."""
    if not pg_server.controllable:
        pytest.skip("external PostgreSQL: cannot stop it")
    pair.repo.write({"cluster.yaml": pair.cluster(unreachable="5s", lost="120s")}, "cluster")
    a = pair.start("a")
    wait_until(lambda: role(a) == "leader", 30, "controller a to lead")
    b = pair.start("b")
    wait_until(lambda: role(b) == "standby", 30, "controller b to stand by")
    pair.agents.start("n1", [a.url, b.url])
    pair.repo.write({"models/a.yaml": model_yaml("sim-a", min_=1)}, "add sim-a")
    before = wait_until(lambda: ready_replicas(a, "sim-a", 1), 90, "one replica ready on the leader")

    seen: list[tuple[str, bool]] = []  # (role, store error shown) as a's status reported it
    watching = threading.Event()
    watching.set()

    def watch() -> None:
        while watching.is_set():
            with contextlib.suppress(urllib.error.URLError, OSError, KeyError):
                lead = get(a, "/api/v1/status")["leadership"]
                seen.append((str(lead["role"]), bool(lead["store_error"])))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()  # before the stop, so the window in which a keeps its claim cannot be missed
    pg_server.stop()
    try:
        wait_until(lambda: role(a) == "standby", 30, "the leader to step down without its store")
        watching.clear()
        watcher.join(10)
        lead = get(a, "/api/v1/status")["leadership"]
        assert lead["store_error"], lead
        assert role(b) == "standby", "no store, no new leader"
        # The claim is kept while it is valid, not dropped at the first error: a was seen leading while its
        # status showed the store error.
        assert ("leader", True) in seen, sorted(set(seen))
        assert all(pid_alive(p) for p in before.values()), "engines keep running without a leader"
    finally:
        pg_server.start()
    leader = wait_until(lambda: next((c for c in (a, b) if role(c) == "leader"), None), 60, "a leader again")
    after = wait_until(lambda: ready_replicas(leader, "sim-a", 1), 60, "the replica adopted again")
    assert after == before
