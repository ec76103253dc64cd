"""The cluster repo: models of every kind, and the one pipeline that loads and validates it.

The pipeline's names are imported on first use, so `import llmgw.config.models` (the router does) stays light
and `llmgw.catalog`, which the pipeline uses, can import the models without a cycle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmgw.config.errors import ConfigError, SemanticError, format_path
    from llmgw.config.files import content_hash, load_repo
    from llmgw.config.loader import LoadedDocument, LoadResult, Repo, content_hash_of, validate_files

_EXPORTS = {
    "ConfigError": "llmgw.config.errors",
    "SemanticError": "llmgw.config.errors",
    "format_path": "llmgw.config.errors",
    "content_hash": "llmgw.config.files",
    "load_repo": "llmgw.config.files",
    "LoadedDocument": "llmgw.config.loader",
    "LoadResult": "llmgw.config.loader",
    "Repo": "llmgw.config.loader",
    "content_hash_of": "llmgw.config.loader",
    "validate_files": "llmgw.config.loader",
}

__all__ = [
    "ConfigError",
    "LoadResult",
    "LoadedDocument",
    "Repo",
    "SemanticError",
    "content_hash",
    "content_hash_of",
    "format_path",
    "load_repo",
    "validate_files",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'llmgw.config' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
