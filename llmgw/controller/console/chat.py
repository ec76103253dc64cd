"""The chat page: a conversation streamed through the router, with the way the request went beside it.

The browser posts to the console (same origin, CSRF token in a header); the console sends the request to
the router with the session's project key (a tenant) or the key typed into the form (an admin: an admin
token is not an API key, and the router would rightly refuse it), under a request id it made, and passes the
router's event stream back unchanged. The decision (endpoint, time to first token, tokens, cost) is then read
from the usage row the router writes, the same row `llmgw request ID` shows.

A signed-in person's exchanges are kept on a thread of theirs (llmgw.controller.console.threads): the request
names one, or a new one is started and its id comes back in `x-llmgw-thread`; the answer is kept once it has
streamed whole.
"""

from __future__ import annotations

import secrets
from typing import Any

import aiohttp
from aiohttp import web

from llmgw.controller.console import threads, you
from llmgw.controller.console.web import CONSOLE, controller, render, session_of
from llmgw.core import jsonsafe
from llmgw.store import StoreError
from llmgw.store.queries.request_queries import record_view

MAX_MESSAGES = 100
KEEP_STREAM_BYTES = 4 * 1024 * 1024  # of a person's answer stream, kept to take the answer's text from
CONNECT_S = 10.0


def allowed_models(request: web.Request) -> list[str]:
    """A tenant's project's models; a person's: those of the projects they may use (the repo's memberships and
    their groups'); an admin's: every model."""
    d = controller(request).desired
    if d is None:
        return []
    session = session_of(request)
    names = sorted(d.models)
    if session.kind == "person":
        projects = you.usable_projects(request)
        return [n for n in names if any(d.catalog.allowed(p, n) for p in projects)]
    project = session.project
    return names if project is None else [n for n in names if d.catalog.allowed(project, n)]


async def page(request: web.Request) -> web.StreamResponse:
    router = request.app[CONSOLE].router_url
    history = None
    wanted = request.query.get("thread")
    if wanted and session_of(request).kind == "person":
        history = await threads.thread_history(request, wanted)
        if history is None:
            return render(
                request, "error.html", 404, title="Not found", message=f"you have no thread {wanted}"
            )
    return render(request, "chat.html", models=allowed_models(request), router=router, history=history)


def _bad(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def _body(raw: Any, models: list[str]) -> tuple[str, list[dict[str, str]], str, str] | str:
    """(model, messages, key typed, thread id or '') or what is wrong with the body."""
    if not isinstance(raw, dict):
        return 'body must be {"model": NAME, "messages": [{"role": ..., "content": ...}], "key": KEY?, "thread": ID?}'
    model, messages, key = raw.get("model"), raw.get("messages"), raw.get("key") or ""
    thread = raw.get("thread") or ""
    if not isinstance(thread, str):
        return "thread must be a thread id (a string)"
    if not isinstance(model, str) or model not in models:
        return f"model {model!r} is not one this login may use ({', '.join(models) or 'none'})"
    if not isinstance(messages, list) or not 0 < len(messages) <= MAX_MESSAGES:
        return f"messages: 1 to {MAX_MESSAGES} of {{role, content}}"
    clean = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            return "each message needs role user, assistant or system"
        if not isinstance(m.get("content"), str):
            return "each message needs content, a string"
        clean.append({"role": m["role"], "content": m["content"]})
    if not isinstance(key, str):
        return "key must be a string"
    return model, clean, key.strip(), thread


async def send(request: web.Request) -> web.StreamResponse:
    router = request.app[CONSOLE].router_url
    if router is None:
        return _bad("this controller knows no router to chat through (set console_router_url)", 503)
    try:
        parsed = _body(jsonsafe.loads(await request.read()), allowed_models(request))
    except ValueError:
        parsed = "body must be JSON"
    if isinstance(parsed, str):
        return _bad(parsed)
    model, messages, typed, wanted_thread = parsed
    session = session_of(request)
    key = session.key or typed
    if not key:
        return _bad(
            "chatting as an admin or a person takes a project's API key: paste one into the key field"
        )
    thread_id = None
    if session.kind == "person":
        asked = messages[-1]["content"]
        thread_id = await threads.thread_for(request, wanted_thread or None, model, asked)
        if thread_id is None:
            return _bad(f"you have no thread {wanted_thread} (deleted, or older than its retention)", 404)
    request_id = "console-" + secrets.token_hex(12)
    headers = {"Authorization": f"Bearer {key}", "x-request-id": request_id, "x-llmgw-tags": "via=console"}
    payload = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_S)
    async with aiohttp.ClientSession(timeout=timeout) as client:
        try:
            upstream = await client.post(
                router.rstrip("/") + "/chat/completions", json=payload, headers=headers
            )
        except aiohttp.ClientError as exc:
            return _bad(f"the router at {router} did not answer: {exc}", 502)
        async with upstream:
            if upstream.status != 200:
                return web.Response(
                    body=await upstream.read(), status=upstream.status, content_type="application/json"
                )
            headers = {"Content-Type": "text/event-stream", "x-request-id": request_id}
            if thread_id is not None:
                headers["x-llmgw-thread"] = thread_id
            response = web.StreamResponse(headers=headers)
            await response.prepare(request)
            kept = bytearray()
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
                if thread_id is not None and len(kept) < KEEP_STREAM_BYTES:
                    kept += chunk
            await response.write_eof()
            if thread_id is not None:
                await threads.keep_exchange(request, thread_id, messages[-1]["content"], bytes(kept))
            return response


async def decision(request: web.Request) -> web.StreamResponse:
    """The usage row of a chat request (404 until the router has written it: the page asks again)."""
    c, session = controller(request), session_of(request)
    request_id = request.match_info["request_id"]
    if not request_id.startswith("console-"):
        return render(
            request, "error.html", 404, title="Not found", message="only the console's own requests"
        )
    try:
        rows = [record_view(r) for r in await c.store.usage_by_request(request_id)]
    except StoreError as exc:
        return render(
            request, "error.html", 503, title="Unavailable", message=f"the store is unavailable: {exc}"
        )
    rows = [r for r in rows if session.project in (None, r["project"])]
    if not rows:
        # 202, not 404: not written yet is no error (routers write usage about every second); the page asks again.
        return web.Response(
            text='<p data-pending="1">waiting for the router\'s usage row…</p>',
            status=202,
            content_type="text/html",
        )
    return render(request, "chat_decision.html", row=rows[0])
