"""The stand-in answers to the real vLLM: every check runs against both. The real one is a replica of the session's
fleet (tests/vllm_real/fleet.py), reached on its own port (not the pass-through: engine against engine); the stand-in
(tests/agent/standins/vllm, which the fast tests use) is started with exactly the flags the agent started that
replica with, read from its process. Checked on both: the flags are accepted, the metric names and types llmgw
reads, the KV-event wire format (ZMQ frames, the msgpack BlockStored fields, hashes the router recomputes from
the model's own tokenizer and chat template), and the runtime LoRA endpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from llmgw_agent.engines import metric_mapping
from llmgw_router.decisions.prefix import vllm_block_hashes
from llmgw_router.routing.tokenizer import PromptTokenizer
from support import free_port, wait_until

from .engine_io import metric_types
from .fleet import VLLM_GROUP, VLLM_TIMEOUT, Fleet, command_line, descendants

pytestmark = [pytest.mark.integration, pytest.mark.vllm, VLLM_GROUP, VLLM_TIMEOUT]

STANDIN = Path(__file__).parents[1] / "agent" / "standins" / "vllm"
SIDES = ["stand-in", "real"]
MODULE = "vllm.entrypoints.openai.api_server"
# What the agent passes a CPU replica with KV events and LoRA (engines.py), each taken by both.
AGENT_FLAGS = {
    "--served-model-name",
    "--host",
    "--port",
    "--max-model-len",
    "--max-num-seqs",
    "--enable-lora",
    "--max-loras",
    "--max-lora-rank",
    "--kv-events-config",
    "--prefix-caching-hash-algo",
    "--enforce-eager",
}
_MAPPING = metric_mapping("vllm")
METRICS = {
    _MAPPING.running: "gauge",
    _MAPPING.waiting: "gauge",
    str(_MAPPING.kv_usage): "gauge",
    str(_MAPPING.prompt_tokens): "counter",
    str(_MAPPING.generation_tokens): "counter",
    "vllm:prefix_cache_queries_total": "counter",
    "vllm:prefix_cache_hits_total": "counter",
    "vllm:cache_config_info": "gauge",
}
CACHE_LABELS = {"block_size", "enable_prefix_caching", "num_gpu_blocks", "kv_cache_memory_bytes"}
BLOCK_STORED = {
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
}
LORA = "contract-lora"


@dataclass(frozen=True)
class Engine:
    side: str
    base: str  # the engine's own address
    key: str
    served: str
    model_dir: Path
    events: str  # where a SUB socket connects to its KV-event publisher
    seed: str  # its PYTHONHASHSEED: the root of its block hashes
    flags: list[str]  # its command line after the model


def _flag(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


def _events_address(flags: list[str]) -> str:
    """A connectable address for the publisher the --kv-events-config names (the IPv4-mapped form binds the
    IPv4 address)."""
    endpoint = json.loads(_flag(flags, "--kv-events-config"))["endpoint"]
    return str(endpoint).replace("[::ffff:", "").replace("]:", ":")


@pytest.fixture(scope="module")
def real_engine(vllm_fleet: Fleet) -> Engine:
    replica = vllm_fleet.replicas[0]
    server = next(p for p in descendants(int(replica["pid"])) if MODULE in command_line(p))
    argv = Path(f"/proc/{server}/cmdline").read_bytes().decode().split("\0")[:-1]
    environ = dict(
        item.split("=", 1)
        for item in Path(f"/proc/{server}/environ").read_bytes().decode().split("\0")
        if item
    )
    model = _flag(argv, "--model")
    flags = argv[argv.index("--model") + 2 :]
    base = f"http://{_flag(flags, '--host')}:{_flag(flags, '--port')}"
    key = vllm_fleet.engine_key(replica["id"])
    served = _flag(flags, "--served-model-name")
    events = _events_address(flags)
    return Engine("real", base, key, served, Path(model), events, environ["PYTHONHASHSEED"], flags)


def _with(flags: list[str], name: str, value: str) -> list[str]:
    out = list(flags)
    out[out.index(name) + 1] = value
    return out


@pytest.fixture(scope="module")
def standin_engine(real_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """The stand-in on ports of its own, with every other flag as the agent gave the real replica."""
    port, events_port = free_port(), free_port()
    config = json.loads(_flag(real_engine.flags, "--kv-events-config"))
    config["endpoint"] = f"tcp://[::ffff:127.0.0.1]:{events_port}"
    flags = _with(_with(real_engine.flags, "--port", str(port)), "--kv-events-config", json.dumps(config))
    env = {
        **os.environ,
        "VLLM_API_KEY": real_engine.key,
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "PYTHONHASHSEED": real_engine.seed,
    }
    log = (tmp_path_factory.mktemp("standin") / "vllm.log").open("wb")
    argv = [sys.executable, str(STANDIN), "serve", str(real_engine.model_dir), *flags]
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, start_new_session=True)
    log.close()
    engine = Engine(
        "stand-in",
        f"http://127.0.0.1:{port}",
        real_engine.key,
        real_engine.served,
        real_engine.model_dir,
        _events_address(flags),
        real_engine.seed,
        flags,
    )
    try:
        wait_until(
            lambda: proc.poll() is not None or _status(engine, "/health")[0] == 200, 30, "the stand-in"
        )
        assert proc.poll() is None, f"the stand-in refused the real replica's flags: {argv}"
        yield engine
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait(10)


@pytest.fixture(params=SIDES)
def engine(request: pytest.FixtureRequest) -> Engine:
    name = "standin_engine" if request.param == "stand-in" else "real_engine"
    found: Engine = request.getfixturevalue(name)
    return found


def _status(engine: Engine, path: str, body: Any = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {engine.key}", "Content-Type": "application/json"}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(engine.base + path, data, headers), timeout=60
        ) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except OSError:
        return 0, ""


def _models(engine: Engine) -> list[dict[str, Any]]:
    status, text = _status(engine, "/v1/models")
    assert status == 200, text
    data: list[dict[str, Any]] = json.loads(text)["data"]
    return data


def test_the_agents_flags_are_taken(engine: Engine) -> None:
    taken = {f for f in engine.flags if f.startswith("--")}
    assert taken >= AGENT_FLAGS, sorted(AGENT_FLAGS - taken)
    assert _status(engine, "/health")[0] == 200
    assert [m["id"] for m in _models(engine)] == [engine.served]
    assert _status(dataclasses.replace(engine, key="wrong"), "/v1/models")[0] == 401


def test_metric_names_and_types(engine: Engine) -> None:
    page = _status(engine, "/metrics")[1]
    types = metric_types(page)
    assert {n: types.get(n) for n in METRICS} == METRICS
    info = next(line for line in page.splitlines() if line.startswith("vllm:cache_config_info{"))
    labels = {kv.split("=", 1)[0] for kv in info[info.index("{") + 1 : info.rindex("}")].split(",")}
    assert labels >= CACHE_LABELS, sorted(CACHE_LABELS - labels)
    assert info.endswith(" 1.0")


def _first_batch(engine: Engine) -> tuple[list[bytes], list[dict[str, Any]]]:
    """A chat request whose prompt no engine has seen, and the first KV-event message its engine publishes
    after: the frames and the request's messages."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 2000)
    sub.connect(engine.events)
    words = (Path(__file__).parents[2] / "docs" / "routing.md").read_text(encoding="utf-8").split()
    try:
        for attempt in range(10):  # a SUB misses what is published before its connection is up
            messages = [
                {
                    "role": "system",
                    "content": f"{engine.side} {attempt} {time.time()} " + " ".join(words[:300]),
                },
                {"role": "user", "content": "hello"},
            ]
            body = {"model": engine.served, "messages": messages, "max_tokens": 1}
            assert _status(engine, "/v1/chat/completions", body)[0] == 200
            with contextlib.suppress(zmq.Again):
                return sub.recv_multipart(), messages
        raise AssertionError(f"no KV event from {engine.side} at {engine.events}")
    finally:
        sub.close(linger=0)


