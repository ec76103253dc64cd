"""Prefill and decode apart on the real vLLM (its CPU build, issue 46): a prefill and a decode engine of the tiny
Llama sharing vLLM's ExampleConnector store (a directory: the prefill writes each prompt's KV there, the decode
finds it by the prompt), llmgw's router in front of them from a snapshot, asked by the OpenAI SDK.

What it proves, each from the engines' own counters: the prefill was asked for one token per request; the decode
took the prompt's whole KV blocks from the transfer (`vllm:prompt_tokens_by_source_total{source=
"external_kv_transfer"}`) and computed only the rest; and the text it wrote from that KV is the text it writes
computing the prompt itself (greedy), so the KV it loaded was the prompt's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from faults.procs import RouterProc, start_router_proc
from fixtures.vllm_models import TinyLlama, tiny_llama  # noqa: F401  (registers it)
from llmgw_agent.engine_process import group_alive
from support import free_port, wait_until

from .engine_io import metric_value
from .fleet import VLLM_GROUP

pytestmark = [pytest.mark.integration, pytest.mark.vllm, VLLM_GROUP, pytest.mark.timeout(600)]

# The CPU build's KV block. The ExampleConnector moves whole blocks of the prompt less its last token
# (vLLM's example_connector.py, align_to_block_size): the decode computes the rest itself.
BLOCK = 128
CONTEXT = 512
READY_S = 420
TOKENS = 8
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
# Two prompts of one to two blocks (about 170 and 185 tokens in the tiny Llama's tokens), different from their
# first word: each has its own stored KV (the store is keyed by the whole prompt).
PROMPTS = {
    "stream": "The router sends the prompt to a prefill replica first, then the decode replica takes the KV "
    "cache it computed and streams the answer. " * 6,
    "whole": "A controller reads the cluster repository, places replicas on agents, and publishes snapshots "
    "to routers. " * 6,
}


@dataclass
class Engine:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise AssertionError(f"vLLM {self.name} exited {self.proc.returncode}; its log ends:\n{tail}")

    def metrics(self) -> str:
        self.alive()
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return str(r.read().decode())

    def healthy(self) -> bool:
        self.alive()
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def terminate(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)

    def wait_gone(self) -> None:
        """The whole session gone after `terminate`: vLLM's multiprocessing resource tracker ignores SIGTERM and
        outlives the server for a moment, so the group is waited for, then killed."""
        try:
            self.proc.wait(30)
            wait_until(lambda: not group_alive(self.proc.pid), 10, f"vLLM {self.name}'s processes gone")
        except (subprocess.TimeoutExpired, AssertionError):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            wait_until(lambda: not group_alive(self.proc.pid), 10, f"vLLM {self.name}'s processes killed")


def _launch(python: str, tiny: TinyLlama, name: str, role: str, store: Path, core: int, tmp: Path) -> Engine:
    """One vLLM API server of the tiny Llama with the ExampleConnector on `store`, in a session of its own (its
    EngineCore is its child: one killpg stops both), its OpenMP threads on `core`."""
    port = free_port()
    connector = {
        "kv_connector": "ExampleConnector",
        "kv_role": role,
        "kv_connector_extra_config": {"shared_storage_path": str(store)},
    }
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny.model)]
    argv += ["--served-model-name", name, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--enforce-eager", "--max-model-len", str(CONTEXT), "--max-num-seqs", "2"]
    argv += ["--kv-transfer-config", json.dumps(connector)]
    if role == "kv_consumer":
        # Its own prefix cache would serve a prompt it has seen; the KV must come from the store, or be computed.
        argv.append("--no-enable-prefix-caching")
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(core),
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=out, start_new_session=True)
    return Engine(name, f"http://127.0.0.1:{port}", proc, log)


@pytest.fixture(scope="module")
def pd_engines(
    vllm_python: str,
    tiny_llama: TinyLlama,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Engine, Engine, Path]]:
    """The prefill and the decode engine, started at once (a start is mostly imports), and their store."""
    tmp = tmp_path_factory.mktemp("vllm-pd")
    store = tmp / "kv-store"
    store.mkdir()
    cores = sorted(os.sched_getaffinity(0))
    engines: list[Engine] = []
    try:
        engines.append(_launch(vllm_python, tiny_llama, "mp", "kv_producer", store, cores[0], tmp))
        engines.append(_launch(vllm_python, tiny_llama, "md", "kv_consumer", store, cores[-1], tmp))
        wait_until(
            lambda: all(e.healthy() for e in engines), READY_S, "both vLLM engines ready", interval=1.0
        )
        yield engines[0], engines[1], store
    finally:
        for engine in engines:  # both told at once: each takes seconds to shut down
            engine.terminate()
        for engine in engines:
            engine.wait_gone()


def _snapshot(prefill: Engine, decode: Engine) -> dict[str, Any]:
    model = {"context_length": CONTEXT, "capabilities": ["chat"], "routing_policy": "rr"}
    pd = {"prefill": "mp", "decode": "md", "on_failure": "fail"}  # no plain replica: a failed step shows
    endpoints = [
        {"replica_id": f"{e.name}-1", "model": e.name, "engine": "vllm", "base_url": e.url, "slots": 2}
        for e in (prefill, decode)
    ]
    return {
        "revision": "vllm-pd-1",
        "router": {"scrape_interval": "200ms"},
        "models": {"m": model | {"disaggregation": pd}, "mp": model, "md": model},
        "policies": {"rr": {"picker": "round_robin"}},
        "endpoints": endpoints,
    }


@pytest.fixture
def router(pd_engines: tuple[Engine, Engine, Path], tmp_path: Path) -> Iterator[RouterProc]:
    prefill, decode, _ = pd_engines
    (tmp_path / "snapshot.json").write_text(json.dumps(_snapshot(prefill, decode)))
    proc = start_router_proc(
        tmp_path / "router.log", ["--snapshot", str(tmp_path / "snapshot.json"), "--no-auth"]
    )
    try:

        def scraped() -> bool:
            with urllib.request.urlopen(proc.metrics + "/metrics", timeout=5) as r:
                page = r.read().decode()
            return (
                all(f'endpoint="{e.name}-1"' in page for e in (prefill, decode)) and 'state="ready"' in page
            )

        wait_until(scraped, 30, "the router to scrape both engines")
        yield proc
    finally:
        proc.stop()


def _counts(prefill: Engine, decode: Engine) -> dict[str, float]:
    """The counters the test reads: the prefill's max_tokens asked (sum, count) and prompt tokens, the decode's
    prompt tokens by where they came from."""
    p, d = prefill.metrics(), decode.metrics()
    return {
        "max_tokens_sum": metric_value(p, "vllm:request_params_max_tokens_sum"),
        "max_tokens_count": metric_value(p, "vllm:request_params_max_tokens_count"),
        "prefill_prompt": metric_value(p, "vllm:prompt_tokens_total"),
        "transferred": metric_value(d, BY_SOURCE, {"source": "external_kv_transfer"}),
        "computed": metric_value(d, BY_SOURCE, {"source": "local_compute"}),
    }


def _grown(prefill: Engine, decode: Engine, before: dict[str, float], requests: int, prompts: int) -> Any:
    """How much each counter grew, read once the prefill counted `requests` more and the decode `prompts` more
    prompt tokens (an engine counts in its stats step after the answer, not before it)."""

    def read() -> dict[str, float] | None:
        grown = {k: v - before[k] for k, v in _counts(prefill, decode).items()}
        done = grown["max_tokens_count"] >= requests and grown["transferred"] + grown["computed"] >= prompts
        return grown if done else None

    return wait_until(read, 30, "the engines' counters updated", interval=0.2)


def _moved(prompt_tokens: int) -> int:
    """The prompt tokens the ExampleConnector moves: its whole blocks, the last token left out."""
    return (prompt_tokens - 2) // BLOCK * BLOCK


def _messages(key: str) -> list[Any]:
    return [{"role": "user", "content": PROMPTS[key]}]


def test_the_router_serves_in_two_steps_and_the_decode_takes_the_prefills_kv(
    pd_engines: tuple[Engine, Engine, Path], router: RouterProc
) -> None:
    prefill, decode, store = pd_engines
    client = openai.OpenAI(base_url=router.api + "/v1", api_key="none", max_retries=0, timeout=120)
    greedy: dict[str, Any] = {"max_tokens": TOKENS, "temperature": 0, "extra_body": {"ignore_eos": True}}
    before = _counts(prefill, decode)

    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=_messages("stream"),
            stream=True,
            stream_options={"include_usage": True},
            **greedy,
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    stream_usage = chunks[-1].usage
    assert streamed and stream_usage is not None, chunks[-3:]
    assert stream_usage.completion_tokens == TOKENS

    whole = client.chat.completions.create(model="m", messages=_messages("whole"), **greedy)
    text = whole.choices[0].message.content
    assert text and whole.usage is not None and whole.usage.completion_tokens == TOKENS

    prompts = [stream_usage.prompt_tokens, whole.usage.prompt_tokens]
    assert all(BLOCK < n <= CONTEXT for n in prompts), f"each prompt has a whole block to move: {prompts}"
    grown = _grown(prefill, decode, before, 2, sum(prompts))
    # The prefill was asked for one token each time, and read both prompts.
    assert grown["max_tokens_count"] == 2 and grown["max_tokens_sum"] == 2, grown
    assert grown["prefill_prompt"] == sum(prompts), grown
    # The decode took each prompt's whole blocks from the prefill's store and computed only the rest.
    assert grown["transferred"] == sum(map(_moved, prompts)) > 0, grown
    assert grown["computed"] == sum(prompts) - grown["transferred"], grown
    assert len(list(store.iterdir())) == 2, "one stored KV per prompt"
    with urllib.request.urlopen(router.metrics + "/metrics", timeout=5) as r:
        page = r.read().decode()
    for pool, role in (("mp", "prefill"), ("md", "decode")):
        assert f'disaggregated_steps_total{{model="{pool}",outcome="ok",role="{role}"}} 2.0' in page, role

    # The same whole request on the decode alone, the store emptied: it computes the prompt itself and writes
    # the same text, so the KV it loaded above was this prompt's.
    shutil.rmtree(store)
    store.mkdir()
    before = _counts(prefill, decode)
    direct = openai.OpenAI(base_url=decode.url + "/v1", api_key="none", max_retries=0, timeout=120)
    alone = direct.chat.completions.create(model="md", messages=_messages("whole"), **greedy)
    assert alone.usage is not None and alone.usage.prompt_tokens == whole.usage.prompt_tokens
    grown = _grown(prefill, decode, before, 0, alone.usage.prompt_tokens)
    assert grown["transferred"] == 0 and grown["computed"] == alone.usage.prompt_tokens, grown
    assert alone.choices[0].message.content == text
    client.close()
    direct.close()
