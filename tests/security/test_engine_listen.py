"""M1: engines listen on 127.0.0.1 only; routers reach them through the agent's key-checking pass-through.

A real agent process (against the fake controller) starts a real sim engine and a stand-in that imitates vLLM's
"key only under /v1" behaviour. The serving address is 127.0.0.2 (a loopback address other than 127.0.0.1, so
the socket table tells the pass-through's socket from the engine's).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from agent.fake_controller import FakeController
from agent.test_daemon import AgentProcs, registered, sim_spec, start_ready
from llmgw_agent.config import AgentConfig
from llmgw_agent.passthrough import authorized, key_digest, needs_passthrough

pytestmark = pytest.mark.integration

SERVING = "127.0.0.2"
KEY = "engine-key"
STANDINS = Path(__file__).parent.parent / "agent" / "standins"


def listening_sockets(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket `pid` listens on, from /proc/net/tcp{,6} and the pid's fds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                local, state, inode = cols[1], cols[3], cols[9]
                if state != "0A" or inode not in inodes:  # 0A: LISTEN
                    continue
                hexaddr, hexport = local.split(":")
                found.add((_address(hexaddr, width), int(hexport, 16)))
    return found


def children(parent: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    raw = f.read()
            except OSError:
                continue
            if int(raw[raw.rfind(")") + 2 :].split()[1]) == parent:
                found.append(int(name))
    return found


def _address(hexaddr: str, width: int) -> str:
    raw = bytes.fromhex(hexaddr)
    if width == 8:
        return ".".join(str(b) for b in reversed(raw))
    words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
    return ":".join(b"".join(words)[i : i + 2].hex() for i in range(0, 16, 2))


@pytest.fixture
async def ctl() -> AsyncIterator[FakeController]:
    controller = FakeController(token="agent-token")
    await controller.start()
    yield controller
    await controller.stop()


@pytest.fixture
def agents(tmp_path: Path) -> Any:
    procs = AgentProcs(tmp_path)
    yield procs
    procs.cleanup()


async def _start(ctl: FakeController, agents: AgentProcs, spec: dict[str, Any]) -> tuple[str, int]:
    agents.start(
        [ctl.url],
        advertise_host=SERVING,
        bind_host=SERVING,
        engines={"vllm": {"path": str(STANDINS / "vllm")}},
    )
    await registered(ctl)
    status = await start_ready(ctl, agents, spec)
    assert status.base_url == f"http://{SERVING}:{status.port}"
    assert status.pid is not None
    # The shard's process is the pass-through; the engine is its child, in the same process group.
    assert listening_sockets(status.pid) == {(SERVING, status.port)}
    (engine_pid,) = children(status.pid)
    engine_sockets = listening_sockets(engine_pid)
    assert engine_sockets, "the engine listens somewhere"
    assert {addr for addr, _ in engine_sockets} == {"127.0.0.1"}, engine_sockets
    assert status.port not in {port for _, port in engine_sockets}
    ((_, engine_port),) = engine_sockets
    return status.base_url or "", engine_port


async def _stream_text(resp: aiohttp.ClientResponse) -> list[str]:
    events = []
    async for line in resp.content:
        if line.startswith(b"data: "):
            events.append(line[6:].strip().decode())
    return events


async def test_m1_sim_engine_listens_on_loopback_and_every_path_needs_the_key(
    ctl: FakeController, agents: AgentProcs
) -> None:
    base, _ = await _start(ctl, agents, sim_spec())
    chat = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    async with aiohttp.ClientSession() as http:
        for method, path in [
            ("GET", "/metrics"),
            ("GET", "/health"),
            ("GET", "/v1/models"),
            ("POST", "/v1/chat/completions"),
            ("GET", "/anything-else"),
        ]:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                async with http.request(method, base + path, json=chat, headers=headers) as resp:
                    assert resp.status == 401, (method, path, headers)
        key = {"Authorization": f"Bearer {KEY}"}
        async with http.get(base + "/metrics", headers=key) as resp:
            assert resp.status == 200 and "vllm:num_requests_running" in await resp.text()
        async with http.post(
            base + "/v1/chat/completions", json={**chat, "stream": True}, headers=key
        ) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            events = await _stream_text(resp)
    assert events[-1] == "[DONE]" and len(events) >= 3


async def test_m1_vllm_standin_invocations_is_open_on_the_engine_and_closed_at_the_serving_address(
    ctl: FakeController, agents: AgentProcs
) -> None:
    spec = sim_spec("rep-vllm", engine="vllm", model="vllm-model", args={})
    base, engine_port = await _start(ctl, agents, spec)
    body = {"prompt": "hi", "max_tokens": 3}
    async with aiohttp.ClientSession() as http:
        # The stand-in is faithful to vLLM: its own key leaves /invocations open. This is the hole.
        async with http.post(f"http://127.0.0.1:{engine_port}/invocations", json=body) as resp:
            assert resp.status == 200
        for path in ("/invocations", "/pooling", "/score", "/metrics", "/v1/completions"):
            async with http.post(base + path, json=body) as resp:
                assert resp.status == 401, path
        key = {"Authorization": f"Bearer {KEY}"}
        async with http.post(base + "/invocations", json=body, headers=key) as resp:
            assert resp.status == 200 and (await resp.json())["choices"][0]["text"] == "w0 w1 w2"
        async with http.post(base + "/v1/completions", json={**body, "stream": True}, headers=key) as resp:
            assert resp.status == 200
            events = await _stream_text(resp)
    assert [json.loads(e)["choices"][0]["text"] for e in events[:-1]] == ["w0", "w1", "w2"]
    assert events[-1] == "[DONE]"


def test_m1_all_addresses_is_never_the_default() -> None:
    cfg = AgentConfig(controllers=["127.0.0.1:1"], state_dir="/tmp/x", advertise_host="10.0.0.5")
    assert cfg.bind_host is None  # the supervisor serves on the advertised address
    # Only llama.cpp's key covers every path, and only on loopback may it go without the pass-through.
    assert not needs_passthrough("llamacpp", "127.0.0.1")
    for engine in ("sim", "vllm", "sglang", "trtllm"):
        assert needs_passthrough(engine, "127.0.0.1")
    for engine in ("sim", "llamacpp", "vllm", "sglang", "trtllm"):
        assert needs_passthrough(engine, "10.0.0.5") and needs_passthrough(engine, "0.0.0.0")


def test_m1_passthrough_key_check_is_exact() -> None:
    digest = key_digest(KEY)
    assert authorized(f"Bearer {KEY}", digest) and authorized(f"bearer {KEY}", digest)
    for header in (None, "", KEY, f"Bearer {KEY}x", f"Basic {KEY}", "Bearer ", f"Bearer {KEY[:-1]}"):
        assert not authorized(header, digest), header


NODE = """\
apiVersion: llmgw/v1
kind: Node
metadata: {name: gpu-1}
spec:
  address: 10.0.0.5
