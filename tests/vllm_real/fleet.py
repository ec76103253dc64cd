"""One deployment of the real vLLM (the CPU build) for the whole session: a controller, one agent and a router as
processes, and two replicas of the tiny Llama (tests/fixtures/vllm_models.py) fetched through the controller's
weights mirror like any directory source. Starting vLLM takes a minute and 3 GiB per replica: every vLLM test
shares this one (tests/vllm_real/conftest.py), in one xdist group.
"""

from __future__ import annotations

import contextlib
import json
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from controller.helpers import Agents, Repo, cluster_yaml
from faults.procs import ControllerProc, RouterProc, start_controller_proc, start_router_proc
from fixtures.vllm_models import TinyLlama
from support import free_port, wait_until
from typer.testing import CliRunner

from llmgw.adapters.keys import hash_key
from llmgw.adapters.mirror import MirrorStore
from llmgw.cli.main import app
from llmgw.core.security import engine_key

__all__ = [
    "KEY",
    "MODEL",
    "VLLM_GROUP",
    "VLLM_TIMEOUT",
    "Fleet",
    "adapter_yaml",
    "command_line",
    "descendants",
    "policy_yaml",
    "start_fleet",
]

# Every vLLM test on one worker, one after another: two replicas take 6 GiB and both cores.
VLLM_GROUP = pytest.mark.xdist_group("vllm")

TOKEN = "vllm-fleet-token"
KEY = "sk-llmgw-" + "v" * 43
DEBUG = "vllm-fleet-debug"
SECRET = "vllm-fleet-cluster-secret"
MODEL = "tiny-llama"
ADAPTER = "tiny-support"
SOURCE = "llmgw-tests/tiny-llama"
SEED = "42"
CONTEXT = 2048
SLOTS = 8
# Two replicas on a 2-core machine: a vLLM start is mostly imports and process spawns, slower when loaded.
READY_S = 420
# The first vLLM test also waits for the fleet (the session fixture starts it within that test's time).
VLLM_TIMEOUT = pytest.mark.timeout(READY_S + 180)


def policy_yaml(picker: str) -> str:
    """The model's routing policy: prefix-scored (max_score) or round-robin, both asking for KV events with the
    same hash seed, so switching between them changes no shard spec and restarts nothing."""
    return f"""\
apiVersion: llmgw/v1
kind: RoutingPolicy
metadata: {{name: vllm-tests}}
spec:
  picker: {picker}
  weights: {{prefix: 4, inflight: 1}}
  prefix: {{hash_seed: "{SEED}"}}
"""


def model_yaml(tokenizer_dir: Path) -> str:
    return f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: {MODEL}}}
spec:
  context_length: {CONTEXT}
  source: {{repo: {SOURCE}, revision: v1, manifest: manifests/tiny-llama.json}}
  tokenizer_dir: {tokenizer_dir}
  routing_policy: vllm-tests
  capabilities: [chat, completions]
  scaling: {{min: 2, max: 2}}
  profiles:
    - name: cpu
      engine: vllm
      cpu_cores: 1
      slots: {SLOTS}
      args: {{enable_lora: true, max_loras: 2, max_lora_rank: 8}}
      env: {{VLLM_CPU_KVCACHE_SPACE: "1", VLLM_NO_USAGE_STATS: "1", HF_HUB_OFFLINE: "1"}}
"""


def adapter_yaml(path: Path) -> str:
    """A LoRA on a `path` source (the same directory on every node): loadable at runtime."""
    return f"""\
apiVersion: llmgw/v1
kind: Adapter
metadata: {{name: {ADAPTER}}}
spec:
  base: {MODEL}
  source: {{path: {path}}}
  rank: 8
