"""The simulated engine: an OpenAI-compatible aiohttp server with a latency model and vLLM's metric names.

Run as `llmgw-agent sim-engine ...` or `python -m llmgw_agent.sim ...`. It lets the whole system and the
scheduling benchmarks run without GPUs; everything it says is marked simulated (`owned_by: llmgw-sim`, Greek-letter
output). Timing is deterministic given the inputs (see sim_model).

It answers only what the OpenAI API documents: an answer ends by itself (`stop`) after its own length unless the
client's max_tokens or the context cut it (`length`); its timing breakdown (`llmgw_sim`) is added to a body only
when the request asks with the `X-Llmgw-Sim-Info` header (it is always in the `x-llmgw-sim-*` response headers).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from llmgw_agent.sim_cli import behaviour_from_args, build_parser
from llmgw_agent.sim_events import KvEventPublisher, batch_events
from llmgw_agent.sim_metrics import render_metrics
from llmgw_agent.sim_model import (
    ErrorPacer,
    LatencyConfig,
    PrefixCache,
    ToolCall,
    answer_length,
    canned_answer,
    continuation_refusal,
    embedding,
    output_tokens,
    plan_timing,
    relevance,
    response_schema,
    schema_sample,
    tokenize,
    tool_calls,
)
from llmgw_agent.sim_parts import (
    Behaviour as Behaviour,
    FifoSlots,
    SimStats,
    Work as Work,
    openai_error,
    tool_call_obj,
)

# Behaviour and Work are built by the sim's callers (tests, evals) beside SimEngine: named here too.
from llmgw_agent.sim_pd import KV_PATH, Disaggregation

OWNED_BY = "llmgw-sim"
SIM_INFO_HEADER = "X-Llmgw-Sim-Info"  # a request carrying it gets the `llmgw_sim` timing field in its body


class SimEngine:
    def __init__(
        self, model: str, cfg: LatencyConfig, api_key: str | None, behaviour: Behaviour | None = None
    ) -> None:
        self.model = model
        self.behaviour = behaviour or Behaviour()
        self.errors = ErrorPacer(self.behaviour.error_rate)
        self.cfg = cfg
        self.api_key = api_key
        self.cache = PrefixCache(cfg.block_size, cfg.capacity_blocks, cfg.hash_seed)
        self.events: KvEventPublisher | None = None
        self.slots = FifoSlots(cfg.max_concurrency)
        self.stats = SimStats()
        self.created = int(time.time())
        # A judge (`--judge-unsafe WORD=S1,S9`): completions answer as Llama Guard 3 does. None: not a judge.
        self.judge_rules: list[tuple[str, str]] | None = None
        self.pd = Disaggregation()  # vLLM's prefill/decode protocol (sim_pd.py)

    # ---- the model ----

    async def admit(self, work: Work) -> None:
        """Wait for a slot (FIFO), then pay prefill for the uncached part of the prompt."""
        arrived = time.monotonic()
        await self.slots.acquire()
        self.stats.running += 1
        work.started = time.monotonic()
        work.queue_ms = (work.started - arrived) * 1000
        # A decode that brought its prompt's KV from a prefill engine computes none of it.
        cached = max(self.cache.lookup(work.prompt, work.salt), work.remote_kv)
        work.timing = plan_timing(self.cfg, len(work.prompt), cached)
        self.stats.kv_tokens += len(work.prompt) + work.max_tokens
        self.stats.prompt_tokens += len(work.prompt)
        try:
            await asyncio.sleep(work.timing.prefill_ms / 1000)
        except BaseException:  # the client went away during prefill: give the slot back
            self.finish(work, 0)
            raise
        work.token_due = work.started + work.timing.prefill_ms / 1000
        change = self.cache.insert(work.prompt, work.salt)
        if self.events is not None:
            self.events.publish(batch_events(change, self.cfg.block_size))

    def finish(self, work: Work, generated: int) -> None:
        self.stats.running -= 1
        self.stats.kv_tokens -= len(work.prompt) + work.max_tokens
        self.stats.requests_finished += 1
        self.slots.release()

    async def decode_one(self, work: Work) -> None:
        """One token, due one decode step after the last was due (decoding begins when prefill would end),
        not one step after this process woke: the sim stands in for an accelerator, whose step time does not
        stretch when the host's CPU is busy. A late wake-up is made up by the next tokens, never run ahead of."""
        self.stats.generation_tokens += 1
        work.token_due += self.cfg.decode_ms_per_token / 1000
        await asyncio.sleep(max(work.token_due - time.monotonic(), 0.0))

    def usage(self, work: Work, completion_tokens: int) -> dict[str, Any]:
        assert work.timing is not None
        return {
            "prompt_tokens": len(work.prompt),
            "completion_tokens": completion_tokens,
            "total_tokens": len(work.prompt) + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": work.timing.cached_tokens},
        }

    def sim_info(self, work: Work, completion_tokens: int) -> dict[str, Any]:
        assert work.timing is not None
        return {
            "queue_ms": round(work.queue_ms, 3),
            "prefill_ms": work.timing.prefill_ms,
            "decode_ms": completion_tokens * work.timing.decode_ms_per_token,
            "cached_tokens": work.timing.cached_tokens,
        }

    # ---- HTTP ----

    def check_auth(self, request: web.Request) -> web.Response | None:
        if not self.api_key:
            return None
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        # Constant time: the key must not be guessable byte by byte from response timings.
        if not hmac.compare_digest(given, f"Bearer {self.api_key}".encode()):
            return openai_error(
                401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
            )
        return None

    async def read_body(self, request: web.Request) -> dict[str, Any] | web.Response:
        denied = self.check_auth(request)
        if denied is not None:
            return denied
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return openai_error(400, "request body is not valid JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return openai_error(400, "request body must be a JSON object", "invalid_request_error")
        if body.get("model") not in (self.model, None):
            return openai_error(
                404,
                f"The model `{body.get('model')}` does not exist.",
                "invalid_request_error",
                "model_not_found",
            )
        return body

    def limit(self, body: dict[str, Any]) -> int | web.Response | None:
        """The client's cap on the answer (max_completion_tokens, else max_tokens); None: it set none."""
        raw = body.get("max_completion_tokens", body.get("max_tokens"))
        if raw is None:
            return None
        if not isinstance(raw, int) or isinstance(raw, bool) or raw < 0:
            return openai_error(400, "max_tokens must be a non-negative integer", "invalid_request_error")
        return raw

    def room(self, prompt: list[str]) -> int | web.Response | None:
        """What the context leaves for the answer (None: no context length given); a prompt that does not
        fit is refused as vLLM refuses it."""
        if self.cfg.context_length is None:
            return None
        room = self.cfg.context_length - len(prompt)
        if room < 0:
            return openai_error(
                400,
                f"This model's maximum context length is {self.cfg.context_length} tokens. However, your "
                f"request has {len(prompt)} input tokens.",
                "invalid_request_error",
            )
        return room

    def answer(
        self, body: dict[str, Any], prompt: list[str], limit: int | None, room: int | None, chat: bool
    ) -> tuple[list[str], str]:
        """The words of a text answer and its finish_reason. A configured or schema answer has its own
        length; generated words stop after `default_max_tokens` (the sim's end-of-sequence), sooner when the
        client's limit or the context cuts them. `ignore_eos` (vLLM's and llama.cpp's own field) makes them run
        until the limit, as on those engines: that is how a benchmark sizes its load."""
        chosen = self._chosen_words(body) if chat else None
        if chosen is not None:
            count, finish = answer_length(len(chosen), limit, room)
            return chosen[:count], finish
        runs_to_limit = body.get("ignore_eos") is True and limit is not None
        natural = None if runs_to_limit else self.cfg.default_max_tokens
        count, finish = answer_length(natural, limit, room)
        return output_tokens(prompt, count), finish

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self.read_body(request)
        if isinstance(body, web.Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return openai_error(400, "messages must be a non-empty list", "invalid_request_error")
        refused = continuation_refusal(body)
        if refused is not None:
            return openai_error(400, refused, "invalid_request_error")
        parts: list[str] = []
        for m in messages:
            content = m.get("content", "") if isinstance(m, dict) else ""
            if isinstance(content, list):  # content parts: keep the text ones
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            parts.append(f"{m.get('role', 'user') if isinstance(m, dict) else 'user'}: {content}")
        return await self.generate(request, body, tokenize("\n".join(parts)), chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self.read_body(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            prompt = " ".join(str(p) for p in prompt)
        if self.judge_rules is not None and not body.get("stream"):
            return self.judge(str(prompt))
        return await self.generate(request, body, tokenize(str(prompt)), chat=False)

    def judge(self, prompt: str) -> web.Response:
        """Answer as Llama Guard 3: `unsafe` and the categories of every rule whose word is in the judged
        conversation (between its markers), else `safe`."""
        start, end = prompt.find("<BEGIN CONVERSATION>"), prompt.find("<END CONVERSATION>")
        judged = (prompt[start:end] if 0 <= start < end else prompt).lower()
        codes: list[str] = []
        for word, categories in self.judge_rules or ():
            if word.lower() in judged:
                codes += [c for c in categories.split(",") if c and c not in codes]
        text = "unsafe\n" + ",".join(codes) if codes else "safe"
        words = len(text.split())
        choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
        usage = {"prompt_tokens": len(tokenize(prompt)), "completion_tokens": words}
        usage["total_tokens"] = usage["prompt_tokens"] + words
        resp = {
            "id": "cmpl-" + uuid.uuid4().hex,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }
        return web.json_response(resp)

    async def generate(
        self, request: web.Request, body: dict[str, Any], prompt: list[str], chat: bool
    ) -> web.StreamResponse:
        limit = self.limit(body)
        if isinstance(limit, web.Response):
            return limit
        room = self.room(prompt)
        if isinstance(room, web.Response):
            return room
        if self.behaviour.error_rate and self.errors.fail():
            return openai_error(503, "simulated engine error (the sim's error_rate)", "server_error")
        salt = body.get("cache_salt")
        words, finish = self.answer(body, prompt, limit, room, chat)
        reserved = len(words) if limit is None else limit
        work = Work(prompt, reserved, salt=salt if isinstance(salt, str) and salt else None)
        work.remote_kv = await self.pd.take(body, prompt)
        calls = tool_calls(body) if chat and "tools" not in self.behaviour.fail_probes else []
        if body.get("stream"):
            return await self.stream(request, body, work, chat, (words, finish))
        await self.admit(work)
        # Tool calls' arguments count as their whitespace words, whatever max_tokens says.
        if calls:
            words = tokenize(" ".join(c[2] for c in calls))
        try:
            self.stats.observe_ttft(time.monotonic() - work.started + work.queue_ms / 1000)
            for _ in words:
                await self.decode_one(work)
        finally:
            self.finish(work, len(words))
        text = (" " if _continues(body) and words else "") + " ".join(words)
        rid = uuid.uuid4().hex
        if chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
            obj, prefix = "chat.completion", "chatcmpl-"
        else:
            choice, obj, prefix = {"index": 0, "text": text}, "text_completion", "cmpl-"
        choice["finish_reason"] = finish
        if calls:
            tool_objs = [tool_call_obj(c) for c in calls]
            choice["message"] = {"role": "assistant", "content": None, "tool_calls": tool_objs}
            choice["finish_reason"] = "tool_calls"
        if chat:
            choice["message"]["refusal"] = None  # the API's message always carries it
        choice["logprobs"] = None
        resp = {
            "id": prefix + rid,
            "object": obj,
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(work, len(words)),
        }
        if self.pd.keeps_kv(body):  # a prefill for a remote decode: where its KV is kept
            resp["kv_transfer_params"] = self.pd.hold(prompt)
        if request.headers.get(SIM_INFO_HEADER):
            resp["llmgw_sim"] = self.sim_info(work, len(words))
        return web.json_response(resp, headers=self._headers(work))

    def _chosen_words(self, body: dict[str, Any]) -> list[str] | None:
        """A configured answer, or a JSON value for a response_format (unless that probe is to fail)."""
        canned = canned_answer(self.behaviour.answers, body)
        if canned is not None:
            return canned.split(" ")
        schema = response_schema(body)
        if schema is not None and "response_format" not in self.behaviour.fail_probes:
            return json.dumps(schema_sample(schema)).split(" ")
        return None

    def _headers(self, work: Work) -> dict[str, str]:
        assert work.timing is not None
        return {
            "x-llmgw-sim-cached-tokens": str(work.timing.cached_tokens),
            "x-llmgw-sim-prefill-ms": f"{work.timing.prefill_ms:g}",
        }

    async def stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        work: Work,
        chat: bool,
        answer: tuple[list[str], str],
    ) -> web.StreamResponse:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        include_usage = include_usage and "stream_usage" not in self.behaviour.fail_probes
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        obj = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time())
        await self.admit(work)
        words, text_finish = answer
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **self._headers(work)})
        sent = 0
        try:
            await resp.prepare(request)
            self.stats.observe_ttft(time.monotonic() - work.started + work.queue_ms / 1000)

            async def send(choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> None:
                chunk = {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": self.model,
                    "choices": choices,
                }
                if include_usage:
                    chunk["usage"] = None
                chunk.update(extra or {})
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

            if chat:
                await send(
                    [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
                )
            calls = tool_calls(body) if chat and "tools" not in self.behaviour.fail_probes else []
            for index, call in enumerate(calls):
                sent += await self._stream_tool_call(send, index, call, work)
            for i, word in enumerate(words if not calls else ()):
                await self.decode_one(work)
                piece = word if i == 0 and not _continues(body) else " " + word
                delta: dict[str, Any] = {"delta": {"content": piece}} if chat else {"text": piece}
                await send([{"index": 0, **delta, "finish_reason": None, "logprobs": None}])
                sent += 1
            last: dict[str, Any] = {"delta": {}} if chat else {"text": ""}
            finish = text_finish if not calls else "tool_calls"
            await send([{"index": 0, **last, "finish_reason": finish, "logprobs": None}])
            if include_usage:
                extra: dict[str, Any] = {"usage": self.usage(work, sent)}
                if request.headers.get(SIM_INFO_HEADER):
                    extra["llmgw_sim"] = self.sim_info(work, sent)
                await send([], extra)
            await resp.write(b"data: [DONE]\n\n")
        finally:
            self.finish(work, sent)
        return resp

    async def _stream_tool_call(self, send: Any, index: int, call: ToolCall, work: Work) -> int:
        """A tool call as OpenAI streams one (the `index`-th of the answer's): the id and name first, then the
        arguments word by word."""
        head = tool_call_obj((call[0], call[1], ""))
        await send([{"index": 0, "delta": {"tool_calls": [{"index": index, **head}]}, "finish_reason": None}])
        pieces = call[2].split(" ")
        for i, piece in enumerate(pieces):
            await self.decode_one(work)
            args = {"index": index, "function": {"arguments": piece if i == 0 else " " + piece}}
            await send([{"index": 0, "delta": {"tool_calls": [args]}, "finish_reason": None}])
        return len(pieces)

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await self.read_body(request)
        if isinstance(body, web.Response):
            return body
        raw = body.get("input", "")
        inputs = raw if isinstance(raw, list) else [raw]
        data = [
            {"object": "embedding", "index": i, "embedding": embedding(str(text))}
            for i, text in enumerate(inputs)
        ]
        tokens = sum(len(tokenize(str(t))) for t in inputs)
        self.stats.prompt_tokens += tokens
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": self.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def rerank(self, request: web.Request) -> web.Response:
        """Cohere/Jina-style rerank as vLLM and llama.cpp answer it, scored by word overlap."""
        body = await self.read_body(request)
        if isinstance(body, web.Response):
            return body
        query, docs = body.get("query"), body.get("documents")
        if not isinstance(query, str) or not isinstance(docs, list) or not docs:
            return openai_error(
                400, "query must be a string, documents a non-empty list", "invalid_request_error"
            )
        texts = [d.get("text", "") if isinstance(d, dict) else str(d) for d in docs]
        ranked = sorted(range(len(texts)), key=lambda i: (-relevance(query, texts[i]), i))
        top_n = body.get("top_n")
        if isinstance(top_n, int) and top_n > 0:
            ranked = ranked[:top_n]
        results = []
        for i in ranked:
            result: dict[str, Any] = {"index": i, "relevance_score": relevance(query, texts[i])}
            if body.get("return_documents", True):
                result["document"] = {"text": texts[i]}
            results.append(result)
        tokens = len(texts) * len(tokenize(query)) + sum(len(tokenize(t)) for t in texts)
        self.stats.prompt_tokens += tokens
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        rid = "rerank-" + uuid.uuid4().hex
        return web.json_response({"id": rid, "model": self.model, "usage": usage, "results": results})

    async def score(self, request: web.Request) -> web.Response:
        """vLLM's /v1/score: text_1 against text_2 (one to one, one to many, or pairwise)."""
        body = await self.read_body(request)
        if isinstance(body, web.Response):
            return body
        first, second = body.get("text_1"), body.get("text_2")
        lefts = first if isinstance(first, list) else [first]
        rights = second if isinstance(second, list) else [second]
        if not all(isinstance(t, str) for t in [*lefts, *rights]) or not lefts or not rights:
            return openai_error(
                400, "text_1 and text_2 must be strings or lists of strings", "invalid_request_error"
            )
        if len(lefts) == 1:
            lefts = lefts * len(rights)
        if len(lefts) != len(rights):
            return openai_error(400, "text_1 and text_2 must be the same length", "invalid_request_error")
        data = [
            {"index": i, "object": "score", "score": relevance(a, b)}
            for i, (a, b) in enumerate(zip(lefts, rights, strict=True))
        ]
        tokens = sum(len(tokenize(a)) + len(tokenize(b)) for a, b in zip(lefts, rights, strict=True))
        self.stats.prompt_tokens += tokens
        usage = {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
        rid = "score-" + uuid.uuid4().hex
        return web.json_response(
            {
                "id": rid,
                "object": "list",
                "created": int(time.time()),
                "model": self.model,
                "data": data,
                "usage": usage,
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        denied = self.check_auth(request)
        if denied is not None:
            return denied
        card = {"id": self.model, "object": "model", "created": self.created, "owned_by": OWNED_BY}
        return web.json_response({"object": "list", "data": [card]})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """vLLM's POST /reset_prefix_cache: drop every cached block (AllBlocksCleared on the event stream)."""
        denied = self.check_auth(request)
        if denied is not None:
            return denied
        self.cache.clear()
        if self.events is not None:
            self.events.publish(batch_events(None, self.cfg.block_size, cleared=True))
        return web.Response(text="")

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=render_metrics(self), content_type="text/plain", charset="utf-8")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_post("/v1/rerank", self.rerank)
        app.router.add_post("/v1/score", self.score)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post(KV_PATH, self.pd.serve_pull)
        return app


def _continues(body: dict[str, Any]) -> bool:
    """A chat continuing its final assistant message: its first word follows that message's last."""
    return body.get("continue_final_message") is True


def engine_from_args(ns: argparse.Namespace) -> SimEngine:
    if ns.max_concurrency < 1:
        raise SystemExit("--max-concurrency must be at least 1")
    cfg = LatencyConfig(
        prefill_ms_per_token=ns.prefill_ms_per_token,
        decode_ms_per_token=ns.decode_ms_per_token,
        max_concurrency=ns.max_concurrency,
        block_size=ns.block_size,
        capacity_blocks=ns.prefix_cache,
        kv_capacity_tokens=ns.kv_capacity_tokens,
        default_max_tokens=ns.max_tokens_default,
        hash_seed=ns.hash_seed,
        context_length=ns.context_length,
    )
    engine = SimEngine(ns.model, cfg, os.environ.get(ns.api_key_env) or None, behaviour_from_args(ns))
    if ns.judge_unsafe is not None:
        rules = [rule.partition("=") for rule in ns.judge_unsafe]
        if any(not word or not sep or not codes for word, sep, codes in rules):
            raise SystemExit("--judge-unsafe takes WORD=CATEGORIES, e.g. --judge-unsafe bomb=S9")
        engine.judge_rules = [(word, codes) for word, _sep, codes in rules]
    if ns.kv_events_port is not None:
        engine.events = KvEventPublisher(ns.kv_events_host, ns.kv_events_port)
    return engine


def run(ns: argparse.Namespace) -> None:
    engine = engine_from_args(ns)
    if ns.load_ms < 0:
        raise SystemExit("--load-ms must be 0 or more")
    if ns.load_ms:
        print(f"llmgw sim engine: loading {ns.model} for {ns.load_ms:g} ms", flush=True)
        time.sleep(ns.load_ms / 1000)  # nothing listens yet: health checks are refused, as while vLLM loads
    print(f"llmgw sim engine: model {ns.model} on http://{ns.host}:{ns.port}", flush=True)
    engine.pd.host, engine.pd.port = ns.host, ns.port
    web.run_app(engine.app(), host=ns.host, port=ns.port, print=None, access_log=None)


def main(argv: Sequence[str] | None = None) -> None:
    run(build_parser().parse_args(argv))


if __name__ == "__main__":
    main()
