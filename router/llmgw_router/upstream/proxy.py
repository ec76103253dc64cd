"""Send one request to one endpoint and pass the answer back: whole, or as a stream event by event.

The only place that talks HTTP to engines on the request path (engines through `llmgw_router.upstream.http1`, providers
through aiohttp) and the only place that translates either client's errors: a failure before any byte reached
the client becomes `UpstreamUnavailable` (the caller may retry elsewhere); after that the stream just ends.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

from llmgw.core.errors import TransientError
from llmgw_router.server import sse
from llmgw_router.server.errors import ApiError, error_response
from llmgw_router.server.exchange import Exchange, HttpReply
from llmgw_router.upstream.egress import ForbiddenAddress
from llmgw_router.upstream.http1 import EngineClient, UpstreamHttpError

__all__ = ["ProxyResult", "UpstreamCall", "UpstreamUnavailable", "fetch", "forward"]

_RETRYABLE_STATUS = frozenset({502, 503})
_FLUSH_WITHOUT_SEPARATOR = 64 * 1024
DEFAULT_WRITE_TIMEOUT = 30.0


class UpstreamUnavailable(TransientError):
    """The endpoint could not be reached or failed before the client saw anything: safe to retry elsewhere."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, delay=0.0)  # on another endpoint, at once
        self.reason = reason


# Not frozen: built on every request, and a frozen dataclass costs about three times as much to construct
# (object.__setattr__ per field). Nothing mutates these after construction.
@dataclass(slots=True)
class UpstreamCall:
    url: str
    payload: bytes
    headers: dict[str, str]
    stream: bool
    strip_usage_chunk: bool  # we asked for usage and the client did not: drop that extra event
    rewrite_model: str | None  # a provider's answers carry its own model name; show ours
    reply_headers: dict[str, str]
    retry_on_5xx: bool
    any_body: bool = False  # an answer need not be JSON (a transcription as text, srt, vtt)
    audio_seconds: float | None = None  # the audio sent, when the router could tell (a WAV)


@dataclass(slots=True)
class ProxyResult:
    response: HttpReply | None  # None: a stream, already written to the client through the exchange
    status: int
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    first_byte_at: float | None = None
    upstream_failed: bool = False  # a stream broke after it had started
    client_gone: bool = False  # the client disconnected mid-stream (its upstream request is closed with it)
    finished: bool = False  # the client has the whole answer (a stream's `data: [DONE]` went out)
    events: int = 0  # stream events forwarded to the client (what a stream cut short is charged by)
    images: int | None = None  # pictures made (an images model's answer; None: not a picture answer)
    audio_seconds: float | None = None  # audio heard: the engine's usage, else the router's reading


def _usage(obj: Any) -> tuple[int | None, int | None]:
    if not isinstance(obj, dict):
        return None, None
    usage = obj.get("usage")
    if usage is None and isinstance(obj.get("response"), dict):  # a passed-through Responses stream's end
        usage = obj["response"].get("usage")
    if not isinstance(usage, dict):
        return None, None
    # Chat's names; the Responses API's (a /v1/responses passed through); a reranker's total alone.
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", usage.get("total_tokens")))
    completion = usage.get("completion_tokens", usage.get("output_tokens", 0))
    return (
        prompt if isinstance(prompt, int) else None,
        completion if isinstance(completion, int) else None,
    )


class Upstream(Protocol):
    """An engine's answer being read: the lean engine client's response or an aiohttp one, adapted."""

    status: int

    def header(self, name: str, default: str = "") -> str: ...
    async def read(self) -> bytes: ...
    async def readany(self) -> bytes: ...
    def close(self) -> None: ...
    def release(self) -> None: ...


class _AiohttpUpstream:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status

    def header(self, name: str, default: str = "") -> str:
        return self._response.headers.get(name, default)

    async def read(self) -> bytes:
        return await self._response.read()

    async def readany(self) -> bytes:
        return await self._response.content.readany()

    def close(self) -> None:
        self._response.close()

    def release(self) -> None:
        self._response.release()


async def _open(session: aiohttp.ClientSession, engines: EngineClient | None, call: UpstreamCall) -> Upstream:
    if engines is not None and engines.handles(call.url):
        return await engines.post(call.url, call.payload, call.headers)
    # No redirects: a provider's 302 to a metadata service or an internal host would have the router fetch
    # it and relay the answer to the tenant. A 3xx is an upstream error (forward).
    response = await session.post(call.url, data=call.payload, headers=call.headers, allow_redirects=False)
    return _AiohttpUpstream(response)


