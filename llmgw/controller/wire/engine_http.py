"""The controller's one HTTP client for engines: model checks, canary and admin evals, and yielding's metrics read.

An engine's address is what its agent reported, so a compromised node chooses it. Hence, as for the router's
engine connections (llmgw.adapters.egress): every address connected to is checked (no link-local or metadata
service), redirects are never followed (a 3xx is an answer, not a new destination), and every answer is read
up to a bound, so an endless body cannot grow the controller (one process for the whole fleet). A refusal quotes
only the engine's own error message from an OpenAI-shaped error body, never an arbitrary page: results are
readable with a `plan` token.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from llmgw.adapters.egress import AnswerTooLarge, checked_connector, read_at_most

__all__ = [
    "MAX_ANSWER_BYTES",
    "MAX_STREAM_BYTES",
    "EngineTarget",
    "engine_session",
    "post_json",
    "post_stream",
    "refusal_words",
]

MAX_ANSWER_BYTES = 4 * 1024 * 1024  # one chat completion, or one metrics page
MAX_STREAM_BYTES = 16 * 1024 * 1024  # every chunk of one streamed answer together
_QUOTED_CHARS = 200


@dataclass(frozen=True, slots=True)
class EngineTarget:
    """One replica's engine, as the controller reaches it."""

    replica: str
    model: str  # the name the engine serves
    base_url: str  # http://host:port, without /v1
    api_key: str | None
    engine: str


def engine_session(timeout: aiohttp.ClientTimeout | None = None) -> aiohttp.ClientSession:
    """A session whose every connection is checked as the controller's (the only way it reaches engines)."""
    return aiohttp.ClientSession(connector=checked_connector("the controller"), timeout=timeout)


def refusal_words(status: int, body: bytes) -> str:
    """What a non-200 answer says: the engine's error message (OpenAI's `error.message`, or vLLM's and SGLang's
    top-level `message`), cut; a redirect is named as one; any other body is not quoted."""
    if 300 <= status < 400:
        return f"{status}, a redirect (not followed: an engine answers where it was asked)"
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    message: object = None
    if isinstance(doc, dict):
        error = doc.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        message = message if isinstance(message, str) else doc.get("message")
    if not isinstance(message, str):
        return f"{status} (no engine error message in its body)"
    cut = message[:_QUOTED_CHARS] + ("…" if len(message) > _QUOTED_CHARS else "")
    return f"{status}: {cut}"


@asynccontextmanager
async def _post(
    session: aiohttp.ClientSession, target: EngineTarget, path: str, body: dict[str, Any], timeout_s: float
) -> AsyncIterator[aiohttp.ClientResponse]:
    """The POST to the engine with its key; redirects are not followed."""
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    async with session.post(
        target.base_url + path,
        json=body,
        headers=headers,
        allow_redirects=False,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    ) as resp:
        yield resp


def _unreachable(target: EngineTarget, exc: BaseException) -> str:
    return f"{target.replica} could not be reached: {type(exc).__name__} {exc}".rstrip()


async def post_json(
    session: aiohttp.ClientSession, target: EngineTarget, path: str, body: dict[str, Any], timeout_s: float
) -> tuple[Any, str | None]:
    """POST to the engine; (the JSON answer, None) or (None, what went wrong in words)."""
    try:
        async with _post(session, target, path, body, timeout_s) as resp:
            text = await read_at_most(resp, MAX_ANSWER_BYTES, target.replica)
            if resp.status != 200:
                return None, f"{target.replica} answered {refusal_words(resp.status, text)}"
            return json.loads(text), None
    except AnswerTooLarge as exc:
        return None, str(exc)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return None, _unreachable(target, exc)
    except ValueError:
        return None, f"{target.replica} answered with a body that is not JSON"


async def post_stream(
    session: aiohttp.ClientSession, target: EngineTarget, path: str, body: dict[str, Any], timeout_s: float
) -> tuple[list[Any], str | None]:
    """POST a streamed request; (the chunks, None) or (the chunks so far, what went wrong in words). The
    stream is cut at MAX_STREAM_BYTES (aiohttp bounds each line)."""
    chunks: list[Any] = []
    seen = 0
    try:
        async with _post(session, target, path, body, timeout_s) as resp:
            if resp.status != 200:
                text = await read_at_most(resp, MAX_ANSWER_BYTES, target.replica)
                return [], f"{target.replica} answered {refusal_words(resp.status, text)}"
            async for raw in resp.content:
                seen += len(raw)
                if seen > MAX_STREAM_BYTES:
                    return chunks, f"{target.replica} streamed more than {MAX_STREAM_BYTES} bytes; cut there"
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                try:
                    chunks.append(json.loads(line.removeprefix("data:").strip()))
                except ValueError:
                    return (
                        chunks,
                        f"{target.replica} streamed a chunk that is not JSON ({len(line)} characters)",
                    )
    except AnswerTooLarge as exc:
        return chunks, str(exc)
    except ValueError as exc:  # aiohttp refuses a line longer than its read buffer
        return chunks, f"{target.replica} streamed a line too long to read ({exc})"
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return chunks, _unreachable(target, exc)
    return chunks, None
