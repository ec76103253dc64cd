"""Federation end to end (issue 45): two real `llmgw up` on loopback, `east` and `west`, each the other's peer,
each serving a simulated model. A request to `PEER/MODEL` is served by the other; one that comes back round
the loop is answered 508; a project with `residency: []` never reaches the peer; a model a fallback names and
the peer does not offer is withdrawn; a peer that is stopped (SIGSTOP: it answers nothing) leaves routing and
comes back when it is continued; both sides keep the usage row of a request served across.

Both `up`s start at once and are shared by the module's tests, which run in file order (the stop comes last).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import free_port, free_port_range, wait_until

from .up_process import LOCAL_NODE_AND_ORG, Up, admin_call, llmgw_command, printed

# One worker runs the module: its tests share the two `llmgw up` (a worker of its own would start two more).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300), pytest.mark.xdist_group("e2e-federation")]

READY_S = 60.0  # a sim replica ready and the peer's models listed on the other side
PEER_CHECK = "1s"  # how often each side checks the other: a stopped peer is seen within a few seconds


def _repo(root: Path, name: str, other: str, other_port: int) -> Path:
    repo = root / f"repo-{name}"
    repo.mkdir()
    (repo / "cluster.yaml").write_text(
        f"""apiVersion: llmgw/v1
kind: Cluster
metadata: {{name: {name}}}
spec:
  region: {name}
  engines: {{sim: {{}}}}
  peers:
    - name: {other}
      url: http://127.0.0.1:{other_port}
      key: {{file: peer-{other}}}
      region: {other}
      check_interval: {PEER_CHECK}
      timeout: 1s
{LOCAL_NODE_AND_ORG}---
apiVersion: llmgw/v1
kind: Project
metadata: {{name: playground}}
spec: {{organization: org, models: ["*"]}}
---
apiVersion: llmgw/v1
kind: Project
metadata: {{name: homebody}}
spec: {{organization: org, models: ["*"], residency: []}}
---
apiVersion: llmgw/v1
kind: Model
metadata: {{name: sim-chat}}
spec:
  context_length: 4096
  fallbacks: [{other}/retired]
  scaling: {{min: 1, max: 1}}
  profiles:
    - name: sim
      engine: sim
      args: {{prefill_ms_per_token: 0.1, decode_ms_per_token: 1, max_concurrency: 8}}
