"""The rule combining an identity provider's groups with the repo's memberships (issue 44, docs/tenancy.md,
Groups): a union; where the repo gives a role in a scope it holds there; among groups the strongest; a project's
role the strongest over it, its team and its organization. The browser test shows it live (test_oidc_browser.py)."""

from __future__ import annotations

from pathlib import Path

from llmgw.adapters.repo_files import load_repo
from llmgw.core.config.specs.console_spec import GroupGrant
from llmgw.core.snapshot import Tenants
from llmgw.core.tenancy.groups import Held, combined, from_groups, project_role_among
from llmgw.core.tenancy.people import Membership

TENANTS = Tenants.model_validate(
    {
        "organizations": {"acme": {}},
        "teams": {"research": {"organization": "acme"}},
        "projects": {"playground": {"team": "research"}, "evals": {"organization": "acme"}},
    }
)
MAPPING = {
    "ml": [GroupGrant(team="research", role="maintainer"), GroupGrant(project="evals", role="viewer")],
    "evals-owners": [GroupGrant(project="evals", role="maintainer")],
    "readers": [GroupGrant(project="playground", role="viewer")],
}


def _roles(held: list[Held]) -> dict[tuple[str, str], tuple[str, str]]:
    return {(h.membership.scope_kind, h.membership.scope_name): (h.membership.role, h.source) for h in held}


def test_groups_give_their_grants_the_strongest_per_scope() -> None:
    assert _roles(from_groups(["ml", "evals-owners", "not-mapped"], MAPPING)) == {
        ("team", "research"): ("maintainer", "group ml"),
        ("project", "evals"): ("maintainer", "group evals-owners"),
    }
    assert from_groups([], MAPPING) == []


def test_the_repo_wins_where_it_gives_a_role_and_the_rest_is_a_union() -> None:
    repo = [Membership("project", "evals", "viewer"), Membership("organization", "acme", "viewer")]
    held = combined(repo, from_groups(["ml", "evals-owners"], MAPPING))
    assert _roles(held) == {
        ("project", "evals"): ("viewer", "repo"),  # evals-owners' maintainer does not override the repo
        ("organization", "acme"): ("viewer", "repo"),
        ("team", "research"): ("maintainer", "group ml"),
    }
    assert project_role_among(held, "playground", TENANTS) == "maintainer", "through team research"
    assert project_role_among(held, "evals", TENANTS) == "viewer", "acme's and evals' own: viewer"
    assert project_role_among(held, "nowhere", TENANTS) is None
    demoted = combined([Membership("project", "playground", "member")], from_groups(["readers"], MAPPING))
    assert project_role_among(demoted, "playground", TENANTS) == "member", (
        "a weaker group role changes nothing"
    )


def test_a_group_granting_a_role_in_an_undeclared_scope_is_refused_at_its_place(tmp_path: Path) -> None:
    (tmp_path / "tenants.yaml").write_text(
        "apiVersion: llmgw/v1\nkind: Organization\nmetadata: {name: acme}\nspec: {}\n---\n"
        "apiVersion: llmgw/v1\nkind: Team\nmetadata: {name: research}\nspec: {organization: acme}\n"
    )
    (tmp_path / "cluster.yaml").write_text(
        "apiVersion: llmgw/v1\nkind: Cluster\nmetadata: {name: c}\nspec:\n  console:\n    identity_provider:\n"
        "      issuer: https://login.example.com\n      client_id: c\n      client_secret: {file: oidc}\n"
        "      groups_claim: groups\n      groups:\n        ml: [{team: reserch}]\n"
    )
    result = load_repo(tmp_path)
    errors = [str(e).replace(str(tmp_path) + "/", "") for e in result.errors]
    assert any(
        e.startswith("cluster.yaml:")
        and "group `ml` grants a role in Team `reserch`" in e
        and "research" in e
        for e in errors
    ), errors
