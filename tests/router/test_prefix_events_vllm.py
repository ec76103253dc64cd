"""Real replicas publish KV events: the agent starts vLLM (its stand-in, tests/agent/standins/vllm: the real
CLI's flags, refusing others) with `--kv-events-config` on a port it allocates on 127.0.0.1, its pass-through
relays them behind the engine key, and a real router reads the relay the controller publishes and fills its
precise index from the events.

The stand-in imitates vLLM's publisher (ZMQ PUB, `[topic, seq, msgpack KVEventBatch]`, block hashes by vLLM's
sha256 algorithm from PYTHONHASHSEED) with a word per token, held to the real one (vLLM's CPU build) by
tests/vllm_real/test_vllm_contract.py; tests/vllm_real/test_vllm_real.py routes on a real vLLM's events."""

from __future__ import annotations

import json
import sys
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from llmgw_agent.engines import LaunchContext, launch_plan
from llmgw_agent.kv_relay import RELAY_PATH
from llmgw_agent.protocol import KvEventsRequest, ShardSpec, ShardStatus, WeightSource
from llmgw_agent.supervisor import Supervisor, SupervisorConfig
from llmgw_router.app import serve
from llmgw_router.decisions.prefix import vllm_block_hashes
from llmgw_router.path.service import Router, RouterOptions
from support import free_port_range, wait_for

from llmgw.controller.wire.publisher import kv_events_address
from llmgw.core.snapshot import RouterSnapshot

from .test_prefix_tokenizer import MESSAGES, write_model_dir

pytestmark = pytest.mark.integration

STANDIN = Path(__file__).parents[1] / "agent" / "standins" / "vllm"
KEY = "vllm-engine-key"
SEED = "7"
SYSTEM = " ".join(f"rule{i}" for i in range(64))  # 4 blocks of 16 words


def spec(events: bool = True) -> ShardSpec:
    return ShardSpec(
        replica_id="v1",
        model="base",
        engine="vllm",
        slots=4,
        api_key=KEY,
        served_model_name="base",
        kv_events=KvEventsRequest(hash_seed=SEED) if events else None,
    )


def test_the_vllm_command_line_asks_for_events_on_the_address_the_agent_gives() -> None:
    ctx = LaunchContext(
        "127.0.0.1", 20001, "/models/m", "/state/work/v1-0", None, kv_events=("127.0.0.1", 20002)
    )
    plan = launch_plan(spec(), ctx)
    at = plan.argv.index("--kv-events-config")
    assert json.loads(plan.argv[at + 1]) == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://[::ffff:127.0.0.1]:20002",  # IPv4-mapped: vLLM binds it (engines.py)
        "topic": "kv-events",
    }
    assert plan.argv[plan.argv.index("--prefix-caching-hash-algo") + 1] == "sha256"
    assert plan.env["PYTHONHASHSEED"] == SEED  # vLLM's NONE_HASH: random without it, unknowable to routers
    ipv6 = launch_plan(spec(), LaunchContext("::1", 1, None, "/w", None, kv_events=("::1", 2)))
    assert "tcp://[::1]:2" in ipv6.argv[ipv6.argv.index("--kv-events-config") + 1]
    # not asked for, or no port allocated: no flag, no seed
    for plain in (
        launch_plan(spec(events=False), ctx),
        launch_plan(spec(), LaunchContext("h", 1, None, "/w")),
    ):
        assert "--kv-events-config" not in plain.argv and "PYTHONHASHSEED" not in plain.env


@pytest.fixture
async def supervisor(tmp_path: Path) -> AsyncIterator[Supervisor]:
    # the stand-in publishes with pyzmq and msgpack, which the test's interpreter has (vLLM ships them)
    vllm = tmp_path / "vllm"
    vllm.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
    vllm.chmod(0o755)
    ports = free_port_range(100)
    cfg = SupervisorConfig(
        state_dir=tmp_path / "state",
        advertise_host="127.0.0.1",
        bind_host="127.0.0.1",
        port_range=(ports, ports + 99),
        engine_binaries={"vllm": str(vllm)},
        ready_timeout_s=30,
        stop_grace_s=5,
        poll_interval_s=0.05,
    )
    sup = Supervisor(cfg, lambda _: None)
    yield sup
    await sup.stop_all()
    await sup.close()


def snapshot(status: ShardStatus, tokenizer_dir: str | None = None) -> RouterSnapshot:
    assert status.base_url is not None
    return RouterSnapshot.model_validate(
        {
            "revision": "vllm-events-1",
            "router": {"default_policy": "prefix"},
            "policies": {
                "prefix": {
                    "picker": "max_score",
                    "weights": {"prefix": 4, "inflight": 1},
                    "prefix": {"hash_seed": SEED},
                }
            },
            "models": {"base": {"context_length": 4096, "tokenizer_dir": tokenizer_dir}},
            "endpoints": [
                {
                    "replica_id": "v1",
                    "model": "base",
                    "engine": "vllm",
                    "base_url": status.base_url,
                    "api_key": KEY,
                    "kv_events": kv_events_address(status.base_url, status.kv_events_path),
                }
            ],
        }
    )