async def forward(
    session: aiohttp.ClientSession,
    exchange: Exchange,
    call: UpstreamCall,
    engines: EngineClient | None = None,
    streaming: Callable[[ProxyResult], None] | None = None,
    *,
    write_timeout: float = DEFAULT_WRITE_TIMEOUT,
    ending: Callable[[], None] | None = None,
) -> ProxyResult:
    """Send `call` to its endpoint: plain-http engines through `engines` (the lean client), everything else
    (providers over TLS) through the aiohttp `session`. `streaming` is handed the result as soon as a stream
    starts, so what it learns (usage, whether the client got the end) outlives a cancelled handler.
    A stream whose client takes longer than `write_timeout` seconds to accept one write is cut off (the
    exchange waits while the client's TCP window is closed; without a bound a client that stops reading
    would hold its endpoint slot for as long as it liked). `ending` is called just before a stream's last
    bytes are written (the request's concurrency slots go back before the client can read them)."""
    try:
        upstream = await _open(session, engines, call)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise UpstreamUnavailable(f"connect failed: {_reason(exc)}") from None
    try:
        if upstream.status in _RETRYABLE_STATUS and call.retry_on_5xx:
            raise UpstreamUnavailable(f"engine answered {upstream.status}")
        if 300 <= upstream.status < 400:
            return _redirect_refused(upstream, call)
        if call.stream and upstream.status == 200:
            streamed = await _stream(exchange, upstream, call, streaming, write_timeout, ending)
            # Back to the pool when the engine's message is complete (after [DONE] its end is usually
            # in already); closed otherwise. Not waited for: the client and the accounting come first.
            upstream.release()
            return streamed
        try:
            data = await upstream.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise UpstreamUnavailable(f"connection lost: {_reason(exc)}") from None
    except BaseException:
        upstream.close()
        raise
    upstream.release()
    return _whole(upstream, data, call)


async def fetch(
    session: aiohttp.ClientSession, engines: EngineClient | None, call: UpstreamCall
) -> tuple[int, Any]:
    """Send `call` and read its whole answer for the router itself (a disaggregated request's prefill step):
    the status and the parsed JSON body. Nothing reaches the client; an endpoint that cannot be reached, or
    answers what is not JSON, raises `UpstreamUnavailable` as `forward` does."""
    try:
        upstream = await _open(session, engines, call)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise UpstreamUnavailable(f"connect failed: {_reason(exc)}") from None
    try:
        data = await upstream.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        upstream.close()
        raise UpstreamUnavailable(f"connection lost: {_reason(exc)}") from None
    upstream.release()
    obj = _parse_answer(data, exact=False)
    if not isinstance(obj, dict):
        raise UpstreamUnavailable(f"engine answered {upstream.status} with a body that is not a JSON object")
    return upstream.status, obj


def _redirect_refused(upstream: Upstream, call: UpstreamCall) -> ProxyResult:
    """A 3xx: not followed, not relayed (its body may be the redirect target's bait), not retried elsewhere
    (the endpoint answered; it answered wrongly): a 502 the client can read."""
    upstream.close()
    err = ApiError(
        502,
        f"The upstream answered {upstream.status} (a redirect); the router follows no redirects.",
        "upstream_redirect",
        "server_error",
        headers=call.reply_headers,
    )
    return ProxyResult(error_response(err), 502)


def _whole(upstream: Upstream, data: bytes, call: UpstreamCall) -> ProxyResult:
    """A whole answer as it goes back: its usage read, a provider's model renamed."""
    obj = _parse_answer(data, exact=call.rewrite_model is not None)
    if call.any_body and upstream.status == 200:
        obj = obj if isinstance(obj, dict) else {}
        usage = obj.get("usage")  # a transcription's: {"type": "duration", "seconds": N}
        seconds = (
            usage.get("seconds") if isinstance(usage, dict) and usage.get("type") == "duration" else None
        )
        heard = seconds if isinstance(seconds, int | float) else call.audio_seconds
        return _whole_audio(upstream, data, call, heard)
    if not isinstance(obj, dict):
        # Truncated JSON, an HTML error page, a proxy's banner: not an answer the client can use, and not one
        # to pass on as if it were. The caller retries elsewhere or answers 502 in OpenAI's shape.
        raise UpstreamUnavailable(f"engine answered {upstream.status} with a body that is not a JSON object")
    result = ProxyResult(None, upstream.status)
    if upstream.status == 200:
        result.prompt_tokens, result.completion_tokens = _usage(obj)
        if call.rewrite_model is not None:
            obj["model"] = call.rewrite_model
            data = json.dumps(obj).encode()
    # The engine's bytes as they came (parsed only to read the usage), unless the model name was changed.
    headers = call.reply_headers
    headers["Content-Type"] = upstream.header("Content-Type", "application/json")
    result.response = HttpReply(upstream.status, data, headers)
    return result


def _whole_audio(upstream: Upstream, data: bytes, call: UpstreamCall, seconds: float | None) -> ProxyResult:
    headers = call.reply_headers
    headers["Content-Type"] = upstream.header("Content-Type", "application/json")
    return ProxyResult(HttpReply(upstream.status, data, headers), upstream.status, audio_seconds=seconds)


def _parse_answer(data: bytes, exact: bool) -> Any:
    """An engine's answer parsed (None when it is not JSON). orjson first, about four times cheaper, where
    only the usage is read from it and the bytes go on as they came; it reads an integer beyond 64 bits as a
    float, so an answer that is encoded again (`exact`: a provider's, its model renamed) is parsed by json,
    as is anything orjson refuses and json may take (NaN, a byte-order mark, UTF-16)."""
    if not exact:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(data)
    except ValueError:
        return None


