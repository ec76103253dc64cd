"""People in the repo (issue 44): Person documents load, publish to routers, and answer who belongs where and
what each role may do; their mistakes are refused at file:line:col with what would be right."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmgw_router.path.auth import KeyPrincipal, personal_principal
from llmgw_router.server.errors import ApiError

from llmgw.adapters.repo_files import load_repo
from llmgw.core.plan import catalog_documents, document_changes
from llmgw.core.snapshot import Tenants
from llmgw.core.tenancy.limits import Budget, limit_key
from llmgw.core.tenancy.people import (
    ACTIONS,
    ROLE_TABLE,
    Membership,
    may,
    memberships_of,
    person_chain,
    project_role,
    scope_role,
)
from llmgw.core.tenancy.projects import tenant_chain

TENANTS = """\
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
spec: {per_member: {rpm: 5}}
---
apiVersion: llmgw/v1
kind: Team
metadata: {name: research}
spec: {organization: acme}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: evals}
spec: {team: research, per_member: {tpm: 1000, concurrency: 2}}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: direct}
spec: {organization: acme}
---
apiVersion: llmgw/v1
kind: Person
metadata: {name: alice}
spec:
  email: alice@example.com
  limits: {rpm: 30, budget: {amount: 2.5, period: 7d}}
  memberships:
    - {team: research, role: viewer}
    - {project: evals, role: maintainer}
---
apiVersion: llmgw/v1
kind: Person
metadata: {name: bob}
spec:
  email: bob@example.com
  memberships:
    - {organization: acme}
