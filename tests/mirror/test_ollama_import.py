"""`llmgw mirror import-ollama`: an Ollama models directory laid out here as `ollama pull` leaves it (a manifest
under manifests/registry.ollama.ai, blobs named by their real sha256; the gemma GGUF as the model blob, hard
linked), imported into the mirror with its projector and served; a blob whose bytes are not its digest refused."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from gguf_patch import patch_architecture
from typer.testing import CliRunner

from llmgw.adapters.mirror import MirrorStore
from llmgw.cli.main import app
from llmgw.core.weights.ollama import OllamaError, parse_name

GEMMA = os.environ.get("LLMGW_TEST_MODEL", "")
pytestmark = pytest.mark.skipif(not Path(GEMMA).is_file(), reason="LLMGW_TEST_MODEL is not a file")
PROJECTOR = b"GGUF\x03\x00\x00\x00" + b"a stand-in projector's bytes" * 100


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture(scope="module")
def gemma_sha() -> str:
    return sha256_of(Path(GEMMA))


def ollama_dir(
    root: Path, gemma_sha: str, projector: bytes | None = PROJECTOR, model: Path = Path(GEMMA)
) -> Path:
    """Ollama's models directory holding `gemma3:270m` (and a projector when given), blobs by digest; `model`
    is the model blob, whose sha256 is `gemma_sha`."""
    blobs = root / "blobs"
    blobs.mkdir(parents=True)
    os.link(model, blobs / f"sha256-{gemma_sha}")
    size = model.stat().st_size
    model = {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{gemma_sha}", "size": size}
    template = {
        "mediaType": "application/vnd.ollama.image.template",
        "digest": "sha256:" + "0" * 64,
        "size": 3,
    }
    layers = [model, template]
    if projector is not None:
        sha = hashlib.sha256(projector).hexdigest()
        (blobs / f"sha256-{sha}").write_bytes(projector)
        layers.append(
            {
                "mediaType": "application/vnd.ollama.image.projector",
                "digest": f"sha256:{sha}",
                "size": len(projector),
            }
        )
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / "gemma3" / "270m"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return root


def import_args(name: str, ollama: Path, mirror: Path) -> list[str]:
    """`llmgw mirror import-ollama NAME` from the Ollama directory `ollama` into the mirror `mirror`."""
    return ["mirror", "import-ollama", name, "--ollama-dir", str(ollama), "--mirror-dir", str(mirror)]


def test_a_pulled_model_and_its_projector_are_imported_checked_by_digest(
    tmp_path: Path, gemma_sha: str
) -> None:
    source = ollama_dir(tmp_path / "ollama", gemma_sha)
    mirror = tmp_path / "mirror"
    args = import_args("gemma3:270m", source, mirror)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    revision = f"270m-{gemma_sha[:12]}"
    assert f"imported gemma3:270m as ollama/gemma3@{revision}: model.gguf" in result.stdout
    version = mirror / "ollama" / "gemma3" / revision
    assert sha256_of(version / "model.gguf") == gemma_sha
    assert (version / "mmproj.gguf").read_bytes() == PROJECTOR
    [entry] = MirrorStore(mirror).entries()
    assert (entry.repo, entry.files, entry.problem) == ("ollama/gemma3", 2, None)
    assert entry.origin is not None and entry.origin.startswith("ollama gemma3:270m (")
    recorded = json.loads((version / "llmgw-origin.json").read_text())["files"]
    assert isinstance(recorded[0].pop("fetched_at"), float)  # when it was copied and checked
    assert recorded[0] == {
        "name": "model.gguf",
        "from": str(source / "blobs" / f"sha256-{gemma_sha}"),
        "sha256": gemma_sha,
        "size": Path(GEMMA).stat().st_size,
    }
    listed = CliRunner().invoke(app, ["mirror", "list", "--mirror-dir", str(mirror), "--json"])
    assert json.loads(listed.stdout)[0]["origin"] == entry.origin
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 1 and "already holds" in again.output  # a revision names fixed bytes


def test_a_corrupted_blob_is_refused_and_nothing_is_added(tmp_path: Path, gemma_sha: str) -> None:
    source = ollama_dir(tmp_path / "ollama", gemma_sha)
    sha = hashlib.sha256(PROJECTOR).hexdigest()
    (source / "blobs" / f"sha256-{sha}").write_bytes(PROJECTOR[:-1] + b"!")  # same size, other bytes
    mirror = tmp_path / "mirror"
    args = import_args("gemma3:270m", source, mirror)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert f"sha256-{sha}" in result.output and f"named by sha256 {sha}" in result.output
    assert "corrupt or changed, not added" in result.output
    assert MirrorStore(mirror).entries() == []
    assert not any(p.is_file() for p in mirror.rglob("*"))  # no staging left behind


def test_a_missing_model_or_a_bad_name_says_what_to_do(tmp_path: Path) -> None:
    args = import_args("qwen3:8b", tmp_path, tmp_path / "m")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "ollama pull qwen3:8b" in result.output
    assert parse_name("me/tiny").words() == "me/tiny:latest"
    with pytest.raises(OllamaError, match="NAME\\[:TAG\\]"):
        parse_name("a/b/c:1")


def test_a_model_whose_architecture_llamacpp_does_not_load_is_refused_unless_anyway(tmp_path: Path) -> None:
    kevlar = tmp_path / "kevlar.gguf"
    patch_architecture(Path(GEMMA), kevlar, "kevlar")
    source = ollama_dir(tmp_path / "ollama", sha256_of(kevlar), projector=None, model=kevlar)
    mirror = tmp_path / "mirror"
    args = import_args("gemma3:270m", source, mirror)
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 1
    assert (
        "architecture 'kevlar' is not one llama.cpp b11434" in refused.output and "--anyway" in refused.output
    )
    assert MirrorStore(mirror).entries() == []
    anyway = CliRunner().invoke(app, [*args, "--anyway"])
    assert anyway.exit_code == 0 and "model.gguf" in anyway.stdout, anyway.output
