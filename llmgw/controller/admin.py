"""The admin API (`/api/v1/...`): token required; JSON only; errors never carry a traceback."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from llmgw import placement
from llmgw.controller import views
from llmgw.controller.core import Controller
from llmgw.controller.desired import tree_hash
from llmgw.controller.routers import note_demand, note_usage, token_ok
from llmgw.controller.source import Checkout

log = logging.getLogger("llmgw.controller.admin")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CONTROLLER: web.AppKey[Controller] = web.AppKey("controller", Controller)
POLL_NOW: web.AppKey[asyncio.Event] = web.AppKey("poll_now", asyncio.Event)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def _admin(request: web.Request) -> Controller:
    c = request.app[CONTROLLER]
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(presented.encode(), c.admin_token.encode()):
        raise web.HTTPUnauthorized(
            text='{"error": {"message": "admin token required: Authorization: Bearer <token>"}}',
            content_type="application/json",
        )
    return c


def _router_or_admin(request: web.Request) -> Controller:
    c = request.app[CONTROLLER]
    if not token_ok(c, request):
        raise web.HTTPUnauthorized(
            text='{"error": {"message": "token required: Authorization: Bearer <token>"}}',
            content_type="application/json",
        )
    return c


async def status(request: web.Request) -> web.Response:
    return web.json_response(views.status_json(_admin(request)))


async def nodes(request: web.Request) -> web.Response:
    return web.json_response({"nodes": views.nodes_json(_admin(request))})


async def replicas(request: web.Request) -> web.Response:
    c = _admin(request)
    model = request.query.get("model")
    items = [views.replica_json(c, r) for r in sorted(c.replicas.values(), key=lambda r: (r.model, r.id))]
    return web.json_response({"replicas": [r for r in items if model in (None, r["model"])]})


async def models(request: web.Request) -> web.Response:
    c = _admin(request)
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
    c = _admin(request)
    d = c.desired
    name = request.match_info["model"]
    entry = d.resolve(name) if d else None
    if d is None or entry is None:
        return _error(404, f"model {name!r} is not in the applied revision")
    found = placement.explain(entry.name, d.fleet_models, views.node_views(c), views.replica_views(c))
    chosen = found.chosen
    return web.json_response(
        {
            "model": entry.name,
            "health": views.model_health(c, entry.name),
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


async def state(request: web.Request) -> web.Response:
    return web.json_response(views.live_state(_admin(request)).model_dump(mode="json"))


async def events(request: web.Request) -> web.Response:
    """Recent events, newest first: from the store (they survive a restart), else from memory."""
    c = _admin(request)
    try:
        limit = max(1, min(1000, int(request.query.get("limit", "100"))))
    except ValueError:
        return _error(400, "limit must be a whole number between 1 and 1000")
    try:
        stored = await c.store.recent_events(limit=limit)
        stored.sort(key=lambda e: -e.time)
        items = [{"time": e.time, "kind": e.kind, "object": e.object, "message": e.message} for e in stored]
    except Exception as exc:  # the store down: what this process saw is still worth showing
        log.warning("events from the store unavailable, showing this process's: %s", exc)
        items = list(c.events.items)[-limit:][::-1]
    return web.json_response({"events": items})


async def webhook(request: web.Request) -> web.Response:
    """Only triggers a poll (the body is not trusted for anything), and no more than one per
    `webhook_min_interval` however many arrive. With `webhook_secret_file` set it must carry GitHub's
    `X-Hub-Signature-256: sha256=HEX`, the HMAC-SHA256 of the body under that secret."""
    c = request.app[CONTROLLER]
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    operator = scheme.lower() == "bearer" and hmac.compare_digest(presented.encode(), c.admin_token.encode())
    if c.settings.webhook_secret_file is not None and not operator:  # `llmgw apply` asks with its token
        refusal = webhook_signature_refusal(
            c.settings.webhook_secret_file, await request.read(), request.headers.get("X-Hub-Signature-256")
        )
        if refusal is not None:
            log.warning("webhook from %s refused: %s", request.remote, refusal)
            return _error(401, refusal)
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
    c = _admin(request)
    if not c.settings.apply_from_admin:
        return _error(403, "this controller does not accept revisions over the admin API")
    try:
        body = await request.json()
    except ValueError:
        return _error(400, 'body must be JSON: {"path": DIR} or {"files": {"rel/path.yaml": "..."}}')
    if not isinstance(body, dict):
        return _error(400, "body must be a JSON object")
    try:
        root = _apply_root(c, body)
    except PathNotAllowed as exc:
        # `allowed` lets a client that sent a path (`llmgw apply`) fall back to sending the files.
        message = {"message": str(exc), "allowed": [str(p) for p in exc.allowed]}
        return web.json_response({"error": message}, status=400)
    except ValueError as exc:
        return _error(400, str(exc))
    revision = str(body.get("revision") or tree_hash(root))
    where = str(body.get("source") or f"apply {root}")
    result = await c.offer(
        Checkout(revision, root, where), force=bool(body.get("force", False)), from_source=False
    )
    payload: dict[str, Any] = {"result": result, "revision": revision}
    if result == "refused" and c.refused is not None:
        payload["errors"] = list(c.refused.errors)
        first = c.refused.errors[0] if c.refused.errors else ""
        # The same `error.message` as every other error of this API, beside the full list.
        payload["error"] = {"message": f"revision refused ({len(c.refused.errors)} error(s)): {first}"}
        return web.json_response(payload, status=422)
    return web.json_response(payload)


class PathNotAllowed(ValueError):
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
    digest = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:16]
    root = (c.settings.state_dir / "applied" / digest).resolve()
    for rel, text in files.items():
        target = (root / str(rel)).resolve()
        if root not in target.parents or not isinstance(text, str):
            raise ValueError(f"file {rel!r}: must be a relative path inside the repo with text content")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return root


async def demand(request: web.Request) -> web.Response:
    c = _router_or_admin(request)
    name = note_demand(c, request.match_info["model"])
    if name is None:
        return _error(404, f"model {request.match_info['model']!r} is not in the applied revision")
    return web.json_response({"model": name, "health": views.model_health(c, name)}, status=202)


async def usage_seen(request: web.Request) -> web.Response:
    c = _router_or_admin(request)
    try:
        body = await request.json()
    except ValueError:
        return _error(400, 'body must be JSON: {"models": ["name", ...]}')
    known = note_usage(c, body.get("models", []) if isinstance(body, dict) else [])
    return web.json_response({"known": known})


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error from this app is JSON (`{"error": {"message": ...}}`), including aiohttp's own 404, 405
    and 413, and a bug is a 500 with no traceback in the body (it goes to the log)."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        if exc.status == 404:
            message = f"no such endpoint: {request.method} {request.path} (see docs/controller.md)"
        elif exc.status == 405:
            message = (
                f"{request.method} is not allowed on {request.path}; allowed: {exc.headers.get('Allow', '')}"
            )
        elif exc.status == 413:
            message = f"request body too large (the limit is {request.app._client_max_size} bytes)"
        else:
            message = exc.reason
        keep = {k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")}
        return web.json_response({"error": {"message": message}}, status=exc.status, headers=keep)
    except ConnectionResetError:
        # The client went away while sending its body: nobody is left to answer, and it is not our error.
        log.info("admin request %s %s: the client went away", request.method, request.path)
        return web.Response(status=400)
    except Exception:
        log.exception("admin request %s %s failed", request.method, request.path)
        return _error(500, "internal error in the controller (its log has the details)")


def add_routes(app: web.Application) -> None:
    app.middlewares.append(json_errors)
    app.router.add_get("/api/v1/status", status)
    app.router.add_get("/api/v1/nodes", nodes)
    app.router.add_get("/api/v1/replicas", replicas)
    app.router.add_get("/api/v1/models", models)
    app.router.add_get("/api/v1/explain/{model}", explain)
    app.router.add_get("/api/v1/state", state)
    app.router.add_get("/api/v1/events", events)
    app.router.add_post("/api/v1/webhook", webhook)
    app.router.add_post("/api/v1/apply", apply)
    app.router.add_post("/api/v1/demand/{model}", demand)
    app.router.add_post("/api/v1/usage-seen", usage_seen)
