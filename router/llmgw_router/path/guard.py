"""Guardrails on the request path: which apply to a request, the input screen (block, redact, warn), the
judge call, the output screen of a whole answer, and the sliding-window screen of a stream (guard_stream.py).

The decisions are llmgw.core.evals.guardrails'; this is the shell: it compiles the snapshot's guardrails once per
table, asks a judge model's endpoint for a raw completion in Llama Guard 3's format, counts verdicts, and
remembers each guardrail's judge trouble for the status page. The catalog resolved every attachment down the
tenant tree; the router reads `snapshot.guard` as published.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw.core.evals import guardrails as gr
from llmgw.core.words import parse_duration
from llmgw_router.decisions.scheduler import RequestInfo
from llmgw_router.fleet.metrics import PREFIX
from llmgw_router.fleet.table import RoutingTable
from llmgw_router.path.accounting import Call
from llmgw_router.path.guard_stream import GuardedStream
from llmgw_router.routing.forwarding import Forwarding
from llmgw_router.server.errors import ApiError, error_response
from llmgw_router.server.exchange import Exchange, HttpReply

__all__ = ["GUARDED_KINDS", "Guard", "JudgeAsk", "Screened", "ask_judge", "blocked_error"]

GUARDED_KINDS = frozenset({"chat", "completions", "responses", "images"})  # the kinds whose text is a prompt

log = logging.getLogger(__name__)

# Asks a judge model for a raw completion of `prompt` within `timeout` seconds; None: it could not answer
# (no endpoint, refused, timed out). The service implements it over its forwarding and engine client.
JudgeAsk = Callable[[str, str, float], Awaitable[str | None]]


@dataclass(slots=True)
class Screened:
    """The input screen's outcome: the body to send (redacted, or the client's) and the verdict kept."""

    body: dict[str, Any]
    changed: bool
    verdict: gr.Verdict


class _GuardCollector(Collector):
    def __init__(self, guard: Guard) -> None:
        self._guard = guard

    def collect(self) -> Iterator[Metric]:
        on = GaugeMetricFamily(PREFIX + "guardrails_enabled", "0 while the Cluster turns every check off")
        down = GaugeMetricFamily(
            PREFIX + "guardrail_judge_unavailable",
            "1 while a guardrail's judge could not answer its last ask",
            labels=["guardrail", "fails"],
        )
        table = self._guard.table()
        on.add_metric([], 1.0 if table is None or table.snapshot.guard.enabled else 0.0)
        for name, status in self._guard.status().items():
            if status["judge"] is not None:
                down.add_metric([name, status["on_judge_error"]], 0.0 if status["judge"] == "ok" else 1.0)
        yield from (on, down)


class Guard:
    """The guardrails of one router process."""

    def __init__(self, table: Callable[[], RoutingTable | None], registry: CollectorRegistry) -> None:
        self.table = table
        self.verdicts = Counter(
            PREFIX + "guardrail_verdicts",
            "Guardrail findings, by guardrail, rule, stage and the action taken (block, redact, warn, "
            "unjudged: a judge that could not answer and failed open)",
            ["guardrail", "rule", "stage", "action"],
            registry=registry,
        )
        registry.register(_GuardCollector(self))
        self._compiled_for: RoutingTable | None = None
        self._compiled: dict[str, gr.CompiledGuardrail] = {}
        self._chains: dict[tuple[str | None, str], tuple[gr.CompiledGuardrail, ...]] = {}
        self._judge_trouble: dict[str, str | None] = {}  # guardrail -> last failure (None: answered)

    # ------------------------------------------------------------------ which apply

    def guards_for(
        self, table: RoutingTable, project: str | None, model: str
    ) -> tuple[gr.CompiledGuardrail, ...]:
        """The project's guardrails (inherited down its tenant tree) and the model's, each once; none while
        the Cluster turns them off. Memoised per table: a snapshot is when they change."""
        guard = table.snapshot.guard
        if not guard.enabled or not guard.guardrails:
            return ()
        if table is not self._compiled_for or len(self._chains) > 100_000:
            self._compiled_for, self._chains = table, {}
            self._compiled = {n: gr.compile_guardrail(n, s) for n, s in guard.guardrails.items()}
        key = (project, model)
        found = self._chains.get(key)
        if found is None:
            names = [
                *(guard.projects.get(project, ()) if project is not None else ()),
                *guard.models.get(model, ()),
            ]
            unique = dict.fromkeys(n for n in names if n in self._compiled)
            found = self._chains[key] = tuple(self._compiled[n] for n in unique)
        return found

    def status(self) -> dict[str, dict[str, Any]]:
        """Each guardrail as the status page shows it: mode, stages, and its judge's state (ok, the last
        failure, or `not asked yet`; None without a judge) with what it does then (fails open or closed)."""
        table = self.table()
        if table is None:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for name, spec in table.snapshot.guard.guardrails.items():
            judge: str | None = None
            if spec.judge is not None:
                trouble = self._judge_trouble.get(name, "not asked yet")
                judge = "ok" if name in self._judge_trouble and trouble is None else trouble
            out[name] = {
                "mode": spec.mode,
                "stages": list(spec.stages),
                "judge": judge,
                "on_judge_error": spec.on_judge_error,
            }
        return out

    # ------------------------------------------------------------------ screens

    async def screen_input(
        self, guards: tuple[gr.CompiledGuardrail, ...], body: dict[str, Any], ask: JudgeAsk | None = None
    ) -> Screened:
        """Run the input checks: the verdict, and the body redacted when that is the action. The judges are
        asked too when `ask` is given (else by judge_input, once the request is admitted); never when a
        deterministic check already blocks (their answer could change nothing)."""
        mine = [g for g in guards if g.checks("input")]
        unjudged: list[str] = []
        findings = await scan_off_loop(mine, "\n".join(gr.texts_of(body)), "input", unjudged)
        verdict = gr.decide(mine, findings, "input", unjudged)
        if ask is not None:
            verdict = await self.judge_input(guards, body, verdict, ask)
        elif not _judge_pending(mine, verdict):
            self._count(verdict)
        if verdict.action == "redact":
            redactors = [g for g in mine if g.spec.mode == "redact"]
            return Screened(gr.redact_body(redactors, body), True, verdict)
        return Screened(body, False, verdict)

    async def judge_input(
        self, guards: tuple[gr.CompiledGuardrail, ...], body: dict[str, Any], first: gr.Verdict, ask: JudgeAsk
    ) -> gr.Verdict:
        """The judges' part of the input screen, added to the deterministic verdict `first` (and counted)."""
        mine = [g for g in guards if g.checks("input")]
        if not _judge_pending(mine, first):
            return first
        findings, unjudged = list(first.findings), list(first.unjudged)
        turns = self._for_judge(gr.conversation_of(body))
        for g in mine:
            if g.spec.judge is not None and gr.decide(mine, findings, "input").action != "block":
                finding = await self._judge(g, turns, ask, unjudged, "input")
                findings += [finding] if finding is not None else []
        verdict = gr.decide(mine, findings, "input", unjudged)
        self._count(verdict)
        return verdict

    async def screen_answer(
        self, guards: tuple[gr.CompiledGuardrail, ...], body: dict[str, Any], answer: bytes, ask: JudgeAsk
    ) -> gr.Verdict:
        """The output checks of a whole answer (deterministic ones and a judge); the caller refuses a block."""
        mine = [g for g in guards if g.checks("output")]
        text = answer_text(answer)
        if not mine or text is None:
            return gr.Verdict(stage="output")
        unjudged: list[str] = []
        findings = await scan_off_loop(mine, text, "output", unjudged)
        for g in mine:
            if g.spec.judge is not None and gr.decide(mine, findings, "output").action != "block":
                finding = await self._judge(g, gr.conversation_of(body, text), ask, unjudged, "output")
                findings += [finding] if finding is not None else []
        verdict = gr.decide(mine, findings, "output", unjudged)
        self._count(verdict)
        return verdict

    async def judge_answer(
        self, guards: tuple[gr.CompiledGuardrail, ...], body: dict[str, Any], text: str, ask: JudgeAsk
    ) -> gr.Verdict:
        """The output judges alone, on a whole streamed answer (its deterministic checks ran as it came)."""
        mine = [g for g in guards if g.checks("output") and g.spec.judge is not None]
        findings: list[gr.Finding] = []
        unjudged: list[str] = []
        turns = self._for_judge(gr.conversation_of(body, text))
        for g in mine:
            finding = await self._judge(g, turns, ask, unjudged, "output")
            findings += [finding] if finding is not None else []
        verdict = gr.decide(mine, findings, "output", unjudged)
        self._count(verdict)
        return verdict

    def _for_judge(self, turns: list[gr.Turn]) -> list[gr.Turn]:
        """The conversation cut to what a judge reads (M12: a prompt padded past the judge's context made it
        answer 400, which failed open): at most JUDGE_TURN_CHARS per turn, the head of each kept."""
        return [(who, text[:JUDGE_TURN_CHARS]) for who, text in turns]

    async def _judge(
        self,
        g: gr.CompiledGuardrail,
        turns: list[gr.Turn],
        ask: JudgeAsk,
        unjudged: list[str],
        stage: gr.Stage,
    ) -> gr.Finding | None:
        judge = g.spec.judge
        assert judge is not None
        began = time.monotonic()
        text = await ask(judge.model, gr.llama_guard_prompt(turns), parse_duration(judge.timeout))
        answer = gr.parse_judge_answer(text) if text is not None else None
        if answer is None:
            why = "no answer" if text is None else "an answer not in Llama Guard's format"
            self._trouble(g.name, f"{why} from `{judge.model}` after {time.monotonic() - began:.1f} s")
            if g.spec.on_judge_error == "closed":
                return gr.Finding(g.name, "judge_unavailable")
            unjudged.append(g.name)
            return None
        self._trouble(g.name, None)
        return gr.judge_finding(g, answer)

    def _trouble(self, name: str, why: str | None) -> None:
        """Keep the judge's state; said once when it fails (not on every request) and once when it clears."""
        known, was = name in self._judge_trouble, self._judge_trouble.get(name)
        self._judge_trouble[name] = why
        if why is not None and (not known or was is None):
            log.warning("guardrail %s: its judge could not answer (%s)", name, why)
        elif why is None and was is not None:
            log.info("guardrail %s: its judge answers again", name)

    def _count(self, verdict: gr.Verdict) -> None:
        for f in verdict.findings:
            self.verdicts.labels(f.guardrail, f.rule, verdict.stage, verdict.action).inc()
        for name in verdict.unjudged:
            self.verdicts.labels(name, "judge", verdict.stage, "unjudged").inc()

    # ------------------------------------------------------------------ on the request path

    async def screen_request(
        self,
        exchange: Exchange,
        guards: tuple[gr.CompiledGuardrail, ...],
        body: dict[str, Any],
        raw: bytes,
        call: Call,
    ) -> tuple[dict[str, Any], bytes, gr.Verdict]:
        """The deterministic input screen for the service, before sizing (a redacted prompt is what is sized
        and sent): the verdict kept on `call` (its usage row), a block raised as its 400, a redacted body
        re-encoded for the engine. A request no guardrail could read is refused first (M12)."""
        unreadable = unscreenable(exchange, guards, body)
        if unreadable is not None:
            call.code = unreadable.code or "guardrail_unscannable"
            raise unreadable
        screened = await self.screen_input(guards, body)
        verdict = screened.verdict
        call.guard = {"input": verdict.record()}
        if verdict.action == "redact" and not exchange.surface.redacts_in_place:
            # A Responses turn is rebuilt from its own input for each engine: redacting the chat it became
            # would not reach the engine, so what would be redacted is refused instead.
            verdict = dataclasses.replace(verdict, action="block")
            call.guard = {"input": verdict.record()}
        if verdict.action == "block":
            call.code = "guardrail_blocked"
            raise blocked_error(verdict)
        if screened.changed:
            return screened.body, json.dumps(screened.body).encode(), verdict
        return body, raw, verdict

    async def judge_request(
        self,
        guards: tuple[gr.CompiledGuardrail, ...],
        body: dict[str, Any],
        first: gr.Verdict,
        call: Call,
        ask: JudgeAsk,
    ) -> None:
        """The input judges for the service, once the request is within its limits (M12: a tenant at its
        rate limit or out of budget does not get to drive the shared judge): a block raised as its 400."""
        verdict = await self.judge_input(guards, body, first, ask)
        if verdict is first:
            return
        call.guard = {**(call.guard or {}), "input": verdict.record()}
        if verdict.action == "block":
            call.code = "guardrail_blocked"
            raise blocked_error(verdict)

    async def forward_screened(
        self,
        exchange: Exchange,
        guards: tuple[gr.CompiledGuardrail, ...],
        body: dict[str, Any],
        call: Call,
        ask: JudgeAsk,
        forward: Callable[[Exchange], Awaitable[HttpReply | None]],
    ) -> HttpReply | None:
        """Forward with the output screen: a stream through GuardedStream (cut on a block; held and judged
        whole when a judge applies), a whole answer checked before the client sees it (a block replaces it
        with the 400). A Responses or Messages stream under an output guardrail was refused before
        (`unscreenable`): its exchange translates event by event and has no place for a chat error event."""
        mine = tuple(g for g in guards if g.checks("output"))
        if body.get("stream") is True and not exchange.surface.streams_translated:

            async def judge(text: str) -> gr.Verdict:
                return await self.judge_answer(mine, body, text, ask)

            judged = any(g.spec.judge is not None for g in mine)
            if judged:
                # The judge reads the whole answer before its end goes out: the slots stay taken while it
                # does, and go back at the request's end (settle), not when the engine's stream ends.
                call.ending = None
            wrapped = GuardedStream(exchange, mine, self._count, judge if judged else None)
            reply = await forward(wrapped)
            if wrapped.verdict is not None:
                call.guard = {**(call.guard or {}), "output": wrapped.verdict.record()}
            if wrapped.cut and call.result is not None:
                # Not a client that left: the client has the whole answer it may have, ended by the router.
                call.result.client_gone, call.result.finished = False, True
                call.code = "guardrail_blocked"
            return reply
        reply = await forward(exchange)
        if reply is None or reply.status != 200:
            return reply
        verdict = await self.screen_answer(guards, body, reply.body, ask)
        call.guard = {**(call.guard or {}), "output": verdict.record()}
        if verdict.action != "block":
            return reply
        call.code = "guardrail_blocked"
        refused = error_response(blocked_error(verdict))
        refused.headers = {**reply.headers, "Content-Type": "application/json"}
        return refused


