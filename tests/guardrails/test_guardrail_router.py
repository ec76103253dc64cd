"""Guardrails through a real router: sim engines as processes (one of them a Llama Guard judge answering
`unsafe` for configured words), the snapshot the catalog publishes from a repo with guardrails at every level
of the tenant tree, and the official openai client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import openai
import pytest
from llmgw_router.app import Listeners, serve
from llmgw_router.path.auth import Authenticator, StaticKeys
from llmgw_router.path.service import Router, RouterOptions
from prometheus_client import generate_latest
from router.helpers import SimProcess, endpoint, start_sim, wait_healthy_sync
from support import free_port, wait_for

from llmgw.adapters.keys import hash_key
from llmgw.store.records import UsageRecord

from .repo import CLUSTER_OFF, catalog, snapshot

pytestmark = pytest.mark.integration

KEYS = {p: "sk-llmgw-" + c * 43 for p, c in (("p1", "a"), ("p2", "b"), ("p3", "c"))}


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, SimProcess]]:
    procs = {
        "sim-chat": start_sim("sim-chat", "k-chat"),
        # 20 ms a word: the stream reaches the output rule piece by piece even on a loaded machine (at 1 ms the
        # router could read all 24 words in one go, and the cut came before any piece was let through).
        "sim-out": start_sim("sim-out", "k-out", decode_ms=20.0),
        "guard": start_sim(
            "guard", "k-guard", extra=["--judge-unsafe", "bomb=S9", "--judge-unsafe", "hate=S10"]
        ),
    }
    try:
        wait_healthy_sync(list(procs.values()))
        yield procs
    finally:
        for p in procs.values():
            p.kill()


def endpoints(sims: dict[str, SimProcess], judge_up: bool = True) -> list[dict[str, Any]]:
    eps = [endpoint(sims["sim-chat"], "chat-1"), endpoint(sims["sim-out"], "out-1")]
    judge = endpoint(sims["guard"], "guard-1")
    if not judge_up:  # the judge's replica is published but nothing listens there: connection refused
        judge["base_url"] = f"http://127.0.0.1:{free_port()}"
    return [*eps, judge]


class Usage:
    def __init__(self) -> None:
        self.records: list[UsageRecord] = []

    def record(self, rec: UsageRecord) -> None:
        self.records.append(rec)

    async def of(self, request_id: str) -> UsageRecord:
        found = await wait_for(
            lambda: next((r for r in self.records if r.request_id == request_id), None),
            10,
            f"the usage row of {request_id}",
        )
        assert isinstance(found, UsageRecord)
        return found


@pytest.fixture
async def gateway(sims: dict[str, SimProcess]) -> AsyncIterator[tuple[Router, str, Usage]]:
    usage = Usage()
    keys = StaticKeys.from_file_lines([f"{hash_key(k)} {p} key-{p}" for p, k in KEYS.items()])
    router = Router(RouterOptions(router_id="r1", operator_token="ops"), Authenticator(keys), usage=usage)
    router.apply_snapshot(snapshot(catalog(), endpoints(sims)))
    listeners: Listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    try:
        yield router, f"http://127.0.0.1:{listeners.api_port}", usage
    finally:
        await listeners.close()


def client(url: str, project: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS[project], max_retries=0, timeout=30)


async def chat(url: str, project: str, text: str, model: str = "sim-chat", **kw: Any) -> Any:
    async with client(url, project) as c:
        return await c.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": text}],
            max_tokens=kw.pop("max_tokens", 6),
            **kw,
        )


def verdicts(router: Router) -> str:
    return generate_latest(router.metrics.registry).decode()


async def test_block_on_input_names_the_rule_and_never_echoes_the_content(
    gateway: tuple[Router, str, Usage],
) -> None:
    router, url, usage = gateway
    with pytest.raises(openai.BadRequestError) as refused:
        await chat(url, "p1", "tell me the forbidden recipe")
    err = refused.value
    assert err.status_code == 400
    assert err.code == "guardrail_blocked"
    message = err.body["message"]  # type: ignore[index]
    assert message == "The request was blocked by guardrail `team-words` (rule keyword)."
    assert "forbidden" not in message and "recipe" not in message
    rec = await usage.of(err.response.headers["x-request-id"])
    assert (rec.status, rec.code) == (400, "guardrail_blocked")
    assert rec.guard == {"input": {"action": "block", "stage": "input", "rules": ["team-words/keyword"]}}
    assert rec.endpoint == ""  # no engine saw it
    assert (
        'llmgw_router_guardrail_verdicts_total{action="block",guardrail="team-words",rule="keyword",stage="input"} 1.0'
        in verdicts(router)
    )


async def test_a_judge_refusal_names_the_hazard(gateway: tuple[Router, str, Usage]) -> None:
    _, url, usage = gateway
    with pytest.raises(openai.BadRequestError) as refused:
        await chat(url, "p1", "how do I build a bomb")
    assert refused.value.body["message"] == (  # type: ignore[index]
        "The request was blocked by guardrail `p1-judge` (rule judge): S9 Indiscriminate Weapons."
    )
    rec = await usage.of(refused.value.response.headers["x-request-id"])
    assert rec.guard is not None and rec.guard["input"]["hazards"] == ["S9"]


async def test_redact_replaces_pii_before_the_engine_sees_it(gateway: tuple[Router, str, Usage]) -> None:
    _, url, usage = gateway
    # The sim's words are seeded by the prompt it got: the redacted request must be answered exactly as the
    # redacted text is, by a project no guardrail touches (p3, another organization).
    raw = await chat(url, "p1", "mail jane.doe@example.com the card 4111 1111 1111 1111")
    same = await chat(url, "p3", "mail [EMAIL] the card [CARD]")
    unredacted = await chat(url, "p3", "mail jane.doe@example.com the card 4111 1111 1111 1111")
    answer = raw.parse().choices[0].message.content
    assert answer == same.parse().choices[0].message.content
    assert answer != unredacted.parse().choices[0].message.content
    rec = await usage.of(raw.headers["x-request-id"])
    assert rec.status == 200
    assert rec.guard is not None
    assert rec.guard["input"] == {
        "action": "redact",
        "stage": "input",
        "rules": ["org-pii/pii.card", "org-pii/pii.email"],
    }


async def test_warn_serves_and_records_the_verdict(gateway: tuple[Router, str, Usage]) -> None:
    router, url, usage = gateway
    raw = await chat(url, "p3", "a heads-up for you")
    assert raw.parse().choices[0].message.content
    rec = await usage.of(raw.headers["x-request-id"])
    assert rec.status == 200
    assert rec.guard == {"input": {"action": "warn", "stage": "input", "rules": ["p3-warn/keyword"]}}
    assert 'action="warn",guardrail="p3-warn",rule="keyword",stage="input"} 1.0' in verdicts(router)


async def test_guardrails_are_inherited_down_the_tenant_tree(gateway: tuple[Router, str, Usage]) -> None:
    _, url, usage = gateway
    # team-words is the team's: p1 (in the team) is refused, p2 (directly under the organization) is not.
    with pytest.raises(openai.BadRequestError):
        await chat(url, "p1", "the forbidden word")
    served = await chat(url, "p2", "the forbidden word")
    rec = await usage.of(served.headers["x-request-id"])
    assert rec.status == 200 and rec.guard == {"input": {"action": "pass", "stage": "input"}}
    # org-pii is the organization's: p2 is redacted too, p3 (another organization) is not checked at all.
    p2 = await usage.of((await chat(url, "p2", "me@example.org")).headers["x-request-id"])
    assert p2.guard is not None and p2.guard["input"]["action"] == "redact"
    p3 = await usage.of((await chat(url, "p3", "me@example.org")).headers["x-request-id"])
    assert p3.guard == {"input": {"action": "pass", "stage": "input"}}


async def test_an_output_rule_cuts_the_stream_with_a_final_error_event(
    gateway: tuple[Router, str, Usage],
) -> None:
    _, url, usage = gateway
    body = {
        "model": "sim-out",
        "messages": [{"role": "user", "content": "count the greek letters"}],
        "max_tokens": 48,  # the sim's words step through all 24 letters: omega comes before the end
        "stream": True,
    }
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEYS['p3']}"}
        ) as resp,
    ):
        assert resp.status == 200
        text = (await resp.read()).decode()
        request_id = resp.headers["x-request-id"]
    events = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["error"]["code"] == "guardrail_blocked"
    assert last["error"]["message"] == "The answer was blocked by guardrail `out-cut` (rule keyword)."
    pieces = [
        c["delta"].get("content") or "" for e in events[:-2] for c in json.loads(e)["choices"] if "delta" in c
    ]
    assert "omega" not in "".join(pieces)  # the piece that tripped never reached the client
    assert 0 < len([p for p in pieces if p]) < 48
    rec = await usage.of(request_id)
    assert (rec.status, rec.code) == (200, "guardrail_blocked")
    assert rec.guard is not None and rec.guard["output"]["rules"] == ["out-cut/keyword"]


async def test_a_whole_answer_tripping_an_output_rule_is_refused(gateway: tuple[Router, str, Usage]) -> None:
    _, url, _ = gateway
    with pytest.raises(openai.BadRequestError) as refused:
        await chat(url, "p3", "count the greek letters", model="sim-out", max_tokens=30)
    assert refused.value.code == "guardrail_blocked"
    # A short answer without the word passes the same rule.
    assert (
        await chat(url, "p3", "count the greek letters", model="sim-out", max_tokens=1)
    ).status_code == 200


async def test_a_whole_answer_is_judged_as_the_last_agent_turn(gateway: tuple[Router, str, Usage]) -> None:
    router, url, usage = gateway
    with pytest.raises(openai.BadRequestError) as refused:  # the sim judge reads the user turn as context
        await chat(url, "p3", "a bomb of letters", model="sim-out", max_tokens=1)
    assert refused.value.body["message"] == (  # type: ignore[index]
        "The answer was blocked by guardrail `out-judge` (rule judge): S9 Indiscriminate Weapons."
    )
    rec = await usage.of(refused.value.response.headers["x-request-id"])
    assert rec.guard is not None and rec.guard["output"]["hazards"] == ["S9"]
    assert rec.endpoint == "out-1"  # the engine answered; the client got the refusal instead
    assert 'guardrail="out-judge",rule="judge",stage="output"} 1.0' in verdicts(router)


async def test_a_responses_request_that_would_be_redacted_is_refused(
    gateway: tuple[Router, str, Usage],
) -> None:
    _, url, _ = gateway
    async with client(url, "p1") as c:
        with pytest.raises(openai.BadRequestError) as refused:
            await c.responses.create(model="sim-chat", input="mail jane.doe@example.com", max_output_tokens=4)
    assert refused.value.code == "guardrail_blocked"
    assert "pii.email" in refused.value.body["message"]  # type: ignore[index]
    async with client(url, "p1") as c:  # nothing to redact: served
        answer = await c.responses.create(model="sim-chat", input="hello", max_output_tokens=4)
    assert answer.output_text


async def test_judge_down_fails_closed_or_open_as_each_guardrail_says(
    sims: dict[str, SimProcess], gateway: tuple[Router, str, Usage]
) -> None:
    router, url, usage = gateway
    router.apply_snapshot(snapshot(catalog(), endpoints(sims, judge_up=False)))
    with pytest.raises(openai.APIStatusError) as closed:  # p1-judge fails closed
        await chat(url, "p1", "hello there")
    assert closed.value.status_code == 503
    assert closed.value.code == "guardrail_unavailable"
    served = await chat(url, "p2", "hello there")  # p2-judge fails open: served, recorded as not judged
    rec = await usage.of(served.headers["x-request-id"])
    assert rec.status == 200
    assert rec.guard == {"input": {"action": "unjudged", "stage": "input", "unjudged": ["p2-judge"]}}
    status = router.guard.status()
    assert status["p1-judge"]["on_judge_error"] == "closed" and status["p1-judge"]["judge"].startswith(
        "no answer"
    )
    assert status["p2-judge"]["on_judge_error"] == "open" and status["p2-judge"]["judge"].startswith(
        "no answer"
    )
    page = verdicts(router)
    assert 'llmgw_router_guardrail_judge_unavailable{fails="closed",guardrail="p1-judge"} 1.0' in page
    assert 'llmgw_router_guardrail_judge_unavailable{fails="open",guardrail="p2-judge"} 1.0' in page
    # The judge back: it answers, and the status says so.
    router.apply_snapshot(snapshot(catalog(), endpoints(sims)))
    assert (await chat(url, "p1", "hello there")).status_code == 200
    assert router.guard.status()["p1-judge"]["judge"] == "ok"


async def test_the_cluster_switch_turns_every_check_off_live(
    sims: dict[str, SimProcess], gateway: tuple[Router, str, Usage]
) -> None:
    router, url, usage = gateway
    router.apply_snapshot(snapshot(catalog(**{"cluster.yaml": CLUSTER_OFF}), endpoints(sims)))
    served = await chat(url, "p1", "the forbidden word")
    rec = await usage.of(served.headers["x-request-id"])
    assert rec.status == 200 and rec.guard is None  # nothing checked: absent, not "passed"
    assert "llmgw_router_guardrails_enabled 0.0" in verdicts(router)
    async with (
        aiohttp.ClientSession() as s,
        s.get(url + "/ready", headers={"Authorization": "Bearer ops"}) as r,
    ):
        ready = await r.json()  # the guardrails' setup: for the operator's token only (L12)
    assert ready["guard"]["enabled"] is False
    router.apply_snapshot(snapshot(catalog(), endpoints(sims)))  # and on again with the next snapshot
    with pytest.raises(openai.BadRequestError):
        await chat(url, "p1", "the forbidden word")
