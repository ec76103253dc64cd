"""llama.cpp over a directory source: the one GGUF (or the first part of a split set) is what llama-server is
given, and it loads the other parts from beside it; a directory with no GGUF, two models or a split set missing
a part is refused by `llmgw validate` (over the repo manifest) and by the agent (over the directory), by name.

The split is made from the real gemma file by llama.cpp's own `llama-gguf-split` and served by the real
llama-server."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from fixtures.llama import require_llama
from llmgw_agent.gguf_parts import gguf_entry, split_part_name
from llmgw_agent.protocol import ShardSpec, ShardStatus, WeightSource
from llmgw_agent.supervisor import Supervisor, SupervisorConfig
from support import free_port_range, wait_for

from llmgw.adapters.repo_files import load_repo

SHA = "a" * 64


def test_a_whole_gguf_or_the_first_part_of_a_complete_split_is_the_entry() -> None:
    assert gguf_entry(["README.md", "gemma.gguf", "mmproj-gemma.gguf"]).path == "gemma.gguf"
    parts = [split_part_name("q/gemma", n, 3) for n in (3, 1, 2)]
    assert gguf_entry([*parts, "config.json"]).path == "q/gemma-00001-of-00003.gguf"


def test_a_directory_without_one_usable_model_says_why() -> None:
    assert "no .gguf file" in str(gguf_entry(["config.json", "model.safetensors"]).problem)
    missing = gguf_entry([split_part_name("gemma", 1, 4), split_part_name("gemma", 3, 4)])
    assert missing.path is None
    assert missing.problem == (
        "the split GGUF gemma is incomplete: gemma-00002-of-00004.gguf, gemma-00004-of-00004.gguf missing of 4 parts"
    )
    two = gguf_entry(["gemma-q4.gguf", "gemma-q8.gguf"])
    assert two.path is None and "2 GGUF models (gemma-q4.gguf, gemma-q8.gguf)" in str(two.problem)


MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: gemma}
spec:
  context_length: 1024
  source:
    repo: google/gemma-3-270m-gguf
    revision: main
    manifest: manifests/gemma.json
  profiles: [{name: cpu, engine: ENGINE}]
"""


def _repo(tmp_path: Path, names: list[str], engine: str = "llamacpp") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "models.yaml").write_text(MODEL.replace("ENGINE", engine))
    (tmp_path / "manifests").mkdir()
    files = [{"name": n, "size": 1, "sha256": SHA} for n in names]
    (tmp_path / "manifests" / "gemma.json").write_text(
        json.dumps({"format": "llmgw-manifest/1", "files": files})
    )
    return tmp_path


def test_validate_refuses_an_incomplete_split_set_at_the_manifest(tmp_path: Path) -> None:
    result = load_repo(_repo(tmp_path, [split_part_name("gemma", 1, 2)]))
    assert not result.ok
    (error,) = [str(e).replace(str(tmp_path) + "/", "") for e in result.errors]
    assert error.startswith("models.yaml:9:15: spec.source.manifest: llama.cpp profiles need one GGUF model")
    assert "gemma-00002-of-00002.gguf missing of 2 parts" in error
    assert "every part of the split set" in error


def test_validate_refuses_a_directory_with_no_gguf_only_for_llamacpp(tmp_path: Path) -> None:
    result = load_repo(_repo(tmp_path / "a", ["config.json"]))
    assert not result.ok and "holds no .gguf file" in str(result.errors[0])
    assert load_repo(_repo(tmp_path / "b", ["config.json"], engine="sim")).ok
    complete = [split_part_name("gemma", n, 2) for n in (1, 2)]
    assert load_repo(_repo(tmp_path / "c", complete)).ok


# ---------------------------------------------------------------------------------------------- the real thing


@pytest.fixture(scope="module")
def split_gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gemma split into 3 parts by llama.cpp's llama-gguf-split (shipped beside llama-server)."""
    binary, model = require_llama()
    out = tmp_path_factory.mktemp("split") / "gemma"
    out.mkdir()
    splitter = Path(binary).with_name("llama-gguf-split")
    done = subprocess.run(
        [str(splitter), "--split-max-tensors", "100", model, str(out / "gemma")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [split_part_name("gemma", n, 3) for n in (1, 2, 3)]
    return out


@pytest.fixture
async def supervisor(tmp_path: Path) -> AsyncIterator[tuple[Supervisor, list[ShardStatus]]]:
    binary, _ = require_llama()
    ports = free_port_range(20)
    updates: list[ShardStatus] = []
    cfg = SupervisorConfig(
        state_dir=tmp_path / "state",
        advertise_host="127.0.0.1",
        bind_host="127.0.0.1",
        port_range=(ports, ports + 19),
        engine_binaries={"llamacpp": binary},
        ready_timeout_s=120,
        stop_grace_s=2,
        poll_interval_s=0.1,
    )
    s = Supervisor(cfg, updates.append)
    yield s, updates
    await s.stop_all()
    await s.close()


def _spec(replica: str, directory: Path) -> ShardSpec:
    return ShardSpec(
        replica_id=replica,
        model="gemma",
        engine="llamacpp",
        source=WeightSource(path=str(directory)),
        context_length=512,
        slots=1,
        cpu_cores=1,
        api_key="split-key",
    )


def _state(s: Supervisor, replica: str, *states: str) -> ShardStatus | None:
    return next((st for st in s.statuses() if st.replica_id == replica and st.state in states), None)


def _argv(pid: int | None) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


@pytest.mark.llamacpp
async def test_llama_server_serves_a_split_gguf_from_its_first_part(
    supervisor: tuple[Supervisor, list[ShardStatus]], split_gemma: Path
) -> None:
    s, _ = supervisor
    s.start(_spec("split", split_gemma))
    status = await wait_for(lambda: _state(s, "split", "ready", "failed"), 150, "the split gemma to load")
    assert status.state == "ready", status.message
    cmdline = _argv(status.pid)
    assert cmdline[cmdline.index(b"-m") + 1] == str(split_gemma / "gemma-00001-of-00003.gguf").encode()
    body = {"model": "gemma", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}
    headers = {"Authorization": "Bearer split-key"}
    url = f"{status.base_url}/v1/chat/completions"
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
    assert answer["choices"][0]["message"]["content"], answer


async def test_the_agent_refuses_a_split_set_missing_a_part_before_starting_anything(
    supervisor: tuple[Supervisor, list[ShardStatus]], split_gemma: Path, tmp_path: Path
) -> None:
    s, _ = supervisor
    partial = tmp_path / "partial"
    partial.mkdir()
    for n in (1, 3):
        name = split_part_name("gemma", n, 3)
        (partial / name).symlink_to(split_gemma / name)
    s.start(_spec("partial", partial))
    status = await wait_for(lambda: _state(s, "partial", "failed"), 30, "the refusal")
    assert status.pid is None
    assert status.message == (
        f"llamacpp: {partial}: the split GGUF gemma is incomplete: gemma-00002-of-00003.gguf missing of 3 parts"
    )