---
apiVersion: llmgw/v1
kind: Person
metadata: {name: carol}
spec: {email: carol@example.com}
"""


def load(tmp_path: Path, text: str = TENANTS):  # type: ignore[no-untyped-def]
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "tenants.yaml").write_text(text)
    return load_repo(tmp_path)


@pytest.fixture
def tenants(tmp_path: Path) -> Tenants:
    result = load(tmp_path)
    assert result.ok and result.repo is not None, [str(e) for e in result.errors]
    return result.repo.catalog.tenants()


def test_people_are_published_with_their_memberships_and_limits(tenants: Tenants) -> None:
    assert sorted(tenants.people) == ["alice", "bob", "carol"]
    assert tenants.people["alice"].limits.rpm == 30
    assert tenants.organizations["acme"].per_member is not None
    assert tenants.organizations["acme"].per_member.rpm == 5
    evals_share = tenants.projects["evals"].per_member
    assert evals_share is not None and (evals_share.tpm, evals_share.concurrency) == (1000, 2)
    # The published tree goes to routers as JSON: it comes back the same.
    assert Tenants.model_validate_json(tenants.model_dump_json()) == tenants


def test_memberships_of_lists_what_is_declared_in_order(tenants: Tenants) -> None:
    assert memberships_of("alice", tenants) == [
        Membership("team", "research", "viewer"),
        Membership("project", "evals", "maintainer"),
    ]
    assert memberships_of("bob", tenants) == [Membership("organization", "acme", "member")]
    assert memberships_of("carol", tenants) == []  # a person of no scope is declarable
    assert memberships_of("nobody", tenants) == []


def test_a_role_covers_the_scopes_beneath_and_the_strongest_wins(tenants: Tenants) -> None:
    assert project_role("alice", "evals", tenants) == "maintainer"  # stronger than the team's viewer
    assert project_role("alice", "direct", tenants) is None  # not under research
    assert project_role("bob", "evals", tenants) == "member"  # through the organization
    assert project_role("bob", "direct", tenants) == "member"
    assert project_role("carol", "evals", tenants) is None
    assert project_role("bob", "unknown", tenants) is None
    assert scope_role("alice", "team", "research", tenants) == "viewer"
    assert scope_role("bob", "team", "research", tenants) == "member"
    assert scope_role("alice", "organization", "acme", tenants) is None


def test_the_roles_table() -> None:
    assert set(ROLE_TABLE) == set(ACTIONS)
    assert not may("viewer", "create_personal_key") and not may("viewer", "create_project_key")
    assert may("maintainer", "create_project_key") and may("maintainer", "create_personal_key")
    assert may("member", "create_personal_key") and not may("member", "create_project_key")
    assert may("viewer", "view_usage") and not may("viewer", "use_models")
    assert not any(may(None, action) for action in ACTIONS)
    # A stronger role may everything a weaker one may.
    for action in ACTIONS:
        assert may("viewer", action) <= may("member", action) <= may("maintainer", action)


@pytest.mark.parametrize(
    ("person", "says"),
    [
        ("  email: nobody\n", "email"),
        ("  email: d@example.com\n  memberships: [{project: evlas}]\n", "Project `evlas` is not defined"),
        (
            "  email: d@example.com\n  memberships: [{project: evals}, {project: evals, role: viewer}]\n",
            "twice",
        ),
        ("  email: d@example.com\n  memberships: [{project: evals, team: research}]\n", "takes only one of"),
        ("  email: ALICE@example.com\n", "has the email of person `alice`"),
        ("  email: d@example.com\n  memberships: [{project: evals, role: owner}]\n", "role"),
    ],
)
def test_a_bad_person_is_refused_at_its_place(tmp_path: Path, person: str, says: str) -> None:
    text = TENANTS + "---\napiVersion: llmgw/v1\nkind: Person\nmetadata: {name: dave}\nspec:\n" + person
    result = load(tmp_path, text)
    assert not result.ok
    errors = [str(e).replace(str(tmp_path) + "/", "") for e in result.errors]
    assert any(e.startswith("tenants.yaml:") and says in e for e in errors), errors


def test_a_persons_chain_adds_their_shares_and_own_limits(tenants: Tenants) -> None:
    base = tenant_chain(tenants, "evals")
    assert base is not None
    chain = person_chain(base, "alice", tenants)
    assert [(t.level, t.name) for t in chain.levels] == [
        ("organization", "acme"),
        ("team", "research"),
        ("project", "evals"),
        ("member", "alice@organization/acme"),
        ("member", "alice@project/evals"),
        ("person", "alice"),
    ]
    assert chain.levels[3].limits.rpm == 5
    assert (chain.levels[4].limits.tpm, chain.levels[4].limits.concurrency) == (1000, 2)
    assert chain.levels[5].limits.rpm == 30
    assert chain.levels[5].limits.budget == Budget(2.5, 7 * 86400)
    # bob sets no limits of his own: no person level; the shares are his.
    bob = person_chain(base, "bob", tenants)
    assert [t.name for t in bob.levels[3:]] == ["bob@organization/acme", "bob@project/evals"]
    # The limiter's keys keep each person's pool apart.
    assert limit_key(chain.levels[4], "tokens") == "member:alice@project/evals:tokens"


def test_a_personal_key_is_served_only_where_its_owner_may_use_models(tenants: Tenants) -> None:
    bob = KeyPrincipal("key_b", "evals", "bob")
    assert personal_principal(bob, tenants, None).project == "evals"  # the key's default
    assert personal_principal(bob, tenants, "direct").project == "direct"  # the header's, a member there too
    alice = KeyPrincipal("key_a", None, "alice")
    with pytest.raises(ApiError) as refused:
        personal_principal(alice, tenants, None)
    assert (refused.value.status, refused.value.code) == (400, "project_required")
    with pytest.raises(ApiError) as refused:
        personal_principal(alice, tenants, "direct")
    assert (refused.value.status, refused.value.code) == (403, "not_a_member")
    carol = KeyPrincipal("key_c", "evals", "carol")
    with pytest.raises(ApiError) as refused:
        personal_principal(carol, tenants, None)
    assert refused.value.code == "not_a_member" and "is not a member" in refused.value.message
    gone = KeyPrincipal("key_g", "evals", "gone")
    with pytest.raises(ApiError) as refused:
        personal_principal(gone, tenants, None)
    assert refused.value.code == "person_not_declared"
    with pytest.raises(ApiError) as refused:
        personal_principal(bob, tenants, "nowhere")
    assert refused.value.code == "unknown_project"


def test_the_plan_shows_a_membership_taken_away(tmp_path: Path) -> None:
    before = load(tmp_path / "before", TENANTS)
    after = load(tmp_path / "after", TENANTS.replace("    - {project: evals, role: maintainer}\n", ""))
    assert before.repo is not None and after.repo is not None
    changes = document_changes(catalog_documents(before.repo.catalog), catalog_documents(after.repo.catalog))
    (change,) = changes
    assert (change.kind, change.name, change.change) == ("Person", "alice", "change")
    assert any(f.path.startswith("spec.memberships") and "evals" in f.old for f in change.fields), change
