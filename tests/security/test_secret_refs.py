"""H3: secret references are confined to the process's secrets directory and env prefix.

A repo editor must not be able to name a file or variable the operator did not put there for them: the
router sends a provider key as a bearer token to a URL the same document chooses, and the controller ships
the Cluster token to Nodes the same editor declares. `llmgw validate` refuses the reference with file:line
and the field path; the process re-checks when it reads it (a symlink is only visible then).
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from faults.procs import FakeEngine, start_router_proc
from support import write_bindings
from typer.testing import CliRunner

from llmgw.adapters.secrets import SecretError, read_secret
from llmgw.adapters.ssh.remote import StepFailed, target_for
from llmgw.cli.main import app
from llmgw.controller.parts.settings import ControllerOptions
from llmgw.core.config.models import Node, SecretRef
from llmgw.core.config.secretrefs import SecretPolicy, SecretRefError, resolve

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster-repo"
OUTSIDE = "outside-secret-value-never-sent"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return Path(shutil.copytree(EXAMPLE, tmp_path / "repo"))


def _validate(repo: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["validate", str(repo)])
    return result.exit_code, result.output


def _provider_model(key: str) -> str:
    return f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: ext}}
spec:
  context_length: 4096
  provider:
    url: https://api.example.com/v1
    model: gpt-x
    key: {key}
"""


def _line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


def _secrets(tmp: Path) -> Path:
    secrets = tmp / "secrets"
    secrets.mkdir(exist_ok=True)
    (secrets / "good-key").write_text("good-provider-key\n")
    (tmp / "outside").write_text(OUTSIDE + "\n")
    return secrets


# ---------------------------------------------------------------------------------------------- validate


def test_h3_absolute_file_ref_is_refused(repo: Path, tmp_path: Path) -> None:
    text = _provider_model("{file: /etc/llmgw/store.dsn}")
    (repo / "models" / "ext.yaml").write_text(text)
    code, out = _validate(repo)
    line = _line_of(text, "key:")
    assert code == 1
    assert f"models/ext.yaml:{line}:" in out, out
    assert "spec.provider.key.file: absolute secret file path '/etc/llmgw/store.dsn'" in out, out
    assert "relative to the secrets directory, e.g. `store.dsn`" in out  # what would be right
    with pytest.raises(SecretRefError, match="refused: absolute secret file path"):
        resolve(SecretRef(file=str(tmp_path / "outside")), SecretPolicy(_secrets(tmp_path)))


def test_h3_dotdot_file_ref_is_refused(repo: Path, tmp_path: Path) -> None:
    text = _provider_model("{file: ../../admin-token}")
    (repo / "models" / "ext.yaml").write_text(text)
    code, out = _validate(repo)
    assert code == 1
    assert f"models/ext.yaml:{_line_of(text, 'key:')}:" in out, out
    assert "spec.provider.key.file: secret file path '../../admin-token' climbs out with `..`" in out, out
    secrets = _secrets(tmp_path)
    for name in ("../outside", "sub/../../outside", "~/outside"):
        with pytest.raises(SecretRefError, match="refused"):
            resolve(SecretRef(file=name), SecretPolicy(secrets))


def test_h3_unprefixed_env_ref_is_refused(repo: Path) -> None:
    cluster = (repo / "cluster.yaml").read_text()
    assert "\nspec:\n" in cluster
    cluster = cluster.replace("\nspec:\n", "\nspec:\n  secret: {env: PGPASSWORD}\n", 1)
    (repo / "cluster.yaml").write_text(cluster)
    code, out = _validate(repo)
    assert code == 1
    assert f"cluster.yaml:{_line_of(cluster, 'PGPASSWORD')}:" in out, out
    assert "spec.secret.env: environment variable 'PGPASSWORD' does not start with the secret prefix" in out
    assert "LLMGW_SECRET_PGPASSWORD" in out  # the suggestion
    env = {"PGPASSWORD": OUTSIDE, "LLMGW_SECRET_DB": "fine"}
    policy = SecretPolicy(Path("/nonexistent"))
    with pytest.raises(SecretRefError, match="does not start with the secret prefix LLMGW_SECRET_"):
        resolve(SecretRef(env="PGPASSWORD"), policy, env)
    with pytest.raises(SecretRefError, match="prefix"):
        resolve(SecretRef(env="LLMGW_SECRET_"), policy, env)  # the prefix alone names nothing
    assert resolve(SecretRef(env="LLMGW_SECRET_DB"), policy, env) == "fine"
    # Another prefix is the process's choice, not the repo's.
    assert resolve(SecretRef(env="PGPASSWORD"), SecretPolicy(Path("/x"), "PG"), env) == OUTSIDE