async def test_the_router_subscribes_to_a_vllm_replica_and_its_events_fill_the_precise_index(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    weights = tmp_path / "weights"
    weights.mkdir()
    supervisor.start(spec().model_copy(update={"source": WeightSource(path=str(weights))}))
    status = await wait_for(
        lambda: next((x for x in supervisor.statuses() if x.state in ("ready", "failed")), None), limit_s=30
    )
    assert status.state == "ready", status.last_output_lines
    assert status.kv_events_port is not None and status.kv_events_port != status.port
    address = f"{status.base_url}{RELAY_PATH}"

    router = Router(RouterOptions())  # no authenticator: every caller is admitted (--no-auth)
    router.apply_snapshot(snapshot(status))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    prefix = router.forwarding.prefix
    try:
        await wait_for(lambda: prefix.subscribed.get("v1") == address, 10, "the router's subscription")
        body = {
            "model": "base",
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}],
            "max_tokens": 2,
        }
        expected = vllm_block_hashes([zlib.crc32(w.encode()) for w in (SYSTEM + " hello").split()], 16, SEED)
        async with aiohttp.ClientSession() as http:

            async def sent_and_indexed() -> bool:
                # a PUB socket drops what it sends before the subscription has joined: ask until one arrives
                url = f"http://127.0.0.1:{listeners.api_port}/v1/chat/completions"
                async with http.post(url, json=body) as r:
                    assert r.status == 200, await r.text()
                return prefix.events.match("v1", expected) == len(expected) == 4

            await wait_for(sent_and_indexed, 15, "the replica's stored blocks in the router's precise index")
        assert prefix.events.heard("v1")
    finally:
        await listeners.close()


async def test_a_vllm_replica_with_a_tokenizer_is_scored_precisely_from_the_models_own_token_ids(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    """The stand-in tokenizes with the model directory's tokenizer.json and chat template and salts the first
    block, as vLLM does; the router, given the same directory as the model's tokenizer_dir, finds the whole
    prompt in the replica's events."""
    pytest.importorskip("tokenizers")
    weights = tmp_path / "weights"
    weights.mkdir()
    write_model_dir(weights)
    supervisor.start(spec().model_copy(update={"source": WeightSource(path=str(weights))}))
    status = await wait_for(
        lambda: next((x for x in supervisor.statuses() if x.state in ("ready", "failed")), None), limit_s=30
    )
    assert status.state == "ready", status.last_output_lines
    router = Router(RouterOptions(debug_token="dbg"))
    router.apply_snapshot(snapshot(status, str(weights)))
    listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    prefix = router.forwarding.prefix
    body = {"model": "base", "messages": MESSAGES, "max_tokens": 2}
    url = f"http://127.0.0.1:{listeners.api_port}/v1/chat/completions"
    try:
        await wait_for(lambda: "v1" in prefix.subscribed, 10, "the router's subscription")
        async with aiohttp.ClientSession() as http:

            async def decision() -> str:
                async with http.post(url, json=body, headers={"x-llmgw-debug": "dbg"}) as r:
                    assert r.status == 200, await r.text()
                    return r.headers["x-llmgw-decision"]

            async def indexed() -> bool:
                await decision()
                return prefix.events.size("v1") >= 4

            await wait_for(indexed, 15, "the replica's stored blocks in the router's precise index")
            seen = await decision()
        # scored from the replica's events, and holding every block of the prompt (prefix 1: the whole share)
        assert "prefix_by=v1:precise" in seen and "prefix:1]" in seen, seen
    finally:
        await listeners.close()


def test_the_sim_started_by_an_agent_publishes_where_the_agent_says_with_the_policys_seed() -> None:
    sim = ShardSpec(replica_id="s1", model="m", engine="sim", kv_events=KvEventsRequest(hash_seed=SEED))
    plan = launch_plan(
        sim, LaunchContext("127.0.0.1", 20001, None, "/w", None, kv_events=("127.0.0.1", 20002))
    )
    tail = plan.argv[plan.argv.index("--kv-events-host") :]
    assert tail[:6] == ["--kv-events-host", "127.0.0.1", "--kv-events-port", "20002", "--hash-seed", SEED]
    # an engine with no publisher the agent knows (SGLang's flag is not in engines.md) is started as before
    sglang = ShardSpec(replica_id="g1", model="m", engine="sglang", kv_events=KvEventsRequest())
    ctx = LaunchContext("127.0.0.1", 20001, "/models/m", "/w", None, kv_events=("10.0.0.5", 20002))
    assert not any("kv" in a for a in launch_plan(sglang, ctx).argv)