""",
        encoding="utf-8",
    )
    return repo


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Up]]:
    root = tmp_path_factory.mktemp("federation")
    names = ("router", "router_metrics", "controller", "controller_metrics")
    ports = {side: {n: free_port() for n in names} for side in ("east", "west")}
    ups: dict[str, Up] = {}
    for side, other in (("east", "west"), ("west", "east")):
        tmp = root / side
        tmp.mkdir()
        low = free_port_range(20)
        up = Up(
            tmp,
            ports[side],
            llamacpp=False,
            repo=_repo(root, side, other, ports[other]["router"]),
            engine_ports=f"{low}-{low + 19}",
        )
        secrets = up.state_dir / "controller" / "secrets"
        secrets.mkdir(parents=True)
        (secrets / "bindings.yaml").write_text(
            f"peer-{other}: {{purposes: [provider-key], hosts: ['127.0.0.1:{ports[other]['router']}']}}\n"
        )
        ups[side] = up
    try:
        for up in ups.values():
            up.start()
        keys = {side: printed(up).key for side, up in ups.items()}
        for side, other in (("east", "west"), ("west", "east")):  # each is given a key of the other's project
            key_file = ups[side].state_dir / "controller" / "secrets" / f"peer-{other}"
            key_file.write_text(keys[other] + "\n")
            key_file.chmod(0o600)
        for side, other in (("east", "west"), ("west", "east")):  # each side has read the other's models
            _served(ups[side], keys[side], f"{other}/sim-chat")
        yield ups
    finally:
        for up in ups.values():
            if up.proc is not None and up.proc.poll() is None:
                up.proc.send_signal(signal.SIGCONT)  # a test that failed while it was stopped
            up.kill_everything()


def _post(up: Up, key: str, model: str, timeout: float = 30) -> tuple[int, dict[str, Any], str]:
    """A chat request to `up`'s router: (status, answer, its x-request-id)."""
    body = {"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
    ask = urllib.request.Request(
        f"http://127.0.0.1:{up.ports['router']}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(ask, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read()), answer.headers.get("x-request-id", "")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}"), exc.headers.get("x-request-id", "")


def _served(up: Up, key: str, model: str) -> tuple[dict[str, Any], str]:
    """The first 200 answer for `model` (its replica, or the peer's models, may still be on their way)."""

    def attempt() -> tuple[dict[str, Any], str] | None:
        status, answer, request_id = _post(up, key, model)
        return (answer, request_id) if status == 200 else None

    found: tuple[dict[str, Any], str] = wait_until(attempt, READY_S, f"{model} served")
    return found


def _usage_row(up: Up, request_id: str) -> dict[str, Any]:
    def row() -> dict[str, Any] | None:  # a router writes usage within about a second of the answer
        status, found = admin_call(up, "GET", f"/api/v1/requests/{request_id}")
        return found["requests"][0] if status == 200 else None

    found: dict[str, Any] = wait_until(row, 10.0, f"the usage row of {request_id}")
    return found


def test_each_sides_peer_model_is_served_by_the_other_with_usage_on_both(pair: dict[str, Up]) -> None:
    east, west = pair["east"], pair["west"]
    for here, there, peer in ((east, west, "west"), (west, east, "east")):
        key = printed(here).key
        answer, request_id = _served(here, key, f"{peer}/sim-chat")
        assert answer["model"] == f"{peer}/sim-chat", answer
        mine, theirs = _usage_row(here, request_id), _usage_row(there, request_id)
        assert mine["endpoint"] == f"peer:{peer}/sim-chat", mine
        assert mine["model"] == f"{peer}/sim-chat" and mine["project"] == "playground"
        assert theirs["model"] == "sim-chat" and theirs["project"] == "playground", theirs
        assert theirs["endpoint"] and not theirs["endpoint"].startswith("peer:"), theirs
        assert theirs["tokens_out"] == mine["tokens_out"] > 0


def test_a_request_that_comes_back_round_the_peers_is_answered_508(pair: dict[str, Up]) -> None:
    east = pair["east"]
    key = printed(east).key
    # east offers west's models, and west offers east's: east/sim-chat there is west/east/sim-chat here.
    wait_until(
        lambda: _post(east, key, "west/east/sim-chat")[0] != 404, READY_S, "west/east/sim-chat offered"
    )
    status, answer, _ = _post(east, key, "west/east/sim-chat")
    assert status == 508, answer
    assert answer["error"]["code"] == "peer_loop"
    assert "already passed through cluster `east`" in answer["error"]["message"]


def test_a_project_with_residency_never_reaches_the_peer(pair: dict[str, Up]) -> None:
    east, west = pair["east"], pair["west"]
    status, made = admin_call(east, "POST", "/api/v1/keys", {"project": "homebody"})
    assert status == 201, made
    status, answer, request_id = _post(east, made["key"], "west/sim-chat")
    assert status == 403, answer
    assert answer["error"]["code"] == "kept_home"
    assert "residency allows regions none" in answer["error"]["message"]
    assert "peer `west` declares region `west`" in answer["error"]["message"]
    # Served at home, the same project is answered: the rule keeps it off the peer only.
    assert _served(east, made["key"], "sim-chat")[0]["model"] == "sim-chat"
    assert admin_call(west, "GET", f"/api/v1/requests/{request_id}")[0] == 404


def test_a_model_a_fallback_names_and_the_peer_does_not_offer_is_withdrawn(pair: dict[str, Up]) -> None:
    east = pair["east"]
    status, answer, _ = _post(east, printed(east).key, "west/retired")
    assert status == 404, answer
    assert answer["error"]["code"] == "model_withdrawn"
    assert "withdrawn by peer `west`" in answer["error"]["message"]


def test_plan_says_what_a_peer_change_does(pair: dict[str, Up], tmp_path: Path) -> None:
    east = pair["east"]
    _served(east, printed(east).key, "west/sim-chat")  # traffic to the peer in the window
    changed = tmp_path / "changed"
    shutil.copytree(east.repo, changed)
    cluster = changed / "cluster.yaml"
    text = cluster.read_text(encoding="utf-8")
    text = text.replace(
        "  peers:\n", "  peers:\n    - {name: north, url: 'http://127.0.0.1:9', region: north}\n", 1
    )
    text = text.replace(
        'metadata: {name: playground}\nspec: {organization: org, models: ["*"]}',
        'metadata: {name: playground}\nspec: {organization: org, models: ["*"], no_store: true}',
    )
    cluster.write_text(text, encoding="utf-8")
    argv = [*llmgw_command(), "plan", str(changed), "--format", "json"]
    argv += ["--controller", f"http://127.0.0.1:{east.ports['controller']}"]
    argv += ["--token-file", str(east.state_dir / "controller" / "admin-token")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=east.tmp)
    assert done.returncode == 0, done.stderr + done.stdout
    items = {i["words"] for i in json.loads(done.stdout)["impact"]["items"]}
    said = "\n".join(sorted(items))
    assert any(
        w.startswith("keeps project playground off peer west, where project playground sent") for w in items
    ), said
    assert any("(no_store: true)" in w for w in items), said
    assert any(w.startswith("adds peer north (http://127.0.0.1:9)") for w in items), said
    assert any(
        w.startswith("a fallback names west/retired, which peer west does not offer now") for w in items
    ), said


def test_a_stopped_peer_leaves_routing_and_comes_back(pair: dict[str, Up]) -> None:
    east, west = pair["east"], pair["west"]
    key = printed(east).key
    _served(east, key, "west/sim-chat")
    assert west.proc is not None
    west.proc.send_signal(signal.SIGSTOP)  # its router and controller answer nothing now
    try:

        def refused() -> dict[str, Any] | None:
            # Until east's controller sees west down, a request is sent there and waits for it: not yet.
            try:
                status, answer, _ = _post(east, key, "west/sim-chat", timeout=2)
            except TimeoutError:
                return None
            return answer if status == 503 else None

        answer = wait_until(refused, 20.0, "west/sim-chat out of routing")
        assert answer["error"]["code"] == "peer_unavailable"
        assert "peer `west`, which is down (no answer within 1s)" in answer["error"]["message"]
    finally:
        west.proc.send_signal(signal.SIGCONT)
    assert _served(east, key, "west/sim-chat")[0]["model"] == "west/sim-chat"
