"""Helpers for router tests: sim engines as real processes, a router served in the test's loop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from llmgw_agent.passthrough import DIGEST_ENV, fronted_argv, key_digest
from support import free_port, wait_until


@dataclass
class SimProcess:
    model: str
    port: int
    key: str
    proc: subprocess.Popen[bytes]
    group: bool = False  # the process leads a group of its own (a pass-through and the sim behind it)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            if self.group:
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


def start_sim(
    model: str, key: str, *, decode_ms: float = 1.0, concurrency: int = 8, extra: list[str] | None = None
) -> SimProcess:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "llmgw_agent.sim",
        "--port",
        str(port),
        "--model",
        model,
        "--decode-ms-per-token",
        str(decode_ms),
        "--prefill-ms-per-token",
        "0.01",
        "--max-concurrency",
        str(concurrency),
        *(extra or []),
    ]
    env = dict(os.environ, VLLM_API_KEY=key)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return SimProcess(model, port, key, proc)


def start_relaying_sim(model: str, key: str, extra: list[str] | None = None) -> SimProcess:
    """A sim publishing KV events on 127.0.0.1 behind the agent's pass-through, which relays them at
    `base_url + RELAY_PATH` to key holders: what an agent starts for a model whose policy weighs prefixes."""
    port, engine_port, events_port = free_port(), free_port(), free_port()
    engine = [sys.executable, "-m", "llmgw_agent.sim", "--port", str(engine_port), "--model", model]
    engine += ["--decode-ms-per-token", "1", "--prefill-ms-per-token", "0.01", "--max-concurrency", "8"]
    engine += ["--kv-events-port", str(events_port), *(extra or [])]
    argv = fronted_argv(sys.executable, "127.0.0.1", port, engine_port, engine, events_port)
    env = dict(os.environ, VLLM_API_KEY=key, **{DIGEST_ENV: key_digest(key)})
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    return SimProcess(model, port, key, proc, group=True)


# What the controller's automatic model check publishes for a sim with the default probes (all pass): a
# snapshot whose requests offer tools or a json_schema response_format carries it, as the controller's would.
SIM_VERIFIED = ["response_format", "stream_usage", "tools"]


def endpoint(s: SimProcess, replica_id: str, slots: int | None = 8, **kw: Any) -> dict[str, Any]:
    return {
        "replica_id": replica_id,
        "model": s.model,
        "engine": "sim",
        "base_url": s.base_url,
        "api_key": s.key,
        "slots": slots,
        "simulated": True,
        **kw,
    }


def wait_healthy_sync(sims: list[SimProcess], limit_s: float = 60.0) -> None:
    """Each sim engine answers /health (support.wait_until: one deadline per engine, named)."""
    for s in sims:
        wait_until(lambda s=s: _sim_healthy(s), limit_s, f"sim engine {s.model} on port {s.port}")  # type: ignore[misc]


def _sim_healthy(s: SimProcess) -> bool:
    import urllib.error
    import urllib.request

    if s.proc.poll() is not None:
        raise AssertionError(f"sim engine for {s.model} exited with {s.proc.returncode}")
    try:
        # with the key: a sim behind the pass-through answers nothing without it
        health = urllib.request.Request(s.base_url + "/health", headers={"Authorization": f"Bearer {s.key}"})
        with urllib.request.urlopen(health, timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False