def _scan_event(raw: bytes, result: ProxyResult, call: UpstreamCall) -> bytes | None:
    """Take usage from the stream's usage event; return the event to send (None to drop it)."""
    if call.rewrite_model is None and b'"usage"' not in raw:
        return raw
    event = sse.parse(raw)
    # Parsed as a whole answer is (orjson first), unless the event is encoded again with its model renamed.
    data = event.data
    obj = None if data is None or event.done else _parse_answer(data, call.rewrite_model is not None)
    prompt, completion = _usage(obj)
    is_usage_event = prompt is not None and isinstance(obj, dict) and not obj.get("choices")
    if prompt is not None:
        result.prompt_tokens, result.completion_tokens = prompt, completion
    if is_usage_event and call.strip_usage_chunk:
        return None
    if call.rewrite_model is not None and isinstance(obj, dict):
        obj["model"] = call.rewrite_model
        return sse.format_event(json.dumps(obj).encode(), event.name, event.id)
    return raw


def _reason(exc: BaseException) -> str:
    # The lean client's errors say what happened; aiohttp's class names do, except a refused address.
    if isinstance(exc, UpstreamHttpError):
        return str(exc)
    cause = getattr(exc, "os_error", None)
    return str(cause) if isinstance(cause, ForbiddenAddress) else type(exc).__name__


async def _first_bytes(upstream: Upstream) -> bytes:
    """Wait for the stream's first bytes before answering the client: a replica that dies before producing
    anything is still a retry, not a broken stream."""
    try:
        first = await upstream.readany()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise UpstreamUnavailable(f"connection lost before the first byte: {_reason(exc)}") from None
    if not first:
        raise UpstreamUnavailable("engine closed the stream before sending anything")
    if not sse.could_start(first):
        raise UpstreamUnavailable("engine's stream is not server-sent events")
    return first


async def _stream(
    exchange: Exchange,
    upstream: Upstream,
    call: UpstreamCall,
    started: Callable[[ProxyResult], None] | None,
    write_timeout: float,
    ending: Callable[[], None] | None = None,
) -> ProxyResult:
    data = await _first_bytes(upstream)
    result = ProxyResult(None, 200)
    if started is not None:
        started(result)
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **call.reply_headers}
    exchange.start_stream(200, headers)
    try:
        await _pass_events(exchange, upstream, call, result, data, write_timeout, ending)
        if result.finished:
            return result
    except ConnectionResetError:  # the client left (or stalled): drop the upstream so the engine stops too
        result.client_gone = True
        upstream.close()
        return result
    except (
        aiohttp.ClientPayloadError,
        aiohttp.ServerDisconnectedError,
        aiohttp.ClientOSError,
        UpstreamHttpError,
        TimeoutError,
    ):
        result.upstream_failed = True  # the client has bytes already: the stream just ends
    if ending is not None:
        ending()
    try:
        await exchange.write_eof(write_timeout)
    except ConnectionResetError:
        result.client_gone = True
    return result


async def _pass_events(
    exchange: Exchange,
    upstream: Upstream,
    call: UpstreamCall,
    result: ProxyResult,
    data: bytes,
    write_timeout: float,
    ending: Callable[[], None] | None,
) -> None:
    """The engine's events to the client as they complete, until its `data: [DONE]` (then the client's answer
    is ended, `result.finished`) or the engine's end (the caller ends the client's)."""
    reader = sse.EventReader()
    while True:
        chunk = reader.feed_block(data)  # the complete events; the rest waits for more bytes
        if call.rewrite_model is not None or b'"usage"' in chunk:
            chunk = _scanned(chunk, result, call)
        if len(reader.pending) > _FLUSH_WITHOUT_SEPARATOR:
            chunk += reader.take_pending()
        if chunk:
            # Counted by their `data:` field at a line's start (a value's own "data:" is inside a line).
            result.events += chunk.count(b"\ndata:") + chunk.startswith(b"data:") - chunk.count(sse.DONE_LINE)
            if sse.DONE_LINE in chunk:
                # The OpenAI stream's last event: end the client's answer now (with it, one write) rather
                # than after the engine's end of message. A client may hang up right after [DONE]; waiting
                # for the engine's final bytes first made that look like a request cut short (499, no usage).
                if ending is not None:
                    ending()
                await exchange.write_eof(write_timeout, chunk)
                if result.first_byte_at is None:
                    result.first_byte_at = time.monotonic()
                result.finished = True
                return
            await exchange.write(chunk, write_timeout)
            if result.first_byte_at is None:
                result.first_byte_at = time.monotonic()
        data = await upstream.readany()
        if not data:
            break
    if rest := reader.take_pending():  # what the engine sent after its last complete event, before it ended
        await exchange.write(rest, write_timeout)


def _scanned(block: bytes, result: ProxyResult, call: UpstreamCall) -> bytes:
    """The events of `block` as they go to the client: usage noted, the usage chunk dropped, the model renamed
    (only a block that may hold a change is split and scanned event by event)."""
    return b"".join(e for raw in sse.split(block) if (e := _scan_event(raw, result, call)) is not None)
