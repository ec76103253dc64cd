"""The plan's Impact: what each change does to the traffic the fleet served in a recent window. Pure.

`plan_impact` joins the plan (its model and document changes) with a `UsageSummary` and says, per change,
what it takes away or refuses and how much:
- access: a project loses a model it used (the model is removed, the project is removed, or an allowlist no
  longer lets it) — decided the way the router decides, over the planned catalog's tenants;
- limits: a tenant's rpm, tpm, concurrency or budget tightened, against its busiest minute, its peak
  concurrency, its spend at the window's rate;
- capacity: a model's replicas lowered (scaling.max) or its preferred profile changed, against its peak
  concurrency and the capacity of one replica (measured by `llmgw bench --save`, else assumed from slots);
- cost: changed prices or a removed model, projected to a 30-day month at the window's traffic;
- peers (peer_impact.py): a peer removed, or a project kept off one, and notes on what a peer change does.

An item is a "loss" when traffic like the window's would be cut off, refused or queued; everything else is
a "note". `--impact-exitcode` fails a plan with a loss (exit 3). Only what changes is judged: a project
refused before this plan is not this plan's loss.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from llmgw.core.config.models import Limits, ModelSpec, OrganizationSpec, ProjectSpec, TeamSpec
from llmgw.core.fleet.autoscale import assumed_capacity
from llmgw.core.plan.diff import catalog_documents
from llmgw.core.plan.peer_impact import peer_impact
from llmgw.core.plan.values import Impact, ImpactItem, Plan, Topic
from llmgw.core.snapshot import Tenants
from llmgw.core.tenancy.projects import allowed, has_tenants
from llmgw.core.traffic.usage_summary import TenantLevel, UsageSummary
from llmgw.core.words import count, duration_words, money, parse_duration

if TYPE_CHECKING:
    from llmgw.core.desired.catalog import Catalog
    from llmgw.core.fleet.views import LiveState

__all__ = [
    "MONTH_S",
    "NOT_IN_SAVED_STATE",
    "impact_dict",
    "impact_lines",
    "impact_markdown",
    "plan_impact",
    "unknown_impact",
]

MONTH_S = 30 * 86400.0
NOT_IN_SAVED_STATE = "usage: not in this saved state (saved without a usage summary); no Impact"
_KIND = {"organization": "Organization", "team": "Team", "project": "Project"}
_LEVEL = {v: k for k, v in _KIND.items()}


def unknown_impact(reason: str) -> Impact:
    return Impact(known=False, reason=reason)


def plan_impact(plan: Plan, usage: UsageSummary, catalog: Catalog, live: LiveState) -> Impact:
    """The Impact of `plan` (from `live` to `catalog`) on the traffic `usage` summarises."""
    new_docs = catalog_documents(catalog)
    span = _span(usage)
    window = _window_words(usage)
    items = [
        *_access(usage, catalog, live, window),
        *_limits(usage, live.documents, new_docs, window, span),
        *_capacity(plan, usage, catalog, live, window),
        *_cost(plan, usage, catalog, live, window, span),
        *peer_impact(usage, catalog, live, window),
    ]
    items.sort(key=lambda i: (i.severity != "loss", _TOPICS.index(i.topic), i.subject))
    return Impact(
        known=True,
        window=window,
        coverage=_coverage_words(usage),
        requests=sum(m.requests for m in usage.models),
        items=tuple(items),
    )


_TOPICS: tuple[Topic, ...] = ("access", "limit", "capacity", "cost")


def _span(usage: UsageSummary) -> float:
    """Seconds the window's records cover: a store younger than the window covers less of it."""
    start = max(usage.since, usage.earliest) if usage.earliest is not None else usage.since
    return max(usage.until - start, 60.0)


def _window_words(usage: UsageSummary) -> str:
    days = usage.window_s / 86400
    if days >= 1 and days == int(days):
        return f"the last {days:g} day{'s' * (days != 1)}"
    return f"the last {duration_words(usage.window_s)}"


def _coverage_words(usage: UsageSummary) -> str:
    """Said once, in the headline: a store younger than the window holds less traffic than the words say."""
    if usage.rows == 0:
        return "no requests were recorded"
    if usage.earliest is not None and usage.earliest - usage.since > 3600:
        return f"records cover only the last {duration_words(usage.until - usage.earliest)}"
    return ""


