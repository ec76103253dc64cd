"""The admin API's handlers (`/api/v1/...`): token required; JSON only; errors never carry a traceback.

Every endpoint declares the scope it needs in the route table (llmgw.controller.api.routes.ROUTES, which
registers them and from which docs/admin-openapi.json is generated): `plan` reads, `apply` applies revisions,
`admin` does everything else, API keys included (llmgw.controller.parts.admin_tokens). A token without the scope gets
403 saying which scope it has and which the endpoint needs; an unknown token gets 401.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from llmgw.adapters.repo_files import content_hash
from llmgw.adapters.secrets import SecretError
from llmgw.adapters.sources import Checkout, GitSource, RevisionSource
from llmgw.controller.api import applied_files, audited as admin_ops, guard, weights as weights_admin
from llmgw.controller.api.audited import AUDIT_ACTION, AUDIT_DETAIL, AUDIT_OBJECT
from llmgw.controller.api.guard import error, require_parts
from llmgw.controller.core import CONTROLLER, Controller
from llmgw.controller.parts.admin_tokens import Scope, allows
from llmgw.controller.parts.credentials import valid_node_name
from llmgw.controller.parts.hub import AgentError
from llmgw.controller.status import fleet as views
from llmgw.controller.wire.publisher import (
    note_demand,
    note_usage,
    token_ok,
)
from llmgw.core import jsonsafe, placement
from llmgw.core.api.admin_api import UsageSeenBody
from llmgw.core.config.models import Disaggregation
from llmgw.core.errors import LlmgwError
from llmgw.core.security import bearer_token
from llmgw.store import StoreError

log = logging.getLogger("llmgw.controller.api.admin")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
POLL_NOW: web.AppKey[asyncio.Event] = web.AppKey("poll_now", asyncio.Event)
SOURCE: web.AppKey[RevisionSource] = web.AppKey("source", object)  # type: ignore[arg-type]
GIT_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")  # SHA-1 or SHA-256 object names
ACTOR_DETAIL_MAX = 200


def require(request: web.Request, scope: Scope) -> Controller:
    """The whole Controller, for a handler here whose route needs `scope` (guard.require_parts): these read most
    of it (the revision pipeline, the store, the credentials, the status) until they are split by subject."""
    return require_parts(request, scope, CONTROLLER)


def _router_or_admin(request: web.Request) -> Controller:
    c = request.app[CONTROLLER]
    if not token_ok(c, request):
        raise web.HTTPUnauthorized(
            text='{"error": {"message": "token required: Authorization: Bearer <token>"}}',
            content_type="application/json",
        )
    return c


async def status(request: web.Request) -> web.Response:
    return web.json_response(views.status_json(require(request, "plan")))


async def nodes(request: web.Request) -> web.Response:
    return web.json_response({"nodes": views.nodes_json(require(request, "plan"))})


async def replicas(request: web.Request) -> web.Response:
    c = require(request, "plan")
    model = request.query.get("model")
    output = allows(
        guard.principal(request).scope, "admin"
    )  # engine output tails, as /logs: admin scope only
    recs = sorted(c.replicas.values(), key=lambda r: (r.model, r.id))
    items = [views.replica_json(c, r, with_output=output) for r in recs]
    return web.json_response({"replicas": [r for r in items if model in (None, r["model"])]})


async def models(request: web.Request) -> web.Response:
    c = require(request, "plan")
    d = c.desired
    if d is None:
        return web.json_response({"models": []})
    out: list[dict[str, Any]] = []
    for name in sorted(d.models):
        m = d.models[name]
        out.append(
            views.model_health(c, name)
            | {
                "aliases": list(m.aliases),
                "profiles": [
                    {"name": p.name, "engine": p.profile.engine, "fingerprint": p.fingerprint[:12]}
                    for p in m.profiles
                ],
                "provider": m.spec.provider.url if m.spec.provider else None,
                "fallbacks": list(m.spec.fallbacks),
            }
        )
    return web.json_response({"models": out})


async def explain(request: web.Request) -> web.Response:
    c = require(request, "plan")
    d = c.desired
    name = request.match_info["model"]
    entry = d.resolve(name) if d else None
    if d is None or entry is None:
        return error(404, f"model {name!r} is not in the applied revision")
    found = placement.explain(entry.name, d.fleet_models, views.node_views(c), views.replica_views(c))
    chosen = found.chosen
    return web.json_response(
        {
            "model": entry.name,
            "health": views.model_health(c, entry.name),
            "pools": _pools(c, entry.spec.disaggregation),
            "problem": found.problem,
            "would_place": None
            if chosen is None
            else {
                "profile": chosen.profile,
                "nodes": list(chosen.nodes),
                "gpus": [list(s.gpus) for s in chosen.shards],
                "why": chosen.why,
            },
            "profiles": [
                {
                    "profile": p.profile,
                    "summary": p.summary,
                    "nodes": [
                        {
                            "node": v.node,
                            "accepted": v.accepted,
                            "reasons": list(v.reasons),
                            "words": v.words(),
                        }
                        for v in p.verdicts
                    ],
                }
                for p in found.profiles
            ],
        }
    )


def _pools(c: Controller, pd: Disaggregation | None) -> dict[str, Any] | None:
    """A disaggregated model's prefill and decode pools, each with its health (None: a plain model)."""
    d = c.desired
    if pd is None or d is None:
        return None
    pools = {role: d.resolve(name) for role, name in (("prefill", pd.prefill), ("decode", pd.decode))}
    return {
        role: {"model": e.name, "health": views.model_health(c, e.name)} for role, e in pools.items() if e
    }


