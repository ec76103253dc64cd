"""What `llmgw mirror import-ollama` reads of Ollama's model directory. Pure: names and JSON in, records out.

Ollama keeps a pulled model as a manifest, `manifests/registry.ollama.ai/{namespace}/{name}/{tag}` (namespace
`library` unless the name has one), JSON in the OCI image-manifest shape whose `layers` each name a blob by
`digest` (`sha256:<hex>`), `size` and `mediaType`: `application/vnd.ollama.image.model` is the GGUF,
`application/vnd.ollama.image.projector` a vision model's projector (also a GGUF); the rest (template, params,
license) are not weights. The blob itself is `blobs/sha256-<hex>`: its name is its digest, which the import
checks the bytes against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, ValidationError

from llmgw.core.errors import LlmgwError

__all__ = [
    "MODEL_FILE",
    "MODEL_MEDIA_TYPE",
    "PROJECTOR_MEDIA_TYPE",
    "OllamaBlob",
    "OllamaError",
    "OllamaName",
    "blob_path",
    "parse_name",
    "weight_blobs",
]

MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
PROJECTOR_MEDIA_TYPE = "application/vnd.ollama.image.projector"
REGISTRY = "registry.ollama.ai"
MODEL_FILE, PROJECTOR_FILE = "model.gguf", "mmproj.gguf"  # what the mirror calls them
_FILE_NAMES = {MODEL_MEDIA_TYPE: MODEL_FILE, PROJECTOR_MEDIA_TYPE: PROJECTOR_FILE}
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")


class OllamaError(LlmgwError):
    """An Ollama name, manifest or blob that cannot be imported; the message says which and why."""


@dataclass(frozen=True)
class OllamaName:
    namespace: str
    name: str
    tag: str

    @property
    def manifest(self) -> PurePosixPath:
        """The manifest's path under Ollama's models directory."""
        return PurePosixPath("manifests", REGISTRY, self.namespace, self.name, self.tag)

    def words(self) -> str:
        lead = "" if self.namespace == "library" else f"{self.namespace}/"
        return f"{lead}{self.name}:{self.tag}"


@dataclass(frozen=True)
class OllamaBlob:
    file_name: str  # what the mirror calls it: model.gguf, mmproj.gguf
    sha256: str
    size: int


class _Layer(BaseModel):
    model_config = ConfigDict(extra="ignore")
    mediaType: str
    digest: str
    size: int


class _Manifest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    layers: list[_Layer]


def parse_name(text: str) -> OllamaName:
    """`NAME[:TAG]` or `NAMESPACE/NAME[:TAG]` (tag `latest` when not given), as `ollama pull` takes it."""
    path, _, tag = text.partition(":")
    parts = path.split("/")
    if len(parts) == 1:
        parts = ["library", *parts]
    tag = tag or "latest"
    if len(parts) != 2 or not all(_PART.match(p) for p in (*parts, tag)):
        raise OllamaError(f"{text!r}: not an Ollama model name; give NAME[:TAG], e.g. gemma3:270m")
    return OllamaName(parts[0], parts[1], tag)


def weight_blobs(body: bytes, where: str) -> list[OllamaBlob]:
    """The model GGUF and the projector (when there is one) a manifest names, with their digests and sizes."""
    try:
        manifest = _Manifest.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        at = ".".join(str(p) for p in first["loc"])
        raise OllamaError(f"{where}: not an Ollama manifest ({at}: {first['msg']})") from exc
    out: list[OllamaBlob] = []
    for index, layer in enumerate(manifest.layers):
        file_name = _FILE_NAMES.get(layer.mediaType)
        if file_name is None:
            continue
        digest = _DIGEST.match(layer.digest)
        if digest is None:
            raise OllamaError(f"{where}: layers[{index}].digest {layer.digest!r} is not sha256:<64 hex>")
        if any(b.file_name == file_name for b in out):
            raise OllamaError(f"{where}: more than one layer of type {layer.mediaType}")
        out.append(OllamaBlob(file_name, digest.group(1), layer.size))
    if not any(b.file_name == MODEL_FILE for b in out):
        raise OllamaError(f"{where}: no layer of type {MODEL_MEDIA_TYPE} (the model's GGUF)")
    return out


def blob_path(sha256: str) -> PurePosixPath:
    """A blob's path under Ollama's models directory."""
    return PurePosixPath("blobs", f"sha256-{sha256}")
