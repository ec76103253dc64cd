"""Which mirror versions a catalog uses, for `llmgw mirror unused` and `mirror remove`. Pure.

A Model's or Adapter's `source: {repo, revision}` uses `{repo}/{revision}` (revision `main` when not given); a
`source.url` uses the version its path names, `/{repo}/resolve/{revision}/...`, whatever host it is spelled with:
matched by path, not by spelling, so a base written with another scheme, host name or a trailing slash cannot
make a file in use look unused. The caller must have read the catalog: an unreadable catalog and an empty one
would both call everything unused, and the next step after that list is deletion.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import unquote, urlsplit

from llmgw.core.config.models import Source
from llmgw.core.weights.fetch_plan import DEFAULT_REVISION

__all__ = ["Version", "parse_version", "source_version", "unused_versions", "users_of_versions"]

Version = tuple[str, str]  # (repo, revision)


def source_version(source: Source | None) -> Version | None:
    """The mirror version a source names, or None (a path on the node, a URL outside the HF layout)."""
    if source is None:
        return None
    if source.repo is not None:
        return source.repo, source.revision or DEFAULT_REVISION
    if source.url is None:
        return None
    path = unquote(urlsplit(source.url).path).strip("/")
    head, sep, rest = path.partition("/resolve/")
    revision = rest.split("/", 1)[0]
    return (head, revision) if sep and head and revision else None


def users_of_versions(
    models: Mapping[str, Source | None], adapters: Mapping[str, Source | None]
) -> dict[Version, list[str]]:
    """Each version in use -> who uses it (`Model/NAME`, `Adapter/NAME`), sorted."""
    out: dict[Version, list[str]] = {}
    named = [(f"Model/{n}", s) for n, s in models.items()] + [
        (f"Adapter/{n}", s) for n, s in adapters.items()
    ]
    for user, source in sorted(named):
        version = source_version(source)
        if version is not None:
            out.setdefault(version, []).append(user)
    return out


def unused_versions(held: Iterable[Version], used: Mapping[Version, list[str]]) -> list[Version]:
    return sorted(v for v in held if v not in used)


def parse_version(text: str) -> Version:
    """`REPO@REVISION` as `mirror list` prints it (ValueError when it is not that)."""
    repo, sep, revision = text.rpartition("@")
    if not sep or not repo or not revision:
        raise ValueError(f"{text!r}: give REPO@REVISION as `llmgw mirror list` prints it")
    return repo, revision
