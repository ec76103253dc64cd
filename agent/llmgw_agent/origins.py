"""Where a version of a model's files came from: `llmgw-origin.json`, the one record the mirror and the agents'
weights caches both keep (docs/weights.md, *Where each version came from*).

The mirror writes it beside a version's manifest (`ROOT/{repo}/{revision}/llmgw-origin.json`); an agent beside the
directory it published (`<cache>/dir-<hash>/llmgw-origin.json`, next to `model/`, so the engine's directory holds
only the model's files). One format: `origin` (in words: the URL fetched from, `local directory PATH`, `ollama
NAME:TAG (...)`, or the places a node fetched from), the `repository` and `revision` when the version is a
registry's (None: not a registry's, or not said), and per file its `name`, what it was fetched or copied `from`
(a URL, a path, a blob), the `sha256` and `size` it arrived with and when it was verified (`fetched_at`, Unix
seconds; None: not recorded). The file is not part of the model: no manifest lists it and nodes never fetch it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["ORIGIN_FILE", "FileOrigin", "OriginRecord", "read_record", "write_record"]

ORIGIN_FILE = "llmgw-origin.json"


class _Record(BaseModel):
    # Unknown fields are ignored: a newer writer's record still reads. `from` on disk and on the wire alike.
    model_config = ConfigDict(extra="ignore", validate_by_name=True, serialize_by_alias=True)


class FileOrigin(_Record):
    name: str
    source: str | None = Field(
        None, alias="from"
    )  # the URL fetched, the path or blob copied; None: not known
    sha256: str
    size: int
    fetched_at: float | None = None

    @classmethod
    def now(cls, name: str, source: str | None, sha256: str, size: int) -> FileOrigin:
        return cls(name=name, source=source, sha256=sha256, size=size, fetched_at=time.time())


class OriginRecord(_Record):
    origin: str
    repository: str | None = None
    revision: str | None = None
    files: list[FileOrigin] = Field(default_factory=list)

    def text(self) -> str:
        return self.model_dump_json(indent=1) + "\n"


def write_record(directory: Path, record: OriginRecord) -> None:
    """`directory/llmgw-origin.json`, whole or not at all (written aside, then renamed)."""
    target = directory / ORIGIN_FILE
    partial = target.with_name(f".{ORIGIN_FILE}.partial")
    partial.write_text(record.text())
    os.replace(partial, target)


def read_record(directory: Path) -> OriginRecord | None:
    """The record beside a version's files, or None when there is none or it does not read (a version kept
    before the record existed, or a damaged file: either way its origin is not known)."""
    try:
        return OriginRecord.model_validate_json((directory / ORIGIN_FILE).read_bytes())
    except (OSError, ValidationError):
        return None