"""


@dataclass
class Fleet:
    tmp: Path
    tiny: TinyLlama
    controller: ControllerProc
    router: RouterProc
    agents: Agents
    repo: Repo
    replicas: list[dict[str, Any]] = field(default_factory=list)

    @property
    def address(self) -> str:
        return self.controller.url.removeprefix("http://")

    def admin_get(self, path: str) -> Any:
        req = urllib.request.Request(self.controller.url + path, headers=self.controller.admin_headers)
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def ready_replicas(self) -> list[dict[str, Any]] | None:
        items = [r for r in self.admin_get("/api/v1/replicas")["replicas"] if r["model"] == MODEL]
        failed = [r for r in items if r["state"] == "failed"]
        if failed:
            logs = "".join(
                p.read_text(errors="replace")[-3000:] for p in self.tmp.glob("agents/*/agent-*.log")
            )
            raise AssertionError(f"a vLLM replica failed: {failed}\nagent log tail:\n{logs}")
        ready = [r for r in items if r["state"] == "ready"]
        return ready if len(ready) == 2 else None

    def engine_key(self, replica_id: str) -> str:
        return engine_key(SECRET.encode(), replica_id)

    def cli(self, *args: str) -> tuple[int, str]:
        """`llmgw ARGS` against the controller: exit code and output."""
        flags = ["--controller", self.controller.url, "--token-file", str(self.tmp / "token")]
        result = CliRunner().invoke(app, [*args, *flags])
        return result.exit_code, result.output

    def stop(self) -> None:
        self.router.stop()
        self.controller.stop()
        self.agents.cleanup()


def _write_repo(tmp: Path, tiny: TinyLlama, mirror_port: int) -> Repo:
    (tmp / "cluster-secret").write_text(SECRET + "\n")
    repo = Repo(tmp / "repo", use_git=True)
    manifest = tmp / "tiny-llama.json"
    made = CliRunner().invoke(app, ["model", "manifest", str(tiny.model), "-o", str(manifest)])
    assert made.exit_code == 0 and manifest.exists(), f"llmgw model manifest: {made.output}"
    cluster = cluster_yaml(unreachable="10s", lost="120s") + (
        "  secret: {file: cluster-secret}\n"
        f"  mirror: {{url: 'http://127.0.0.1:{mirror_port}', origin: none}}\n"
    )
    repo.write(
        {
            "cluster.yaml": cluster,
            "manifests/tiny-llama.json": manifest.read_text(),
            "policies.yaml": policy_yaml("max_score"),
            "models/tiny-llama.yaml": model_yaml(tiny.model),
        },
        "the tiny Llama on vLLM",
    )
    return repo


def _start_router(tmp: Path, controller: ControllerProc) -> RouterProc:
    """A router following the controller, accepting KEY for project p1, answering DEBUG with its rationale."""
    (tmp / "keys").write_text(f"{hash_key(KEY)} p1 key-1\n")
    (tmp / "debug-token").write_text(DEBUG + "\n")
    args = ["--controller", controller.url.removeprefix("http://"), "--token-file", str(tmp / "token")]
    args += ["--keys-file", str(tmp / "keys"), "--debug-token-file", str(tmp / "debug-token")]
    return start_router_proc(tmp / "router.log", args)


def start_fleet(tmp: Path, tiny: TinyLlama, vllm_python: str) -> Fleet:
    """Everything started and both replicas ready; on a failure, what was started is stopped."""
    mirror = tmp / "mirror"
    MirrorStore(mirror).add_directory(tiny.model, SOURCE, "v1")
    mirror_port = free_port()
    repo = _write_repo(tmp, tiny, mirror_port)
    (tmp / "token").write_text(TOKEN + "\n")
    settings = {
        "repo": str(repo.path),
        "poll_s": 0.3,
        "store": f"sqlite:///{tmp / 'controller.db'}",
        "admin_token_file": str(tmp / "token"),
        "state_dir": str(tmp / "controller-state"),
        "secrets_dir": str(tmp),
        "mirror_dir": str(mirror),
        "mirror_listen": f"127.0.0.1:{mirror_port}",
        "command_timeout_s": 30.0,
        "drain_s": 0.3,
        "backoff_base_s": 2.0,
    }
    with contextlib.ExitStack() as undo:
        controller = start_controller_proc(tmp / "controller.log", settings, TOKEN)
        undo.callback(controller.stop)
        agents = Agents(tmp, tmp / "token")
        undo.callback(agents.cleanup)
        # The environment's python: the agent runs vLLM as its module (the CPU build has no working `vllm`).
        engines = {"vllm": {"path": vllm_python, "version": "0.32.0"}}
        agents.start(
            "n1",
            controller.url.removeprefix("http://"),
            cpu_cores=2,
            extra={"engines": engines, "ready_timeout_s": READY_S, "stop_grace_s": 15},
        )
        router = _start_router(tmp, controller)
        undo.callback(router.stop)
        fleet = Fleet(tmp, tiny, controller, router, agents, repo)
        fleet.replicas = wait_until(fleet.ready_replicas, READY_S, "two vLLM replicas ready", interval=1.0)
        undo.pop_all()
    return fleet


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (/proc's children lists), e.g. vLLM's API server and its EngineCore."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


def command_line(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""
