"""The cluster repo: models of every kind, and the one pipeline that loads and validates it."""

from llmgw.config.errors import ConfigError, SemanticError, format_path
from llmgw.config.files import content_hash, load_repo
from llmgw.config.loader import LoadedDocument, LoadResult, Repo, content_hash_of, validate_files

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
