"""Who is calling the admin API's routes people may call, and the one check of what their role lets them do
there (`refusal`, over `llmgw.core.tenancy.people.may`: the table the console reads too, docs/tenancy.md, Roles).
An admin token may everything its scope allows; a person, what their role in the scope allows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from aiohttp import web

from llmgw.adapters import keys as keymod
from llmgw.controller.api import guard
from llmgw.controller.api.guard import PERSON, PRINCIPAL, error
from llmgw.controller.parts.desired import Desired
from llmgw.core.snapshot import Tenants
from llmgw.core.tenancy.people import ROLE_TABLE, Action, may, memberships_of, project_role
from llmgw.store import Store, StoreError

__all__ = ["PARTS", "KeyPeople", "PeopleParts", "caller", "refusal", "tenants_of"]


class PeopleParts(Protocol):
    """What the people routes read: the store, the applied revision (its projects and people), the wall clock
    and the controller's event log."""

    @property
    def store(self) -> Store: ...

    @property
    def desired(self) -> Desired | None: ...

    @property
    def wall(self) -> Callable[[], float]: ...

    async def event(self, kind: str, obj: str, message: str) -> None: ...


PARTS: web.AppKey[PeopleParts] = web.AppKey("people_parts", PeopleParts)


class KeyPeople:
    """guard.PersonFinder over the store's keys and the applied revision's people."""

    def __init__(self, parts: PeopleParts) -> None:
        self._parts = parts

    async def person_of_key(self, token: str) -> str | None:
        try:
            found = await keymod.lookup(self._parts.store, token, self._parts.wall())
        except StoreError:
            return None
        if found is None or found.state != "active" or found.owner is None:
            return None
        return found.owner if found.owner in tenants_of(self._parts).people else None


def tenants_of(c: PeopleParts) -> Tenants:
    """The applied revision's tenant tree (empty before any revision is applied)."""
    return c.desired.catalog.tenants() if c.desired is not None else Tenants()


def caller(request: web.Request) -> tuple[str, str | None]:
    """(who, for messages and events; the person, None for an admin token). 401 without either: fails closed."""
    if PERSON in request:
        return f"person {request[PERSON]}", request[PERSON]
    guard.require_parts(request, "admin", PARTS)  # 401 with nobody known, 403 below scope admin: fails closed
    return request[PRINCIPAL].name, None


def refusal(person: str | None, action: Action, project: str | None, tenants: Tenants) -> web.Response | None:
    """The one check of a person's role (an admin token may everything): None when `person` may do `action`
    in `project` (None: in any scope they hold), else the 403 that says which role they hold and which it
    needs."""
    if person is None:
        return None
    if project is None:
        roles = [m.role for m in memberships_of(person, tenants)]
        if any(may(role, action) for role in roles):
            return None
        where, held = "anywhere", ", ".join(sorted(set(roles))) or "no role"
    else:
        role = project_role(person, project, tenants)
        if may(role, action):
            return None
        where, held = f"in project {project!r}", role or "no role"
    needs = " or ".join(sorted(ROLE_TABLE[action]))
    return error(
        403,
        f"person {person!r} holds {held} {where}; {action.replace('_', ' ')} needs {needs} "
        "(docs/tenancy.md, Roles)",
    )
