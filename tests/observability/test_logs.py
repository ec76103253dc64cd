"""Logs from the control plane: a real agent process keeps its engines' output in its ring (redacted), the
controller relays it (`/api/v1/{nodes,replicas}/.../logs`, paginated and streaming) and `llmgw logs -f` (the
real CLI, as a process) prints it as it comes; a failed start carries its log tail in its event.

The engine is a stand-in for `vllm serve` (standins/talky-vllm) that prints its key three ways and a numbered
`tick` line every 0.2 s; a model named `broken` makes it fail before it is ready.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from controller.helpers import Admin, Agents, Repo, cluster_yaml, settings_for, start
from support import free_port, wait_for

from llmgw.controller.app import RunningController

pytestmark = pytest.mark.integration

TALKY = Path(__file__).parent / "standins" / "talky-vllm"
LLMGW = str(Path(sys.executable).parent / "llmgw")
NODE = "n1"


def vllm_model(name: str, weights: Path) -> str:
    """A vLLM model whose weights are a directory on the node (the stand-in reads nothing of it)."""
    (weights / name).mkdir(parents=True, exist_ok=True)
    return f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: {name}}}
spec:
  source: {{path: "{weights / name}"}}
  context_length: 4096
  scaling: {{min: 1, max: 1}}
  profiles:
    - {{name: gpu, engine: vllm, gpu_class: test-80g, gpus: 1, cpu_cores: 1, min_memory_gb: 1}}
"""


def gpu_inventory(tmp: Path) -> Path:
    """The node says it has one 80 GiB card (vLLM is a GPU engine); the stand-in never touches it."""
    path = tmp / "gpu-inventory.json"
    gpu = {
        "index": 0,
        "uuid": "GPU-test",
        "name": "Test 80GB",
        "class": "test-80g",
        "memory_bytes": 80 * 1024**3,
    }
    path.write_text(json.dumps({"cpu_cores": 4, "memory_bytes": 16 * 1024**3, "gpus": [gpu]}))
    return path


class Fleet:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.repo = Repo(tmp / "repo", use_git=False)
        self.agents = Agents(tmp, tmp / "token")
        self.running: RunningController | None = None
        self.admin: Admin | None = None

    async def up(self, models: dict[str, str]) -> Admin:
        self.repo.write({"cluster.yaml": cluster_yaml(unreachable="3s", lost="30s"), **models})
        self.running, self.admin = await start(
            settings_for(self.tmp, self.repo.path, listen=f"127.0.0.1:{free_port()}")
        )
        self.start_agent()
        return self.admin

    def start_agent(self) -> None:
        assert self.running is not None
        extra = {
            "engines": {"vllm": {"path": str(TALKY)}},
            "inventory_override": str(gpu_inventory(self.tmp)),
        }
        self.agents.start(NODE, self.running.url.split("://")[-1], extra=extra)

    def key(self, replica_id: str) -> str:
        assert self.running is not None
        from llmgw.core.security import engine_key

        return engine_key(self.running.controller.cluster_secret().encode(), replica_id)

    async def close(self) -> None:
        if self.running is not None:
            await self.running.stop()
        self.agents.cleanup()


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    f = Fleet(tmp_path)
    try:
        yield f
    finally:
        await f.close()


async def _ready(admin: Admin, model: str) -> dict[str, Any]:
    async def found() -> dict[str, Any] | None:
        return next(iter(await admin.replicas(model, "ready")), None)

    replica: dict[str, Any] = await wait_for(found, 60, f"a ready replica of {model}")
    return replica


async def _tick_numbers(admin: Admin, path: str) -> list[int]:
    page = await admin.get(path + "?grep=%5Etick&limit=1000")
    return [int(line["text"].split()[1]) for line in page["lines"]]


