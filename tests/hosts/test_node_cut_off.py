"""Fault: a node's host cut off from everyone (its switch port down), then back.

Must hold: the controller marks the node Unreachable and starts nothing in its replica's place (lost_after is
longer than the cut); the router stops sending to the cut node's replica while it is gone (every request is
answered, by the other node) and sends to it again once it is back. Must not be lost: the cut node's replica,
never started twice (same id, same engine process, no replica_start event since the cut).
"""

from __future__ import annotations

import time
import urllib.request

import openai
import pytest
from controller.helpers import model_yaml
from support import wait_until

from hosts.lab import API_KEY, HostLab

pytestmark = [pytest.mark.hosts, pytest.mark.postgres]

DEBUG = "hosts-debug-token"


def served_by(client: openai.OpenAI, replicas: dict[str, tuple[str, int]]) -> str | None:
    """The node whose replica answered one request (from the router's decision); None when it failed."""
    try:
        raw = client.completions.with_raw_response.create(
            model="sim-a", prompt="where", max_tokens=2, extra_headers={"x-llmgw-debug": DEBUG}
        )
    except openai.APIError:
        return None
    decision = raw.headers.get("x-llmgw-decision", "")
    endpoint = decision.split(";", 1)[0].removeprefix("endpoint=")
    assert endpoint in replicas, f"the decision names one replica of {sorted(replicas)}: {decision!r}"
    return replicas[endpoint][0]


def endpoint_state(lab: HostLab, router: str, replica: str) -> str | None:
    """The state the router's /metrics gives the replica's endpoint (ready, stale, breaker_open, ...)."""
    url = lab.router_url(router).replace(":8000", ":9000") + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            lines = r.read().decode().splitlines()
    except OSError:
        return None
    mine = [x for x in lines if x.startswith("llmgw_router_endpoint_state{") and f'endpoint="{replica}"' in x]
    on = [x for x in mine if x.endswith(" 1.0")]
    return on[0].split('state="', 1)[1].split('"', 1)[0] if on else None


def test_node_cut_off_and_back_keeps_its_replica_and_routing_follows(lab: HostLab) -> None:
    for name in ("db", "ca", "n1", "n2", "r1"):
        lab.add_host(name)
    lab.start_postgres("db")
    lab.cluster(unreachable="2s", lost="300s")
    lab.start_controller("ca")
    wait_until(lambda: lab.role("ca") == "leader", 30, "ca to lead")
    for node in ("n1", "n2"):
        lab.start_agent(node, ["ca"])
    # Three of a node's four cores each: one replica per node.
    lab.repo.write({"models/a.yaml": model_yaml("sim-a", min_=2, cores=3)}, "add sim-a")
    before = wait_until(lambda: lab.ready("ca", "sim-a", 2), 90, "two replicas of sim-a ready")
    assert sorted(node for node, _ in before.values()) == ["n1", "n2"]
    (lab.tmp / "debug-token").write_text(DEBUG + "\n")
    lab.start_router("r1", ["ca"], ["--debug-token-file", str(lab.tmp / "debug-token")])
    client = openai.OpenAI(base_url=lab.router_url("r1") + "/v1", api_key=API_KEY, max_retries=0, timeout=20)
    wait_until(lambda: {served_by(client, before) for _ in range(6)} == {"n1", "n2"}, 60, "both nodes served")

    cut_at = time.time()
    lab.net.isolate("n1")
    try:
        wait_until(lambda: lab.node_state("ca", "n1") == "Unreachable", 30, "n1 Unreachable")
        # Once the router judges n1's engine gone (its scrapes fail: stale, or its breaker open), every
        # request goes to n2 and is answered.
        cut = next(rid for rid, (node, _) in before.items() if node == "n1")
        wait_until(
            lambda: endpoint_state(lab, "r1", cut) not in (None, "ready"), 30, "the router to judge n1"
        )
        assert {served_by(client, before) for _ in range(20)} == {"n2"}
        assert lab.replicas("ca", "sim-a") is not None and len(lab.replicas("ca", "sim-a") or []) == 2
    finally:
        lab.net.rejoin("n1")
    wait_until(lambda: lab.node_state("ca", "n1") == "Ready", 60, "n1 Ready again")
    assert wait_until(lambda: lab.ready("ca", "sim-a", 2), 60, "both replicas ready again") == before
    wait_until(lambda: endpoint_state(lab, "r1", cut) == "ready", 60, "the router to judge n1 ready again")
    wait_until(lambda: served_by(client, before) == "n1", 60, "the router to send to n1 again")
    started = [e for e in lab.events("ca", cut_at) if e["kind"] == "replica_start"]
    assert started == [], f"nothing started for the cut: {started}"
