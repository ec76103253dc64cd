"""A signed-in person's own things on the chat page: their threads (kept for the Cluster's
`console.threads.retention` after the last message, deletable by them) and their notes (full-text searched by the
store: llmgw.store.queries.notes). Every handler reads and writes only the session's person's rows."""

from __future__ import annotations

import json
import secrets

from aiohttp import web

from llmgw.controller.console.web import controller, render, session_of
from llmgw.store.queries.notes import Note, NoteSearchError
from llmgw.store.queries.threads import ChatThread

MAX_TITLE = 80
MAX_NOTE = 20_000  # characters of a note's body: a note, not a document store
MAX_ANSWER_KEPT = 200_000  # characters of one answer kept in a thread (the rest is cut, and says so)


def _refused(request: web.Request, code: int, message: str) -> web.Response:
    return render(request, "error.html", code, title="Not done", message=message)


def title_of(first_message: str) -> str:
    """A thread's title: its first message's first line, cut to MAX_TITLE characters."""
    line = first_message.strip().splitlines()[0] if first_message.strip() else "(empty)"
    return line if len(line) <= MAX_TITLE else line[: MAX_TITLE - 1] + "…"


def answer_text(stream: bytes) -> str:
    """The assistant's text in an OpenAI chat-completions event stream: every `delta.content`, in order. Lines
    that are not such events (comments, [DONE], a usage chunk) add nothing."""
    text: list[str] = []
    for line in stream.decode("utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        try:
            event = json.loads(line[5:])
        except ValueError:
            continue
        choices = event.get("choices") if isinstance(event, dict) else None
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            delta = choices[0].get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                text.append(delta["content"])
    answer = "".join(text)
    return answer if len(answer) <= MAX_ANSWER_KEPT else answer[:MAX_ANSWER_KEPT] + " [cut: too long to keep]"


async def thread_for(request: web.Request, thread_id: str | None, model: str, first: str) -> str | None:
    """The id of the person's thread this chat request goes on: theirs named in the request, or a new one.
    None when the named thread is not theirs (or no longer kept)."""
    c, person = controller(request), session_of(request).name
    if thread_id:
        return thread_id if await c.store.thread(person, thread_id) is not None else None
    now = c.wall()
    thread = ChatThread("t-" + secrets.token_hex(10), person, title_of(first), model, now, now)
    await c.store.start_thread(thread)
    return thread.id


async def keep_exchange(request: web.Request, thread_id: str, asked: str, stream: bytes) -> None:
    c = controller(request)
    await c.store.add_messages(
        session_of(request).name, thread_id, [("user", asked), ("assistant", answer_text(stream))], c.wall()
    )


async def threads_page(request: web.Request) -> web.StreamResponse:
    c = controller(request)
    threads = await c.store.threads_of(session_of(request).name)
    retention = c.desired.cluster.console.threads.retention if c.desired is not None else None
    return render(request, "threads.html", threads=threads, retention=retention)


async def thread_history(request: web.Request, thread_id: str) -> dict[str, object] | None:
    """The thread as the chat page's script seeds its history with (a JSON block); None: not theirs."""
    found = await controller(request).store.thread(session_of(request).name, thread_id)
    if found is None:
        return None
    thread, messages = found
    said = [{"role": m.role, "content": m.content} for m in messages]
    return {"id": thread.id, "model": thread.model, "messages": said}


async def delete_thread(request: web.Request) -> web.StreamResponse:
    thread_id = request.match_info["thread_id"]
    if not await controller(request).store.delete_thread(session_of(request).name, thread_id):
        return _refused(request, 404, f"you have no thread {thread_id} (deleted already, or pruned)")
    raise web.HTTPSeeOther("/ui/chat/threads")


async def notes_page(request: web.Request) -> web.StreamResponse:
    c, person = controller(request), session_of(request).name
    query = request.query.get("q", "").strip()
    error = ""
    try:
        notes = await c.store.search_notes(person, query) if query else await c.store.notes_of(person)
    except NoteSearchError as exc:
        notes, error = [], str(exc)
    return render(request, "notes.html", notes=notes, q=query, error=error)


async def save_note(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    title, body = form.get("title"), form.get("body")
    if not isinstance(title, str) or not title.strip() or not isinstance(body, str):
        return _refused(request, 400, "a note needs a title (and a body, which may be empty)")
    if len(body) > MAX_NOTE or len(title) > MAX_TITLE:
        return _refused(
            request, 400, f"a note's title is at most {MAX_TITLE} characters, its body {MAX_NOTE}"
        )
    c = controller(request)
    now = c.wall()
    await c.store.save_note(
        Note("n-" + secrets.token_hex(10), session_of(request).name, title.strip(), body, now, now)
    )
    raise web.HTTPSeeOther("/ui/notes")


async def delete_note(request: web.Request) -> web.StreamResponse:
    note_id = request.match_info["note_id"]
    if not await controller(request).store.delete_note(session_of(request).name, note_id):
        return _refused(request, 404, f"you have no note {note_id}")
    raise web.HTTPSeeOther("/ui/notes")
