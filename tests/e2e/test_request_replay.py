"""Bodies kept and replayed end to end (issue 45): one real `llmgw up` (its own content key) whose project keeps
every request's bodies for a few seconds. `llmgw request ID --body` shows the kept request (its email
redacted by the PII rules) and answer, whole or streamed; `--replay MODEL` sends the kept request to the other
model and shows the two answers side by side; past its TTL the body is gone.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import free_port, free_port_range, wait_until

from .up_process import LOCAL_NODE_AND_ORG, Up, admin_call, llmgw_command, printed

# One worker runs the module: its tests share one `llmgw up` (a worker of its own would start another).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300), pytest.mark.xdist_group("e2e-replay")]

BRIEF_TTL_S = 10  # project `brief`: long enough to see its body kept, short enough to see it go
READY_S = 60.0

_MODEL = """---
apiVersion: llmgw/v1
kind: Model
metadata: {{name: {name}}}
spec:
  context_length: 4096
  scaling: {{min: 1, max: 1}}
  profiles:
    - name: sim
      engine: sim
      args: {{prefill_ms_per_token: 0.1, decode_ms_per_token: 1, max_concurrency: 8}}
"""


def _repo(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir()
    (repo / "cluster.yaml").write_text(
        f"""apiVersion: llmgw/v1
kind: Cluster
metadata: {{name: replay}}
spec: {{engines: {{sim: {{}}}}}}
{LOCAL_NODE_AND_ORG}---
apiVersion: llmgw/v1
kind: Project
metadata: {{name: playground}}
spec:
  organization: org
  models: ["*"]
  retention: {{content: true, ttl: 1h, bodies: {{share: 1, max_bytes: 4096}}}}
---
apiVersion: llmgw/v1
kind: Project
metadata: {{name: brief}}
spec:
  organization: org
  models: ["*"]
  retention: {{content: true, ttl: {BRIEF_TTL_S}s, bodies: {{share: 1}}}}
"""
        + _MODEL.format(name="sim-a")
        + _MODEL.format(name="sim-b"),
        encoding="utf-8",
    )
    return repo


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    root = tmp_path_factory.mktemp("replay")
    names = ("router", "router_metrics", "controller", "controller_metrics")
    low = free_port_range(20)
    run = Up(
        root,
        {n: free_port() for n in names},
        llamacpp=False,
        repo=_repo(root),
        engine_ports=f"{low}-{low + 19}",
    )
    run.start()
    try:
        printed(run)  # up is serving: its key is made
        token = run.state_dir / "controller" / "admin-token"
        wait_until(token.exists, READY_S, "the controller's admin token")
        yield run
    finally:
        run.kill_everything()


def _chat(up: Up, model: str, text: str, stream: bool = False, key: str | None = None) -> str:
    """A request answered 200 (the replica may still be starting); its x-request-id."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 8,
        "stream": stream,
    }

    def attempt() -> str | None:
        ask = urllib.request.Request(
            f"http://127.0.0.1:{up.ports['router']}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {key or printed(up).key}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(ask, timeout=30) as answer:
                answer.read()
                return answer.headers["x-request-id"] if answer.status == 200 else None
        except urllib.error.HTTPError:
            return None

    found: str = wait_until(attempt, READY_S, f"{model} answering")
    return found


def _llmgw(up: Up, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [
        *llmgw_command(),
        "request",
        *args,
        "--controller",
        f"http://127.0.0.1:{up.ports['controller']}",
        "--token-file",
        str(up.state_dir / "controller" / "admin-token"),
    ]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"}
    )


def _kept(up: Up, request_id: str) -> dict[str, Any]:
    def shown() -> dict[str, Any] | None:  # usage is written about a second after the answer
        done = _llmgw(up, request_id, "--body", "--json")
        return json.loads(done.stdout) if done.returncode == 0 else None

    found: dict[str, Any] = wait_until(shown, 15.0, f"the kept body of {request_id}", interval=0.5)
    return found


def test_the_kept_body_is_shown_redacted_and_replayed_on_another_model_side_by_side(up: Up) -> None:
    request_id = _chat(up, "sim-a", "hello, reach me at jane.doe@example.com please")
    kept = _kept(up, request_id)
    assert kept["project"] == "playground" and kept["model"] == "sim-a" and kept["status"] == 200
    assert kept["redacted"] and "jane.doe@example.com" not in kept["request"]
    assert "[EMAIL]" in json.loads(kept["request"])["messages"][0]["content"]
    assert json.loads(kept["answer"])["choices"][0]["message"]["content"] == kept["answer_text"] != ""

    shown = _llmgw(up, request_id, "--body")
    assert shown.returncode == 0, shown.stderr
    assert "request body" in shown.stdout and "answer body" in shown.stdout and "[EMAIL]" in shown.stdout

    replayed = _llmgw(up, request_id, "--replay", "sim-b", "--json")
    assert replayed.returncode == 0, replayed.stderr
    found = json.loads(replayed.stdout)
    assert found["replay"]["model"] == "sim-b" and found["replay"]["error"] is None
    assert found["replay"]["answer"]["choices"][0]["message"]["content"] == found["replay"]["answer_text"]
    assert found["original"]["answer_text"] == kept["answer_text"]
    side_by_side = _llmgw(up, request_id, "--replay", "sim-b")
    assert side_by_side.returncode == 0, side_by_side.stderr
    assert "sim-a (kept)" in side_by_side.stdout and "sim-b (replayed on" in side_by_side.stdout


def test_a_body_past_its_ttl_is_gone(up: Up) -> None:
    status, made = admin_call(up, "POST", "/api/v1/keys", {"project": "brief"})
    assert status == 201, made
    request_id = _chat(up, "sim-a", "soon forgotten", key=made["key"])
    path = f"/api/v1/requests/{request_id}/body"
    wait_until(lambda: admin_call(up, "GET", path)[0] == 200, BRIEF_TTL_S, "the body kept")

    def gone() -> dict[str, Any] | None:
        status, said = admin_call(up, "GET", path)
        return said if status == 404 else None

    said = wait_until(gone, BRIEF_TTL_S + 10.0, "the body gone past its TTL")
    assert "past its TTL" in said["error"]["message"]


def test_a_streamed_answer_is_kept_as_its_events(up: Up) -> None:
    request_id = _chat(up, "sim-b", "tell me something", stream=True)
    kept = _kept(up, request_id)
    assert kept["stream"] and kept["answer"].startswith("data:")
    assert kept["answer_text"]
