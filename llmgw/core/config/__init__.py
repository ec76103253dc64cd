"""The cluster repo: models of every kind, and the one pipeline that loads and validates it.

The pipeline's names are imported on first use, so `import llmgw.core.config.models` (the router does) stays light
and `llmgw.core.catalog`, which the pipeline uses, can import the models without a cycle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmgw.adapters.repo_files import content_hash, load_repo
    from llmgw.core.config.errors import ConfigError, SemanticError, format_path
    from llmgw.core.repo import LoadedDocument, LoadResult, Repo, content_hash_of, validate_files

_EXPORTS = {
    "ConfigError": "llmgw.core.config.errors",
    "SemanticError": "llmgw.core.config.errors",
    "format_path": "llmgw.core.config.errors",
    "content_hash": "llmgw.adapters.repo_files",
    "load_repo": "llmgw.adapters.repo_files",
    "LoadedDocument": "llmgw.core.repo",
    "LoadResult": "llmgw.core.repo",
    "Repo": "llmgw.core.repo",
    "content_hash_of": "llmgw.core.repo",
    "validate_files": "llmgw.core.repo",
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
        raise AttributeError(f"module 'llmgw.core.config' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