def test_h3_prefixed_env_and_relative_file_refs_validate(repo: Path) -> None:
    (repo / "models" / "ext.yaml").write_text(_provider_model("{file: providers/openai}"))
    cluster = (
        (repo / "cluster.yaml").read_text().replace("\nspec:\n", "\nspec:\n  secret: {env: LLMGW_SECRET_C}\n")
    )
    (repo / "cluster.yaml").write_text(cluster)
    code, out = _validate(repo)
    assert code == 0, out


def test_h3_symlink_escaping_the_secrets_dir_is_refused(tmp_path: Path) -> None:
    secrets = _secrets(tmp_path)
    (secrets / "escape").symlink_to(tmp_path / "outside")
    (secrets / "sub").mkdir()
    (secrets / "sub" / "up").symlink_to(tmp_path)  # a directory link out, then a file
    (secrets / "alias").symlink_to(secrets / "good-key")  # a link that stays inside is fine
    policy = SecretPolicy(secrets)
    for name in ("escape", "sub/up/outside"):
        with pytest.raises(SecretRefError, match="leads out of the secrets directory"):
            resolve(SecretRef(file=name), policy)
    assert resolve(SecretRef(file="alias"), policy) == "good-provider-key"


# ---------------------------------------------------------------------------------------------- controller


def test_h3_controller_reads_cluster_secrets_from_its_secrets_dir_never_the_cwd_or_repo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    (state / "secrets").mkdir(parents=True)
    (state / "secrets" / "cluster-secret").write_text("from-the-secrets-dir\n")
    (state / "admin-token").write_text(OUTSIDE + "\n")  # the controller's own, next to the dir
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    (elsewhere / "cluster-secret").write_text(OUTSIDE + "\n")
    monkeypatch.chdir(elsewhere)
    settings = ControllerOptions(repo=str(tmp_path / "repo"), store="sqlite:///x.db", state_dir=state)
    policy = settings.secret_policy()
    assert policy.secrets_dir == state / "secrets" and policy.env_prefix == "LLMGW_SECRET_"
    monkeypatch.chdir(tmp_path)  # made absolute at settings time: a later chdir changes nothing
    assert read_secret(SecretRef(file="cluster-secret"), policy) == "from-the-secrets-dir"
    # validate refuses these; a revision that reached the controller anyway is refused again here
    for ref in (SecretRef(file="../admin-token"), SecretRef(file=str(state / "admin-token"))):
        with pytest.raises(SecretError, match="refused"):
            read_secret(ref, policy)
    monkeypatch.setenv("ADMIN_TOKEN", OUTSIDE)
    with pytest.raises(SecretError, match="prefix"):
        read_secret(SecretRef(env="ADMIN_TOKEN"), policy)


def _node(identity: dict[str, str]) -> Node:
    return Node.model_validate(
        {
            "apiVersion": "llmgw/v1",
            "kind": "Node",
            "metadata": {"name": "gpu-1"},
            "spec": {"address": "10.0.0.5", "ssh": {"identity": identity}},
        }
    )