# How much of each turn a judge reads: Llama Guard 3's context is 8k tokens, and a turn cut to its head is
# judged on what it says first (what a model reads first, too) rather than refused by the judge's engine.
JUDGE_TURN_CHARS = 6000


def _judge_pending(mine: Sequence[gr.CompiledGuardrail], verdict: gr.Verdict) -> bool:
    """Whether a judge is still to be asked after the deterministic verdict (not when it already blocks)."""
    return verdict.action != "block" and any(g.spec.judge is not None for g in mine)


def unscreenable(
    exchange: Exchange, guards: Sequence[gr.CompiledGuardrail], body: dict[str, Any]
) -> ApiError | None:
    """The 400 for a request its guardrails could not read (M12), or None: a prompt of token ids under an
    input check; a streamed Responses or Messages answer under an output check."""
    reading = next((g for g in guards if g.checks("input")), None)
    if reading is not None and gr.token_prompt(body):
        return ApiError(
            400,
            f"Guardrail `{reading.name}` checks this request's prompt, and a prompt of token ids cannot be "
            "read: send the prompt as text.",
            "guardrail_unscannable",
            param="prompt",
        )
    screening = next((g for g in guards if g.checks("output")), None)
    if screening is not None and body.get("stream") is True and exchange.surface.streams_translated:
        return ApiError(
            400,
            f"Guardrail `{screening.name}` checks this model's answers, and a streamed answer of this API "
            "cannot be checked: send `stream: false` (or use /v1/chat/completions, whose streams are "
            "checked).",
            "guardrail_stream_unscreenable",
            param="stream",
        )
    return None


