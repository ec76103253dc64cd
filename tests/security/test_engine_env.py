"""C2: a profile's `env` reaches an engine process, so only names that tune the engine may: nothing that loads code
(LD_PRELOAD, PYTHONPATH), takes the agent's GPUs (CUDA_VISIBLE_DEVICES) or lifts a guard (VLLM_SERVER_DEV_MODE).
`llmgw validate` refuses the rest with file:line and the field path; the agent filters a ShardSpec handed to it
directly, and starts engines from a minimal environment rather than its own."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from llmgw_agent import repo_rules
from llmgw_agent.protocol import ShardSpec, ShardStatus
from llmgw_agent.supervisor import Supervisor, SupervisorConfig
from support import free_port_range, wait_for

from .repo_attack import GPU_PROFILE, attack_repo, model, validate

REFUSED = {
    "LD_PRELOAD": "LD_PRELOAD is refused: LD_* names make the dynamic linker load code into the engine",
    "LD_LIBRARY_PATH": "LD_LIBRARY_PATH is refused: LD_* names make the dynamic linker load code into the engine",
    "PYTHONPATH": "PYTHONPATH is refused: PYTHON* names make the interpreter load code into the engine",
    "CUDA_VISIBLE_DEVICES": "CUDA_VISIBLE_DEVICES is refused: the agent sets it to the GPUs it assigned",
    "VLLM_SERVER_DEV_MODE": "VLLM_SERVER_DEV_MODE is refused: opens vLLM's unauthenticated development endpoints",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_c2_validate_refuses_engine_env_that_reaches_beyond_tuning(tmp_path: Path, name: str) -> None:
    profile = (
        GPU_PROFILE
        + f"      env:\n        OMP_NUM_THREADS: '4'\n        {name}: /opt/llmgw/weights/x/lib.so\n"
    )
    result = validate(attack_repo(tmp_path, model(profile)))
    result.assert_refused(name, f"spec.profiles[0].env.{name}", REFUSED[name])
    assert "invalid: 1 error(s)" in result.out  # OMP_NUM_THREADS passes


@pytest.mark.parametrize(
    "name",
    ["HF_TOKEN", "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_PLUGINS", "NCCL_NET_PLUGIN", "HOME", "PATH"],
)
def test_c2_secret_guard_and_plugin_names_are_refused(name: str) -> None:
    assert repo_rules.env_name_problem("vllm", name) is not None


def test_c2_tuning_names_pass_validate(tmp_path: Path) -> None:
    env = "".join(
        f"        {k}: '1'\n"
        for k in ("OMP_NUM_THREADS", "HF_HOME", "HF_HUB_OFFLINE", "VLLM_USE_V1", "NCCL_DEBUG")
    )
    result = validate(attack_repo(tmp_path, model(GPU_PROFILE + "      env:\n" + env)))
    assert result.code == 0, result.out


# A stand-in engine that records the environment it was started with, then answers its health check.
ENV_DUMP = r"""
import http.server, json, os, sys
with open("engine-env.json", "w") as f:  # the cwd is the shard's work directory
    json.dump(dict(os.environ), f)
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.fixture
async def dumping_supervisor(tmp_path: Path) -> AsyncIterator[tuple[Supervisor, list[ShardStatus]]]:
    script = tmp_path / "env_dump.py"
    script.write_text(ENV_DUMP)
    engine = tmp_path / "fake-vllm"
    engine.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    engine.chmod(0o755)
    updates: list[ShardStatus] = []
    ports = free_port_range(100)
    cfg = SupervisorConfig(
        state_dir=tmp_path / "state",
        advertise_host="127.0.0.1",
        bind_host="127.0.0.1",
        port_range=(ports, ports + 99),
        engine_binaries={"vllm": str(engine)},
        ready_timeout_s=60,
        stop_grace_s=2,
        poll_interval_s=0.05,
    )
    sup = Supervisor(cfg, updates.append)
    yield sup, updates
    await sup.stop_all()
    await sup.close()


async def _started_env(sup: Supervisor, spec: ShardSpec) -> dict[str, str]:
    sup.start(spec)
    status = await wait_for(
        lambda: next((s for s in sup.statuses() if s.state in ("ready", "failed")), None), 60, "engine ready"
    )
    assert status.state == "ready", status.last_output_lines
    env: dict[str, str] = json.loads(
        (sup.cfg.state_dir / "work" / spec.shard_id / "engine-env.json").read_text()
    )
    return env


@pytest.mark.integration
async def test_c2_agent_filters_engine_env_from_a_shardspec(
    dumping_supervisor: tuple[Supervisor, list[ShardStatus]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ShardSpec that never went through validate (a spoofed or older controller): the refused names do not
    reach the engine, the tuning name does, and the agent's own unrelated environment is not inherited."""
    sup, _ = dumping_supervisor
    monkeypatch.setenv("LLMGW_AGENT_ONLY_SETTING", "agent-private")
    monkeypatch.setenv("LANG", "C.UTF-8")
    spec = ShardSpec(
        replica_id="envtest",
        model="m",
        engine="vllm",
        api_key="engine-key",
        env={name: "/nonexistent/lib.so" for name in REFUSED} | {"OMP_NUM_THREADS": "3"},
    )
    env = await _started_env(sup, spec)
    for name in REFUSED:
        assert name not in env, (name, env.get(name))
    assert env["OMP_NUM_THREADS"] == "3"
    assert env["VLLM_API_KEY"] == "engine-key"  # what the agent sets itself
    assert "LLMGW_AGENT_ONLY_SETTING" not in env  # the agent's environment is not the engine's
    assert env["LANG"] == "C.UTF-8" and env["PATH"]


@pytest.mark.integration
async def test_gpus_set_by_the_agent_win_over_the_profile(
    dumping_supervisor: tuple[Supervisor, list[ShardStatus]],
) -> None:
    sup, _ = dumping_supervisor
    spec = ShardSpec(
        replica_id="gpus", model="m", engine="vllm", gpus=[2], env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    )
    env = await _started_env(sup, spec)
    assert env["CUDA_VISIBLE_DEVICES"] == "2"