def test_h3_node_ssh_identity_is_confined(tmp_path: Path) -> None:
    secrets = _secrets(tmp_path)
    (secrets / "id").write_text("private key\n")
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "id").write_text("the repo's copy, never read\n")
    policy = SecretPolicy(secrets)
    target = target_for(_node({"file": "id"}), tmp_path / "repo", {}, secrets=policy)
    assert target.identity_file == (secrets / "id").resolve()
    for identity in ({"file": "../outside"}, {"file": str(tmp_path / "outside")}):
        with pytest.raises(StepFailed, match=r"spec.ssh.identity.*refused"):
            target_for(_node(identity), tmp_path / "repo", {}, secrets=policy)
    with pytest.raises(StepFailed, match="prefix"):
        target_for(_node({"env": "HOME_KEY"}), tmp_path / "repo", {"HOME_KEY": OUTSIDE}, secrets=policy)


# ---------------------------------------------------------------------------------------------- router


def _provider(engine: FakeEngine, key: dict[str, str]) -> dict[str, Any]:
    return {"context_length": 2048, "provider": {"url": engine.base_url + "/v1", "model": "up", "key": key}}


def _chat(seen: list[str]) -> Any:
    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "up",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    return handle


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return str(r.read().decode())


@pytest.mark.integration
def test_h3_router_provider_keys_are_confined(tmp_path: Path) -> None:
    secrets = _secrets(tmp_path)
    (secrets / "escape").symlink_to(tmp_path / "outside")
    seen: list[str] = []
    engine = FakeEngine(behave={"/v1/chat/completions": _chat(seen)}).start()
    refused = {
        "ext-absolute": {"file": str(tmp_path / "outside")},
        "ext-dotdot": {"file": "../outside"},
        "ext-symlink": {"file": "escape"},
        "ext-env": {"env": "OUTSIDE_SECRET"},
    }
    models = {"ext-good": _provider(engine, {"file": "good-key"})}
    # Every name bound to the engine's host: what refuses the bad ones here is confinement, not the map.
    names = ["good-key", *(v.get("file") or "$" + v["env"] for v in refused.values())]
    write_bindings(secrets, [f"'{n}': {{purposes: [provider-key], hosts: [127.0.0.1]}}" for n in names])
    models |= {name: _provider(engine, key) for name, key in refused.items()}
    snap = tmp_path / "snapshot.json"
    snap.write_text(json.dumps({"revision": "h3", "models": models, "endpoints": []}))
    os.environ["OUTSIDE_SECRET"] = OUTSIDE  # inherited by the router process
    try:
        # The router runs in another directory than the secrets: relative names are the secrets dir's.
        router = start_router_proc(
            tmp_path / "router.log",
            [
                "--snapshot",
                str(snap),
                "--no-auth",
                "--secrets-dir",
                str(secrets),
                "--state-dir",
                str(tmp_path),
            ],
        )
    finally:
        del os.environ["OUTSIDE_SECRET"]
    try:
        client = openai.OpenAI(base_url=router.api + "/v1", api_key="none", max_retries=0, timeout=30)
        good = client.chat.completions.create(model="ext-good", messages=[{"role": "user", "content": "x"}])
        assert good.choices[0].message.content == "hi"
        assert seen == ["Bearer good-provider-key"]
        for name in refused:
            with pytest.raises(openai.APIStatusError) as caught:
                client.chat.completions.create(model=name, messages=[{"role": "user", "content": "x"}])
            assert caught.value.status_code == 503, (name, caught.value.body)
        assert all(OUTSIDE not in s for s in seen) and len(seen) == 1
        text = _metrics(router.metrics)
        for name in refused:
            assert f'llmgw_router_provider_unavailable{{model="{name}"}} 1.0' in text, text
        assert 'llmgw_router_provider_unavailable{model="ext-good"}' not in text
        log = router.text()
        assert OUTSIDE not in log
        assert "model ext-dotdot: provider dropped" in log and "climbs out with `..`" in log
        assert "through a symbolic link" in log and "does not start with the secret prefix" in log
    finally:
        router.stop()
        engine.stop()
