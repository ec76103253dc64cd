"""The admin API's API keys (`/api/v1/keys`): made, listed and revoked by an admin token, or by a person with
their own key within their role (docs/tenancy.md, Roles), decided by `access.refusal`."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from llmgw.adapters import keys as keymod
from llmgw.controller.api.audited import AUDIT_OBJECT
from llmgw.controller.api.guard import error
from llmgw.controller.api.people.access import PARTS, PeopleParts, caller, refusal, tenants_of
from llmgw.core import jsonsafe
from llmgw.core.tenancy.people import Action, may, project_role
from llmgw.store import ApiKey, StoreError

__all__ = ["key_json", "keys_create", "keys_list", "keys_revoke"]

BODY_SHAPE = '{"project": NAME, "owner": PERSON, "name": LABEL, "expires_in_s": SECONDS}'


def key_json(key: ApiKey, now: float) -> dict[str, Any]:
    return {
        "id": key.id,
        "prefix": key.prefix,
        "project": key.project,
        "owner": key.owner,
        "name": key.name,
        "state": key.state(now),
        "created_at": key.created_at,
        "expires_at": key.expires_at,
        "revoked_at": key.revoked_at,
        "last_used_at": key.last_used_at,
    }


def _body_problem(body: object) -> str | None:
    """What is wrong with a create body's shape, None when nothing."""
    if not isinstance(body, dict):
        return f"body must be a JSON object: {BODY_SHAPE}"
    for field in ("project", "owner"):
        if body.get(field) is not None and (not isinstance(body[field], str) or not body[field]):
            return f"{field} must be a non-empty string or left out"
    if body.get("name") is not None and not isinstance(body["name"], str):
        return "name must be a string (a label for the key) or left out"
    if body.get("project") is None and body.get("owner") is None:
        return 'give "project": the project the key spends against (or "owner": a person\'s own key)'
    expires = body.get("expires_in_s")
    # bool is an int to Python, not a number to JSON: `true` is no number of seconds
    if expires is not None and (
        not isinstance(expires, int | float) or isinstance(expires, bool) or expires <= 0
    ):
        return "expires_in_s must be a positive number of seconds"
    return None


def _unknown(c: PeopleParts, project: str | None, owner: str | None) -> web.Response | None:
    """404 for a project or person the applied revision does not declare (nothing applied: not judged)."""
    d = c.desired
    if d is None:
        return None
    known = sorted(d.catalog.projects)
    if project is not None and known and project not in d.catalog.projects:
        return error(
            404, f"project {project!r} is not in the applied revision (projects: {', '.join(known)})"
        )
    people = sorted(d.catalog.people)
    if owner is not None and owner not in d.catalog.people:
        return error(
            404, f"person {owner!r} is not in the applied revision (people: {', '.join(people) or 'none'})"
        )
    return None


async def keys_create(request: web.Request) -> web.Response:
    """A key for a project, or a person's own key, returned once in `key` (the store keeps only its hash)."""
    c = request.app[PARTS]
    who, person = caller(request)
    try:
        body = jsonsafe.loads(await request.read())
    except ValueError:
        return error(400, f"body must be JSON: {BODY_SHAPE}")
    if problem := _body_problem(body):
        return error(400, problem)
    project, owner, name = body.get("project"), body.get("owner"), body.get("name") or ""
    if person is not None and owner not in (None, person):
        return error(403, f"person {person!r} may make keys of their own only, not of person {owner!r}")
    if unknown := _unknown(c, project, owner):
        return unknown
    tenants = tenants_of(c)
    action: Action = "create_personal_key" if owner is not None else "create_project_key"
    if refused := refusal(person, action, project, tenants):
        return refused
    if (
        owner is not None
        and project is not None
        and not may(project_role(owner, project, tenants), "use_models")
    ):
        return error(
            409,
            f"person {owner!r} may not use models in project {project!r} (role: "
            f"{project_role(owner, project, tenants) or 'none'}): a key of theirs there would never answer",
        )
    now = c.wall()
    try:
        new = await keymod.create_key(
            c.store, project, now, name=name, expires_in=body.get("expires_in_s"), owner=owner
        )
    except StoreError as exc:
        return error(503, f"the store did not take the key: {exc}")
    whose = f"project {project}" if owner is None else f"person {owner}, project {project or '(names one)'}"
    request[AUDIT_OBJECT] = f"{new.key.id} ({whose})"
    await c.event("key_created", new.key.id, f"for {whose} by {who}")
    return web.json_response({**key_json(new.key, now), "key": new.plaintext}, status=201)


async def keys_list(request: web.Request) -> web.Response:
    """Every key (an admin token); a person sees their own and those of the projects they may view keys of."""
    c = request.app[PARTS]
    _who, person = caller(request)
    project, owner = request.query.get("project") or None, request.query.get("owner") or None
    try:
        found = await c.store.list_keys(project, owner)
    except StoreError as exc:
        return error(503, f"the store is unavailable: {exc}")
    if person is not None:
        tenants = tenants_of(c)
        found = [
            k
            for k in found
            if k.owner == person
            or (k.project is not None and may(project_role(person, k.project, tenants), "view_keys"))
        ]
    now = c.wall()
    return web.json_response({"keys": [key_json(k, now) for k in found]})


async def keys_revoke(request: web.Request) -> web.Response:
    """Revoke a key: an admin token any; a person their own, or any of a project they may revoke keys in."""
    c = request.app[PARTS]
    who, person = caller(request)
    key_id = request.match_info["key_id"]
    request[AUDIT_OBJECT] = key_id
    try:
        if person is not None and (refused := await _may_revoke(c, person, key_id)):
            return refused
        revoked = await c.store.revoke_key(key_id, c.wall())
    except StoreError as exc:
        return error(503, f"the store is unavailable: {exc}")
    if not revoked:
        return _missing(key_id)
    await c.event("key_revoked", key_id, f"by {who}")
    return web.json_response({"revoked": key_id})


def _missing(key_id: str) -> web.Response:
    return error(404, f"no key with id {key_id!r} (see `llmgw keys list`)")


async def _may_revoke(c: PeopleParts, person: str, key_id: str) -> web.Response | None:
    """None when `person` may revoke the key (their own, or one of a project they may revoke keys in)."""
    key = await c.store.get_key(key_id)
    if key is None:
        return _missing(key_id)
    if key.owner == person:
        return None
    if key.project is None:
        return error(
            403, f"key {key_id!r} is person {key.owner!r}'s, with no project: only they or an admin revoke it"
        )
    return refusal(person, "revoke_key", key.project, tenants_of(c))
