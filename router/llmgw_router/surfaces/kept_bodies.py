"""Request and answer bodies kept on the content vault (docs/tenancy.md, Bodies kept and replayed): the shell
around llmgw.core.traffic.kept_bodies, on the vault stored responses use (surfaces/responses/keeper.py).

Only on a router with the content key, only for a project whose `retention.bodies` says so, only the share of
its requests it names. The request path asks `begin` just before forwarding (what it asks of a project that keeps
nothing is one dict lookup); a stream's answer is recorded as it goes out, cut at `max_bytes`; `finish`
redacts both bodies with the PII rules of the guardrails that apply (every PII shape when none names one) and
seals them in a task of their own, after the answer went out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import get_args

from llmgw.core.config.specs.guardrail_spec import GuardrailSpec, PiiKind
from llmgw.core.config.specs.tenant.retention_spec import BodyRetention
from llmgw.core.evals.guardrails import CompiledGuardrail, compile_guardrail, redact, redact_body
from llmgw.core.snapshot import Tenants
from llmgw.core.traffic.kept_bodies import KIND, KeptBody, body_retention, cut, sampled
from llmgw_router.server.exchange import Exchange, HttpReply, WrappedExchange
from llmgw_router.surfaces.responses.keeper import Vault

__all__ = ["BodyKeeper", "BodyRecorder", "Keeping"]

log = logging.getLogger(__name__)

_EVERY_PII: tuple[PiiKind, ...] = get_args(PiiKind)


class BodyRecorder(WrappedExchange):
    """The client's exchange, with the first `limit` bytes of a stream's answer kept (`cut` past them)."""

    def __init__(self, inner: Exchange, limit: int) -> None:
        super().__init__(inner)
        self._limit = limit
        self._chunks: list[bytes] = []
        self._kept = 0
        self.cut = False

    def _keep(self, chunk: bytes) -> None:
        room = self._limit - self._kept
        if room <= 0:
            self.cut = self.cut or bool(chunk)
            return
        piece = chunk[:room]
        self._chunks.append(piece)
        self._kept += len(piece)
        self.cut = len(chunk) > room

    async def write(self, chunk: bytes, limit_s: float) -> None:
        self._keep(chunk)
        await self.inner.write(chunk, limit_s)

    async def write_eof(self, limit_s: float, last: bytes = b"") -> None:
        self._keep(last)
        await self.inner.write_eof(limit_s, last)

    def kept(self) -> bytes:
        return b"".join(self._chunks)


@dataclass(slots=True)
class Keeping:
    """One request whose bodies are to be kept: the rule, the request as it came, its recorder."""

    rule: BodyRetention
    ttl_s: float
    project: str
    request: bytes
    pii: CompiledGuardrail | None  # what redacts it; None: `redact: false`
    recorder: BodyRecorder


class BodyKeeper:
    """Kept bodies of every project, on one vault; `clock` is the wall clock TTLs are read on."""

    def __init__(self, vault: Vault, clock: Callable[[], float] = time.time) -> None:
        self.vault = vault
        self.clock = clock
        self._tasks: set[asyncio.Task[None]] = set()
        self._failing = False

    def begin(
        self,
        exchange: Exchange,
        tenants: Tenants,
        project: str,
        request_id: str,
        raw: bytes,
        guards: Sequence[CompiledGuardrail],
    ) -> tuple[Exchange, Keeping | None]:
        """The exchange to answer through and what to keep; `exchange` itself and None when nothing is kept."""
        spec = tenants.projects.get(project)
        kept = body_retention(spec.retention) if spec is not None and not spec.no_store else None
        if kept is None or not sampled(request_id, kept[0].share):
            return exchange, None
        rule, ttl_s = kept
        recorder = BodyRecorder(exchange, rule.max_bytes)
        return recorder, Keeping(
            rule, ttl_s, project, raw, _pii_of(guards) if rule.redact else None, recorder
        )

    def finish(
        self,
        keeping: Keeping,
        request_id: str,
        model: str,
        served: str | None,
        status: int,
        reply: HttpReply | None,
    ) -> None:
        """Seal what the request and its answer were, in a task (the answer has gone out already)."""
        answer = reply.body if reply is not None else keeping.recorder.kept()
        answer_cut = keeping.recorder.cut if reply is None else len(answer) > keeping.rule.max_bytes
        record = _record(keeping, request_id, model, served, status, reply is None, answer, answer_cut)
        record = dataclasses.replace(record, time=self.clock())
        task = asyncio.get_running_loop().create_task(self._put(keeping, request_id, record.data()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _put(self, keeping: Keeping, request_id: str, data: bytes) -> None:
        try:
            await self.vault.put(KIND, keeping.project, request_id, data, keeping.ttl_s, self.clock())
        except Exception as exc:  # the answer went out and is charged; only its keeping failed
            if not self._failing:
                log.warning("cannot keep request bodies (%s): not kept until it works", exc)
                self._failing = True
            return
        if self._failing:
            log.info("request bodies are kept again")
            self._failing = False

    async def drain(self) -> None:
        """Wait for the bodies being sealed (a router stopping, a test reading them at once)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _pii_of(guards: Sequence[CompiledGuardrail]) -> CompiledGuardrail:
    """One guardrail of the PII shapes the applying guardrails check (their patterns and keywords are theirs
    to act on, not the keeping's); every shape when none names one."""
    kinds = {k for g in guards for k in g.spec.pii} or set(_EVERY_PII)
    return _pii_guardrail(tuple(k for k in _EVERY_PII if k in kinds))


