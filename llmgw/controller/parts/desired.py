"""The desired state the controller serves: one immutable value per applied revision.

`build_desired` runs the same pipeline as `llmgw validate` (`llmgw.adapters.repo_files.load_repo`), so the controller and
the CLI can never disagree about what is valid; it raises ConfigInvalidError with every error found.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.adapters.repo_files import load_repo
from llmgw.core.config.models import ClusterSpec
from llmgw.core.desired.catalog import Catalog, ModelEntry
from llmgw.core.errors import ConfigInvalidError
from llmgw.core.fleet.views import ModelView, model_views
from llmgw.core.weights.manifest import ManifestFile
from llmgw.core.words import parse_duration


@dataclass(frozen=True)
class Desired:
    """Everything one revision asks for. Never mutated: a new revision is a new Desired."""

    revision: str
    source: str  # where it came from ("git URL@branch", "dir PATH", "apply PATH")
    root: Path  # the checked-out tree (secret files are relative to it)
    catalog: Catalog
    # Directory sources' manifests from the repo, by model name (core.repo checked them).
    manifests: Mapping[str, tuple[ManifestFile, ...]] = field(default_factory=dict)

    @property
    def cluster(self) -> ClusterSpec:
        return self.catalog.cluster

    @property
    def cluster_name(self) -> str:
        return self.catalog.cluster_name or "default"

    @property
    def models(self) -> Mapping[str, ModelEntry]:
        return self.catalog.models

    def resolve(self, name: str) -> ModelEntry | None:
        return self.catalog.resolve(name)

    @functools.cached_property
    def fleet_models(self) -> Mapping[str, ModelView]:
        """The models as placement reads them: spec and per-profile fingerprints."""
        return model_views(self.catalog)

    def fingerprint(self, model: str, profile: str) -> str | None:
        entry = self.catalog.models.get(model)
        found = entry.profile(profile) if entry else None
        return found.fingerprint if found else None

    # Timings from the Cluster document, in seconds.
    @property
    def heartbeat_interval_s(self) -> float:
        return parse_duration(self.cluster.controller.heartbeat_interval)

    @property
    def unreachable_after_s(self) -> float:
        return parse_duration(self.cluster.controller.unreachable_after)

    @property
    def lost_after_s(self) -> float:
        return parse_duration(self.cluster.controller.lost_after)

    @property
    def resync_interval_s(self) -> float:
        return parse_duration(self.cluster.controller.resync_interval)


def build_desired(root: Path, revision: str, source: str) -> Desired:
    result = load_repo(root, revision)
    if not result.ok or result.repo is None:
        # Paths relative to the repo root: where the clone lives on the controller means nothing to the author.
        prefix = str(root).rstrip("/") + "/"
        errors = [str(e).replace(prefix, "") for e in result.errors if e.severity == "error"]
        errors = errors or ["the cluster repo did not load"]
        raise ConfigInvalidError(errors)
    catalog = result.repo.catalog.with_revision(revision)
    return Desired(revision, source, root, catalog, result.repo.manifests)