# ---------------------------------------------------------------------------------------------- access


def _access(usage: UsageSummary, catalog: Catalog, live: LiveState, window: str) -> list[ImpactItem]:
    old_tenants = _tenants(live.documents)
    new_tenants = catalog.tenants()
    out = []
    for pair in usage.pairs:
        if pair.requests == 0 or not pair.project:
            continue
        if not _was_allowed(pair.project, pair.model, live, old_tenants):
            continue  # refused before this plan: not its doing
        entry = catalog.resolve(pair.model)
        if entry is not None and (
            not has_tenants(new_tenants)
            or allowed(new_tenants, pair.project, (pair.model, entry.name, *entry.spec.aliases))
        ):
            continue
        why = _why_refused(pair.project, pair.model, catalog, new_tenants)
        errors = f" ({count(pair.errors)} of them failed)" if pair.errors else ""
        out.append(
            ImpactItem(
                "loss",
                "access",
                f"project {pair.project}",
                f"removes {pair.model} from project {pair.project}, which sent {pair.requests:,} "
                f"request{'s' * (pair.requests != 1)} to it in {window}{errors}: {why}",
            )
        )
    return out


def _was_allowed(project: str, model: str, live: LiveState, tenants: Tenants | None) -> bool:
    """Allowed by the applied revision; unknown (an older saved state) counts as allowed: it had traffic."""
    if live.models is not None and model not in live.models:
        return False
    if tenants is None or not has_tenants(tenants):
        return True
    aliases = tuple(live.models[model].aliases) if live.models is not None else ()
    return allowed(tenants, project, (model, *aliases))


def _why_refused(project: str, model: str, catalog: Catalog, tenants: Tenants) -> str:
    entry = catalog.resolve(model)
    if entry is None:
        return f"model {model} is removed"
    spec = tenants.projects.get(project)
    if spec is None:
        return f"Project {project} is removed"
    names = (model, entry.name, *entry.spec.aliases)
    chain: list[tuple[str, str, list[str] | None]] = [("Project", project, spec.models)]
    org = spec.organization
    if spec.team is not None and spec.team in tenants.teams:
        chain.append(("Team", spec.team, tenants.teams[spec.team].models))
        org = tenants.teams[spec.team].organization
    if org is not None and org in tenants.organizations:
        chain.append(("Organization", org, tenants.organizations[org].models))
    for kind, name, patterns in chain:
        if patterns is not None and not any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names):
            return f"{kind} {name}'s models no longer allow it"
    return "no tenant allows it"


def _tenants(documents: Mapping[str, Mapping[str, Any]] | None) -> Tenants | None:
    """The applied revision's tenants from its documents; None when the live state does not carry them."""
    if documents is None:
        return None
    orgs, teams, projects = {}, {}, {}
    try:
        for doc in documents.values():
            kind, name, spec = doc.get("kind"), str(doc.get("name")), doc.get("spec") or {}
            if kind == "Organization":
                orgs[name] = OrganizationSpec.model_validate(spec)
            elif kind == "Team":
                teams[name] = TeamSpec.model_validate(spec)
            elif kind == "Project":
                projects[name] = ProjectSpec.model_validate(spec)
    except ValidationError:
        return None  # written by another version: judged as unknown (allowed), not guessed
    return Tenants(organizations=orgs, teams=teams, projects=projects)


# ---------------------------------------------------------------------------------------------- limits


def _limits_of(
    documents: Mapping[str, Mapping[str, Any]] | None, level: TenantLevel, name: str
) -> Limits | None:
    if documents is None:
        return None
    doc = documents.get(f"{_KIND[level]}/{name}")
    if doc is None:
        return None
    try:
        return Limits.model_validate((doc.get("spec") or {}).get("limits") or {})
    except ValidationError:
        return None


