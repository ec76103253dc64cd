"""A directory source's manifest is part of its replicas' fingerprint: editing the manifest at the same path
(new digests, a file more) makes the running replica stale and restarts it, exactly as a changed sha256 of a
file source does; rewriting the same manifest in another order changes nothing.

The reconcile loop against the fake AgentClient (tests/controller/fake_agents.py); repo, controller and store
are real. The pure half (the catalog's fingerprints) is tested first.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import wait_for

from llmgw.adapters.repo_files import load_repo
from llmgw.controller.core import Controller
from llmgw.controller.loops.reconcile import Reconciler
from llmgw.controller.parts.desired import build_desired
from llmgw.controller.parts.metrics import ControllerMetrics
from llmgw.store.store import Store

from .fake_agents import FakeAgents
from .helpers import Repo, cluster_yaml, settings_for

SHA_A, SHA_B = "a" * 64, "b" * 64
FILES = [
    {"name": "config.json", "size": 10, "sha256": SHA_A},
    {"name": "w.safetensors", "size": 90, "sha256": SHA_A},
]
DIRECTORY_MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: qwen}
spec:
  context_length: 4096
  restart_on_profile_change: true
  source: {repo: Qwen/Qwen2.5-0.5B, revision: abc, manifest: manifests/qwen.json}
  scaling: {min: 1, max: 1}
  profiles: [{name: sim, engine: sim, cpu_cores: 1}]
"""
FILE_MODEL = DIRECTORY_MODEL.replace(
    "{repo: Qwen/Qwen2.5-0.5B, revision: abc, manifest: manifests/qwen.json}",
    "{url: 'http://files.internal/qwen.gguf', sha256: SHA}",
)
MIRROR = "  mirror: {url: 'http://mirror.internal:7073', origin: none}\n"


def manifest(files: list[dict[str, object]]) -> str:
    return json.dumps({"files": files})


EDITED = [FILES[0], {**FILES[1], "sha256": SHA_B}]
GROWN = [*FILES, {"name": "tokenizer.json", "size": 3, "sha256": SHA_A}]


def fingerprint(tmp_path: Path, files: list[dict[str, object]] | None) -> str:
    (tmp_path / "manifests").mkdir(exist_ok=True)
    (tmp_path / "cluster.yaml").write_text(cluster_yaml() + MIRROR)
    (tmp_path / "models.yaml").write_text(DIRECTORY_MODEL)
    (tmp_path / "manifests" / "qwen.json").write_text(manifest(files or FILES))
    result = load_repo(tmp_path)
    assert result.ok and result.repo is not None, [str(e) for e in result.errors]
    entry = result.repo.catalog.models["qwen"]
    assert entry.manifest is not None and entry.manifest_digest is not None
    return entry.profiles[0].fingerprint


def test_the_manifest_digest_is_in_the_fingerprint_and_its_order_is_not(tmp_path: Path) -> None:
    first = fingerprint(tmp_path, FILES)
    assert fingerprint(tmp_path, list(reversed(FILES))) == first  # the same bytes, listed otherwise
    assert fingerprint(tmp_path, EDITED) != first  # a new digest for one file
    assert fingerprint(tmp_path, GROWN) != first  # a file more
    assert fingerprint(tmp_path, FILES) == first


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[Controller, FakeAgents, Reconciler, Repo]]:
    repo = Repo(tmp_path / "repo", use_git=False)
    settings = settings_for(tmp_path, repo.path)
    store = await Store.open(settings.store)
    agents = FakeAgents(clock=time.monotonic)
    c = Controller(settings, store, ControllerMetrics(), admin_token="admin", agents=agents)
    agents.on_change = c.notify
    reconciler = Reconciler(c)
    agents.on_register = reconciler.adopt
    yield c, agents, reconciler, repo
    await reconciler.close()
    await c.stop_background()
    await store.close()


async def settle(reconciler: Reconciler) -> None:
    await reconciler.pass_once()
    await wait_for(lambda: reconciler.in_flight == 0, 10, "the pass's commands to finish")


@pytest.mark.parametrize(
    ("model", "before", "after"),
    [
        pytest.param(DIRECTORY_MODEL, manifest(FILES), manifest(EDITED), id="manifest-edited-in-place"),
        pytest.param(DIRECTORY_MODEL, manifest(FILES), manifest(GROWN), id="manifest-gained-a-file"),
        pytest.param(
            FILE_MODEL.replace("SHA", SHA_A), "", FILE_MODEL.replace("SHA", SHA_B), id="file-sha256"
        ),
    ],
)
async def test_a_changed_manifest_restarts_the_replica_as_a_changed_file_source_does(
    setup: tuple[Controller, FakeAgents, Reconciler, Repo], model: str, before: str, after: str
) -> None:
    c, agents, reconciler, repo = setup
    directory = model is DIRECTORY_MODEL
    files = {"cluster.yaml": cluster_yaml() + MIRROR, "models/qwen.yaml": model}
    repo.write({**files, "manifests/qwen.json": before} if directory else files)
    c.desired = build_desired(repo.path, "rev-1", "test")
    agents.register("n1")
    await settle(reconciler)
    [first] = agents.started()
    assert first.spec is not None
    agents.report("n1", first.replica_id, "ready")
    await settle(reconciler)
    assert len(agents.started()) == 1  # nothing changed: nothing restarts

    # The same manifest again (another order): the same bytes, so the same fingerprint and no restart.
    if directory:
        repo.write({"manifests/qwen.json": manifest(list(reversed(json.loads(before)["files"])))})
        c.desired = build_desired(repo.path, "rev-1b", "test")
        await settle(reconciler)
        assert len(agents.started()) == 1

    repo.write({"manifests/qwen.json": after} if directory else {"models/qwen.yaml": after})
    c.desired = build_desired(repo.path, "rev-2", "test")
    assert c.desired.fingerprint("qwen", "sim") != first.spec.fingerprint
    await settle(reconciler)
    replacement = [s for s in agents.started() if s.replica_id != first.replica_id]
    assert len(replacement) == 1, agents.sent  # make-before-break: the new replica first
    assert replacement[0].spec is not None
    assert replacement[0].spec.fingerprint == c.desired.fingerprint("qwen", "sim")
    agents.report("n1", replacement[0].replica_id, "ready")
    await settle(reconciler)
    await settle(reconciler)
    assert [s.replica_id for s in agents.stopped()] == [first.replica_id]