@functools.cache  # at most the 15 sets of the four shapes: compiled once each, not per request
def _pii_guardrail(kinds: tuple[PiiKind, ...]) -> CompiledGuardrail:
    return compile_guardrail("kept-bodies", GuardrailSpec(pii=list(kinds)))


def _record(
    keeping: Keeping,
    request_id: str,
    model: str,
    served: str | None,
    status: int,
    stream: bool,
    answer: bytes,
    answer_cut: bool,
) -> KeptBody:
    limit = keeping.rule.max_bytes
    request, request_cut = cut(keeping.request, limit)
    answer_text, cut_here = cut(answer, limit)
    pii = keeping.pii
    if pii is not None:
        request = _redacted_request(pii, request, request_cut)
        answer_text = _redacted_answer(pii, answer_text, stream)
    return KeptBody(
        request_id=request_id,
        project=keeping.project,
        model=model,
        served=served,
        status=status,
        stream=stream,
        request=request,
        answer=answer_text if answer else None,
        request_cut=request_cut,
        answer_cut=answer_cut or cut_here,
        redacted=pii is not None,
    )


def _redacted_request(pii: CompiledGuardrail, text: str, was_cut: bool) -> str:
    """The request redacted field by field while it is whole JSON (it stays replayable), as text otherwise."""
    if not was_cut:
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if isinstance(body, dict):
            return json.dumps(redact_body([pii], body), ensure_ascii=False)
    return redact(pii, text)


def _redacted_answer(pii: CompiledGuardrail, text: str, stream: bool) -> str:
    """The answer with its choices' texts redacted, its JSON (each event's, for a stream) kept as JSON: ids,
    times and counts are not PII, and a redaction of them would leave what no reader parses."""
    if not stream:
        return _redacted_event(pii, text)
    lines = []
    for line in text.split("\n"):
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            line = "data: " + _redacted_event(pii, line[5:].strip())
        lines.append(line)
    return "\n".join(lines)


def _redacted_event(pii: CompiledGuardrail, text: str) -> str:
    try:
        obj = json.loads(text)
    except ValueError:
        return redact(pii, text)  # cut at max_bytes: no JSON is left to keep
    choices = obj.get("choices") if isinstance(obj, dict) else None
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        if isinstance(choice.get("text"), str):
            choice["text"] = redact(pii, choice["text"])
        for part in ("message", "delta"):
            inner = choice.get(part)
            if isinstance(inner, dict) and isinstance(inner.get("content"), str):
                inner["content"] = redact(pii, inner["content"])
    return json.dumps(obj, ensure_ascii=False)
