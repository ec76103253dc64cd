"""Whole-repo checks of Person documents: every membership names a declared scope, once, and no two people
share an email (sign-in finds a person by it). Pure; run by semantic.check beside the other stages."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmgw.core.config.models import Organization, Person, Project, Team
from llmgw.core.config.validation import did_you_mean

__all__ = ["check_people"]

# (index, path, message, hint) -> None: checker.Checker.add
Add = Callable[..., None]


def check_people(documents: Sequence[object], add: Add) -> None:
    scopes: dict[str, set[str]] = {
        "organization": {d.metadata.name for d in documents if isinstance(d, Organization)},
        "team": {d.metadata.name for d in documents if isinstance(d, Team)},
        "project": {d.metadata.name for d in documents if isinstance(d, Project)},
    }
    emails: dict[str, str] = {}
    for index, doc in enumerate(documents):
        if not isinstance(doc, Person):
            continue
        email = doc.spec.email.lower()
        if email in emails:
            add(
                index,
                ("spec", "email"),
                f"person `{doc.metadata.name}` has the email of person `{emails[email]}`",
                "one Person per address: sign-in finds the person by it",
            )
        emails.setdefault(email, doc.metadata.name)
        seen: set[tuple[str, str]] = set()
        for pos, m in enumerate(doc.spec.memberships):
            kind, name = next((k, getattr(m, k)) for k in scopes if getattr(m, k) is not None)
            if name not in scopes[kind]:
                kind_title = kind.capitalize()
                add(
                    index,
                    ("spec", "memberships", pos, kind),
                    f"{kind_title} `{name}` is not defined",
                    did_you_mean(name, scopes[kind]) or f"add a {kind_title} document named `{name}`",
                )
            if (kind, name) in seen:
                add(
                    index,
                    ("spec", "memberships", pos),
                    f"{kind} `{name}` is listed twice for person `{doc.metadata.name}`",
                    "keep one membership per scope, with the role meant",
                )
            seen.add((kind, name))
