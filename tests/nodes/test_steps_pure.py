"""The pure parts of bootstrap: reading the probe, wheel compatibility, rendering, engine commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmgw.adapters.ssh import render
from llmgw.adapters.ssh.bootstrap import parse_probe
from llmgw.adapters.ssh.engines import engine_command
from llmgw.adapters.ssh.remote import StepFailed, target_for
from llmgw.adapters.ssh.wheels import Wheelhouse, compatibility_problem
from llmgw.core.config.models import EngineSettings, Node
from llmgw.core.config.secretrefs import SecretPolicy

PROBE = """arch=x86_64
mem_kb=16303120
uid=0
systemd=offline
python=3.10.12 /usr/bin/python3
python=3.12.3 /usr/bin/python3.12
python=3.11.9 /usr/local/bin/python3.11
"""


def test_probe_prefers_the_python_the_wheels_were_built_for() -> None:
    m = parse_probe(PROBE, wanted=(3, 11))
    assert (m.python, m.python_version) == ("/usr/local/bin/python3.11", (3, 11, 9))
    assert m.memory_bytes == 16303120 * 1024 and m.arch == "x86_64" and m.root
    assert m.nvidia_smi is None
    assert not m.systemd  # installed but not init: no units can be started
    assert parse_probe(PROBE, wanted=None).python == "/usr/bin/python3.12"


def test_probe_sees_systemd_running_and_nvidia_smi() -> None:
    m = parse_probe(
        "arch=aarch64\nsystemd=degraded\nnvidia_smi=/usr/bin/nvidia-smi\npython=3.11.2 /usr/bin/python3\n",
        None,
    )
    assert m.systemd and m.nvidia_smi == "/usr/bin/nvidia-smi" and m.memory_bytes is None


def test_probe_without_python_311_says_so() -> None:
    with pytest.raises(StepFailed, match=r"python3 3.11\+ not found \(3.10.12 at /usr/bin/python3\)"):
        parse_probe("arch=x86_64\npython=3.10.12 /usr/bin/python3\n", None)
    with pytest.raises(StepFailed, match="no python3 on PATH"):
        parse_probe("arch=x86_64\n", None)


def _house(*names: str) -> Wheelhouse:
    return Wheelhouse(Path("/w"), dict.fromkeys(names, "0" * 64), names[0], "0.1.0", "x")


def test_compatibility_of_compiled_wheels() -> None:
    house = _house("llmgw_agent-0.1.0-py3-none-any.whl", "yarl-1.9-cp311-cp311-manylinux_2_17_x86_64.whl")
    assert compatibility_problem(house, (3, 11), "x86_64") is None
    assert "node has Python 3.12" in (compatibility_problem(house, (3, 12), "x86_64") or "")
    assert "node is aarch64" in (compatibility_problem(house, (3, 11), "aarch64") or "")
    assert compatibility_problem(_house("llmgw_agent-0.1.0-py3-none-any.whl"), (3, 13), "riscv64") is None


def test_rendering_is_deterministic_and_matches_the_agent_config_model() -> None:
    from llmgw_agent.config import AgentConfig

    layout = render.Layout(prefix="/srv/llmgw")
    settings = render.AgentSettings(
        node="gpu-1",
        controllers=("10.0.0.1:7070",),
        tls=True,
        token=False,
        advertise_host="10.0.0.5",
        labels={"zone": "a"},
        engines={"llamacpp": {"path": "/usr/bin/llama-server", "version": "b11434"}},
    )
    first = render.agent_config(layout, settings)
    assert first == render.agent_config(layout, settings)
    conf = AgentConfig.model_validate(json.loads(first))
    assert conf.tls is not None and conf.tls.key == "/srv/llmgw/etc/tls/agent.key"
    assert conf.controller_urls() == ["wss://10.0.0.1:7070/agent/v1"]
    token = AgentConfig.model_validate_json(
        render.agent_config(layout, render.AgentSettings("n", ("c:1",), False, True, "h"))
    )
    assert (token.token_file, token.tls) == ("/srv/llmgw/etc/token", None)
    unit = render.systemd_unit(layout, "gpu-1").decode()
    assert "ExecStart=/srv/llmgw/venv/bin/llmgw-agent run --config /srv/llmgw/etc/agent.json" in unit
    assert "KillMode=process" in unit


def test_engine_commands() -> None:
    assert engine_command("llamacpp", None, "agent") == "llama-server --version"
    assert engine_command("llamacpp", EngineSettings(path="/opt/ll/llama-server"), "a") == (
        "/opt/ll/llama-server --version"
    )
    assert (
        engine_command("sim", None, "/p/venv/bin/llmgw-agent") == "/p/venv/bin/llmgw-agent sim-engine --help"
    )
    with pytest.raises(StepFailed, match="unknown engine"):
        engine_command("tgi", None, "a")


def _node(ssh: dict[str, object]) -> Node:
    return Node.model_validate(
        {
            "apiVersion": "llmgw/v1",
            "kind": "Node",
            "metadata": {"name": "gpu-1"},
            "spec": {"address": "10.0.0.5", "ssh": ssh},
        }
    )


def test_target_reads_the_identity_from_the_secrets_dir_and_known_hosts_from_the_repo(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    (secrets / "keys").mkdir(parents=True)
    (secrets / "keys" / "id").write_text("key\n")
    node = _node({"user": "ops", "port": 2222, "identity": {"file": "keys/id"}, "known_hosts": "ssh/kh"})
    target = target_for(node, tmp_path / "repo", {}, secrets=SecretPolicy(secrets))
    assert (target.where, target.identity_file, target.known_hosts) == (
        "ops@10.0.0.5:2222",
        (secrets / "keys" / "id").resolve(),
        tmp_path / "repo" / "ssh" / "kh",
    )
    assert not target.insecure_accept_host_key


def test_target_identity_from_the_environment_is_never_shown() -> None:
    node = _node({"identity": {"env": "LLMGW_SECRET_GPU1_KEY"}})
    policy = SecretPolicy(Path("/nonexistent"))
    with pytest.raises(StepFailed, match=r"LLMGW_SECRET_GPU1_KEY is not set"):
        target_for(node, Path("."), {}, secrets=policy)
    env = {"LLMGW_SECRET_GPU1_KEY": "-----BEGIN OPENSSH PRIVATE KEY-----\nsecret"}
    target = target_for(node, Path("."), env, secrets=policy)
    assert "secret" not in repr(target) and target.identity_text is not None


def test_a_local_node_needs_no_ssh() -> None:
    local = Node.model_validate(
        {"apiVersion": "llmgw/v1", "kind": "Node", "metadata": {"name": "here"}, "spec": {"local": True}}
    )
    with pytest.raises(StepFailed, match="is local"):
        target_for(local, Path("."), {}, secrets=SecretPolicy(Path("/nonexistent")))


def test_a_node_that_asks_for_a_node_health_listener_gets_one_in_its_agent_config() -> None:
    from llmgw_agent.config import AgentConfig

    doc = {
        "apiVersion": "llmgw/v1",
        "kind": "Node",
        "metadata": {"name": "gpu-1"},
        "spec": {"address": "10.0.0.5"},
    }
    asked = Node.model_validate(
        {**doc, "spec": {"address": "10.0.0.5", "agent": {"metrics_listen": "0.0.0.0:9092"}}}
    )
    assert asked.spec.agent.metrics_listen == "0.0.0.0:9092"
    assert Node.model_validate(doc).spec.agent.metrics_listen is None
    with pytest.raises(ValueError, match="metrics_listen"):
        Node.model_validate({**doc, "spec": {"address": "10.0.0.5", "agent": {"metrics_listen": "9092"}}})
    layout = render.Layout()
    with_listener = render.AgentSettings("gpu-1", ("c:1",), False, True, "h", metrics_listen="0.0.0.0:9092")
    conf = AgentConfig.model_validate_json(render.agent_config(layout, with_listener))
    assert conf.metrics_listen == "0.0.0.0:9092"
    plain = json.loads(render.agent_config(layout, render.AgentSettings("gpu-1", ("c:1",), False, True, "h")))
    assert "metrics_listen" not in plain  # absent, not null: the agent's own default (no listener) stands
