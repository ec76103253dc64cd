"""Whole-repo checks of capacity: classes, rollouts and GPU quotas (called by `semantic.check`).

- the Cluster's `classes` are unique, and when it declares them a model's `class` names one;
- `rollout` can make progress (max_surge and max_unavailable are not both 0), and the deprecated
  `restart_on_profile_change` is a warning that says what to write instead;
- a tenant's GPU limit is said once (`gpu_quota` or `capacity.<class>.limit.gpus`), and a model's owner names
  a tenant when any tenant declares capacity;
- a Team's or Organization's `gpu_quota` holds what its models' `scaling.min` needs with their preferred
  profiles (placement may fall back to another profile; a minimum that cannot fit in the quota at all is a
  repo that can never be Healthy).
"""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.core.config.errors import IssueAdder
from llmgw.core.config.models import Cluster, Model, Organization, Project, Team
from llmgw.core.config.validation import did_you_mean

__all__ = ["check_capacity"]


def check_capacity(documents: Sequence[object], add: IssueAdder) -> None:
    classes = _classes(documents, add)
    teams: dict[str, str] = {}  # team -> organization
    orgs: set[str] = set()
    projects: set[str] = set()
    quotas = False
    for index, doc in enumerate(documents):
        if isinstance(doc, Team):
            teams.setdefault(doc.metadata.name, doc.spec.organization)
        if isinstance(doc, Organization):
            orgs.add(doc.metadata.name)
        if isinstance(doc, Project):
            projects.add(doc.metadata.name)
        if isinstance(doc, Team | Organization) and doc.spec.gpu_quota:
            quotas = True
        if isinstance(doc, Team | Organization | Project) and doc.spec.capacity:
            quotas = True
            _gpu_limit_once(index, doc, add)
    needs: dict[str, dict[str, list[tuple[str, int]]]] = {}  # scope -> class -> (model, GPUs)
    for index, doc in enumerate(documents):
        if not isinstance(doc, Model):
            continue
        _model_class(index, doc, classes, add)
        _rollout(index, doc, add)
        _count_need(doc, teams, needs)
        owner = doc.spec.owner
        if quotas and owner is not None and owner not in {*teams, *orgs, *projects}:
            add(
                index,
                ("spec", "owner"),
                f"owner `{owner}` names no Project, Team or Organization: this model counts against no GPU "
                "quota, guarantee or limit",
                did_you_mean(owner, [*projects, *teams, *orgs])
                or "name the team that owns it, if a quota should apply",
                warning=True,
            )
    for index, doc in enumerate(documents):
        if isinstance(doc, Team | Organization):
            scope = f"{doc.kind} {doc.metadata.name}"
            _quota(index, scope, doc.spec.gpu_quota, needs.get(scope, {}), add)


def _gpu_limit_once(index: int, doc: Team | Organization | Project, add: IssueAdder) -> None:
    """A class's GPU limit is said once: in `gpu_quota` or in `capacity.<class>.limit.gpus`."""
    old = doc.spec.gpu_quota if isinstance(doc, Team | Organization) else {}
    for gpu_class, capacity in sorted(doc.spec.capacity.items()):
        if gpu_class in old and capacity.limit.gpus is not None:
            add(
                index,
                ("spec", "capacity", gpu_class, "limit", "gpus"),
                f"{gpu_class}'s GPU limit is given twice: gpu_quota says {old[gpu_class]}, capacity says "
                f"{capacity.limit.gpus}",
                f"keep capacity.{gpu_class}.limit.gpus and drop gpu_quota.{gpu_class}",
            )


def _classes(documents: Sequence[object], add: IssueAdder) -> list[str] | None:
    for index, doc in enumerate(documents):
        if isinstance(doc, Cluster) and doc.spec.classes is not None:
            seen: set[str] = set()
            for pos, name in enumerate(doc.spec.classes):
                if name in seen:
                    add(index, ("spec", "classes", pos), f"class `{name}` is listed twice", "list it once")
                seen.add(name)
            if not doc.spec.classes:
                add(
                    index,
                    ("spec", "classes"),
                    "an empty classes list declares no class a model could name",
                    "list the classes highest first, e.g. [critical, interactive, batch], or remove it",
                )
            return list(doc.spec.classes)
    return None


def _model_class(index: int, doc: Model, classes: list[str] | None, add: IssueAdder) -> None:
    name = doc.spec.model_class
    if classes is None or name is None or name in classes:
        return
    hint = did_you_mean(name, classes) or f"name one of the Cluster's classes: {', '.join(classes)}"
    add(index, ("spec", "class"), f"class `{name}` is not one of the Cluster's classes", hint)


def _rollout(index: int, doc: Model, add: IssueAdder) -> None:
    spec = doc.spec
    rollout = spec.rollout
    if rollout.max_surge == 0 and rollout.max_unavailable == 0:
        add(
            index,
            ("spec", "rollout"),
            "max_surge 0 and max_unavailable 0: a roll could neither start a replacement nor stop a replica",
            "give max_surge >= 1 (replacement first) or max_unavailable >= 1 (stop first)",
        )
    old = spec.restart_on_profile_change
    if old is None:
        return
    explicit = "on_change" in rollout.model_fields_set
    if explicit and (rollout.on_change == "restart") != old:
        add(
            index,
            ("spec", "restart_on_profile_change"),
            f"restart_on_profile_change: {str(old).lower()} contradicts rollout.on_change: {rollout.on_change}",
            "remove restart_on_profile_change (deprecated; rollout.on_change says it)",
        )
        return
    instead = "write `rollout: {on_change: restart}` instead" if old else "remove it (false is the default)"
    add(
        index,
        ("spec", "restart_on_profile_change"),
        "restart_on_profile_change is deprecated",
        instead,
        warning=True,
    )


def _count_need(
    doc: Model, teams: dict[str, str], needs: dict[str, dict[str, list[tuple[str, int]]]]
) -> None:
    spec = doc.spec
    if spec.owner is None or not spec.profiles or spec.scaling.min == 0:
        return
    first = spec.profiles[0]
    if first.gpu_class is None:
        return
    per = (first.gpus or 1) * first.nodes
    scopes = []
    if spec.owner in teams:
        scopes = [f"Team {spec.owner}", f"Organization {teams[spec.owner]}"]
    else:
        scopes = [f"Organization {spec.owner}"]
    for scope in scopes:
        needs.setdefault(scope, {}).setdefault(first.gpu_class, []).append(
            (doc.metadata.name, spec.scaling.min * per)
        )


def _quota(
    index: int,
    scope: str,
    quota: dict[str, int],
    needs: dict[str, list[tuple[str, int]]],
    add: IssueAdder,
) -> None:
    for gpu_class, limit in sorted(quota.items()):
        wanted = needs.get(gpu_class, [])
        total = sum(n for _, n in wanted)
        if total > limit:
            parts = ", ".join(f"{m} {n}" for m, n in wanted)
            add(
                index,
                ("spec", "gpu_quota", gpu_class),
                f"{scope} may hold {limit} {gpu_class}, but scaling.min of the models it owns needs {total} "
                f"with their first profiles ({parts})",
                f"raise the quota to {total}, lower those models' scaling.min, or put a profile of another "
                "class first",
            )