def _limits(
    usage: UsageSummary,
    old_docs: Mapping[str, Mapping[str, Any]] | None,
    new_docs: Mapping[str, Mapping[str, Any]],
    window: str,
    span: float,
) -> list[ImpactItem]:
    out: list[ImpactItem] = []
    for t in usage.tenants:
        new = _limits_of(new_docs, t.level, t.name)
        if new is None:
            continue  # the tenant is gone: its projects' access says what that does
        old = _limits_of(old_docs, t.level, t.name) or Limits()
        who = f"{t.level} {t.name}"
        for field, peak, what in (
            ("tpm", t.peak_tpm, "peak minute"),
            ("rpm", t.peak_rpm, "peak minute"),
            ("concurrency", t.peak_concurrency, "peak concurrency"),
        ):
            before, after = getattr(old, field), getattr(new, field)
            if after is None or (before is not None and after >= before):
                continue
            unit = {"tpm": " tokens", "rpm": " requests", "concurrency": " requests at once"}[field]
            verb = "sets" if before is None else "lowers"
            sentence = (
                f"{verb} {who}'s {field} to {count(after)}; its {what} in {window} was {count(peak)}{unit}"
            )
            lost = peak > after
            out.append(
                ImpactItem(
                    "loss" if lost else "note", "limit", who, sentence + ("" if lost else " (within it)")
                )
            )
        out += _budget(t.level, t.name, old, new, t.cost, span, window)
    return out


def _budget(
    level: TenantLevel, name: str, old: Limits, new: Limits, spent: float, span: float, window: str
) -> list[ImpactItem]:
    if new.budget is None:
        return []
    period = parse_duration(new.budget.period)
    rate_new = new.budget.amount / period
    if old.budget is not None and rate_new >= old.budget.amount / parse_duration(old.budget.period):
        return []
    projected = spent / span * period
    verb = "sets" if old.budget is None else "lowers"
    who = f"{level} {name}"
    sentence = (
        f"{verb} {who}'s budget to {money(new.budget.amount)} per {new.budget.period}; at the rate of {window} "
        f"it spends {money(projected)} per {new.budget.period}"
    )
    lost = projected > new.budget.amount
    return [ImpactItem("loss" if lost else "note", "limit", who, sentence + ("" if lost else " (within it)"))]


# ---------------------------------------------------------------------------------------------- capacity


def _per_replica(model: str, spec: ModelSpec, usage: UsageSummary) -> tuple[int | None, str]:
    """One replica's capacity for the preferred (first) profile, and where the number comes from."""
    if not spec.profiles:
        return None, "no profile (a provider)"
    p = spec.profiles[0]
    for c in usage.capacity:
        if c.model == model and c.profile == p.name and c.gpu_class == (p.gpu_class or ""):
            if c.concurrency is not None:
                return c.concurrency, f"a measured capacity of {c.concurrency} per replica (profile {p.name})"
            break
    slots = assumed_capacity(p.slots, p.engine, p.args)
    if slots is not None:
        return (
            slots,
            f"a capacity of {slots} per replica assumed from the slots of profile {p.name} (not measured)",
        )
    return None, f"an unknown capacity per replica (profile {p.name}: not measured, no slots declared)"


def _capacity(
    plan: Plan, usage: UsageSummary, catalog: Catalog, live: LiveState, window: str
) -> list[ImpactItem]:
    out = []
    for m in plan.models:
        if m.change != "change" or live.models is None or m.model not in live.models:
            continue
        entry = catalog.models.get(m.model)
        if entry is None:
            continue
        old, new = live.models[m.model], entry.spec
        max_lowered = new.scaling.max < old.scaling.max
        profile_moved = bool(new.profiles) and (not old.profiles or new.profiles[0] != old.profiles[0])
        if not (max_lowered or profile_moved):
            continue
        used = usage.model(m.model)
        peak = used.peak_concurrency if used is not None else 0
        per, source = _per_replica(m.model, new, usage)
        replicas = f"{new.scaling.max} replica{'s' * (new.scaling.max != 1)}"
        head = (
            f"drops {m.model}'s max to {replicas}"
            if max_lowered
            else f"changes {m.model}'s preferred profile (max {replicas})"
        )
        sentence = f"{head}; its peak concurrency in {window} was {peak} against {source}"
        if per is None:
            out.append(ImpactItem("note", "capacity", f"model {m.model}", sentence + ": not judged"))
            continue
        total = per * new.scaling.max
        lost = peak > total
        tail = f": at most {total} at once" if lost else f": within it ({total} at once)"
        out.append(ImpactItem("loss" if lost else "note", "capacity", f"model {m.model}", sentence + tail))
    return out