async def weights_list(request: web.Request) -> web.Response:
    return web.json_response({"nodes": weights_admin.weights_json(require(request, "plan"))})


async def weights_collect(request: web.Request) -> web.Response:
    c = require(request, "apply")
    try:
        body = jsonsafe.loads(await request.read() or b"{}")
    except ValueError:
        return error(400, 'body must be JSON: {"dry_run": true|false, "node": NAME (optional)}')
    dry_run, node = (body.get("dry_run", True), body.get("node")) if isinstance(body, dict) else (None, None)
    if not isinstance(dry_run, bool) or not (node is None or isinstance(node, str)):
        return error(400, 'body must be {"dry_run": true|false, "node": NAME (optional)}')
    try:
        results = await weights_admin.collect(c, dry_run, node)
    except weights_admin.NothingApplied as exc:
        return error(409, str(exc))
    except AgentError as exc:
        return error(404, str(exc))
    return web.json_response({"dry_run": dry_run, "nodes": results})


async def state(request: web.Request) -> web.Response:
    return web.json_response(views.live_state(require(request, "plan")).model_dump(mode="json"))


async def events(request: web.Request) -> web.Response:
    """Recent events, newest first: from the store (they survive a restart), else from memory."""
    c = require(request, "plan")
    limit = admin_ops.whole_number(request.query.get("limit", "100"), 1, admin_ops.LIST_MAX)
    if limit is None:
        return error(400, f"limit must be a whole number from 1 to {admin_ops.LIST_MAX}")
    try:
        stored = await c.store.recent_events(limit=limit)
        stored.sort(key=lambda e: -e.time)
        items = [{"time": e.time, "kind": e.kind, "object": e.object, "message": e.message} for e in stored]
    except StoreError as exc:  # the store down: what this process saw is still worth showing
        log.warning("events from the store unavailable, showing this process's: %s", exc)
        items = list(c.events.items)[-limit:][::-1]
    return web.json_response({"events": items})


async def webhook(request: web.Request) -> web.Response:
    """Only triggers a poll (the body is not trusted for anything), and no more than one per
    `webhook_min_interval` however many arrive. With `webhook_secret_file` set it must carry GitHub's
    `X-Hub-Signature-256: sha256=HEX`, the HMAC-SHA256 of the body under that secret."""
    c = request.app[CONTROLLER]
    presented = bearer_token(request.headers.get("Authorization"))
    holder = c.admin_tokens.principal(presented) if presented is not None else None
    operator = holder is not None and allows(holder.scope, "apply")  # whoever may apply may ask for a poll
    if c.settings.webhook_secret_file is not None and not operator:  # `llmgw apply` asks with its token
        refusal = webhook_signature_refusal(
            c.settings.webhook_secret_file, await request.read(), request.headers.get("X-Hub-Signature-256")
        )
        if refusal is not None:
            log.warning("webhook from %s refused: %s", request.remote, refusal)
            return error(401, refusal)
    trigger = request.app[POLL_NOW]
    trigger.set()
    return web.json_response({"polling": True}, status=202)


