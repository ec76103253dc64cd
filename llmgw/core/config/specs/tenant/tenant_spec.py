"""What an Organization, a Team and a Project declare: allowed models, limits at their level, each member's
share, GPU quotas and guaranteed capacity, and a project's admission band, retention, response cache and
where its requests may go (docs/tenancy.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, model_validator

from llmgw.core.config.base import Budget, Name, Strict
from llmgw.core.config.specs.tenant.cache_spec import ResponseCacheSpec
from llmgw.core.config.specs.tenant.person_spec import PersonLimits
from llmgw.core.config.specs.tenant.quota_spec import CAPACITY_DESCRIPTION, Capacity
from llmgw.core.config.specs.tenant.retention_spec import ContentRetention

__all__ = [
    "GPU_QUOTA_DESCRIPTION",
    "PER_MEMBER_DESCRIPTION",
    "GpuQuota",
    "Limits",
    "OrganizationSpec",
    "ProjectSpec",
    "TeamSpec",
]


class Limits(Strict):
    """Limits of a tenant; unset means no limit at this level (parents' limits still apply)."""

    rpm: int | None = Field(None, ge=0, description="Requests per minute")
    tpm: int | None = Field(None, ge=0, description="Tokens per minute (prompt + completion)")
    concurrency: int | None = Field(None, ge=0, description="Requests in flight at once")
    budget: Budget | None = Field(None, description="Spending limit per period")


GpuQuota = dict[str, Annotated[int, Field(ge=0)]]
GPU_QUOTA_DESCRIPTION = (
    "At most this many GPUs of each GPU class (e.g. {h100-80g: 16}) held by replicas of the models whose "
    "`owner` is this tenant or beneath it (unset: no quota)"
)


PER_MEMBER_DESCRIPTION = (
    "Each person's own share here: every person's requests through this scope are held to these limits "
    "apart from everyone else's (unset: no share per member)"
)


class OrganizationSpec(Strict):
    """Allowed models and limits of the organization."""

    models: list[str] | None = Field(None, description="Allowed models: names, aliases or globs (unset: all)")
    limits: Limits = Field(default_factory=Limits)
    per_member: PersonLimits | None = Field(None, description=PER_MEMBER_DESCRIPTION)
    gpu_quota: GpuQuota = Field(default_factory=dict, description=GPU_QUOTA_DESCRIPTION)
    capacity: Capacity = Field(default_factory=dict, description=CAPACITY_DESCRIPTION)


class TeamSpec(Strict):
    """Parent organization, allowed models and limits of the team."""

    organization: Name = Field(description="Organization this team belongs to")
    models: list[str] | None = Field(None, description="Allowed models (unset: as the organization)")
    limits: Limits = Field(default_factory=Limits)
    per_member: PersonLimits | None = Field(None, description=PER_MEMBER_DESCRIPTION)
    gpu_quota: GpuQuota = Field(default_factory=dict, description=GPU_QUOTA_DESCRIPTION)
    capacity: Capacity = Field(default_factory=dict, description=CAPACITY_DESCRIPTION)


class ProjectSpec(Strict):
    """A project sits under exactly one parent: a team, or an organization directly."""

    model_config = ConfigDict(
        json_schema_extra={"oneOf": [{"required": ["team"]}, {"required": ["organization"]}]}
    )

    team: Name | None = Field(None, description="Team this project belongs to")
    organization: Name | None = Field(None, description="Organization, for a project directly under one")
    models: list[str] | None = Field(None, description="Allowed models (unset: as its team)")
    limits: Limits = Field(default_factory=Limits)
    per_member: PersonLimits | None = Field(None, description=PER_MEMBER_DESCRIPTION)
    capacity: Capacity = Field(default_factory=dict, description=CAPACITY_DESCRIPTION)
    priority: int = Field(
        0,
        ge=-1000,
        le=1000,
        description="Admission band within a model's class: a waiting request of a higher priority goes first",
    )
    share: float = Field(
        1.0,
        gt=0,
        le=1000,
        description="Fair share of a busy model's admissions against other projects of the same band",
    )
    retention: ContentRetention | None = Field(
        None, description="Content kept for this project (unset: none; only shapes are recorded)"
    )
    response_cache: ResponseCacheSpec | None = Field(
        None,
        description="Reuse this project's identical requests' answers (unset: never; docs/response-cache.md)",
    )
    residency: list[Name] | None = Field(
        None,
        description="The regions a peer must declare to be sent this project's requests (unset: any peer; "
        "[]: none, its requests stay in this cluster)",
    )
    no_store: bool = Field(
        False,
        description="Nothing of its requests is kept: never sent to a peer (whose keeping is not this "
        "cluster's to govern) and no body kept (`retention.bodies` is refused)",
    )

    @model_validator(mode="after")
    def _one_parent(self) -> ProjectSpec:
        if (self.team is None) == (self.organization is None):
            raise ValueError("a project takes exactly one parent: `team` or `organization`")
        if self.no_store and self.retention is not None and self.retention.bodies is not None:
            raise ValueError("no_store keeps no body: remove `retention.bodies` or `no_store`")
        return self
