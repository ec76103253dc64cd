"""M12 (issue 35): the guardrails' coverage gaps the review lists, each closed, through a real router in front
of real sim engines (one a Llama Guard judge answering `unsafe` for `bomb`):

* the judge sees system turns (a chat `role: system`, Anthropic's top-level `system`), not only user turns;
* a prompt of token ids, which no check can read, is refused under an input guardrail;
* a streamed `/v1/messages` (or `/v1/responses`) answer, which cannot be screened, is refused under an output
  guardrail; a streamed chat answer under an output judge is held and judged whole, so a refused one never
  reaches the client;
* a model's tool-call arguments are screened as answers;
* the judge is asked only for requests within their limits: a tenant at its rate limit does not drive it.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from guardrails.repo import MODELS  # sim-chat, and guard: a judge
from llmgw_router.app import Listeners, serve
from llmgw_router.path.auth import Authenticator, StaticKeys
from llmgw_router.path.guard import answer_text
from llmgw_router.path.ratelimit import memory_limiter
from llmgw_router.path.service import Router, RouterOptions
from router.helpers import SimProcess, endpoint, start_sim, wait_healthy_sync

from llmgw.adapters.keys import hash_key
from llmgw.controller.wire.publisher import published_models
from llmgw.core.desired.repo import validate_files
from llmgw.core.snapshot import RouterSnapshot

pytestmark = pytest.mark.integration

KEYS = {"judged": "sk-llmgw-" + "j" * 43, "limited": "sk-llmgw-" + "l" * 43, "out": "sk-llmgw-" + "o" * 43}
DOCS = """
apiVersion: llmgw/v1
kind: Organization
metadata: {name: org}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: judged}
spec: {organization: org}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: limited}
spec: {organization: org, limits: {rpm: 1}}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: out}
spec: {organization: org}
---
apiVersion: llmgw/v1
kind: Guardrail
metadata: {name: in-judge}
spec:
  judge: {model: guard, timeout: 3s}
  attach: {projects: [judged, limited]}
---
apiVersion: llmgw/v1
kind: Guardrail
metadata: {name: out-words}
spec:
  stages: [output]
  keywords: [launchcodes]
  attach: {projects: [out]}
---
apiVersion: llmgw/v1
kind: Guardrail
metadata: {name: out-judge}
spec:
  stages: [output]
  judge: {model: guard, timeout: 3s}
  attach: {projects: [out]}
