"""Whole-repo checks of the Cluster's `console`: every scope an identity provider group grants a role in is
declared (a grant of a misspelt team would give nothing, silently). Pure; run by semantic.check."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmgw.core.config.models import Cluster, Organization, Project, Team
from llmgw.core.config.validation import did_you_mean

__all__ = ["check_console"]

# (index, path, message, hint) -> None: checker.Checker.add
Add = Callable[..., None]


def check_console(documents: Sequence[object], add: Add) -> None:
    scopes: dict[str, set[str]] = {
        "organization": {d.metadata.name for d in documents if isinstance(d, Organization)},
        "team": {d.metadata.name for d in documents if isinstance(d, Team)},
        "project": {d.metadata.name for d in documents if isinstance(d, Project)},
    }
    for index, doc in enumerate(documents):
        if not isinstance(doc, Cluster) or doc.spec.console.identity_provider is None:
            continue
        for group, grants in doc.spec.console.identity_provider.groups.items():
            for pos, grant in enumerate(grants):
                kind, name = next((k, getattr(grant, k)) for k in scopes if getattr(grant, k) is not None)
                if name in scopes[kind]:
                    continue
                title = kind.capitalize()
                add(
                    index,
                    ("spec", "console", "identity_provider", "groups", group, pos, kind),
                    f"group `{group}` grants a role in {title} `{name}`, which is not defined",
                    did_you_mean(name, scopes[kind]) or f"add a {title} document named `{name}`",
                )