def webhook_signature_refusal(secret_file: Path, body: bytes, header: str | None) -> str | None:
    """None when `header` is GitHub's signature of `body` under the secret in `secret_file`, else why not."""
    try:
        secret = secret_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        return f"the controller cannot read its webhook secret ({exc.strerror}); refusing every webhook"
    if not header or not header.startswith("sha256="):
        return "X-Hub-Signature-256: sha256=<hmac of the body> is required (the webhook secret is set)"
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(header.strip().encode(), expected.encode()):
        return "X-Hub-Signature-256 does not match the body under the webhook secret"
    return None


async def apply(request: web.Request) -> web.Response:
    c, principal = require(request, "apply"), guard.principal(request)
    if not c.settings.apply_from_admin:
        return error(403, "this controller does not accept revisions over the admin API")
    try:
        body = jsonsafe.loads(await request.read())
    except ValueError:
        return error(400, 'body must be JSON: {"path": DIR} or {"files": {"rel/path.yaml": "..."}}')
    if not isinstance(body, dict):
        return error(400, "body must be a JSON object")
    try:
        root = _apply_root(c, body)
    except PathNotAllowed as exc:
        # `allowed` lets a client that sent a path (`llmgw apply`) fall back to sending the files.
        message = {"message": str(exc), "allowed": [str(p) for p in exc.allowed]}
        return web.json_response({"error": message}, status=400)
    except ValueError as exc:
        return error(400, str(exc))
    force = bool(body.get("force", False))
    request[AUDIT_ACTION] = "apply.force" if force else "apply"
    request[AUDIT_DETAIL] = str(body.get("actor") or "")[:ACTOR_DETAIL_MAX]
    asked = body.get("revision")
    if asked is not None and not isinstance(asked, str):
        return error(400, "revision must be a string (a git commit SHA of the source, or left out)")
    source = request.app.get(SOURCE)
    try:
        revision = await label_for_apply(source, root, asked or None)
    except LabelRefused as exc:
        return web.json_response({"error": {"message": str(exc)}}, status=409)
    request[AUDIT_OBJECT] = revision
    if isinstance(source, GitSource) and GIT_SHA.match(revision) and revision == await source.branch_tip():
        # Verifying the label fetched the branch, and this is its tip: the next poll shows nothing new. Without
        # this, a poll (which `llmgw apply` asks for) landing after a later admin apply would re-apply this.
        c.source_showed(revision)
    where = str(body.get("source") or f"apply {root}")
    detail = str(body.get("actor") or "")[:ACTOR_DETAIL_MAX]
    result = await c.offer(
        Checkout(revision, root, where),
        force=force,
        from_source=False,
        actor=principal.name,
        actor_detail=detail,
    )
    payload: dict[str, Any] = {"result": result, "revision": revision, "actor": principal.name}
    if asked and asked != revision:
        payload["asked_revision"] = asked
    if result == "refused" and c.refused is not None:
        payload["errors"] = list(c.refused.errors)
        first = c.refused.errors[0] if c.refused.errors else ""
        # The same `error.message` as every other error of this API, beside the full list.
        payload["error"] = {"message": f"revision refused ({len(c.refused.errors)} error(s)): {first}"}
        return web.json_response(payload, status=422)
    return web.json_response(payload)


class LabelRefused(LlmgwError, ValueError):
    """An admin apply asked for a git SHA label that the files it sent are not."""


async def label_for_apply(source: RevisionSource | None, root: Path, asked: str | None) -> str:
    """The label an admin apply is recorded and served under.

    * `apply:<content hash>` by default: it says an admin sent it, and what it was;
    * the content hash itself (`sha256:...`) when the controller follows a directory: that is exactly what
      its own source calls the same tree, so `llmgw up` + `llmgw apply` stay Synced;
    * a git commit SHA only when the controller follows git and that commit of its branch has exactly these
      files: otherwise the fleet would run content never in git under a commit's name, and show Synced.
    A SHA that does not match is refused (409), anything else is relabelled `apply:<content hash>`.
    """
    content = content_hash(root)
    default = "apply:" + content.split(":", 1)[-1]
    if asked is None or asked == default:
        return default
    if GIT_SHA.match(asked):
        if not isinstance(source, GitSource):
            raise LabelRefused(
                f"revision {asked[:12]} looks like a git commit, but this controller follows "
                f"{getattr(source, 'description', 'no git branch')}: it cannot check that the files sent "
                "are that commit; leave --revision out (it is recorded as apply:<content hash>)"
            )
        at_commit = await source.content_hash_at(asked)
        if at_commit is None:
            raise LabelRefused(
                f"revision {asked[:12]} is not a commit of {source.description} (fetched just now): an "
                "apply may carry a commit's name only when the controller's branch has that commit; push "
                "it first, or leave --revision out (it is recorded as apply:<content hash>)"
            )
        if at_commit != content:
            raise LabelRefused(
                f"the files sent are not commit {asked[:12]} of {source.description} (their content hash "
                f"is {content.split(':', 1)[-1][:12]}, the commit's is {at_commit.split(':', 1)[-1][:12]}); "
                "apply a clean checkout of that commit, or leave --revision out"
            )
        return asked
    if asked == content and not isinstance(source, GitSource):
        return content
    return default