"""


def test_m1_listening_on_all_addresses_is_a_warning_with_its_place() -> None:
    from llmgw.core.desired.repo import validate_files

    result = validate_files({"n.yaml": (NODE + "  serving_listen_all: true\n").encode()})
    assert result.ok
    assert [str(w) for w in result.warnings] == [
        "n.yaml:6:23: warning: spec.serving_listen_all: the agent accepts engine traffic on every address of "
        "this node (0.0.0.0) (set `serving_address` to the address routers reach instead, unless NAT hides it "
        "from the node)"
    ]
    refused = validate_files({"n.yaml": (NODE + "  serving_address: 0.0.0.0\n").encode()})
    assert not refused.ok
    assert "spec.serving_address: `0.0.0.0` is not an address routers can reach" in str(refused.errors[0])


def test_m1_bootstrap_writes_the_serving_address_and_bind_all_only_by_opt_in() -> None:
    from llmgw.adapters.ssh import render

    layout = render.Layout()
    base = {"node": "gpu-1", "controllers": ("10.0.0.1:7070",), "tls": True, "token": False}
    default = json.loads(render.agent_config(layout, render.AgentSettings(**base, advertise_host="10.1.0.5")))
    assert default["advertise_host"] == "10.1.0.5" and "bind_host" not in default
    assert AgentConfig.model_validate(default).bind_host is None
    opted = render.AgentSettings(**base, advertise_host="203.0.113.7", bind_host="0.0.0.0")
    assert json.loads(render.agent_config(layout, opted))["bind_host"] == "0.0.0.0"


@pytest.mark.parametrize(
    ("engine", "arg"),
    [
        ("vllm", "distributed_executor_backend"),
        ("vllm", "kv_events_config"),
        ("vllm", "master_addr"),
        ("sglang", "dist_init_addr"),
        ("sglang", "nnodes"),
        ("trtllm", "mpi_hosts"),
    ],
)
def test_m1_agent_opens_no_distributed_sockets(engine: str, arg: str) -> None:
    """No option that opens a rendezvous or publisher socket gets through the argument allowlists, and a
    multi-node shard starts only for vLLM over Ray, only with the rendezvous and fabric address the controller
    sends (docs/gpu-model.md); the other engines' multi-node shards are refused."""
    from llmgw_agent.engines import LaunchContext, SpecError, launch_plan
    from llmgw_agent.protocol import ShardSpec

    ctx = LaunchContext("127.0.0.1", 20001, "/models/m", "/state/work/r1-0", None)
    with pytest.raises(SpecError, match="unknown arg"):
        launch_plan(ShardSpec(replica_id="r1", model="m", engine=engine, args={arg: "x"}), ctx)  # type: ignore[arg-type]
    refused = (
        "needs its rendezvous and fabric address" if engine == "vllm" else "not implemented by this agent"
    )
    with pytest.raises(SpecError, match=refused):
        launch_plan(ShardSpec(replica_id="r1", model="m", engine=engine, shard_count=2), ctx)  # type: ignore[arg-type]


def test_m1_a_multi_node_vllm_shard_meets_its_peers_on_the_fabric_address_only() -> None:
    from llmgw_agent.engines import LaunchContext, launch_plan
    from llmgw_agent.protocol import Rendezvous, ShardSpec

    ctx = LaunchContext("127.0.0.1", 20001, "/models/m", "/state/work/r1-0", None)
    meet = {"rendezvous": Rendezvous(host="10.9.0.1", port=29500), "fabric_address": "10.9.0.2"}
    worker = launch_plan(
        ShardSpec(replica_id="r1", model="m", engine="vllm", shard_count=2, shard_rank=1, **meet), ctx
    )
    assert worker.argv[worker.argv.index("--ip") + 1] == "10.9.0.2"
    assert worker.argv[worker.argv.index("--address") + 1] == "10.9.0.1:29500"
    assert worker.env["VLLM_HOST_IP"] == "10.9.0.2"
    head_meet = {**meet, "fabric_address": "10.9.0.1"}
    head = launch_plan(ShardSpec(replica_id="r1", model="m", engine="vllm", shard_count=2, **head_meet), ctx)
    assert head.argv[head.argv.index("--ip") + 1] == "10.9.0.1"
    assert head.env["VLLM_HOST_IP"] == "10.9.0.1" and head.env["RAY_ADDRESS"] == "10.9.0.1:29500"
