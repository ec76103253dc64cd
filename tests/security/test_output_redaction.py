"""L3: engine output tails leave the node redacted, and SGLang's key is not on its command line.

The tail is what the agent reports in shard statuses (the controller shows it in /api/v1/replicas and
`llmgw apply --wait` prints it into CI logs). A real supervisor starts a stand-in engine that prints its key,
its server args, a bearer header and secret environment values, then fails.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent.helpers import read_bytes
from llmgw_agent.protocol import ShardSpec, ShardStatus, WeightSource
from llmgw_agent.redact import MASK, redactor, secret_values
from llmgw_agent.supervisor import Supervisor, SupervisorConfig
from support import free_port_range, wait_for

from .test_engine_listen import children

KEY = "engine-key-0123456789abcdef"
HERE = Path(__file__).parent
AGENT_STANDINS = HERE.parent / "agent" / "standins"


@pytest.fixture
async def supervisor(tmp_path: Path) -> AsyncIterator[Supervisor]:
    # The stand-in `sglang` package is found through a PYTHONPATH set in the engine's executable, as a node's
    # operator would; a profile may not set PYTHONPATH (C2).
    sglang_python = tmp_path / "sglang-python"
    sglang_python.write_text(f'#!/bin/sh\nPYTHONPATH={AGENT_STANDINS} exec {sys.executable} "$@"\n')
    sglang_python.chmod(0o755)
    ports = free_port_range(100)
    cfg = SupervisorConfig(
        state_dir=tmp_path / "state",
        advertise_host="127.0.0.1",
        port_range=(ports, ports + 99),
        engine_binaries={"vllm": str(HERE / "standins" / "leaky-engine"), "sglang": str(sglang_python)},
        ready_timeout_s=30,
        stop_grace_s=5,
        poll_interval_s=0.05,
    )
    sup = Supervisor(cfg, lambda _status: None)
    yield sup
    await sup.stop_all()
    await sup.close()


def _spec(engine: str, **kw: object) -> ShardSpec:
    return ShardSpec.model_validate(
        {"replica_id": "r1", "model": "m", "engine": engine, "api_key": KEY, **kw}
    )


@pytest.mark.integration
async def test_l3_engine_output_tail_redacts_key_bearer_and_secret_env(
    supervisor: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_0123456789secret")
    monkeypatch.setenv("ADAPTER_PASSWORD", "hunter2-but-longer")
    supervisor.start(_spec("vllm"))
    failed: ShardStatus = await wait_for(
        lambda: next((s for s in supervisor.statuses() if s.state == "failed"), None), limit_s=30
    )
    text = "\n".join(failed.last_output_lines)
    assert "max_num_batched_tokens=8192 and 12 tokens: fine" in text  # ordinary lines pass untouched
    for secret in (KEY, "hf_0123456789secret", "hunter2-but-longer"):
        assert secret not in text
    assert f"api_key='{MASK}'" in text and f"Bearer {MASK}" in text
    # The agent's own secret-looking variables never reach the engine (C2: engines start from a minimal
    # environment), so the stand-in prints nothing for them; values it did print would be masked (below).
    assert "HF_TOKEN is " in text and "password=" in text


def test_l3_patterns_catch_secrets_the_agent_did_not_hand_out() -> None:
    redact = redactor(secret_values({"HF_TOKEN": "hf_abcdefgh", "OMP_NUM_THREADS": "12345678"}))
    assert redact("Authorization: Bearer sk-live-abc") == f"Authorization: Bearer {MASK}"
    assert redact("--api-key sk-other --port 1") == f"--api-key {MASK} --port 1"
    assert redact('{"token": "abc12345"}') == f'{{"token": "{MASK}"}}'
    assert redact("x-api-key: abcdefg") == f"x-api-key: {MASK}"
    assert redact("api_key=None") == "api_key=None"
    assert redact("control-looking token:    128 '</s>'") == "control-looking token:    128 '</s>'"
    assert redact("threads 12345678") == "threads 12345678"  # not a secret-looking name


@pytest.mark.integration
async def test_l3_sglang_key_is_not_on_argv(supervisor: Supervisor, tmp_path: Path) -> None:
    """SGLang takes its key only as an argument (readable by every local user); behind the agent's
    pass-through, which checks the key on every path, it gets none."""
    weights = tmp_path / "weights"
    weights.mkdir()
    spec = _spec("sglang", source=WeightSource(path=str(weights)))
    supervisor.start(spec)
    ready: ShardStatus = await wait_for(
        lambda: next((s for s in supervisor.statuses() if s.state in ("ready", "failed")), None), limit_s=30
    )
    assert ready.state == "ready", ready.last_output_lines
    assert ready.pid is not None
    # The shard's process (the pass-through) and the engine under it.
    for pid in [ready.pid, *children(ready.pid)]:
        argv = read_bytes(f"/proc/{pid}/cmdline").split(b"\0")
        assert b"--api-key" not in argv and KEY.encode() not in argv
    assert any(b"sglang.launch_server" in read_bytes(f"/proc/{p}/cmdline") for p in children(ready.pid))