class PathNotAllowed(LlmgwError, ValueError):
    """`{"path": DIR}` names a directory outside the ones this controller applies from."""

    def __init__(self, message: str, allowed: tuple[Path, ...]) -> None:
        super().__init__(message)
        self.allowed = allowed


def allowed_path(path: Path, roots: tuple[Path, ...]) -> bool:
    """Whether resolved `path` is one of `roots` or inside one (both resolved, so `..` and symlinks that
    lead out are already followed to where they really point)."""
    return any(path == root or root in path.parents for root in roots)


def _apply_root(c: Controller, body: dict[str, Any]) -> Path:
    if isinstance(body.get("path"), str):
        # Only the controller's own repo (and configured `apply_paths`): the admin token must not turn into
        # "read and echo back YAML errors from any directory on this machine", nor walk "/".
        root = Path(body["path"]).expanduser().resolve()
        roots = c.settings.apply_roots()
        if not allowed_path(root, roots):
            where = ", ".join(str(r) for r in roots) or "none (the controller follows a git URL)"
            raise PathNotAllowed(
                f"path {root} is outside the directories this controller applies from ({where}); send the "
                'files instead ({"files": {...}}, `llmgw apply --send files`) or add the directory to the '
                "controller's apply_paths setting",
                roots,
            )
        if not root.is_dir():
            raise ValueError(f"path {root} is not a directory the controller can read")
        return root
    files = body.get("files")
    if not isinstance(files, dict) or not files:
        raise ValueError(
            'give "path" (a directory the controller can read) or "files" (relative path -> YAML text)'
        )
    if problem := applied_files.files_problem(files):
        raise ValueError(problem)  # before anything is written
    applied_dir = c.settings.state_dir / "applied"
    root = applied_files.write_files(applied_dir, files)
    applied_files.prune(applied_dir, {root} | ({c.desired.root} if c.desired is not None else set()))
    return root


async def upgrade(request: web.Request) -> web.Response:
    # Imported here: the upgrade reaches nodes over SSH, and asyncssh loads only where SSH work is done.
    from llmgw.controller.api.upgrades import upgrade as run_upgrade

    return await run_upgrade(request)


async def demand(request: web.Request) -> web.Response:
    c = _router_or_admin(request)
    name = note_demand(c, request.match_info["model"])
    if name is None:
        return error(404, f"model {request.match_info['model']!r} is not in the applied revision")
    return web.json_response({"model": name, "health": views.model_health(c, name)}, status=202)


async def usage_seen(request: web.Request) -> web.Response:
    c = _router_or_admin(request)
    try:
        body = jsonsafe.loads(await request.read())
    except ValueError:
        return error(400, 'body must be JSON: {"models": ["name", ...]}')
    try:
        seen = UsageSeenBody.model_validate(body, strict=True)  # a count of false is no count
    except ValidationError as exc:
        return error(
            400, f'body must be {{"models": ["name", ...]}} or {{"models": {{"name": count}}}}: {exc}'
        )
    return web.json_response({"known": note_usage(c, seen.models)})


# END


async def router_credential(request: web.Request) -> web.Response:
    """GET /api/v1/credentials/router (scope `admin`, audited): the token routers present on `/router/v1`."""
    c = request.app[CONTROLLER]
    try:
        return web.json_response({"token": c.router_token()})
    except SecretError as exc:
        return web.json_response({"error": {"message": str(exc)}}, status=503)


async def node_credential(request: web.Request) -> web.Response:
    """GET /api/v1/credentials/node/NAME (scope `admin`, audited): node NAME's token, for an agent installed
    by hand."""
    c = request.app[CONTROLLER]
    node = request.match_info["node"]
    bad = valid_node_name(node)
    if bad is not None:
        return web.json_response({"error": {"message": bad}}, status=400)
    try:
        return web.json_response({"node": node, "token": c.node_token(node)})
    except SecretError as exc:
        return web.json_response({"error": {"message": str(exc)}}, status=503)