def test_kv_events_frames_fields_and_hashes(engine: Engine) -> None:
    frames, messages = _first_batch(engine)
    topic = json.loads(_flag(engine.flags, "--kv-events-config"))["topic"]
    assert len(frames) == 3 and frames[0] == topic.encode() and len(frames[1]) == 8, frames[:2]
    batch = msgpack.unpackb(frames[2], strict_map_key=False)
    assert isinstance(batch, list) and isinstance(batch[0], float) and batch[2:] == [0], batch[:1] + batch[2:]
    stored = [e for e in batch[1] if e.get("type") == "BlockStored"]
    assert stored, batch
    event = stored[0]
    assert set(event) == BLOCK_STORED, sorted(set(event) ^ BLOCK_STORED)
    size, ids = event["block_size"], event["token_ids"]
    assert len(ids) == size * len(event["block_hashes"])
    # the prompt as the model's own tokenizer and chat template make it, hashed as the router hashes it
    prompt = PromptTokenizer.load(engine.model_dir).encode_chat(messages)
    assert ids == prompt[: len(ids)]
    assert event["block_hashes"] == vllm_block_hashes(ids, size, engine.seed)


def test_runtime_lora_endpoints(engine: Engine, vllm_fleet: Fleet) -> None:
    path = str(vllm_fleet.tiny.adapter)
    status, text = _status(engine, "/v1/load_lora_adapter", {"lora_name": LORA, "lora_path": path})
    assert (status, text) == (200, f"Success: LoRA adapter '{LORA}' added successfully.")
    status, text = _status(engine, "/v1/load_lora_adapter", {"lora_name": LORA, "lora_path": path})
    assert status == 400 and "already" in json.loads(text)["error"]["message"], (
        text
    )  # the router relies on it
    try:
        card = next(m for m in _models(engine) if m["id"] == LORA)
        assert card["parent"] == engine.served and card["root"] == path, card
        body = {"model": LORA, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert _status(engine, "/v1/chat/completions", body)[0] == 200
    finally:
        status, text = _status(engine, "/v1/unload_lora_adapter", {"lora_name": LORA})
    assert (status, text) == (200, f"Success: LoRA adapter '{LORA}' removed successfully.")
    status, text = _status(engine, "/v1/unload_lora_adapter", {"lora_name": LORA})
    assert status == 404 and "cannot be found" in json.loads(text)["error"]["message"], text
    assert LORA not in {m["id"] for m in _models(engine)}
