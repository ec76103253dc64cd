"""Where a model's weights (or an adapter's files) come from: the Source both the Model and the Adapter kinds
take. Apart from llmgw.core.config.models so that both can use it; models re-exports it. And where a model's
answers come from when no replica makes them: an external Provider (an OpenAI-compatible service, or a ComfyUI
server sent a workflow per request for pictures: docs/images.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from llmgw.core.config.base import SecretRef, Strict

__all__ = ["BUILTIN_WORKFLOWS", "Provider", "ProviderApi", "Source"]


class Source(Strict):
    """Where the weights come from: a path already on the node, a URL the agent fetches (one file, or a
    directory when it ends in `/`), or an HF-style `repo` + `revision` fetched through the Cluster's mirror."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [{"required": ["path"]}, {"required": ["url"]}, {"required": ["repo"]}],
        }
    )

    path: str | None = Field(None, description="Weights already on the node (file or directory)")
    url: str | None = Field(
        None,
        description="http(s) URL the agent fetches (resumable) into its cache; ending in `/` it is a directory "
        "whose files the manifest lists",
    )
    repo: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$",
        description="HF-style repository (`org/name`), fetched as /{repo}/resolve/{revision}/{file} from the "
        "Cluster's mirror first, then its origin",
    )
    revision: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
        description="Revision of `repo` (a commit hash pins the bytes; default `main`)",
    )
    manifest: str | None = Field(
        None,
        description="A directory's manifest: a JSON file in this repo (path from the repo root), written by "
        "`llmgw model manifest`; without it the agent reads the llmgw-manifest.json the mirror publishes",
    )
    token: SecretRef | None = Field(
        None, description="Bearer token for the origin (e.g. an HF token); never sent to the mirror"
    )
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="Checked after fetch when given")
    size_bytes: int | None = Field(None, ge=0, description="Checked after fetch when given")

    @property
    def directory(self) -> bool:
        return self.repo is not None or (self.url is not None and self.url.endswith("/"))

    @model_validator(mode="after")
    def _one_location(self) -> Source:
        if sum(x is not None for x in (self.path, self.url, self.repo)) != 1:
            raise ValueError("a source takes exactly one of `path`, `url` or `repo`")
        if self.revision is not None and self.repo is None:
            raise ValueError("`revision` goes with `repo`")
        if self.manifest is not None and not self.directory:
            raise ValueError("`manifest` describes a directory: a `repo`, or a `url` ending in `/`")
        if self.directory and (self.sha256 is not None or self.size_bytes is not None):
            raise ValueError("a directory's sizes and sha256 are its manifest's, not `sha256`/`size_bytes`")
        if self.token is not None and self.path is not None:
            raise ValueError("`token` is for fetching; a `path` is already on the node")
        return self


# openai: an OpenAI-compatible service, sent the request as it came; comfyui: a ComfyUI server, sent a workflow.
ProviderApi = Literal["openai", "comfyui"]
BUILTIN_WORKFLOWS: tuple[str, ...] = ("flux-schnell", "flux-dev")
DEFAULT_WORKFLOW = "flux-schnell"


def workflow_problem(api: str, workflow: str | None) -> str | None:
    """What is wrong with a provider's `workflow` for its `api`, or None."""
    if workflow is None:
        return None
    if api != "comfyui":
        return f"`workflow` is for `api: comfyui` only (this provider's api is {api})"
    if workflow in BUILTIN_WORKFLOWS or (workflow.startswith("/") and workflow.endswith(".json")):
        return None
    return (
        f"`workflow: {workflow}` is neither a built-in ({', '.join(BUILTIN_WORKFLOWS)}) nor an absolute path to "
        "a .json file in ComfyUI's API format on the routers' machines"
    )


class Provider(Strict):
    """An external OpenAI-compatible service that serves this model instead of replicas."""

    url: str = Field(description="Base URL, e.g. https://api.example.com/v1")
    model: str = Field(description="Model name at the provider")
    key: SecretRef | None = Field(None, description="API key for the provider")
    api: ProviderApi = Field(
        "openai",
        description="openai: an OpenAI-compatible service; comfyui: a ComfyUI server (url without /v1) that "
        "runs a workflow per request for pictures (the model declares capabilities: [images])",
    )
    workflow: str | None = Field(
        None,
        description=f"api comfyui: a built-in workflow (flux-schnell, flux-dev; default {DEFAULT_WORKFLOW}) or "
        "an absolute path on the routers' machines to a JSON file in ComfyUI's API format with {{prompt}}, "
        "{{width}}, {{height}}, {{seed}} placeholders",
    )

    @model_validator(mode="after")
    def _workflow_fits_api(self) -> Provider:
        problem = workflow_problem(self.api, self.workflow)
        if problem is not None:
            raise ValueError(problem)
        return self