# A text this short is scanned on the loop (linear checks over it take microseconds; a thread's hand-off costs
# more), unless a repo regex could backtrack over it; a longer one, or one such a regex reads, in a worker
# thread with SCAN_DEADLINE_S. A regex that tries a bounded number of ways at each position (a literal, a
# class, a fixed count: CompiledGuardrail.bounded) is as linear as the built-in checks.
_INLINE_SCAN_CHARS = gr.SHORT_TEXT_CHARS  # and its bounded regexes search it without their deadline
SCAN_DEADLINE_S = 5.0


async def scan_off_loop(
    guards: Sequence[gr.CompiledGuardrail], text: str, stage: gr.Stage, unjudged: list[str]
) -> list[gr.Finding]:
    """The deterministic checks of `guards` over `text`, never holding the event loop for long (H7): in a
    worker thread with a deadline. A scan past its deadline fails as each guardrail's `on_judge_error` says:
    closed is a `scan_deadline` finding (refused), open is recorded as not checked (`unjudged`)."""
    if not guards:
        return []
    if len(text) <= _INLINE_SCAN_CHARS and all(g.bounded for g in guards):
        return _scan_all(guards, text, stage)
    # The loop's executor and a timeout on this task: what asyncio.to_thread and wait_for do, without the
    # context copy, the wrapping task and the extra future they add to every screened request.
    work = asyncio.get_running_loop().run_in_executor(None, _scan_all, guards, text, stage)
    try:
        async with asyncio.timeout(SCAN_DEADLINE_S):
            return await work
    except TimeoutError:
        log.warning(
            "guardrail scan of a %d-character %s passed its %.0f s deadline",
            len(text),
            stage,
            SCAN_DEADLINE_S,
        )
        unjudged += [g.name for g in guards if g.spec.on_judge_error == "open"]
        return [gr.Finding(g.name, "scan_deadline") for g in guards if g.spec.on_judge_error == "closed"]