async def test_logs_follow_streams_engine_output_with_the_key_redacted(fleet: Fleet) -> None:
    admin = await fleet.up({"models/talky.yaml": vllm_model("talky", fleet.tmp / "weights")})
    replica = await _ready(admin, "talky")
    rid, key = replica["id"], fleet.key(replica["id"])
    path = f"/api/v1/replicas/{rid}/logs"
    await wait_for(lambda: _tick_numbers(admin, path), 20, "tick lines in the ring")
    before = max(await _tick_numbers(admin, path))

    assert fleet.running is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    proc = await asyncio.create_subprocess_exec(
        LLMGW,
        "logs",
        rid,
        "-f",
        "--controller",
        fleet.running.url,
        "--token-file",
        str(fleet.tmp / "token"),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    printed: list[str] = []
    try:
        assert proc.stdout is not None
        while not any(
            m and int(m[1]) > before + 2 for m in (re.search(r": tick (\d+)$", p) for p in printed)
        ):
            raw = await asyncio.wait_for(proc.stdout.readline(), 20)
            assert raw, f"llmgw logs -f ended: {(await proc.stderr.read()).decode() if proc.stderr else ''}"
            printed.append(raw.decode().rstrip("\n"))
    finally:
        proc.terminate()
        await proc.wait()
    text = "\n".join(printed)
    # Streamed: lines the engine printed after the command started reached it, in order, each with node/source.
    ticks = [int(m[1]) for m in re.finditer(r": tick (\d+)$", text, re.MULTILINE)]
    assert ticks == sorted(ticks) and ticks[-1] > before
    assert all(f" {NODE} {rid}: " in line for line in printed), printed[:3]
    # Redacted on the node, before the line entered the ring: the key in none of its three forms.
    assert key not in text
    assert "api_key=***" in text and "Authorization: Bearer ***" in text and "the raw key is ***" in text


async def test_logs_pages_with_a_cursor_and_greps_and_serves_the_agent_s_own_lines(fleet: Fleet) -> None:
    admin = await fleet.up({"models/talky.yaml": vllm_model("talky", fleet.tmp / "weights")})
    replica = await _ready(admin, "talky")
    node_path = f"/api/v1/nodes/{NODE}/logs"
    await wait_for(lambda: _at_least(admin, node_path + "?grep=%5Etick&limit=1000", 6), 20, "six tick lines")
    first = await admin.get(node_path + "?grep=%5Etick&limit=3&since=10m")  # forward from `since`: the oldest
    assert [line["text"] for line in first["lines"]] == ["tick 1", "tick 2", "tick 3"] and first["more"]
    second = await admin.get(node_path + f"?grep=%5Etick&limit=3&cursor={first['next_cursor']}")
    assert [line["text"] for line in second["lines"]] == ["tick 4", "tick 5", "tick 6"]
    assert all(line["source"] == replica["id"] and line["node"] == NODE for line in second["lines"])
    tail = await admin.get(node_path + "?limit=2&grep=%5Etick")  # no cursor, no since: the newest
    newest = [int(line["text"].split()[1]) for line in tail["lines"]]
    assert len(newest) == 2 and newest[1] == newest[0] + 1 and newest[1] >= 6  # not ticks 1 and 2

    agent_lines = await admin.get(node_path + "?source=agent&limit=1000")
    texts = [line["text"] for line in agent_lines["lines"]]
    assert any("registered with" in t for t in texts) and any(
        f"starting shard {replica['id']}" in t for t in texts
    )
    assert all(line["source"] == "agent" for line in agent_lines["lines"])

    # Bad input is a 400 that says what would be right; reading logs needs an admin-scope token.
    assert fleet.running is not None
    async with aiohttp.ClientSession() as s:
        for query, says in (
            ("grep=(", "not a regular expression"),
            ("since=ten", "since="),
            ("limit=0", "1 to 1000"),
            ("cursor=zzz", "pass back next_cursor"),
        ):
            async with s.get(fleet.running.url + node_path + "?" + query, headers=admin.headers) as r:
                assert r.status == 400 and says in (await r.json())["error"]["message"], query
        async with s.get(fleet.running.url + node_path) as r:
            assert r.status == 401
        async with s.get(fleet.running.url + "/api/v1/nodes/nowhere/logs", headers=admin.headers) as r:
            assert r.status == 404 and "nowhere" in (await r.json())["error"]["message"]


async def _at_least(admin: Admin, path: str, count: int) -> bool:
    return len((await admin.get(path))["lines"]) >= count


async def test_a_failed_start_points_to_its_log_which_only_admins_read(fleet: Fleet) -> None:
    """The event names the failure and where its output is; the output (it can hold prompts) is read through the
    admin-scope logs API, redacted (docs/security.md, L11)."""
    admin = await fleet.up({"models/broken.yaml": vllm_model("broken", fleet.tmp / "weights")})

    async def failed_event() -> dict[str, Any] | None:
        events = (await admin.get("/api/v1/events?limit=1000"))["events"]
        return next((e for e in events if e["kind"] == "replica_failed"), None)

    event: dict[str, Any] = await wait_for(failed_event, 60, "a replica_failed event")
    rid, message = event["object"], event["message"]
    assert "engine exited: exit code 3" in message and f"(its output: llmgw logs {rid})" in message
    assert "CUDA out of memory" not in message
    # Through the node's ring, by source: the failed replica may already be gone from the controller's view
    # (replaced after the event), and its lines stay in the ring either way. Admin scope, as for the replica's.
    lines = (await admin.get(f"/api/v1/nodes/{NODE}/logs?source={rid}&limit=1000"))["lines"]
    text = "\n".join(line["text"] for line in lines)
    assert "talky: CUDA out of memory: tried to allocate 1.20 GiB" in text
    assert fleet.key(rid) not in text and "api_key=***" in text
    assert fleet.running is not None
    proc = await asyncio.create_subprocess_exec(
        LLMGW,
        "events",
        "--controller",
        fleet.running.url,
        "--token-file",
        str(fleet.tmp / "token"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert "replica_failed" in out.decode() and "CUDA out of memory" not in out.decode()


async def test_engine_memory_is_reported_against_the_profile_s_reservation(fleet: Fleet) -> None:
    admin = await fleet.up({"models/talky.yaml": vllm_model("talky", fleet.tmp / "weights")})
    await _ready(admin, "talky")

    async def measured() -> dict[str, Any] | None:
        replica = next(iter(await admin.replicas("talky", "ready")), None)
        return replica["memory"] if replica and replica["memory"]["rss_bytes"] else None

    memory: dict[str, Any] = await wait_for(measured, 30, "the engine's resident memory")
    assert 1024 * 1024 < memory["rss_bytes"] < 1024**3  # a small Python process group, measured from /proc
    assert memory["reserved_bytes"] == 1024**3  # min_memory_gb: 1, one node
    # The card placed for it is reserved; what it uses is unknown here (no nvidia-smi), never 0.
    assert memory["gpu_bytes"] is None and memory["gpu_reserved_bytes"] == 80 * 1024**3
    status = await admin.get("/api/v1/status")
    (model,) = [m for m in status["models"] if m["model"] == "talky"]
    assert model["memory"]["reserved_bytes"] == 1024**3 and model["memory"]["rss_bytes"]

    assert fleet.running is not None
    proc = await asyncio.create_subprocess_exec(
        LLMGW,
        "replicas",
        "--controller",
        fleet.running.url,
        "--token-file",
        str(fleet.tmp / "token"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert re.search(r"\d+\.\d/1\.0 GiB, GPU -/80\.0 GiB", out.decode()), out.decode()


async def test_follow_says_when_the_agent_goes_and_goes_on_with_the_restarted_agent_s_lines(
    fleet: Fleet,
) -> None:
    admin = await fleet.up({"models/talky.yaml": vllm_model("talky", fleet.tmp / "weights")})
    rid = (await _ready(admin, "talky"))["id"]
    assert fleet.running is not None
    url = fleet.running.url + f"/api/v1/replicas/{rid}/logs?follow=1&grep=%5Etick&limit=5"
    async with aiohttp.ClientSession() as s, s.get(url, headers=admin.headers) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("application/x-ndjson")

        async def next_item(wanted: str, says: str = "") -> dict[str, Any]:
            while True:
                raw = await asyncio.wait_for(r.content.readline(), 30)
                assert raw, "the stream ended"
                item: dict[str, Any] = json.loads(raw)
                assert set(item) <= {"line", "cursor", "notice"}, item
                if wanted in item and says in json.dumps(item[wanted]):
                    return item

        before = int((await next_item("line"))["line"]["text"].split()[1])
        await asyncio.to_thread(fleet.agents.stop, NODE)  # SIGTERM: the engine keeps running
        await next_item("notice", f"waiting for node {NODE}")
        async with s.get(url.replace("follow=1", "follow=0"), headers=admin.headers) as page:  # not streaming
            assert page.status == 503 and "not connected" in (await page.json())["error"]["message"]
        fleet.start_agent()
        await next_item("notice", f"node {NODE} answers again")
        # The new agent re-adopted the engine: its lines come on, from the new agent's ring (another boot in the
        # cursor), and the engine's count went on from where it was (the same process).
        after = int((await next_item("line"))["line"]["text"].split()[1])
        assert after > before
    # The restarted agent never had the key (it is not in the state file) and still hides it: it read it from
    # the adopted engine's environment.
    key = fleet.key(rid)
    path = f"/api/v1/replicas/{rid}/logs?grep=still+serving&limit=1000"

    async def said() -> dict[str, Any] | None:
        found: dict[str, Any] = await admin.get(path)
        return found if found["lines"] else None

    page: dict[str, Any] = await wait_for(said, 20, "a 'still serving' line from the adopted engine")
    assert all(line["text"] == "talky: still serving with ***" for line in page["lines"])
    assert key not in json.dumps(page)


async def test_the_router_writes_json_log_lines_when_asked(fleet: Fleet) -> None:
    from faults.procs import start_router_proc

    await fleet.up({})
    assert fleet.running is not None
    address = fleet.running.url.split("://")[-1]
    args = [
        "--controller",
        address,
        "--token-file",
        str(fleet.tmp / "token"),
        "--no-auth",
        "--log-format",
        "json",
    ]
    router = await asyncio.to_thread(start_router_proc, fleet.tmp / "router.log", args)
    try:
        await wait_for(lambda: "connected to the controller" in router.text(), 30, "the router's log line")
    finally:
        await asyncio.to_thread(router.stop)
    records = [json.loads(line) for line in router.text().splitlines() if line.startswith("{")]
    connected = next(r for r in records if "connected to the controller" in r["message"])
    assert connected["level"] == "INFO" and connected["logger"].startswith("llmgw_router")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", connected["time"])
    assert not re.search(
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (INFO|WARNING|ERROR) ", router.text(), re.MULTILINE
    )