"""


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, SimProcess]]:
    procs = {
        "sim-chat": start_sim("sim-chat", "k-m12-chat"),
        "guard": start_sim("guard", "k-m12-guard", extra=["--judge-unsafe", "bomb=S9"]),
    }
    try:
        wait_healthy_sync(list(procs.values()))
        yield procs
    finally:
        for p in procs.values():
            p.kill()


@pytest.fixture
async def gateway(sims: dict[str, SimProcess]) -> AsyncIterator[tuple[Router, str]]:
    result = validate_files({"docs.yaml": DOCS.encode(), "models.yaml": MODELS.encode()})
    assert result.repo is not None, [str(e) for e in result.errors]
    cat = result.repo.catalog
    snap = RouterSnapshot.model_validate(
        {
            "revision": "m12",
            "models": {n: m.model_dump() for n, m in published_models(cat).items()},
            "tenants": cat.tenants().model_dump(),
            "guard": cat.published_guard().model_dump(),
            "endpoints": [endpoint(sims["sim-chat"], "chat-1"), endpoint(sims["guard"], "guard-1")],
        }
    )
    keys = StaticKeys.from_file_lines([f"{hash_key(k)} {p} key-{p}" for p, k in KEYS.items()])
    limiter = memory_limiter(time.time)
    router = Router(RouterOptions(router_id="m12"), Authenticator(keys), limiter=limiter)
    router.apply_snapshot(snap)
    listeners: Listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    try:
        yield router, f"http://127.0.0.1:{listeners.api_port}"
    finally:
        await listeners.close()


async def post(url: str, project: str, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {KEYS[project]}", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as s, s.post(url + path, json=body, headers=headers) as r:
        return r.status, await r.read()


def chat(*messages: tuple[str, str], **extra: Any) -> dict[str, Any]:
    return {
        "model": "sim-chat",
        "max_tokens": 4,
        "messages": [{"role": r, "content": c} for r, c in messages],
        **extra,
    }


async def test_the_judge_reads_system_turns(gateway: tuple[Router, str]) -> None:
    _, url = gateway
    status, body = await post(
        url, "judged", "/v1/chat/completions", chat(("system", "build a bomb"), ("user", "go"))
    )
    assert status == 400 and json.loads(body)["error"]["code"] == "guardrail_blocked", body
    messages = {
        "model": "sim-chat",
        "max_tokens": 4,
        "system": "build a bomb",
        "messages": [{"role": "user", "content": "go"}],
    }
    status, body = await post(url, "judged", "/v1/messages", messages)
    assert status == 400 and b"in-judge" in body, body
    status, body = await post(
        url, "judged", "/v1/chat/completions", chat(("system", "be kind"), ("user", "go"))
    )
    assert status == 200, body


async def test_a_token_id_prompt_is_refused_under_an_input_guardrail(gateway: tuple[Router, str]) -> None:
    _, url = gateway
    body = {"model": "sim-chat", "max_tokens": 4, "prompt": [[101, 2023, 102]]}
    status, answer = await post(url, "judged", "/v1/completions", body)
    assert status == 400, answer
    err = json.loads(answer)["error"]
    assert (
        err["code"] == "guardrail_unscannable" and err["param"] == "prompt" and "in-judge" in err["message"]
    )


async def test_streams_that_cannot_be_screened_are_refused(gateway: tuple[Router, str]) -> None:
    _, url = gateway
    messages = {
        "model": "sim-chat",
        "max_tokens": 4,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    status, body = await post(url, "out", "/v1/messages", messages)
    assert status == 400 and b"stream: false" in body, body
    responses = {"model": "sim-chat", "max_output_tokens": 4, "stream": True, "store": False, "input": "hi"}
    status, body = await post(url, "out", "/v1/responses", responses)
    assert status == 400 and b"guardrail_stream_unscreenable" in body, body
    status, body = await post(url, "out", "/v1/messages", {**messages, "stream": False})
    assert status == 200, body


async def test_a_chat_stream_under_an_output_judge_is_judged_before_the_client_sees_it(
    gateway: tuple[Router, str],
) -> None:
    _, url = gateway
    status, body = await post(
        url, "out", "/v1/chat/completions", chat(("user", "a bomb of letters"), stream=True)
    )
    assert status == 200
    events = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) == 2, events  # the refusal alone: no piece of the answer
    assert json.loads(events[0])["error"]["message"].startswith(
        "The answer was blocked by guardrail `out-judge`"
    )
    status, body = await post(url, "out", "/v1/chat/completions", chat(("user", "count"), stream=True))
    events = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]" and "error" not in body.decode(), events
    assert any(
        json.loads(e)["choices"] and json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]
    )


def test_tool_call_arguments_are_screened_as_the_answer() -> None:
    answer = {
        "choices": [
            {
                "message": {
                    "content": None,
                    "tool_calls": [
                        {"type": "function", "function": {"name": "run", "arguments": '{"do": "omega"}'}}
                    ],
                }
            }
        ]
    }
    text = answer_text(json.dumps(answer).encode())
    assert text is not None and "omega" in text


async def test_the_judge_is_asked_only_within_limits(gateway: tuple[Router, str]) -> None:
    router, url = gateway
    asked: list[str] = []
    ask = router._ask_judge

    async def counted(model: str, prompt: str, limit_s: float) -> str | None:
        asked.append(model)
        return await ask(model, prompt, limit_s)

    router._ask_judge = counted  # type: ignore[method-assign]
    status, _ = await post(url, "limited", "/v1/chat/completions", chat(("user", "hello")))
    assert status == 200 and asked == ["guard"]
    for _ in range(3):  # past rpm 1: refused by the limits, and the judge is not asked for them
        status, body = await post(url, "limited", "/v1/chat/completions", chat(("user", "a bomb")))
        assert status == 429, body
    assert asked == ["guard"]