# ---------------------------------------------------------------------------------------------- cost


def _monthly(tokens_in: int, tokens_out: int, spec: ModelSpec, span: float) -> float:
    scale = MONTH_S / span
    return (
        scale
        * (tokens_in * spec.prices.input_per_million + tokens_out * spec.prices.output_per_million)
        / 1e6
    )


def _cost(
    plan: Plan, usage: UsageSummary, catalog: Catalog, live: LiveState, window: str, span: float
) -> list[ImpactItem]:
    out = []
    for m in plan.models:
        if live.models is None or m.model not in live.models:
            continue
        used = usage.model(m.model)
        if used is None or used.requests == 0:
            continue
        old = live.models[m.model]
        traffic = f"{count(used.tokens_in)} tokens in, {count(used.tokens_out)} out"
        was = _monthly(used.tokens_in, used.tokens_out, old, span)
        if m.change == "remove":
            words = f"removes model {m.model}: its traffic of {window} ({traffic}) cost {money(was)} a month"
            out.append(ImpactItem("note", "cost", f"model {m.model}", words))
            continue
        entry = catalog.models.get(m.model)
        if m.change != "change" or entry is None or entry.spec.prices == old.prices:
            continue
        new = entry.spec.prices
        now = _monthly(used.tokens_in, used.tokens_out, entry.spec, span)
        delta = now - was
        prices = (
            f"input {money(old.prices.input_per_million)} -> {money(new.input_per_million)}, output "
            f"{money(old.prices.output_per_million)} -> {money(new.output_per_million)} per million tokens"
        )
        sign = "+" if delta >= 0 else "-"
        words = (
            f"changes {m.model}'s prices ({prices}): at the traffic of {window} ({traffic}) it costs "
            f"{money(now)} a month instead of {money(was)} ({sign}{money(abs(delta))})"
        )
        out.append(ImpactItem("note", "cost", f"model {m.model}", words))
    return out


# ---------------------------------------------------------------------------------------------- renderings

SHORT_ITEMS = 5  # losses the markdown names before the fold
_MARK = {"loss": "!", "note": "="}


def impact_lines(impact: Impact) -> list[str]:
    """The Impact section of the text plan: the headline, then every item (losses first)."""
    if not impact.known:
        return [f"Impact: {impact.reason}.", ""]
    out = [f"Impact: {impact.headline()}"]
    out += [f"  {_MARK[i.severity]} {i.words}" for i in impact.items]
    return [*out, ""]


def impact_markdown(impact: Impact) -> list[str]:
    """The Impact section of the PR comment: the losses in a few bullets, everything in a folded table."""
    out = ["#### Impact", ""]
    if not impact.known:
        return [*out, f"_{impact.reason}._", ""]
    out += [f"**{impact.headline()}**", ""]
    losses = impact.losses
    out += [f"- {i.words}" for i in losses[:SHORT_ITEMS]]
    if len(losses) > SHORT_ITEMS:
        out.append(f"- and {len(losses) - SHORT_ITEMS} more (below)")
    if losses:
        out.append("")
    if not impact.items:
        return out
    cells = [
        f"| `{_MARK[i.severity]}` | {i.topic} | {_cell(i.subject)} | {_cell(i.words)} |" for i in impact.items
    ]
    return [
        *out,
        f"<details><summary>Impact in full: {len(impact.items)} item{'s' * (len(impact.items) != 1)}</summary>",
        "",
        "| | topic | about | what it does |",
        "| --- | --- | --- | --- |",
        *cells,
        "",
        "</details>",
        "",
    ]


def impact_dict(impact: Impact) -> dict[str, Any]:
    return {
        "known": impact.known,
        "reason": impact.reason or None,
        "window": impact.window or None,
        "coverage": impact.coverage or None,
        "requests": impact.requests,
        "headline": impact.headline(),
        "items": [
            {"severity": i.severity, "topic": i.topic, "subject": i.subject, "words": i.words}
            for i in impact.items
        ],
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