def _scan_all(guards: Sequence[gr.CompiledGuardrail], text: str, stage: gr.Stage) -> list[gr.Finding]:
    return [f for g in guards for f in gr.scan(g, text, stage)]


def blocked_error(verdict: gr.Verdict) -> ApiError:
    """The OpenAI-shaped refusal of a block: a 400 naming the guardrail, the rule and any hazard, never the
    content; a 503 when it is a judge that could not answer and fails closed."""
    first = verdict.first
    if first is not None and first.rule == "judge_unavailable":
        return ApiError(
            503,
            f"Guardrail `{first.guardrail}` could not get an answer from its judge and fails closed; retry "
            "shortly.",
            "guardrail_unavailable",
            "server_error",
            headers={"Retry-After": "5"},
        )
    return ApiError(400, gr.refusal_message(verdict), "guardrail_blocked", "invalid_request_error")


async def ask_judge(
    table: RoutingTable | None,
    forwarding: Forwarding,
    session: aiohttp.ClientSession | None,
    model: str,
    prompt: str,
    limit_s: float,
) -> str | None:
    """A raw completion of `prompt` from one of the judge model's endpoints (claimed and released like any
    request's, so the judge's load is seen), or None when none could answer within `limit_s`. Through the
    judge's admission (M12): an endpoint with no free slot is not asked beyond its slots, which is no answer
    (the guardrail's on_judge_error decides), never a judge driven past what it serves."""
    canonical = table.resolve(model) if table is not None else None
    if table is None or canonical is None or session is None:
        return None
    got = forwarding.claim(table, canonical, RequestInfo(), need_room=True, take_stale=True)
    if got is None:
        return None
    ep = got[0]
    headers = {"Content-Type": "application/json"}
    key = ep.provider_key if ep.is_provider else ep.spec.api_key
    if key:
        headers["Authorization"] = f"Bearer {key}"
    payload = {"model": ep.upstream_model or canonical, "prompt": prompt, "max_tokens": 16, "temperature": 0}
    try:
        async with asyncio.timeout(limit_s):
            async with session.post(ep.api_base + "/completions", json=payload, headers=headers) as resp:
                data = await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        forwarding.failed(ep, f"judge ask: {type(exc).__name__}")
        return None
    finally:
        forwarding.release(ep, canonical)
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    text = choices[0].get("text")
    return text if isinstance(text, str) else None


def answer_text(answer: bytes) -> str | None:
    """The generated text of a whole chat or completions answer (None: not one)."""
    try:
        obj = orjson.loads(answer)  # the proxy's parser: a quarter of json's cost on a whole answer
    except orjson.JSONDecodeError:
        return None
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list):
        return None
    parts: list[str] = []
    for c in choices:
        if not isinstance(c, dict):
            continue
        message = c.get("message")
        content = message.get("content") if isinstance(message, dict) else c.get("text")
        if isinstance(content, str):
            parts.append(content)
        if isinstance(message, dict):  # what a tool is asked to do is an answer too (M12)
            calls = message.get("tool_calls")
            legacy = message.get("function_call")
            parts += gr.tool_arguments([*(calls if isinstance(calls, list) else ()), {"function": legacy}])
    return "\n".join(parts)
